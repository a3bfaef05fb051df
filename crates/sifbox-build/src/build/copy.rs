//! COPY and ADD: sources from the context, heredocs, URLs or another
//! stage/image (`--from`), archives unpacked by ADD, `--chown` resolved
//! against the image's /etc/passwd and /etc/group.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use sifbox_engine::transfer::SetId;

use super::{Builder, StageResult};
use crate::context::{clean_abs, Context, CopyPlan, Entry, Kind};
use crate::dockerfile::{Copy, Instruction, Source};
use crate::error::{BuildError, Result};
use crate::layers::{chain_key, FsState};

impl Builder<'_> {
    pub(super) fn copy(
        &mut self,
        inst: &Instruction,
        c: &Copy,
        is_add: bool,
        cur: &mut StageResult,
        results: &HashMap<usize, StageResult>,
    ) -> Result<bool> {
        if c.parents {
            return Err(self.err(inst, "--parents is not supported by sifbox yet"));
        }
        let dest = if c.dest.starts_with('/') {
            c.dest.clone()
        } else {
            format!("{}/{}", Self::workdir(cur), c.dest)
        };
        let dest = if c.dest.ends_with('/') && !dest.ends_with('/') {
            format!("{dest}/")
        } else {
            dest
        };
        let dest_is_dir = cur
            .state
            .lookup(&clean_abs(&dest))
            .and_then(|p| std::fs::symlink_metadata(p).ok())
            .is_some_and(|m| m.is_dir());
        let chmod = match &c.chmod {
            None => None,
            Some(m) => Some(
                u32::from_str_radix(m, 8)
                    .ok()
                    .filter(|m| *m <= 0o7777)
                    .ok_or_else(|| {
                        self.err(
                            inst,
                            format!("--chmod={m}: give an octal mode such as 0755"),
                        )
                    })?,
            ),
        };
        let owner = match &c.chown {
            None => None,
            Some(spec) => Some(self.resolve_owner(inst, &cur.state, spec)?),
        };
        let mut scratch: Vec<tempfile::TempDir> = Vec::new();
        let mut paths: Vec<String> = Vec::new();
        let mut heredocs = Vec::new();
        for s in &c.sources {
            match s {
                Source::Path(p) => paths.push(p.clone()),
                Source::Heredoc(h) => heredocs.push(h.clone()),
            }
        }
        let urls: Vec<String> = paths.iter().filter(|p| is_url(p)).cloned().collect();
        if !urls.is_empty() && !is_add {
            return Err(self.err(inst, "COPY takes no URLs; use ADD"));
        }
        if !urls.is_empty() && c.from.is_some() {
            return Err(self.err(inst, "ADD --from takes no URLs"));
        }
        paths.retain(|p| !is_url(p));
        let mut fetched = Vec::new();
        if !urls.is_empty() {
            let t = self.scratch_dir("sifbox-add.")?;
            for (i, u) in urls.iter().enumerate() {
                let slot = t.path().join(i.to_string());
                std::fs::create_dir(&slot).map_err(|e| BuildError::io(&slot, e))?;
                self.progress.output(&format!("downloading {u}"));
                fetched.push(crate::remote::fetch(u, &slot, c.checksum.as_deref())?);
            }
            scratch.push(t);
        }
        if paths.is_empty() && heredocs.is_empty() && !fetched.is_empty() {
            // Only URLs: where they go follows the rules for local files.
            if fetched.len() > 1 && !dest.ends_with('/') && !dest_is_dir {
                return Err(self.err(
                    inst,
                    format!("destination {dest:?}: several sources are copied, so it must end with a slash"),
                ));
            }
        }
        let (plan, from_key) = match &c.from {
            None if heredocs.is_empty() && paths.is_empty() => (
                Self::plan_urls(&dest, dest_is_dir, &fetched, chmod)?,
                String::new(),
            ),
            None if heredocs.is_empty() => {
                let ctx = self.ctx.with_excludes(&c.exclude)?;
                (
                    ctx.plan_copy(&paths, &dest, dest_is_dir, chmod)?,
                    String::new(),
                )
            }
            None => {
                let (plan, t) =
                    self.plan_heredocs(inst, c, &heredocs, &paths, &dest, dest_is_dir, chmod)?;
                scratch.push(t);
                (plan, String::new())
            }
            Some(from) => {
                let (plan, key, t) =
                    self.plan_from(inst, c, from, &paths, &dest, dest_is_dir, chmod, results)?;
                scratch.push(t);
                (plan, key)
            }
        };
        let mut plan = plan;
        if is_add && c.from.is_none() {
            Self::expand_archives(&mut plan)?;
        }
        if !paths.is_empty() || !heredocs.is_empty() {
            // URLs beside local sources: into the destination directory.
            for f in &fetched {
                plan.entries.push(Entry::own_file(
                    &f.path,
                    PathBuf::from(&f.name),
                    chmod.unwrap_or(0o600),
                    f.mtime,
                )?);
            }
        }
        let key = chain_key(
            &cur.state.key,
            &format!(
                "{}\n{}\n{}\n{:?}\n{from_key}",
                if is_add { "ADD" } else { "COPY" },
                plan.content_hash()?,
                plan.dest_dir,
                owner,
            ),
        );
        let dest_dir = plan.dest_dir.clone();
        let (state, cached) = self.plain_step(&cur.state, &key, |sb| {
            let archives: Vec<Entry> = plan
                .entries
                .iter()
                .filter(|e| matches!(e.kind, Kind::File { .. }) && e.name.as_os_str().is_empty())
                .cloned()
                .collect();
            let files = CopyPlan {
                dest_dir: plan.dest_dir.clone(),
                entries: plan
                    .entries
                    .iter()
                    .filter(|e| !e.name.as_os_str().is_empty())
                    .cloned()
                    .collect(),
            };
            if !files.entries.is_empty() || archives.is_empty() {
                sb.extract(&dest_dir, owner, move |w| files.write_tar(w))?;
            }
            for a in archives {
                sb.extract(&dest_dir, owner, move |w| {
                    let f = a.src.open()?;
                    let mut d = crate::archive::open(f.try_clone()?)?;
                    let mut w = w;
                    std::io::copy(&mut d, &mut w)?;
                    a.src.check(&f)
                })?;
            }
            Ok(())
        })?;
        drop(scratch);
        cur.state = state;
        Ok(cached)
    }

    /// ADD of URLs only: where they go follows the rules for local files.
    fn plan_urls(
        dest: &str,
        dest_is_dir: bool,
        fetched: &[crate::remote::Fetched],
        chmod: Option<u32>,
    ) -> Result<CopyPlan> {
        let clean = clean_abs(dest);
        let into_dir = dest.ends_with('/') || dest_is_dir || fetched.len() > 1;
        let dest_dir = if into_dir {
            clean.clone()
        } else {
            Path::new(&clean)
                .parent()
                .map_or("/".into(), |p| p.display().to_string())
        };
        let entries = fetched
            .iter()
            .map(|f| {
                let name = if into_dir {
                    PathBuf::from(&f.name)
                } else {
                    PathBuf::from(Path::new(&clean).file_name().unwrap_or_default())
                };
                Entry::own_file(&f.path, name, chmod.unwrap_or(0o600), f.mtime)
            })
            .collect::<Result<_>>()?;
        Ok(CopyPlan { dest_dir, entries })
    }

    /// Heredoc sources (written into a scratch dir, returned to be kept
    /// until the copy is done), with the context's paths beside them.
    #[allow(clippy::too_many_arguments, reason = "the parts of one COPY")]
    fn plan_heredocs(
        &self,
        inst: &Instruction,
        c: &Copy,
        heredocs: &[crate::dockerfile::Heredoc],
        paths: &[String],
        dest: &str,
        dest_is_dir: bool,
        chmod: Option<u32>,
    ) -> Result<(CopyPlan, tempfile::TempDir)> {
        let t = self.scratch_dir("sifbox-heredoc.")?;
        let mut names = Vec::new();
        for h in heredocs {
            // The name becomes a file name here and in the image:
            // one plain component, never a path.
            if h.name.is_empty() || h.name == "." || h.name == ".." || h.name.contains(['/', '\0'])
            {
                return Err(self.err(
                    inst,
                    format!("heredoc <<{}: the name must be a file name", h.name),
                ));
            }
            let p = t.path().join(&h.name);
            std::fs::write(&p, &h.content).map_err(|e| BuildError::io(&p, e))?;
            names.push(h.name.clone());
        }
        let hctx = Context::open_plain(t.path())?;
        let mut plan = hctx.plan_copy(&names, dest, dest_is_dir, chmod.or(Some(0o644)))?;
        if !paths.is_empty() {
            let ctx = self.ctx.with_excludes(&c.exclude)?;
            let more = ctx.plan_copy(paths, dest, true, chmod)?;
            plan.entries.extend(more.entries);
        }
        Ok((plan, t))
    }

    /// `--from` a stage or image: the sources are downloaded from a
    /// sandbox of it into a scratch dir (returned to be kept until the
    /// copy is done), with the state's key for the step's.
    #[allow(clippy::too_many_arguments, reason = "the parts of one COPY")]
    fn plan_from(
        &mut self,
        inst: &Instruction,
        c: &Copy,
        from: &str,
        paths: &[String],
        dest: &str,
        dest_is_dir: bool,
        chmod: Option<u32>,
        results: &HashMap<usize, StageResult>,
    ) -> Result<(CopyPlan, String, tempfile::TempDir)> {
        let st = self.state_of(inst, from, results)?;
        let t = self.scratch_dir("sifbox-from.")?;
        let sb = self.layers.reader(&st.state)?;
        let mut names = Vec::new();
        for (i, p) in paths.iter().enumerate() {
            let abs = clean_abs(p);
            let slot = t.path().join(i.to_string());
            std::fs::create_dir(&slot).map_err(|e| BuildError::io(&slot, e))?;
            // A private temp dir, copied on into the image: setuid
            // bits stay, as `COPY --from` keeps them.
            let name = Self::download_followed(&sb, &abs, &slot)
                .map_err(|e| self.err(inst, format!("{abs} in {from}: {e}")))?;
            names.push(format!("{i}/{name}"));
        }
        sb.stop(std::time::Duration::ZERO)?;
        let fctx = Context::open_plain(t.path())?.with_excludes(&c.exclude)?;
        let plan = fctx.plan_copy(&names, dest, dest_is_dir, chmod)?;
        Ok((plan, st.state.key.clone(), t))
    }

    /// ADD: local tar archives (plain, gzip, zstd, bzip2, xz) named as
    /// sources are unpacked into the destination instead of copied (not
    /// those inside a copied directory, as Docker); they are marked by an
    /// empty name.
    fn expand_archives(plan: &mut CopyPlan) -> Result<()> {
        for e in &mut plan.entries {
            if e.top && matches!(e.kind, Kind::File { .. }) {
                let f = e
                    .src
                    .open()
                    .map_err(|err| BuildError::io(&e.src.shown(), err))?;
                if crate::archive::is_tar(f) {
                    e.name = PathBuf::new();
                }
            }
        }
        Ok(())
    }

    /// Downloads `abs` from the stage `sb` into `slot` as `COPY --from`
    /// reads it: the path is resolved inside the stage (by its own kernel
    /// walk, the stage's root as `/`), and when it is itself a symlink its
    /// target is copied, as Docker does. Returns the name it has in `slot`
    /// (the source's own name).
    fn download_followed(
        sb: &sifbox_engine::Sandbox,
        abs: &str,
        slot: &Path,
    ) -> std::result::Result<String, String> {
        let name = Path::new(abs)
            .file_name()
            .map_or_else(|| "root".to_string(), |n| n.to_string_lossy().into_owned());
        let mut path = abs.to_string();
        for _ in 0..=crate::tree::MAX_LINKS {
            sb.download_with(&path, slot, SetId::Keep)
                .map_err(|e| e.to_string())?;
            // The slot is the build's own private dir: one entry in it.
            let got = std::fs::read_dir(slot)
                .map_err(|e| e.to_string())?
                .next()
                .ok_or("nothing was downloaded")?
                .map_err(|e| e.to_string())?;
            let at = got.path();
            let meta = std::fs::symlink_metadata(&at).map_err(|e| e.to_string())?;
            if !meta.file_type().is_symlink() {
                if got.file_name().to_string_lossy() != name {
                    std::fs::rename(&at, slot.join(&name)).map_err(|e| e.to_string())?;
                }
                return Ok(name);
            }
            let target = std::fs::read_link(&at).map_err(|e| e.to_string())?;
            std::fs::remove_file(&at).map_err(|e| e.to_string())?;
            let target = target.to_string_lossy();
            // Relative to the link's directory, as the stage's kernel walks
            // it (not cleaned here: `..` after a symlinked dir is physical).
            path = if target.starts_with('/') {
                target.into_owned()
            } else {
                let dir = path.rsplit_once('/').map_or("", |(d, _)| d);
                format!("{dir}/{target}")
            };
        }
        Err(format!(
            "more than {} symlinks (a loop?)",
            crate::tree::MAX_LINKS
        ))
    }

    /// `--chown=USER[:GROUP]` as numeric ids, from the image's
    /// /etc/passwd and /etc/group (Docker: a user alone gives its uid as
    /// the gid too).
    fn resolve_owner(&self, inst: &Instruction, state: &FsState, spec: &str) -> Result<(u32, u32)> {
        let (user, group) = match spec.split_once(':') {
            Some((u, g)) => (u, Some(g)),
            None => (spec, None),
        };
        let read = |p: &str| self.read_image_file(state, p);
        let field = |text: &str, name: &str| -> Option<u32> {
            text.lines()
                .map(|l| l.split(':').collect::<Vec<_>>())
                .find(|f| f.len() >= 3 && f[0] == name)
                .and_then(|f| f[2].parse().ok())
        };
        let uid = match user.parse::<u32>() {
            Ok(n) => n,
            Err(_) => field(&read("/etc/passwd")?, user).ok_or_else(|| {
                self.err(
                    inst,
                    format!("--chown: user {user:?} is not in the image's /etc/passwd"),
                )
            })?,
        };
        let gid = match group {
            None => uid,
            Some(g) => match g.parse::<u32>() {
                Ok(n) => n,
                Err(_) => field(&read("/etc/group")?, g).ok_or_else(|| {
                    self.err(
                        inst,
                        format!("--chown: group {g:?} is not in the image's /etc/group"),
                    )
                })?,
            },
        };
        Ok((uid, gid))
    }

    /// The text of the image file `path` in `state` (empty when there is
    /// none), at most 16 MiB. Read on the host without following symlinks;
    /// when a step made one on the way (`/etc/passwd -> ...`), a sandbox of
    /// the state resolves it inside the image, so that no host file is
    /// ever read in its place.
    fn read_image_file(&self, state: &FsState, path: &str) -> Result<String> {
        const LIMIT: u64 = 16 << 20;
        let bytes = match state.read_file(path, LIMIT) {
            Ok(b) => b,
            Err(_) => {
                let t = self.scratch_dir("sifbox-read.")?;
                let sb = self.layers.reader(state)?;
                let got = Self::download_followed(&sb, path, t.path());
                sb.stop(std::time::Duration::ZERO)?;
                // The download is in the build's own private dir.
                got.ok()
                    .map(|name| t.path().join(name))
                    .filter(|p| std::fs::symlink_metadata(p).is_ok_and(|m| m.is_file()))
                    .and_then(|p| {
                        let mut b = Vec::new();
                        std::fs::File::open(p)
                            .and_then(|f| {
                                std::io::Read::read_to_end(
                                    &mut std::io::Read::take(f, LIMIT),
                                    &mut b,
                                )
                            })
                            .ok()
                            .map(|_| b)
                    })
            }
        };
        Ok(bytes
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default())
    }
}

fn is_url(s: &str) -> bool {
    s.starts_with("http://") || s.starts_with("https://") || s.starts_with("git@")
}
