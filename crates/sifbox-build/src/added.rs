//! What a state's layers add to its base, as the edits a remix of the
//! base's SIF writes (`sifbox_image::squash::Edit::DirAs` and `NewFile`):
//! the export's fast path for stages whose steps only add files and
//! directories (COPY of context files, WORKDIR).
//!
//! The layers are the overlay upper dirs the steps wrote; what a sandbox of
//! the state sees, and what the snapshot path would pack, is the base with
//! each layer's entries over it. The edits say the same, or there are none:
//! [`derive`] gives [`Derived::No`] for anything a remix cannot say exactly,
//! and the export then takes the snapshot path. That is a deletion (a
//! whiteout or an opaque dir), a symlink, device, fifo or socket, a regular
//! file with two names in the layers (a hard link), an extended attribute
//! other than the overlay's own bookkeeping (`origin`, `impure`, `uuid`), an entry
//! of an id the caller's store tree cannot show as the SIF says (see
//! [`Owners`]), a dir that replaces a file or the other way round. What the
//! remix itself refuses (a new file where the base has an entry, a dir
//! whose mode or owner differ from the base's) falls back the same way.
//!
//! Times are the entries' own, clamped (as the snapshot path's
//! `clamp_times` and pack do): files the steps wrote and dirs they added
//! to have the time of the step, so they get the clamp; context files keep
//! theirs when older. The root gets what the snapshot path's root has: the
//! clamp, mode `0777 & !umask`, root's.
//!
//! Everything is reached through directory fds, `O_NOFOLLOW`, never by
//! path; the files are read when the remix writes them (small ones now).

use std::collections::{BTreeMap, HashMap};
use std::ffi::CStr;
use std::fs::File;
use std::io::Read as _;
use std::os::fd::OwnedFd;
use std::path::PathBuf;

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use sifbox_image::squash::{Attrs, Edit, FileSource, OpenFile};
use sifbox_sys::beneath::open_dir;

/// Files up to this size are read into memory while the layers are walked;
/// larger ones stay open until the remix reads them.
const SMALL_FILE: u64 = 1 << 20;
/// At most this many bytes of small files in memory...
const MAX_SMALL_BYTES: u64 = 256 << 20;
/// ...and this many large files open: beyond, the snapshot path.
const MAX_OPEN_FILES: usize = 256;
/// Directories deeper than this take the snapshot path.
const MAX_DEPTH: usize = 256;

/// Whose the entries of the layers are, and what the image records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owners {
    /// As they are (root's builds: their sandboxes map ids one to one).
    Keep,
    /// Entries of this (uid, gid), the caller's, are root's in the image
    /// (as the snapshot path packs them); any other owner has no edit
    /// (the store's tree would need the sandbox's owners mirrored).
    CallerAsRoot { uid: u32, gid: u32 },
}

/// What [`derive`] found.
#[derive(Debug)]
pub enum Derived {
    /// The edits: the root's, then every dir and file of the layers in
    /// path order (a dir before what it holds).
    Edits {
        edits: Vec<Edit>,
        files: u64,
        dirs: u64,
        bytes: u64,
    },
    /// Why the layers cannot be said as edits.
    No(String),
}

/// One entry of the layers as the overlay shows it (the topmost layer's).
enum Node {
    Dir(Attrs),
    File {
        attrs: Attrs,
        data: FileSource,
        /// (device, inode) in its layer: two names of one are a hard link.
        id: (u64, u64),
    },
}

struct Walk {
    owners: Owners,
    clamp: u32,
    /// By path components below the root, so parents sort first.
    nodes: BTreeMap<Vec<Vec<u8>>, Node>,
    small_bytes: u64,
    open_files: usize,
}

/// Why not, as an early return.
type Why = Result<(), String>;

fn no(why: impl Into<String>) -> Why {
    Err(why.into())
}

fn shown(path: &[Vec<u8>]) -> String {
    let mut s = String::new();
    for c in path {
        s.push('/');
        s.push_str(&String::from_utf8_lossy(c));
    }
    if s.is_empty() {
        s.push('/');
    }
    s
}

