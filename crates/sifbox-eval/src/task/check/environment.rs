//! The checks of `[environment]`: networks, OS, resources, image,
//! workdir, healthcheck and setup commands.

use std::time::Duration;

use super::super::model::{
    HealthCommand, NetworkMode, RawAgent, RawEnvironment, RawHealthcheck, RawSetupCommand,
    RawVerifier,
};
use super::super::{
    bad, cpus_milli, Healthcheck, SetupCommand, DEFAULT_HEALTH_INTERVAL_SEC,
    DEFAULT_HEALTH_TIMEOUT_SEC, DEFAULT_SETUP_TIMEOUT_SEC,
};
use super::values::{check_env, check_user, size_mb, timeout};
use crate::error::Result;

/// The environment's network and each phase's; what cannot be enforced is
/// pushed to `unsupported`, once, where it is written.
pub(super) fn networks(
    e: &RawEnvironment,
    agent: &RawAgent,
    verifier: &RawVerifier,
    unsupported: &mut Vec<String>,
) -> (NetworkMode, NetworkMode, NetworkMode) {
    let network = match (e.network_mode, e.allow_internet) {
        (Some(m), _) => m,
        (None, Some(false)) => NetworkMode::NoNetwork,
        (None, _) => NetworkMode::Public,
    };
    let agent_network = agent.network_mode.unwrap_or(network);
    let verifier_network = verifier.network_mode.unwrap_or(network);
    for (key, mode, own) in [
        (
            "[environment] network_mode",
            network,
            e.network_mode.is_some(),
        ),
        (
            "[agent] network_mode",
            agent_network,
            agent.network_mode.is_some(),
        ),
        (
            "[verifier] network_mode",
            verifier_network,
            verifier.network_mode.is_some(),
        ),
    ] {
        // Said once, where it is written.
        if !own {
            continue;
        }
        match mode {
            NetworkMode::Allowlist => unsupported.push(format!(
                "{key} = \"allowlist\": sifbox cannot enforce a host allowlist (allowed_hosts); use \"public\" or \"no-network\", or run this task with another runtime"
            )),
            NetworkMode::Denylist => unsupported.push(format!(
                "{key} = \"denylist\": sifbox cannot enforce a denylist (blocked_urls, blocked_hosts); use \"public\" or \"no-network\", or run this task with another runtime"
            )),
            NetworkMode::Public | NetworkMode::NoNetwork => {}
        }
    }
    (network, agent_network, verifier_network)
}

/// `[environment] os`: Linux, or Windows (unsupported).
pub(super) fn os(os: Option<&str>, file: &str, unsupported: &mut Vec<String>) -> Result<()> {
    match os.map(str::to_ascii_lowercase).as_deref() {
        None | Some("linux") => {}
        Some("windows") => unsupported
            .push("[environment] os = \"windows\": sifbox runs Linux sandboxes only".to_string()),
        Some(_) => {
            return Err(bad(
                format!("{file}: [environment] os = {:?}", os.unwrap_or_default()),
                "not an operating system Harbor knows",
                "write os = \"linux\" (the default) or leave it out",
            ))
        }
    }
    Ok(())
}

/// MCP servers (unsupported), CPUs, memory and storage (returned, in MiB)
/// and GPU types.
pub(super) fn resources(
    e: &RawEnvironment,
    file: &str,
    unsupported: &mut Vec<String>,
) -> Result<(Option<u64>, Option<u64>)> {
    if e.mcp_servers.as_ref().is_some_and(|m| !m.is_empty()) {
        unsupported.push(
            "[environment] mcp_servers: sifbox starts no MCP servers for the agent".to_string(),
        );
    }
    if let Some(cpus) = e.cpus {
        if cpus_milli(cpus).is_none() {
            return Err(bad(
                format!("{file}: [environment] cpus = {cpus}"),
                "not a number of CPUs above 0",
                "set cpus to e.g. 1 or 0.5, or leave it out for no CPU limit",
            ));
        }
    }
    let memory_mb = size_mb(e.memory_mb, e.memory.as_deref(), "memory", file)?;
    let storage_mb = size_mb(e.storage_mb, e.storage.as_deref(), "storage", file)?;
    if memory_mb == Some(0) {
        return Err(bad(
            format!("{file}: [environment] memory_mb = 0"),
            "a sandbox needs some memory",
            "set memory_mb to e.g. 2048, or leave it out for the default",
        ));
    }
    if storage_mb == Some(0) {
        return Err(bad(
            format!("{file}: [environment] storage_mb = 0"),
            "the sandbox's writable layer needs some space",
            "set storage_mb to e.g. 10240, or leave it out",
        ));
    }
    if let Some(types) = &e.gpu_types {
        if types.len() > 64
            || types
                .iter()
                .any(|t| t.is_empty() || t.len() > 100 || t.chars().any(char::is_control))
        {
            return Err(bad(
                format!("{file}: [environment] gpu_types"),
                "not a list of GPU type names",
                "write e.g. gpu_types = [\"H100\", \"A100\"], or leave it out",
            ));
        }
    }
    Ok((memory_mb, storage_mb))
}

/// `[environment] docker_image`.
pub(super) fn docker_image(image: Option<String>, file: &str) -> Result<Option<String>> {
    let docker_image = match image {
        Some(i) if i.trim().is_empty() || i.chars().any(char::is_control) => return Err(bad(
            format!("{file}: [environment] docker_image = {i:?}"),
            "not an image reference",
            "name an image (a store name, docker://REF or a .sif file), or leave it out to build environment/",
        )),
        other => other,
    };
    Ok(docker_image)
}

