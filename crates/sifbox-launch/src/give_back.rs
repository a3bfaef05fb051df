//! Files that sandboxes wrote as other ids of the caller's subordinate
//! range (a `--logs` dir, an eval job's dir, a build step's layer) are
//! unreadable and unremovable for an unprivileged caller on the host. A
//! helper sandbox with the same id mapping, which runs nothing but
//! sifbox's own requests, gives them back or removes them.

use std::os::unix::fs::DirBuilderExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use sifbox_engine::idmap;
use sifbox_engine::spec::IdMapping;
use sifbox_engine::spec::{Bind, Confinement, NetMode, UsernsMode, Writable};
use sifbox_engine::{Error, Sandbox, SandboxSpec, StartOptions};
use sifbox_image::store::Store;

/// An empty root file system in `store` (`layers/empty`; `layers/` is
/// 0700 in every store): a build's `FROM scratch`, and the helper's root.
pub fn empty_base(store: &Store) -> std::io::Result<PathBuf> {
    let layers = store.root().join("layers");
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&layers)?;
    let p = layers.join("empty");
    std::fs::create_dir_all(&p)?;
    Ok(p)
}

/// Sandboxes of sifbox's own, with a given id mapping: what the caller
/// cannot do on the host to files of its subordinate ids.
#[derive(Debug)]
pub struct Helper<'s> {
    store: &'s Store,
    exe: PathBuf,
    ids: IdMapping,
    confinement: Confinement,
}

impl<'s> Helper<'s> {
    /// Helpers with mapping `ids`, served by the sifbox binary `exe`.
    pub fn new(store: &'s Store, exe: PathBuf, ids: IdMapping, confinement: Confinement) -> Self {
        Helper {
            store,
            exe,
            ids,
            confinement,
        }
    }

    /// Runs `f` in a helper sandbox (the empty base, no network, `binds`
    /// of host dirs), then stops it.
    pub fn run(
        &self,
        binds: Vec<Bind>,
        f: impl FnOnce(&Sandbox) -> sifbox_engine::Result<()>,
    ) -> sifbox_engine::Result<()> {
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let base = empty_base(self.store).map_err(|e| {
            Error::io(
                format!("{}", self.store.root().join("layers/empty").display()),
                e,
            )
        })?;
        let name = format!("helper-{}-{n}", std::process::id());
        let mut spec = SandboxSpec::new(name, base, self.ids.clone());
        spec.hostname = "buildkitsandbox".into();
        spec.net = NetMode::None;
        spec.writable = Writable::Tmpfs { size_mib: 1 };
        spec.binds = binds;
        spec.confinement = self.confinement;
        let mut so = StartOptions::new(self.exe.clone());
        // Dies with the caller, and is not one of the user's in `sifbox ps`.
        so.oneshot = true;
        so.hidden = true;
        let sb = Sandbox::start(spec, &so)?;
        let done = f(&sb);
        sb.stop(std::time::Duration::ZERO)?;
        done
    }

    /// Gives the trees `paths` (dirs on the host) to the caller. Nothing
    /// is followed (`Request::GiveBack`).
    pub fn give_back_trees(&self, paths: &[PathBuf]) -> sifbox_engine::Result<()> {
        if paths.is_empty() {
            return Ok(());
        }
        let binds: Vec<Bind> = paths
            .iter()
            .enumerate()
            .map(|(i, p)| Bind {
                src: p.clone(),
                dst: PathBuf::from(format!("/.sifbox-own/{i}")),
                readonly: false,
            })
            .collect();
        let targets: Vec<String> = binds.iter().map(|b| b.dst.display().to_string()).collect();
        self.run(binds, |sb| targets.iter().try_for_each(|t| sb.give_back(t)))
    }
}

/// Whether `dir` holds files that sandboxes wrote as other ids of the
/// caller's mapping, which the caller can neither read nor remove (a walk
/// by fds, nothing followed, that stops at the first). Never for host
/// root, who reads and removes anything; a file of one of the caller's
/// groups (a setgid project dir's) is the caller's.
pub fn has_foreign_files(dir: &Path) -> bool {
    let uid = rustix::process::geteuid();
    if uid.is_root() {
        return false;
    }
    let mut gids: Vec<u32> = rustix::process::getgroups()
        .unwrap_or_default()
        .into_iter()
        .map(rustix::process::Gid::as_raw)
        .collect();
    gids.push(rustix::process::getegid().as_raw());
    sifbox_engine::transfer::anything_not_owned_by(dir, uid.as_raw(), &gids)
}

/// Gives such files under `dir` ([`has_foreign_files`]) back to the
/// caller: one helper sandbox with the mapping of `userns`, only when
/// there are any.
pub fn give_back_outputs(
    store: &Store,
    exe: PathBuf,
    userns: UsernsMode,
    dir: &Path,
) -> sifbox_engine::Result<()> {
    if !has_foreign_files(dir) {
        return Ok(());
    }
    let ids = idmap::resolve(userns, &idmap::Caller::current())?;
    Helper::new(store, exe, ids, Confinement::default()).give_back_trees(&[dir.to_path_buf()])
}