/// The edits that make the base with `layers` (bottom first) on it, for
/// a build whose clamp is `clamp` and whose caller's umask is `umask`.
/// I/O errors on the layers are [`Derived::No`] as well: the snapshot path
/// then meets them, or not, on its own.
pub fn derive(layers: &[PathBuf], clamp: u32, owners: Owners, umask: u32) -> Derived {
    let mut w = Walk {
        owners,
        clamp,
        nodes: BTreeMap::new(),
        small_bytes: 0,
        open_files: 0,
    };
    for layer in layers {
        let top = match open_dir(rustix::fs::CWD, layer.as_path()) {
            Ok(fd) => fd,
            Err(e) => return Derived::No(format!("{}: {e}", layer.display())),
        };
        let r = check_xattrs(&top, &[]).and_then(|()| w.dir(&top, &mut Vec::new()));
        if let Err(why) = r {
            return Derived::No(format!("{} ({})", why, layer.display()));
        }
    }
    let mut seen: HashMap<(u64, u64), &[Vec<u8>]> = HashMap::new();
    for (path, node) in &w.nodes {
        if let Node::File { id, .. } = node {
            if let Some(other) = seen.insert(*id, path) {
                return Derived::No(format!(
                    "{} and {} are one file (a hard link)",
                    shown(other),
                    shown(path)
                ));
            }
        }
    }
    let root = Attrs {
        mode: u16::try_from(0o777 & !umask).unwrap_or(0o755),
        uid: 0,
        gid: 0,
        mtime: clamp,
    };
    let mut edits = vec![Edit::DirAs {
        path: String::new(),
        attrs: root,
    }];
    let (mut files, mut dirs, mut bytes) = (0, 0, 0);
    for (path, node) in w.nodes {
        let path = match path
            .iter()
            .map(|c| String::from_utf8(c.clone()))
            .collect::<Result<Vec<_>, _>>()
        {
            Ok(p) => p.join("/"),
            Err(_) => return Derived::No(format!("{}: a name that is not UTF-8", shown(&path))),
        };
        match node {
            Node::Dir(attrs) => {
                dirs += 1;
                edits.push(Edit::DirAs { path, attrs });
            }
            Node::File { attrs, data, .. } => {
                files += 1;
                bytes += data.len();
                edits.push(Edit::NewFile { path, data, attrs });
            }
        }
    }
    Derived::Edits {
        edits,
        files,
        dirs,
        bytes,
    }
}

/// Refuses an entry with extended attributes other than the overlay's
/// own records of where a copied-up entry came from (`origin`), that a
/// dir holds such entries (`impure`) and, on a layer's root, of the file
/// system it was written on (`uuid`): an opaque dir, a whiteout, a
/// redirect, a metacopy (data in a lower layer), file capabilities, ACLs.
fn check_xattrs(fd: &OwnedFd, path: &[Vec<u8>]) -> Why {
    let mut buf = vec![0u8; 4096];
    let n = match rustix::fs::flistxattr(fd, &mut buf) {
        Ok(n) => n,
        Err(rustix::io::Errno::RANGE) => return no(format!("{}: many xattrs", shown(path))),
        Err(rustix::io::Errno::NOTSUP) => 0,
        Err(e) => return no(format!("{}: listing xattrs: {e}", shown(path))),
    };
    for name in buf[..n].split(|b| *b == 0).filter(|n| !n.is_empty()) {
        let allowed = [
            b"trusted.overlay.origin".as_slice(),
            b"trusted.overlay.impure",
            b"user.overlay.origin",
            b"user.overlay.impure",
        ];
        // The id of the file system the layer was the upper dir on, on
        // its root.
        let uuid =
            path.is_empty() && (name == b"trusted.overlay.uuid" || name == b"user.overlay.uuid");
        if !allowed.contains(&name) && !uuid {
            let what = if name.ends_with(b".overlay.opaque") || name.ends_with(b".overlay.whiteout")
            {
                "a deletion"
            } else {
                "an extended attribute"
            };
            return no(format!(
                "{}: {what} ({})",
                shown(path),
                String::from_utf8_lossy(name)
            ));
        }
    }
    Ok(())
}