/// `[environment] workdir`.
pub(super) fn workdir(workdir: Option<String>, file: &str) -> Result<Option<String>> {
    let workdir = match workdir {
        Some(w) if !w.starts_with('/') || w.contains('\0') || w.len() > 4096 => {
            return Err(bad(
                format!("{file}: [environment] workdir = {w:?}"),
                "not an absolute path",
                "write an absolute path inside the sandbox, e.g. /app",
            ))
        }
        other => other,
    };
    Ok(workdir)
}

/// `[environment.healthcheck]`.
pub(super) fn healthcheck(h: RawHealthcheck, file: &str) -> Result<Healthcheck> {
    let argv = match h.command {
        Some(HealthCommand::Shell(s)) if !s.trim().is_empty() => {
            vec!["/bin/sh".to_string(), "-c".to_string(), s]
        }
        Some(HealthCommand::Argv(v)) if !v.is_empty() && !v[0].is_empty() => v,
        _ => {
            return Err(bad(
                format!("{file}: [environment.healthcheck]"),
                "no command",
                "set command = \"...\" (run by /bin/sh -c) or an argv list",
            ))
        }
    };
    if argv.iter().any(|a| a.contains('\0')) {
        return Err(bad(
            format!("{file}: [environment.healthcheck] command"),
            "contains a NUL byte",
            "remove it",
        ));
    }
    let key = "[environment.healthcheck]";
    // Harbor's: 0 retries fails at the first failure after the
    // start period, as 1 does.
    let retries = match h.retries.unwrap_or(3) {
        n @ 0..=10_000 => u32::try_from(n.max(1)).unwrap_or(1),
        n => {
            return Err(bad(
                format!("{file}: {key} retries = {n}"),
                "must be 0 to 10000",
                "set retries to e.g. 3",
            ))
        }
    };
    let pause = |v: Option<f64>, name: &str| match v {
        Some(0.0) => Ok(Duration::ZERO),
        v => timeout(
            v,
            DEFAULT_HEALTH_INTERVAL_SEC,
            &format!("{key} {name}"),
            file,
        ),
    };
    let start_period = match h.start_period_sec {
        None | Some(0.0) => Duration::ZERO,
        v => timeout(v, 0.0, &format!("{key} start_period_sec"), file)?,
    };
    Ok(Healthcheck {
        argv,
        interval: pause(h.interval_sec, "interval_sec")?,
        timeout: timeout(
            h.timeout_sec,
            DEFAULT_HEALTH_TIMEOUT_SEC,
            &format!("{key} timeout_sec"),
            file,
        )?,
        start_period,
        start_interval: pause(h.start_interval_sec, "start_interval_sec")?,
        retries,
    })
}

/// `[[environment.setup_commands]]` (BenchFlow's).
pub(super) fn setup_commands(
    raw: Vec<RawSetupCommand>,
    file: &str,
    unsupported: &mut Vec<String>,
) -> Result<Vec<SetupCommand>> {
    let mut setup_commands = Vec::with_capacity(raw.len());
    for (i, c) in raw.into_iter().enumerate() {
        let key = format!("[environment] setup_commands[{i}]");
        let command = match c.command {
            Some(cmd) if !cmd.trim().is_empty() && !cmd.contains('\0') => cmd.trim().to_string(),
            _ => {
                return Err(bad(
                    format!("{file}: {key}"),
                    "no command",
                    "set command = \"...\" (run by /bin/sh -c in the sandbox)",
                ))
            }
        };
        let cwd = match c.cwd.map(|w| w.trim().to_string()) {
            Some(w) if !w.starts_with('/') || w.contains('\0') || w.len() > 4096 => {
                return Err(bad(
                    format!("{file}: {key} cwd = {w:?}"),
                    "not an absolute path",
                    "write an absolute path inside the sandbox, e.g. /app",
                ))
            }
            other => other,
        };
        match c.service.as_deref().map(str::trim) {
            None | Some("main") => {}
            Some(other) => unsupported.push(format!(
                "{key} service = {other:?}: sifbox runs no compose services; setup commands run in the task's one sandbox (service \"main\")"
            )),
        }
        if c.capture_dir.is_some() || c.capture_dir_b64_env.is_some() {
            unsupported.push(format!(
                "{key} capture_dir: sifbox does not copy a sandbox's files into the host's environment"
            ));
        }
        let host_lock = match c.host_lock.map(|l| l.trim().to_string()) {
            Some(l) if l.is_empty() || l.len() > 200 || l.chars().any(char::is_control) => {
                return Err(bad(
                    format!("{file}: {key} host_lock = {l:?}"),
                    "not a lock name",
                    "name the lock with letters, digits, '.', '_' and '-'",
                ))
            }
            other => other,
        };
        setup_commands.push(SetupCommand {
            command,
            timeout: timeout(
                c.timeout_sec,
                DEFAULT_SETUP_TIMEOUT_SEC,
                &format!("{key} timeout_sec"),
                file,
            )?,
            cwd,
            env: check_env(c.env, &format!("{key} env"), file)?,
            user: check_user(c.user, &format!("{key} user"), file)?,
            host_lock,
        });
    }
    Ok(setup_commands)
}
