//! What a phase's command used of the sandbox, and whether the memory
//! limit ended it: the verdict, the error naming the limit and what
//! enforced it, the note when the command carried on.

use sifbox_engine::{ExecStatus, Usage};

use crate::result::RolloutResult;
use crate::task::RolloutLimits;

use super::how_name;

/// What the sandbox used while one phase's command ran.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct PhaseUsage {
    /// CPU time of the phase (None: the host could not tell).
    pub(super) cpu_ns: Option<u64>,
    /// The phase's memory peak.
    pub(super) memory_peak: Option<u64>,
    /// Processes killed for memory during the phase.
    pub(super) oom_kills: u64,
    /// ... and since the sandbox started.
    pub(super) oom_total: u64,
}

impl PhaseUsage {
    pub(super) fn between(before: &Usage, after: &Usage) -> PhaseUsage {
        PhaseUsage {
            cpu_ns: after
                .cpu_ns
                .zip(before.cpu_ns)
                .map(|(a, b)| a.saturating_sub(b)),
            memory_peak: after.memory_peak,
            oom_kills: after.oom_kills.saturating_sub(before.oom_kills),
            oom_total: after.oom_kills,
        }
    }
}

/// The exit code of a command killed by SIGKILL.
pub(super) const KILLED: i32 = 128 + 9;

/// Whether a phase's command died of the memory limit: it failed after a
/// process of the sandbox was killed for memory during the phase, or it
/// was itself killed (SIGKILL) in a sandbox that has had such kills. A
/// command that carried on to exit 0, or ran into its time limit, did not
/// (a note says what was killed).
pub(super) fn killed_for_memory(st: &ExecStatus, used: &PhaseUsage) -> bool {
    match st {
        ExecStatus::Exited {
            timed_out: true, ..
        }
        | ExecStatus::Exited { code: 0, .. } => false,
        ExecStatus::Exited { code, .. } => {
            used.oom_kills > 0 || (*code == KILLED && used.oom_total > 0)
        }
        ExecStatus::Failed { .. } => used.oom_kills > 0,
    }
}

/// The error of a phase killed for memory: the limit, what enforced it,
/// what was killed, what to do.
pub(super) fn oom_message(
    phase: &str,
    st: &ExecStatus,
    used: &PhaseUsage,
    limits: &RolloutLimits,
    e: &sifbox_engine::limits::Enforcement,
) -> String {
    let limit = limits
        .memory_mb
        .map_or_else(|| "its".to_string(), |m| format!("its {m} MiB"));
    let how = e
        .how("memory")
        .map(|h| format!(", enforced by {}", how_name(h)))
        .unwrap_or_default();
    let peak = used
        .memory_peak
        .map(|p| format!(", peak {} MiB", p.div_ceil(1 << 20)))
        .unwrap_or_default();
    let ended = match st {
        ExecStatus::Exited { code, .. } if *code == KILLED => "it was killed (SIGKILL)".to_string(),
        ExecStatus::Exited { code, .. } => format!("it exited with code {code}"),
        ExecStatus::Failed { code, message } => format!("it could not start ({code}): {message}"),
    };
    let killed = if used.oom_kills > 0 {
        format!("{} process(es) of the sandbox killed", used.oom_kills)
    } else {
        format!(
            "{} process(es) of the sandbox killed so far",
            used.oom_total
        )
    };
    format!(
        "the {phase} went over {limit} memory limit{how}: {killed}{peak}, and {ended}; give the task more memory ([environment] memory_mb, or --override-memory-mb)"
    )
}

/// A note when processes were killed for memory during a phase whose
/// command carried on.
pub(super) fn note_oom_survived(r: &mut RolloutResult, phase: &str, used: &PhaseUsage) {
    if used.oom_kills > 0 {
        r.notes.push(format!(
            "{} process(es) of the sandbox were killed for going over the memory limit during the {phase}, which carried on",
            used.oom_kills
        ));
    }
}
