//! Multi-step tasks' rewards (Harbor's `MultiStepTrial`): a step's rewards
//! as a map, the `min_reward` gate that ends a rollout early, and the
//! rollout's rewards from its steps' by `multi_step_reward_strategy`.

use std::collections::BTreeMap;

use crate::task::RewardStrategy;

/// A step's rewards by key: reward.json's keys, or `reward` for a bare
/// number (reward.txt); none when the verifier left no reward.
pub fn rewards_of(
    value: Option<f64>,
    all: Option<&serde_json::Value>,
) -> Option<BTreeMap<String, f64>> {
    match all.and_then(serde_json::Value::as_object) {
        Some(o) => Some(
            o.iter()
                .filter_map(|(k, v)| v.as_f64().map(|v| (k.clone(), v)))
                .collect(),
        ),
        None => value.map(|v| BTreeMap::from([("reward".to_string(), v)])),
    }
}

/// Why a step's `rewards` do not pass `min`: the first key below its
/// threshold, a missing one counting as minus infinity (Harbor's rule).
pub fn below_min(
    rewards: Option<&BTreeMap<String, f64>>,
    min: &BTreeMap<String, f64>,
) -> Option<String> {
    min.iter().find_map(
        |(key, threshold)| match rewards.and_then(|r| r.get(key)).copied() {
            Some(v) if v >= *threshold => None,
            Some(v) => Some(format!("{key} = {v} is below min_reward {threshold}")),
            None => Some(format!("no {key} reward (min_reward {threshold})")),
        },
    )
}

/// The rollout's rewards from its steps' (in order; none for a step
/// without a reward): `final`, the last step's; `mean`, each key's mean
/// over the steps with rewards, a key missing in one of them counting 0.
pub fn combine(
    strategy: RewardStrategy,
    steps: &[Option<BTreeMap<String, f64>>],
) -> Option<BTreeMap<String, f64>> {
    match strategy {
        RewardStrategy::Final => steps.last().cloned().flatten(),
        RewardStrategy::Mean => {
            let rewarded: Vec<&BTreeMap<String, f64>> = steps.iter().flatten().collect();
            let keys: std::collections::BTreeSet<&String> =
                rewarded.iter().flat_map(|r| r.keys()).collect();
            if keys.is_empty() {
                return None;
            }
            #[allow(clippy::cast_precision_loss, reason = "a count of steps")]
            let n = rewarded.len() as f64;
            Some(
                keys.into_iter()
                    .map(|k| {
                        let sum: f64 = rewarded
                            .iter()
                            .map(|r| r.get(k).copied().unwrap_or(0.0))
                            .sum();
                        (k.clone(), sum / n)
                    })
                    .collect(),
            )
        }
    }
}

/// The headline of `rewards`: `reward`, else the only key's value.
pub fn headline(rewards: &BTreeMap<String, f64>) -> Option<f64> {
    match rewards.get("reward") {
        Some(v) => Some(*v),
        None if rewards.len() == 1 => rewards.values().next().copied(),
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(pairs: &[(&str, f64)]) -> BTreeMap<String, f64> {
        pairs.iter().map(|(k, v)| ((*k).to_string(), *v)).collect()
    }

    #[test]
    fn a_steps_rewards() {
        assert_eq!(rewards_of(Some(0.5), None), Some(m(&[("reward", 0.5)])));
        let all = serde_json::json!({"reward": 1, "acc": 0.25});
        assert_eq!(
            rewards_of(Some(1.0), Some(&all)),
            Some(m(&[("reward", 1.0), ("acc", 0.25)]))
        );
        assert_eq!(rewards_of(None, None), None);
    }

    #[test]
    fn min_reward_gates_like_harbor() {
        let min = m(&[("reward", 0.5)]);
        assert_eq!(below_min(Some(&m(&[("reward", 0.5)])), &min), None);
        assert!(below_min(Some(&m(&[("reward", 0.4)])), &min)
            .expect("below")
            .contains("reward = 0.4 is below min_reward 0.5"));
        // Missing key or no reward at all: minus infinity.
        assert!(below_min(Some(&m(&[("acc", 1.0)])), &min).is_some());
        assert!(below_min(None, &min).is_some());
        // Every key of a table gates.
        let min = m(&[("a", 1.0), ("b", 0.0)]);
        assert_eq!(below_min(Some(&m(&[("a", 1.0), ("b", 0.0)])), &min), None);
        assert!(below_min(Some(&m(&[("a", 1.0)])), &min).is_some());
    }

    #[test]
    fn strategies_are_harbors() {
        let steps = vec![
            Some(m(&[("reward", 1.0), ("x", 1.0)])),
            None,
            Some(m(&[("reward", 0.0)])),
        ];
        // Mean: over the steps with rewards, a missing key counting 0.
        assert_eq!(
            combine(RewardStrategy::Mean, &steps),
            Some(m(&[("reward", 0.5), ("x", 0.5)]))
        );
        // Final: the last step run's, verbatim.
        assert_eq!(
            combine(RewardStrategy::Final, &steps),
            Some(m(&[("reward", 0.0)]))
        );
        assert_eq!(combine(RewardStrategy::Final, &steps[..2]), None);
        assert_eq!(combine(RewardStrategy::Mean, &[None, None]), None);
        assert_eq!(combine(RewardStrategy::Mean, &[]), None);
        assert_eq!(headline(&m(&[("reward", 0.5), ("x", 1.0)])), Some(0.5));
        assert_eq!(headline(&m(&[("x", 1.0)])), Some(1.0));
        assert_eq!(headline(&m(&[("x", 1.0), ("y", 0.0)])), None);
    }
}
