//! What a build step does inside its sandbox: run a command with its output
//! streamed, unpack files, and turn a final state into a store image.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::os::fd::AsFd;
use std::path::Path;
use std::thread::JoinHandle;

use cap_std::fs::Dir;
use rustix::pipe::{pipe_with, PipeFlags};
use sifbox_engine::protocol::ExecRequest;
use sifbox_engine::{ExecStatus, Sandbox};
use sifbox_image::layer::{self, ApplyOptions, Devices, Owners};
use sifbox_image::meta::{self, ImageMeta};
use sifbox_image::store::Digest;

use crate::error::{BuildError, Result};
use crate::layers::{FsState, Layers};

/// Lines of output kept to explain a failed step.
pub const TAIL_LINES: usize = 12;

/// Where a step's output goes.
pub trait OutputSink: Send + 'static {
    /// One line of a command's output (without its newline).
    fn line(&mut self, line: &str);
}

/// The output of a running command: read by a thread until every writer
/// is gone (the sandbox stopped), keeping the last lines.
#[derive(Debug)]
pub struct Output {
    reader: JoinHandle<Vec<String>>,
}

impl Output {
    /// The last lines, once the sandbox that wrote them is gone.
    pub fn finish(self) -> Vec<String> {
        self.reader.join().unwrap_or_default()
    }
}

/// Runs `argv` in `sb` with stdout and stderr going to `sink`; returns the
/// exit status and the output reader (finish it after the sandbox stopped,
/// so that processes left in the background cannot hold it open).
pub fn run_command(
    sb: &Sandbox,
    req: ExecRequest,
    mut sink: impl OutputSink,
) -> Result<(ExecStatus, Output)> {
    let (r, w) = pipe_with(PipeFlags::CLOEXEC).map_err(|e| BuildError::io(Path::new("pipe"), e))?;
    let null = File::open("/dev/null").map_err(|e| BuildError::io(Path::new("/dev/null"), e))?;
    let reader = std::thread::spawn(move || {
        let mut tail: std::collections::VecDeque<String> = std::collections::VecDeque::new();
        let mut lines = BufReader::new(File::from(r));
        let mut buf = Vec::new();
        loop {
            buf.clear();
            match lines.read_until(b'\n', &mut buf) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    if buf.last() == Some(&b'\n') {
                        buf.pop();
                    }
                    let line = String::from_utf8_lossy(&buf).into_owned();
                    sink.line(&line);
                    if tail.len() == TAIL_LINES {
                        tail.pop_front();
                    }
                    tail.push_back(line);
                }
            }
        }
        tail.into_iter().collect()
    });
    let status = sb.exec(req, [null.as_fd(), w.as_fd(), w.as_fd()]);
    drop(w);
    Ok((status?, Output { reader }))
}

/// Turns `state` into a store image with `m` as its metadata: the state's
/// root file system as the sandbox sees it, Apptainer's layout added,
/// packed into a SIF. `clamp` bounds mtimes (SOURCE_DATE_EPOCH).
pub fn export(
    layers: &Layers,
    state: &FsState,
    m: &ImageMeta,
    clamp: Option<u32>,
) -> Result<Digest> {
    let store = layers.store();
    let work = store.work_dir("build-image")?;
    let tree = work.path().join("rootfs");
    std::fs::create_dir(&tree).map_err(|e| BuildError::io(&tree, e))?;
    let root = rustix::process::geteuid().is_root();
    let opts = ApplyOptions {
        // Root's build sandboxes map ids one to one: keep them. Others get
        // the tree as theirs, as an import does (the SIF says root).
        owners: if root { Owners::Keep } else { Owners::Caller },
        devices: Devices::Placeholder,
        xattrs: false,
    };
    let t0 = std::time::Instant::now();
    let sb = layers.reader(state)?;
    let dest = tree.clone();
    sb.snapshot(move |r| {
        let dir = Dir::open_ambient_dir(&dest, cap_std::ambient_authority())?;
        layer::apply_layer(r, &dir, &opts).map_err(std::io::Error::other)?;
        Ok(())
    })?;
    sb.stop(std::time::Duration::ZERO)?;
    tracing::debug!("export: snapshot unpacked in {:?}", t0.elapsed());
    meta::write_layout(&tree, m).map_err(|e| BuildError::io(&tree, e))?;
    if let Some(c) = clamp {
        // The tree sandboxes of this store run is the SIF's twin: the same
        // times as anyone who pulls the SIF sees.
        sifbox_image::import::clamp_times(&tree, c).map_err(|e| BuildError::io(&tree, e))?;
    }
    let sif = work.path().join("image.sif");
    // gzip level 6: about three times faster to pack than 9 (mksquashfs's
    // default), for images a few percent larger; builds happen often.
    sifbox_image::import::build_sif_at_level(&tree, m, work.path(), &sif, clamp, Some(6))?;
    tracing::debug!("export: SIF packed at {:?}", t0.elapsed());
    let digest = store.publish_sif(&sif)?;
    let _lock = store.lock(&format!("rootfs-{}", digest.hex()))?;
    publish_mirrored(layers, state, &tree, &digest, true)?;
    Ok(digest)
}