impl Walk {
    fn attrs(&self, st: &rustix::fs::Stat, path: &[Vec<u8>]) -> Result<Attrs, String> {
        let (uid, gid) = match self.owners {
            Owners::Keep => (st.st_uid, st.st_gid),
            Owners::CallerAsRoot { uid, gid } if (st.st_uid, st.st_gid) == (uid, gid) => (0, 0),
            Owners::CallerAsRoot { .. } => {
                return Err(format!(
                    "{}: owned by {}:{}, not the caller (its tree needs the sandbox's owners)",
                    shown(path),
                    st.st_uid,
                    st.st_gid
                ))
            }
        };
        let mtime = u32::try_from(st.st_mtime.max(0))
            .unwrap_or(u32::MAX)
            .min(self.clamp);
        Ok(Attrs {
            mode: u16::try_from(st.st_mode & 0o7777).unwrap_or(0),
            uid,
            gid,
            mtime,
        })
    }

    /// The entries of the layer dir `dir`, at `path`.
    fn dir(&mut self, dir: &OwnedFd, path: &mut Vec<Vec<u8>>) -> Why {
        if path.len() > MAX_DEPTH {
            return no(format!("{}: deeper than {MAX_DEPTH}", shown(path)));
        }
        let mut names: Vec<std::ffi::CString> = Vec::new();
        let entries =
            rustix::fs::Dir::read_from(dir).map_err(|e| format!("{}: {e}", shown(path)))?;
        for e in entries {
            let e = e.map_err(|e| format!("{}: {e}", shown(path)))?;
            let n = e.file_name();
            if n != c"." && n != c".." {
                names.push(n.to_owned());
            }
        }
        names.sort();
        for name in names {
            path.push(name.to_bytes().to_vec());
            let r = self.entry(dir, &name, path);
            path.pop();
            r?;
        }
        Ok(())
    }

