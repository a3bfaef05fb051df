//! The checks of `[verifier]`: where it runs, its own environment, its type.

use super::super::bad;
use super::super::model::{RawVerifier, RawVerifierEnvironment, VerifierMode};
use crate::error::Result;

/// Where the verifier runs.
pub(super) fn mode(v: &RawVerifier, file: &str) -> Result<VerifierMode> {
    // Harbor's rule (verifier_mode.py): the mode written, else separate
    // when the verifier has an environment of its own, else shared.
    let verifier_mode = match (v.environment_mode, &v.environment) {
        (Some(VerifierMode::Shared), Some(_)) => {
            return Err(bad(
                format!("{file}: [verifier] environment_mode = \"shared\""),
                "a shared verifier runs in the agent's sandbox, yet [verifier.environment] gives it one of its own",
                "leave out [verifier.environment], or set environment_mode = \"separate\"",
            ))
        }
        (Some(m), _) => m,
        (None, Some(_)) => VerifierMode::Separate,
        (None, None) => VerifierMode::Shared,
    };
    Ok(verifier_mode)
}

/// `[verifier.environment]`: its image, when it names one.
pub(super) fn image(
    env: Option<&RawVerifierEnvironment>,
    file: &str,
    unsupported: &mut Vec<String>,
) -> Result<Option<String>> {
    let verifier_image = match env {
        None => None,
        Some(v) => {
            match v.os.as_deref().map(str::to_ascii_lowercase).as_deref() {
                None | Some("linux") => {}
                Some("windows") => unsupported.push(
                    "[verifier.environment] os = \"windows\": sifbox runs Linux sandboxes only"
                        .to_string(),
                ),
                Some(_) => {
                    return Err(bad(
                        format!(
                            "{file}: [verifier.environment] os = {:?}",
                            v.os.clone().unwrap_or_default()
                        ),
                        "not an operating system Harbor knows",
                        "write os = \"linux\" (the default) or leave it out",
                    ))
                }
            }
            match v.docker_image.clone() {
                Some(i) if i.trim().is_empty() || i.chars().any(char::is_control) => {
                    return Err(bad(
                        format!("{file}: [verifier.environment] docker_image = {i:?}"),
                        "not an image reference",
                        "name the verifier's image (a store name, docker://REF or a .sif file), or leave it out to build tests/Dockerfile",
                    ))
                }
                other => other,
            }
        }
    };
    Ok(verifier_image)
}

/// `[verifier] type` (BenchFlow's).
pub(super) fn kind(kind: Option<&str>, file: &str, unsupported: &mut Vec<String>) -> Result<()> {
    match kind {
        None | Some("test-script") => {}
        Some("llm-judge") => unsupported.push(
            "[verifier] type = \"llm-judge\": sifbox has no LLM judge; it runs tests/test.sh (type = \"test-script\")".to_string(),
        ),
        Some(other) => {
            return Err(bad(
                format!("{file}: [verifier] type = {other:?}"),
                "not a verifier type BenchFlow knows",
                "write type = \"test-script\" (the default) or leave it out",
            ))
        }
    }
    Ok(())
}