/// Turns `state`, which is the stored image `base` itself or `base` with
/// layers that only add regular files and directories (COPY of context
/// files, WORKDIR: see [`crate::added`]), into a store image with `m` as
/// its metadata, without the snapshot and the pack of [`export`]: the
/// base's SIF remade with what the layers add and Apptainer's layout for
/// `m` written into its squashfs and every byte of the base's file data
/// reused (`sifbox_image::import::remix_sif`), times clamped to `clamp`.
/// `None` when the base or the layers cannot be remade so (then
/// [`export`]).
///
/// The new image's tree is left for the store to unpack on its first run,
/// unless the base's tree or the added entries have owners other than the
/// caller ([`export`] keeps those in the tree it publishes: root's builds
/// keep owners, others' mirror them from the sandbox; an unpack by the
/// store gives everything to the caller) or the store is shared (its
/// members cannot unpack). Then the tree is made here, as [`export`] would
/// have it.
pub fn remix(
    layers: &Layers,
    state: &FsState,
    base: &Digest,
    m: &ImageMeta,
    clamp: u32,
) -> Result<Option<Digest>> {
    let store = layers.store();
    let t0 = std::time::Instant::now();
    let owner = (
        rustix::process::geteuid().as_raw(),
        rustix::process::getegid().as_raw(),
    );
    let mut added_owners = false;
    let added = if state.layers.is_empty() {
        Vec::new()
    } else {
        let Some((edits, what)) = added_edits(state, clamp, owner) else {
            return Ok(None);
        };
        added_owners = edits.iter().any(|e| match e {
            sifbox_image::squash::Edit::DirAs { attrs, .. }
            | sifbox_image::squash::Edit::NewFile { attrs, .. } => (attrs.uid, attrs.gid) != (0, 0),
            _ => false,
        });
        tracing::debug!("export: the layers add {what} (read in {:?})", t0.elapsed());
        edits
    };
    let edits =
        sifbox_image::import::remix_edits(m, added).map_err(|e| BuildError::io(&state.base, e))?;
    let work = store.work_dir("build-image")?;
    let sif = work.path().join("image.sif");
    // gzip level 6, as `export` packs: only the tables and the new files
    // are compressed here.
    let Some(stats) =
        sifbox_image::import::remix_sif(store, base, m, &edits, work.path(), &sif, clamp, Some(6))?
    else {
        return Ok(None);
    };
    let digest = store.publish_sif(&sif)?;
    tracing::debug!(
        "export: {}, remade {base}'s squashfs ({} bytes of file data reused, {} new) in {:?}",
        if state.layers.is_empty() {
            "metadata only"
        } else {
            "files added"
        },
        stats.copied_bytes,
        stats.new_bytes,
        t0.elapsed()
    );
    if relink(store, state, base, &digest, &edits, &stats, clamp, owner) {
        tracing::debug!("export: tree made at {:?}", t0.elapsed());
        return Ok(Some(digest));
    }
    let other_owners = added_owners
        || has_other_owners(&state.base, owner).map_err(|e| BuildError::io(&state.base, e))?;
    // A shared store's members cannot unpack (only read): its owner's
    // builds publish the tree, as the snapshot path does.
    let shared = store.access() == sifbox_image::store::Access::Group;
    if other_owners || shared {
        if owner.0 == 0 && other_owners {
            sifbox_image::import::rootfs_with_owners(store, &digest)?;
        } else if owner.0 == 0 {
            sifbox_image::import::rootfs(store, &digest)?;
        } else {
            let tree = work.path().join("rootfs");
            let _lock = store.lock(&format!("rootfs-{}", digest.hex()))?;
            if !store.rootfs_path(&digest).is_dir() {
                sifbox_image::import::unpack_image(store, &digest, &tree)?;
                // Not shared with the base: the tree is the base's own
                // copy, which sandboxes must see as the SIF has it (link
                // counts included).
                publish_mirrored(layers, state, &tree, &digest, false)?;
            }
        }
        tracing::debug!(
            "export: tree unpacked with its owners at {:?}",
            t0.elapsed()
        );
    }
    Ok(Some(digest))
}