    fn entry(&mut self, dir: &OwnedFd, name: &CStr, path: &mut Vec<Vec<u8>>) -> Why {
        let err = |e: rustix::io::Errno| format!("{}: {e}", shown(path));
        let st = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW).map_err(err)?;
        match FileType::from_raw_mode(st.st_mode) {
            FileType::Directory => {
                let sub = open_dir(dir, name).map_err(|e| format!("{}: {e}", shown(path)))?;
                let st = rustix::fs::fstat(&sub).map_err(err)?;
                check_xattrs(&sub, path)?;
                let attrs = self.attrs(&st, path)?;
                if let Some(Node::File { .. }) = self.nodes.get(path.as_slice()) {
                    return no(format!(
                        "{}: a dir over a file of a layer below",
                        shown(path)
                    ));
                }
                self.nodes.insert(path.clone(), Node::Dir(attrs));
                self.dir(&sub, path)
            }
            FileType::RegularFile => {
                let fd = rustix::fs::openat(
                    dir,
                    name,
                    OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
                    Mode::empty(),
                )
                .map_err(err)?;
                let fst = rustix::fs::fstat(&fd).map_err(err)?;
                if (fst.st_dev, fst.st_ino) != (st.st_dev, st.st_ino)
                    || FileType::from_raw_mode(fst.st_mode) != FileType::RegularFile
                {
                    return no(format!("{}: changed while read", shown(path)));
                }
                check_xattrs(&fd, path)?;
                let attrs = self.attrs(&fst, path)?;
                if let Some(Node::Dir(_)) = self.nodes.get(path.as_slice()) {
                    return no(format!(
                        "{}: a file over a dir of a layer below",
                        shown(path)
                    ));
                }
                let size = u64::try_from(fst.st_size).unwrap_or(0);
                let mut file = File::from(fd);
                let data = if size <= SMALL_FILE {
                    self.small_bytes += size;
                    if self.small_bytes > MAX_SMALL_BYTES {
                        return no("more small files than the fast path reads into memory");
                    }
                    let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
                    file.read_to_end(&mut bytes)
                        .map_err(|e| format!("{}: {e}", shown(path)))?;
                    if bytes.len() as u64 != size {
                        return no(format!("{}: changed while read", shown(path)));
                    }
                    FileSource::Bytes(bytes)
                } else {
                    self.open_files += 1;
                    if self.open_files > MAX_OPEN_FILES {
                        return no("more large files than the fast path keeps open");
                    }
                    FileSource::Open(
                        OpenFile::new(file).map_err(|e| format!("{}: {e}", shown(path)))?,
                    )
                };
                self.nodes.insert(
                    path.clone(),
                    Node::File {
                        attrs,
                        data,
                        id: (st.st_dev, st.st_ino),
                    },
                );
                Ok(())
            }
            FileType::Symlink => no(format!("{}: a symlink", shown(path))),
            FileType::CharacterDevice if st.st_rdev == 0 => {
                no(format!("{}: a deletion (whiteout)", shown(path)))
            }
            other => no(format!("{}: a {other:?}", shown(path))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;
    use std::path::Path;

    fn set_mtime(p: &Path, t: i64) {
        let ts = rustix::fs::Timespec {
            tv_sec: t,
            tv_nsec: 0,
        };
        rustix::fs::utimensat(
            rustix::fs::CWD,
            p,
            &rustix::fs::Timestamps {
                last_access: ts,
                last_modification: ts,
            },
            AtFlags::SYMLINK_NOFOLLOW,
        )
        .expect("utimensat");
    }

    fn me() -> Owners {
        Owners::CallerAsRoot {
            uid: rustix::process::geteuid().as_raw(),
            gid: rustix::process::getegid().as_raw(),
        }
    }

    fn why(layers: &[PathBuf]) -> String {
        match derive(layers, 2_000_000_000, me(), 0o022) {
            Derived::No(why) => why,
            Derived::Edits { edits, .. } => panic!("edits: {edits:?}"),
        }
    }

    #[test]
    fn added_files_and_dirs_become_edits_in_path_order() {
        let t = tempfile::tempdir().expect("tmp");
        let (l1, l2) = (t.path().join("l1"), t.path().join("l2"));
        std::fs::create_dir_all(l1.join("app/work")).expect("mkdir");
        std::fs::create_dir_all(l2.join("app")).expect("mkdir");
        std::fs::write(l1.join("app/a.txt"), b"one").expect("write");
        std::fs::write(l2.join("app/a.txt"), b"two").expect("write");
        let big = vec![7u8; usize::try_from(SMALL_FILE + 1).expect("usize")];
        std::fs::write(l2.join("app/big"), &big).expect("write");
        std::fs::set_permissions(l2.join("app/big"), std::fs::Permissions::from_mode(0o4750))
            .expect("chmod");
        set_mtime(&l1.join("app/work"), 1_000);
        set_mtime(&l2.join("app/a.txt"), 3_000_000_000);
        set_mtime(&l2.join("app/big"), 1_500_000_000);
        set_mtime(&l2.join("app"), 1_600_000_000);
        let Derived::Edits {
            edits,
            files,
            dirs,
            bytes,
        } = derive(&[l1, l2], 2_000_000_000, me(), 0o027)
        else {
            panic!("no edits");
        };
        assert_eq!((files, dirs, bytes), (2, 2, 3 + SMALL_FILE + 1));
        let attrs = |mode, mtime| Attrs {
            mode,
            uid: 0,
            gid: 0,
            mtime,
        };
        let summary: Vec<(String, Attrs, Option<Vec<u8>>)> = edits
            .iter()
            .map(|e| match e {
                Edit::DirAs { path, attrs } => (path.clone(), *attrs, None),
                Edit::NewFile { path, data, attrs } => (
                    path.clone(),
                    *attrs,
                    Some(match data {
                        FileSource::Bytes(b) => b.clone(),
                        FileSource::Open(f) => {
                            let mut b = vec![0u8; usize::try_from(f.size()).expect("usize")];
                            std::os::unix::fs::FileExt::read_exact_at(f.as_file(), &mut b, 0)
                                .expect("read");
                            b
                        }
                    }),
                ),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(
            summary,
            vec![
                (String::new(), attrs(0o750, 2_000_000_000), None),
                // The top layer's dir.
                ("app".into(), attrs(0o755, 1_600_000_000), None),
                // The top layer's file, clamped.
                (
                    "app/a.txt".into(),
                    attrs(0o644, 2_000_000_000),
                    Some(b"two".to_vec())
                ),
                ("app/big".into(), attrs(0o4750, 1_500_000_000), Some(big)),
                ("app/work".into(), attrs(0o755, 1_000), None),
            ]
        );
        assert!(matches!(&edits[4], Edit::DirAs { .. }));
        assert!(matches!(
            &edits[3],
            Edit::NewFile {
                data: FileSource::Open(_),
                ..
            }
        ));
    }

    #[test]
    fn what_a_remix_cannot_say_is_refused() {
        let t = tempfile::tempdir().expect("tmp");
        let l = |n: &str| {
            let p = t.path().join(n);
            std::fs::create_dir_all(p.join("d")).expect("mkdir");
            p
        };
        let sym = l("sym");
        std::os::unix::fs::symlink("x", sym.join("d/link")).expect("symlink");
        assert!(why(&[sym]).contains("/d/link: a symlink"));
        let hard = l("hard");
        std::fs::write(hard.join("d/a"), b"x").expect("write");
        std::fs::hard_link(hard.join("d/a"), hard.join("b")).expect("link");
        assert!(why(&[hard]).contains("a hard link"));
        let fifo = l("fifo");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            fifo.join("d/p"),
            FileType::Fifo,
            Mode::from_raw_mode(0o644),
            0,
        )
        .expect("fifo");
        assert!(why(&[fifo]).contains("/d/p"));
        // A file in one layer, a dir of that name in the next.
        let (lo, hi) = (l("lo"), l("hi"));
        std::fs::write(lo.join("d/x"), b"x").expect("write");
        std::fs::create_dir(hi.join("d/x")).expect("mkdir");
        assert!(why(&[lo.clone(), hi.clone()]).contains("a dir over a file"));
        assert!(why(&[hi, lo]).contains("a file over a dir"));
        let xattr = l("xattr");
        std::fs::write(xattr.join("d/f"), b"x").expect("write");
        let f = File::open(xattr.join("d/f")).expect("open");
        if rustix::fs::fsetxattr(&f, "user.test", b"1", rustix::fs::XattrFlags::empty()).is_ok() {
            assert!(why(&[xattr]).contains("an extended attribute (user.test)"));
        }
        let opaque = l("opaque");
        let d = File::open(opaque.join("d")).expect("open");
        if rustix::fs::fsetxattr(
            &d,
            "user.overlay.opaque",
            b"y",
            rustix::fs::XattrFlags::empty(),
        )
        .is_ok()
        {
            assert!(why(&[opaque]).contains("a deletion"));
        }
        if rustix::process::geteuid().is_root() {
            let wh = l("whiteout");
            rustix::fs::mknodat(
                rustix::fs::CWD,
                wh.join("d/gone"),
                FileType::CharacterDevice,
                Mode::from_raw_mode(0),
                0,
            )
            .expect("whiteout");
            assert!(why(&[wh]).contains("a deletion (whiteout)"));
            let other = l("other");
            std::fs::write(other.join("d/f"), b"x").expect("write");
            rustix::fs::chownat(
                rustix::fs::CWD,
                other.join("d/f"),
                Some(rustix::fs::Uid::from_raw(1000)),
                Some(rustix::fs::Gid::from_raw(1000)),
                AtFlags::empty(),
            )
            .expect("chown");
            assert!(why(std::slice::from_ref(&other)).contains("owned by 1000:1000"));
            // Root's builds keep it.
            let Derived::Edits { edits, .. } = derive(&[other], 2_000_000_000, Owners::Keep, 0o022)
            else {
                panic!("refused");
            };
            assert!(edits.iter().any(|e| matches!(
                e,
                Edit::NewFile { attrs, .. } if (attrs.uid, attrs.gid) == (1000, 1000)
            )));
        }
    }
}
