//! Running a RUN step: its command, environment and `--mount`s (cache,
//! tmpfs, secret, bind), the host CA and apt setup, in a sandbox layer.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;

use sifbox_engine::protocol::ExecRequest;
use sifbox_engine::spec::{Bind, NetMode, TmpfsMount, DEFAULT_TMPFS_MOUNT_BYTES};
use sifbox_engine::transfer::SetId;
use sifbox_engine::ExecStatus;

use super::{hash_json, Builder, StageResult};
use crate::context::clean_abs;
use crate::dockerfile::{self, Command, Instruction, MountType, Network};
use crate::error::{BuildError, Result};
use crate::layers::{chain_key, FsState, StepOptions};
use crate::plan::StageEnv;
use crate::progress::Progress;
use crate::steps::{self, OutputSink};

/// Where build steps with faked ids find apt's configuration.
const APT_CONF_PATH: &str = "/run/sifbox/apt.conf";

impl Builder<'_> {
    pub(super) fn run(
        &mut self,
        inst: &Instruction,
        r: &dockerfile::Run,
        env: &StageEnv,
        cur: &mut StageResult,
        results: &HashMap<usize, StageResult>,
    ) -> Result<bool> {
        let argv = Self::run_argv(r, cur);
        let mut run_env = env.run_env();
        if !run_env.iter().any(|(k, _)| k == "PATH") {
            run_env.push(("PATH".into(), sifbox_engine::spec::DEFAULT_PATH.into()));
        }
        if cur.meta.user.is_none() && !run_env.iter().any(|(k, _)| k == "HOME") {
            run_env.push(("HOME".into(), "/root".into()));
        }
        let workdir = Self::workdir(cur);
        let net = match r.network {
            Some(Network::None) => NetMode::None,
            _ => NetMode::Host,
        };
        let mut binds = Vec::new();
        let mut tmpfs = Vec::new();
        let mut mount_keys = Vec::new();
        let mut scratch: Vec<tempfile::TempDir> = Vec::new();
        for m in &r.mounts {
            if m.kind == MountType::Tmpfs {
                let t = self.tmpfs_mount(inst, m, cur)?;
                mount_keys.push(format!("tmpfs:{}:{}", t.dst.display(), t.size));
                tmpfs.push(t);
                continue;
            }
            if let Some((bind, key)) = self.mount(inst, m, cur, results, &mut scratch)? {
                binds.push(bind);
                mount_keys.push(key);
            }
        }
        if self.fake_ids {
            // apt drops privileges to _apt and checks that it did, which
            // faked set*id calls cannot pass: tell it to stay root (as
            // Charliecloud's builder does), without touching the image.
            let t = self.scratch_dir("sifbox-apt.")?;
            let conf = t.path().join("apt.conf");
            std::fs::write(&conf, "APT::Sandbox::User \"root\";\n")
                .map_err(|e| BuildError::io(&conf, e))?;
            binds.push(Bind {
                src: conf,
                dst: PathBuf::from(APT_CONF_PATH),
                readonly: true,
            });
            scratch.push(t);
            if !run_env.iter().any(|(e, _)| e == "APT_CONFIG") {
                run_env.push(("APT_CONFIG".into(), APT_CONF_PATH.into()));
            }
        }
        if let Some(ca) = &self.opts.host_ca {
            sifbox_launch::host_ca::show(ca, &mut binds, &mut run_env);
        }
        let key = chain_key(
            &cur.state.key,
            &format!(
                "RUN\n{}\n{}\n{}\n{}\n{:?}\n{}\n{}",
                hash_json(&argv),
                hash_json(&env.env()),
                hash_json(&env.cache_args()),
                hash_json(&mount_keys),
                net,
                cur.meta.user.clone().unwrap_or_default(),
                workdir,
            ),
        );
        let req = ExecRequest::command(argv)
            .base_env(run_env)
            .cwd(Some(workdir))
            .user(cur.meta.user.clone())
            .fake_ids(self.fake_ids)
            .build();
        let mut stubs = mount_stubs(&cur.state, &binds);
        let places: Vec<Bind> = tmpfs
            .iter()
            .map(|t: &TmpfsMount| Bind {
                src: PathBuf::new(),
                dst: t.dst.clone(),
                readonly: false,
            })
            .collect();
        stubs.extend(mount_stubs(&cur.state, &places));
        let progress = Arc::clone(&self.progress);
        let mut outcome: Option<(ExecStatus, steps::Output)> = None;
        let result = self.layers.step(
            &cur.state,
            &key,
            self.opts.no_cache,
            &StepOptions { net, binds, tmpfs },
            |sb| {
                let sink = Sink(progress);
                let (status, out) = steps::run_command(sb, req, sink)?;
                let failed = status.code() != 0;
                outcome = Some((status, out));
                if failed {
                    // Filled in below, once the sandbox is gone.
                    return Err(BuildError::RunFailed {
                        file: String::new(),
                        line: 0,
                        instruction: String::new(),
                        code: 0,
                        tail: String::new(),
                    });
                }
                Ok(())
            },
            &stubs,
        );
        drop(scratch);
        let tail = outcome.map(|(st, out)| (st, out.finish()));
        match result {
            Ok((state, cached)) => {
                cur.state = state;
                Ok(cached)
            }
            Err(BuildError::RunFailed { .. }) => Err(self.run_failed(inst, tail)),
            Err(e) => Err(e),
        }
    }

    /// The step's argv: an exec form as written; a shell form (or a
    /// heredoc script) run by the stage's shell.
    fn run_argv(r: &dockerfile::Run, cur: &StageResult) -> Vec<String> {
        match (
            &r.command,
            r.script_heredoc(),
            r.shell_script_with_heredocs(),
        ) {
            (Command::Exec(v), _, _) => v.clone(),
            // `RUN <<EOF` alone: the body is the script.
            (_, Some(h), _) => {
                let mut v = Self::shell(cur);
                v.push(h.content.clone());
                v
            }
            (Command::Shell(s), None, script) => {
                let mut v = Self::shell(cur);
                v.push(script.unwrap_or_else(|| s.clone()));
                v
            }
        }
    }

    /// A `RUN --mount=type=tmpfs` as the step's tmpfs mount.
    fn tmpfs_mount(
        &self,
        inst: &Instruction,
        m: &dockerfile::Mount,
        cur: &StageResult,
    ) -> Result<TmpfsMount> {
        // A real tmpfs of `size=` (the audit: a host dir took 300
        // MiB past `size=1m`).
        let t = m
            .effective_target()
            .ok_or_else(|| self.err(inst, format!("--mount={}: no target", m.spec)))?;
        let dst = if t.starts_with('/') {
            clean_abs(&t)
        } else {
            clean_abs(&format!("{}/{t}", Self::workdir(cur)))
        };
        Ok(TmpfsMount {
            dst: dst.into(),
            size: m.size.unwrap_or(DEFAULT_TMPFS_MOUNT_BYTES),
            mode: m.mode.unwrap_or(0o1777),
        })
    }

    /// The error of a step whose command failed (`tail`: its status and
    /// last lines of output): sifbox's own when it could not start the
    /// command, else the step's exit code with its output and hints.
    fn run_failed(
        &self,
        inst: &Instruction,
        tail: Option<(ExecStatus, Vec<String>)>,
    ) -> BuildError {
        let (status, lines) = tail.unwrap_or((
            ExecStatus::Failed {
                code: 125,
                message: "no status".into(),
            },
            Vec::new(),
        ));
        // sifbox could not start the command (an unknown USER, the
        // host): an error of sifbox, not a failed step.
        if let ExecStatus::Failed { code: 125, message } = &status {
            return BuildError::StepFailed(Box::new(self.err_at(
                inst.line,
                &inst.original,
                message.clone(),
            )));
        }
        let mut t = String::new();
        if let ExecStatus::Failed { message, .. } = &status {
            let _ = write!(t, ": {message}");
        }
        if !lines.is_empty() {
            t.push_str("; its last lines of output:");
            for l in &lines {
                let _ = write!(t, "\n  | {l}");
            }
        }
        if self.opts.host_ca.is_none() && lines.iter().any(|l| tls_refused(l)) {
            t.push_str(
                "\n(the step could not verify a TLS certificate: where HTTPS goes through an \
                 intercepting proxy, build with --host-ca to show the host's CA bundle to RUN steps)",
            );
        }
        if lines.iter().any(|l| l.contains("No space left on device")) {
            let _ = write!(
                t,
                "\n(a step's layer holds at most {} MiB: raise the bound with --layer-size, or write less in one step)",
                self.layers.layer_size() >> 20
            );
        }
        BuildError::RunFailed {
            file: self.file.clone(),
            line: inst.line,
            instruction: inst.original.clone(),
            code: status.code(),
            tail: t,
        }
    }

    /// A `RUN --mount`: the bind it makes and what of it goes in the cache
    /// key.
    fn mount(
        &mut self,
        inst: &Instruction,
        m: &dockerfile::Mount,
        cur: &StageResult,
        results: &HashMap<usize, StageResult>,
        scratch: &mut Vec<tempfile::TempDir>,
    ) -> Result<Option<(Bind, String)>> {
        let target = || -> Result<String> {
            let t = m
                .effective_target()
                .ok_or_else(|| self.err(inst, format!("--mount={}: no target", m.spec)))?;
            Ok(if t.starts_with('/') {
                clean_abs(&t)
            } else {
                clean_abs(&format!("{}/{t}", Self::workdir(cur)))
            })
        };
        match m.kind {
            MountType::Cache => {
                let dst = target()?;
                let id = m.effective_id().unwrap_or_else(|| dst.clone());
                let dir = self
                    .store
                    .root()
                    .join("build-cache")
                    .join(&chain_key("cache", &self.cache_scope(m, &id))[..24]);
                std::fs::create_dir_all(&dir).map_err(|e| BuildError::io(&dir, e))?;
                Ok(Some((
                    Bind {
                        src: dir,
                        dst: dst.into(),
                        readonly: m.readonly,
                    },
                    format!("cache:{id}:{}", m.readonly),
                )))
            }
            MountType::Secret => {
                let id = m
                    .effective_id()
                    .ok_or_else(|| self.err(inst, "a secret mount needs id= or target="))?;
                let dst = target()?;
                let Some(src) = self.opts.secrets.get(&id) else {
                    if !m.required {
                        // As Docker: a secret that was not given is left out.
                        return Ok(None);
                    }
                    return Err(self.err(
                        inst,
                        format!("secret {id:?} was not given; pass --secret id={id},src=FILE"),
                    ));
                };
                Ok(Some((
                    Bind {
                        src: src.clone(),
                        dst: dst.into(),
                        readonly: true,
                    },
                    format!("secret:{id}"),
                )))
            }
            MountType::Bind => {
                let dst = target()?;
                let source = m.source.clone().unwrap_or_default();
                let (src, key) = match &m.from {
                    None => {
                        // A private copy, made as BuildKit shows the context:
                        // the source looked up inside it, .dockerignore
                        // applied. Writes to it (rw) are thrown away with it.
                        let rel = crate::context::clean_rel(&source);
                        let t = self.scratch_dir("sifbox-bind.")?;
                        let copy = t.path().join("src");
                        let hash = self
                            .ctx
                            .copy_out(&rel, &copy)
                            .map_err(|e| self.err(inst, e.to_string()))?;
                        scratch.push(t);
                        (copy, format!("bind:ctx:{rel}:{hash}"))
                    }
                    Some(from) => {
                        let st = self.state_of(inst, from, results)?;
                        let t = self.scratch_dir("sifbox-bind.")?;
                        let dest = t.path().join("src");
                        let path = clean_abs(&source);
                        let sb = self.layers.reader(&st.state)?;
                        // As BuildKit, a symlink at the source is followed
                        // inside the stage's tree: left as a link, the bind
                        // would follow it on the host (the audit's escape).
                        // A private temp dir: the stage's setuid bits stay.
                        sb.download_following(&path, &dest, SetId::Keep, true)?;
                        sb.stop(std::time::Duration::ZERO)?;
                        scratch.push(t);
                        if dest
                            .symlink_metadata()
                            .map_err(|e| BuildError::io(&dest, e))?
                            .file_type()
                            .is_symlink()
                        {
                            return Err(self.err(
                                inst,
                                format!("--mount source {source:?} in {from:?} is a symlink that was not resolved; point the mount at what it links to"),
                            ));
                        }
                        (dest, format!("bind:{}:{path}", st.state.key))
                    }
                };
                // Either source is a private copy, removed after the step:
                // writes to a rw bind are thrown away with it.
                let readonly = m.readonly;
                Ok(Some((
                    Bind {
                        src,
                        dst: dst.into(),
                        readonly,
                    },
                    key,
                )))
            }
            other => Err(self.err(
                inst,
                format!("--mount type {other:?} is not supported by sifbox"),
            )),
        }
    }
}