/// Makes the store's tree of the remixed image `digest` from the tree of
/// its base (`state.base`, the store's tree of `base`): links to the
/// base's files with `edits` written (`sifbox_image::relink`), instead of
/// an unpack of the new SIF on its first run. Only for a state with
/// layers (as the snapshot path shares its tree's files with the base's),
/// in a private store (a
/// shared store's trees are stripped copies), where the SIF's remix kept
/// every time of the base (the tree has the base's) and wrote no file of
/// several names; the caller's owners as the store gives them (the base's
/// tree has them, and what the edits make is root's or, for root's
/// builds, its own). `false` when it did not (the caller then does what
/// it does without it).
#[allow(clippy::too_many_arguments)]
fn relink(
    store: &sifbox_image::store::Store,
    state: &FsState,
    base: &Digest,
    digest: &Digest,
    edits: &[sifbox_image::squash::Edit],
    stats: &sifbox_image::squash::RemixStats,
    clamp: u32,
    (uid, gid): (u32, u32),
) -> bool {
    let base_tree = store.rootfs_path(base);
    let why = if state.layers.is_empty() {
        // The metadata-only path's tree is the new SIF as it is, link
        // counts included; the snapshot path's, which a build with layers
        // would otherwise take, shares files with the base's.
        Some("metadata only")
    } else if store.access() != sifbox_image::store::Access::Private {
        Some("a shared store")
    } else if stats.clamped > 0 {
        Some("the clamp changed times of the base")
    } else if stats.rewritten_links > 0 {
        Some("a file of several names was rewritten")
    } else if state.base != base_tree || !base_tree.is_dir() {
        Some("the base's tree is not the store's")
    } else {
        None
    };
    let base_time = match sifbox_image::import::image_time(store, base) {
        Ok(t) => t,
        Err(e) => {
            tracing::debug!("export: tree not made from the base's: {e}");
            return false;
        }
    };
    // The tree keeps the base's times: the clamp may change none.
    let why = why.or((clamp < base_time).then_some("the clamp is older than the base"));
    if let Some(why) = why {
        tracing::debug!("export: tree not made from the base's: {why}");
        return false;
    }
    let t0 = std::time::Instant::now();
    let made = (|| -> Result<bool> {
        let _lock = store.lock(&format!("rootfs-{}", digest.hex()))?;
        if store.rootfs_path(digest).is_dir() {
            return Ok(true);
        }
        let work = store.work_dir("relink")?;
        let tree = work.path().join("rootfs");
        let owners = if uid == 0 {
            sifbox_image::relink::TreeOwners::Recorded
        } else {
            sifbox_image::relink::TreeOwners::CallerForRoot { uid, gid }
        };
        let opts = sifbox_image::import::remix_options(clamp, Some(6));
        match sifbox_image::relink::make_tree(&base_tree, &tree, edits, &opts, owners, base_time) {
            Ok(r) => {
                store.publish_rootfs(&tree, digest)?;
                tracing::debug!(
                    "export: tree made from the base's: {} entries linked, {} copied, {} edits, in {:?}",
                    r.linked,
                    r.copied,
                    r.edits,
                    t0.elapsed()
                );
                Ok(true)
            }
            Err(e) => {
                tracing::debug!("export: tree not made from the base's: {e}");
                Ok(false)
            }
        }
    })();
    made.unwrap_or_else(|e| {
        tracing::debug!("export: tree not made from the base's: {e}");
        false
    })
}

