//! The one way an exec request is made: the command, what the sandbox's
//! image says execs default to ([`ExecDefaults`]: its WORKDIR and USER, and
//! its Apptainer env scripts), then the caller's own choices, which win.
//! `sifbox run` and `exec`, the async API, eval's phases and healthchecks,
//! and build steps all go through [`ExecBuilder`], so that they agree.

use std::time::Duration;

use crate::protocol::ExecRequest;
use crate::sandbox::ExecDefaults;

/// Builds an [`ExecRequest`]; see the module's note.
#[derive(Debug, Clone, Default)]
#[must_use]
pub struct ExecBuilder {
    argv: Vec<String>,
    env: Vec<(String, String)>,
    /// The caller set HOME itself.
    home_given: bool,
    cwd: Option<String>,
    user: Option<String>,
    defaults: ExecDefaults,
    env_scripts: bool,
    timeout: Option<Duration>,
    stop_after: bool,
    fake_ids: bool,
    isolate_net: bool,
    guarded: bool,
}

impl ExecRequest {
    /// An exec of `argv` (see [`ExecBuilder`]).
    pub fn command(argv: impl IntoIterator<Item = impl Into<String>>) -> ExecBuilder {
        ExecBuilder {
            argv: argv.into_iter().map(Into::into).collect(),
            ..ExecBuilder::default()
        }
    }
}

impl ExecBuilder {
    /// What the image says: the working directory and user when the caller
    /// gives none, and whether commands go through its env scripts.
    pub fn defaults(mut self, d: &ExecDefaults) -> Self {
        self.defaults = d.clone();
        self.env_scripts |= d.source_env_scripts;
        self
    }

    /// Commands source the image's Apptainer env scripts first.
    pub fn env_scripts(mut self, yes: bool) -> Self {
        self.env_scripts |= yes;
        self
    }

    /// The environment the command starts from (the sandbox's base
    /// environment, the image's); a HOME in it may still be replaced by
    /// the user's home.
    pub fn base_env(mut self, env: Vec<(String, String)>) -> Self {
        self.env = env;
        self
    }

    /// Sets a variable (the caller's: a HOME set here is kept).
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        let key = key.into();
        self.home_given |= key == "HOME";
        crate::spec::set_env(&mut self.env, &key, &value.into());
        self
    }

    /// Sets each of `vars` ([`ExecBuilder::env`]).
    pub fn envs<K: Into<String>, V: Into<String>>(
        mut self,
        vars: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        for (k, v) in vars {
            self = self.env(k, v);
        }
        self
    }

    /// The working directory (else the image's WORKDIR, else `/`).
    pub fn cwd(mut self, dir: Option<String>) -> Self {
        if dir.is_some() {
            self.cwd = dir;
        }
        self
    }

    /// The user of the image (else the image's USER, else root).
    pub fn user(mut self, user: Option<String>) -> Self {
        if user.is_some() {
            self.user = user;
        }
        self
    }

    /// Kill everything the exec started after `timeout` (exit 124).
    pub fn timeout(mut self, timeout: Option<Duration>) -> Self {
        self.timeout = timeout;
        self
    }

    /// The sandbox's last command: it stops once this ends.
    pub fn stop_after(mut self, yes: bool) -> Self {
        self.stop_after = yes;
        self
    }

    /// `chown` and `set*id` succeed without effect (see `fakeroot`).
    pub fn fake_ids(mut self, yes: bool) -> Self {
        self.fake_ids = yes;
        self
    }

    /// The command gets a network namespace of its own with only `lo`.
    pub fn isolate_net(mut self, yes: bool) -> Self {
        self.isolate_net = yes;
        self
    }

    /// The command runs where the sandbox's guarded binds are writable
    /// (see [`ExecRequest::guarded`]).
    pub fn guarded(mut self, yes: bool) -> Self {
        self.guarded = yes;
        self
    }

    /// The request.
    pub fn build(self) -> ExecRequest {
        let argv = if self.env_scripts {
            with_env_scripts(&self.argv)
        } else {
            self.argv
        };
        ExecRequest {
            argv,
            env: self.env,
            cwd: self.cwd.or(self.defaults.cwd).unwrap_or_else(|| "/".into()),
            user: self.user.or(self.defaults.user),
            default_home: !self.home_given,
            timeout_ms: self
                .timeout
                .map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX).max(1)),
            stop_after: self.stop_after,
            fake_ids: self.fake_ids,
            isolate_net: self.isolate_net,
            guarded: self.guarded,
            ..ExecRequest::default()
        }
    }
}

/// The argv that runs `argv` after sourcing the image's
/// `/.singularity.d/env/*.sh` in glob order, as Apptainer does.
pub fn with_env_scripts(argv: &[String]) -> Vec<String> {
    let mut out = vec![
        "/bin/sh".to_string(),
        "-c".to_string(),
        "for f in /.singularity.d/env/*.sh; do [ -r \"$f\" ] && . \"$f\"; done; exec \"$@\""
            .to_string(),
        "sh".to_string(),
    ];
    out.extend(argv.iter().cloned());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn defaults() -> ExecDefaults {
        ExecDefaults {
            cwd: Some("/work".into()),
            user: Some("agent".into()),
            source_env_scripts: false,
        }
    }

    #[test]
    fn the_caller_beats_the_image_which_beats_the_fallbacks() {
        let r = ExecRequest::command(["true"]).build();
        assert_eq!((r.cwd.as_str(), r.user.as_deref()), ("/", None));
        let r = ExecRequest::command(["true"]).defaults(&defaults()).build();
        assert_eq!(
            (r.cwd.as_str(), r.user.as_deref()),
            ("/work", Some("agent"))
        );
        let r = ExecRequest::command(["true"])
            .defaults(&defaults())
            .cwd(Some("/tmp".into()))
            .user(Some("root".into()))
            .build();
        assert_eq!((r.cwd.as_str(), r.user.as_deref()), ("/tmp", Some("root")));
        // None keeps what there is.
        let r = ExecRequest::command(["true"])
            .defaults(&defaults())
            .cwd(None)
            .user(None)
            .build();
        assert_eq!(
            (r.cwd.as_str(), r.user.as_deref()),
            ("/work", Some("agent"))
        );
    }

    #[test]
    fn home_is_the_users_unless_the_caller_set_it() {
        let base = vec![("HOME".to_string(), "/root".to_string())];
        let r = ExecRequest::command(["true"])
            .base_env(base.clone())
            .build();
        assert!(r.default_home);
        let r = ExecRequest::command(["true"])
            .base_env(base)
            .env("HOME", "/home/x")
            .env("A", "1")
            .build();
        assert!(!r.default_home);
        assert!(r.env.contains(&("HOME".into(), "/home/x".into())));
        assert!(r.env.contains(&("A".into(), "1".into())));
    }

    #[test]
    fn env_scripts_wrap_the_command_and_timeouts_round_up() {
        let d = ExecDefaults {
            source_env_scripts: true,
            ..ExecDefaults::default()
        };
        let r = ExecRequest::command(["echo", "hi"]).defaults(&d).build();
        assert_ne!(r.argv, ["echo", "hi"]);
        assert!(
            r.argv.ends_with(&["echo".to_string(), "hi".to_string()]),
            "{:?}",
            r.argv
        );
        let r = ExecRequest::command(["true"])
            .timeout(Some(Duration::from_micros(10)))
            .stop_after(true)
            .build();
        assert_eq!(r.timeout_ms, Some(1));
        assert!(r.stop_after);
    }
}