impl Builder<'_> {
    /// What names a cache mount's dir (see `BuildOptions::cache_scope`):
    /// the id alone when the Dockerfile gave one to `sifbox build` (the
    /// store-wide dir of that id), else the id within the build's context,
    /// or within the caller's scope (eval's task).
    fn cache_scope(&self, m: &dockerfile::Mount, id: &str) -> String {
        match (&self.opts.cache_scope, &m.id) {
            (Some(scope), _) => format!("scope\n{scope}\n{id}"),
            (None, Some(_)) => id.to_string(),
            (None, None) => {
                let ctx = std::fs::canonicalize(&self.opts.context)
                    .unwrap_or_else(|_| self.opts.context.clone());
                format!("context\n{}\n{id}", ctx.display())
            }
        }
    }
}

struct Sink(Arc<Progress>);

impl OutputSink for Sink {
    fn line(&mut self, line: &str) {
        self.0.output(line);
    }
}

/// The mount points a step's sandbox will create that the state does not
/// have: removed from its layer afterwards, so that they do not end up in
/// the image.
fn mount_stubs(state: &FsState, binds: &[Bind]) -> Vec<String> {
    let mut out = Vec::new();
    let fixed = ["/proc", "/dev", "/sys", "/etc/resolv.conf", "/etc/hosts"];
    let all = fixed
        .iter()
        .map(|s| (*s).to_string())
        .chain(binds.iter().map(|b| b.dst.display().to_string()));
    for p in all {
        // The path and every missing parent.
        let mut cur = PathBuf::from(&p);
        loop {
            let s = cur.display().to_string();
            if s == "/" || state.lookup(&s).is_some() {
                break;
            }
            out.push(s);
            if !cur.pop() {
                break;
            }
        }
    }
    out
}

/// Whether a line of a step's output says that TLS verification failed, as
/// Python (pip, requests), OpenSSL, curl, git, Node and Go say it.
fn tls_refused(line: &str) -> bool {
    const SIGNS: &[&str] = &[
        "CERTIFICATE_VERIFY_FAILED",
        "certificate verify failed",
        "SSL certificate problem",
        "self-signed certificate in certificate chain",
        "SELF_SIGNED_CERT_IN_CHAIN",
        "UNABLE_TO_GET_ISSUER_CERT_LOCALLY",
        "x509: certificate signed by unknown authority",
    ];
    SIGNS.iter().any(|s| line.contains(s))
}