/// The edits that say what the layers of `state` add to its base, and a
/// line on what that is; `None` (and why, in the debug log) when they
/// cannot say it exactly.
fn added_edits(
    state: &FsState,
    clamp: u32,
    (uid, gid): (u32, u32),
) -> Option<(Vec<sifbox_image::squash::Edit>, String)> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let why = if u64::from(clamp) > now {
        // The snapshot path's root and layout files have the export's
        // own time then, which no edit knows in advance.
        Some("the clamp (SOURCE_DATE_EPOCH) is in the future".to_string())
    } else {
        None
    };
    let umask = umask();
    let why = why.or_else(|| umask.is_none().then(|| "the umask is unknown".to_string()));
    if let Some(why) = why {
        tracing::debug!("export: the layers are not remade into the base: {why}");
        return None;
    }
    let owners = if uid == 0 {
        crate::added::Owners::Keep
    } else {
        crate::added::Owners::CallerAsRoot { uid, gid }
    };
    match crate::added::derive(&state.layers, clamp, owners, umask.unwrap_or(0o022)) {
        crate::added::Derived::Edits {
            edits,
            files,
            dirs,
            bytes,
        } => Some((
            edits,
            format!("{files} files ({bytes} bytes) and {dirs} dirs"),
        )),
        crate::added::Derived::No(why) => {
            tracing::debug!("export: the layers are not remade into the base: {why}");
            None
        }
    }
}

/// This process's umask (what the snapshot path's tree root gets), from
/// `/proc/self/status` (reading it with `umask(2)` would change it).
fn umask() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find_map(|l| l.strip_prefix("Umask:"))?;
    u32::from_str_radix(line.trim(), 8).ok()
}

/// Publishes `tree` (owned by the caller) as the store's unpacked copy of
/// `digest`, first giving it, for an unprivileged caller with a
/// subordinate range, the owners a sandbox of `state` sees (the caller
/// holds the image's rootfs lock).
fn publish_mirrored(
    layers: &Layers,
    state: &FsState,
    tree: &Path,
    digest: &Digest,
    share: bool,
) -> Result<()> {
    let store = layers.store();
    if !rustix::process::geteuid().is_root()
        && layers.ids().uid_count() > 1
        && !store.rootfs_path(digest).is_dir()
    {
        // The tree is the caller's. Sandboxes of this caller map its
        // subordinate range: give the tree the owners the build gave its
        // files (a user's home, a service's dirs), as seen through that
        // mapping, so that a non-root USER can write where it should. The
        // SIF was packed before: its owners stay root's.
        const AT: &str = "/.sifbox-rootfs";
        let sb = layers.reader_with(
            state,
            vec![sifbox_engine::spec::Bind {
                src: tree.to_path_buf(),
                dst: AT.into(),
                readonly: false,
            }],
        )?;
        sb.mirror_owners(AT)?;
        sb.stop(std::time::Duration::ZERO)?;
    }
    if share
        && store.access() == sifbox_image::store::Access::Private
        && !store.rootfs_path(digest).is_dir()
    {
        // The tree is mostly its base's and its layers' files: share them
        // (hard links) instead of storing them twice. A private store's
        // base is a store tree (a shared store's is a private copy).
        let mut sources: Vec<&Path> = state
            .layers
            .iter()
            .rev()
            .map(std::path::PathBuf::as_path)
            .collect();
        sources.push(&state.base);
        let t0 = std::time::Instant::now();
        match sifbox_image::dedup::link_identical(tree, &sources) {
            Ok(l) => tracing::debug!(
                "export: {} files ({} bytes) shared with the base and layers in {:?}",
                l.files,
                l.bytes,
                t0.elapsed()
            ),
            // Only space is lost: the tree is whole either way.
            Err(e) => tracing::debug!("export: sharing files with the base: {e}"),
        }
    }
    store.publish_rootfs(tree, digest)?;
    Ok(())
}

/// Whether some entry of the tree at `root` has an owner other than
/// `(uid, gid)`: reached by directory fd and name, nothing followed, at
/// any depth ([`sifbox_sys::walk`]).
fn has_other_owners(root: &Path, (uid, gid): (u32, u32)) -> std::io::Result<bool> {
    use sifbox_sys::walk::{self, Entry, Step, Visitor};
    struct Other {
        owner: (u32, u32),
        found: bool,
    }
    impl Visitor for Other {
        fn entry(&mut self, e: &Entry<'_>) -> std::io::Result<Step> {
            if (e.stat.st_uid, e.stat.st_gid) != self.owner {
                self.found = true;
                return Ok(Step::Stop);
            }
            Ok(Step::Descend)
        }
    }
    let top = sifbox_sys::beneath::open_dir(rustix::fs::CWD, root)?;
    let st = rustix::fs::fstat(&top)?;
    if st.st_uid != uid || st.st_gid != gid {
        return Ok(true);
    }
    let mut v = Other {
        owner: (uid, gid),
        found: false,
    };
    walk::walk(
        std::os::fd::AsFd::as_fd(&top),
        walk::Options::default(),
        &mut v,
    )?;
    Ok(v.found)
}
