//! Helpers shared by the `layer_*` suites: tar
//! layers built in memory with the `tar` crate, hostile names included.
#![allow(dead_code, missing_debug_implementations)]

use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use sha2::Digest as _;

pub const MTIME: u64 = 1_600_000_000;

/// A layer being built.
pub struct Layer {
    b: tar::Builder<Vec<u8>>,
    uid: u64,
    gid: u64,
}

impl Default for Layer {
    fn default() -> Self {
        Self::new()
    }
}

impl Layer {
    pub fn new() -> Self {
        Layer {
            b: tar::Builder::new(Vec::new()),
            uid: 0,
            gid: 0,
        }
    }

    /// Owner of the entries added from now on.
    pub fn owner(mut self, uid: u64, gid: u64) -> Self {
        self.uid = uid;
        self.gid = gid;
        self
    }

    /// Adds an entry with raw name bytes (no checks, so hostile names work).
    pub fn raw(
        mut self,
        ty: tar::EntryType,
        path: &[u8],
        mode: u32,
        link: &[u8],
        data: &[u8],
    ) -> Self {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(ty);
        h.set_mode(mode);
        h.set_uid(self.uid);
        h.set_gid(self.gid);
        h.set_mtime(MTIME);
        h.set_size(data.len() as u64);
        if path.len() > 100 {
            // Let the tar crate write a GNU long name.
            self.b
                .append_data(
                    &mut h,
                    std::str::from_utf8(path).expect("utf-8 long name"),
                    data,
                )
                .expect("append");
            return self;
        }
        h.as_old_mut().name[..path.len()].copy_from_slice(path);
        h.as_old_mut().linkname[..link.len()].copy_from_slice(link);
        h.set_cksum();
        self.b.append(&h, data).expect("append");
        self
    }

    pub fn dir(self, path: &str, mode: u32) -> Self {
        self.raw(tar::EntryType::Directory, path.as_bytes(), mode, b"", b"")
    }

    pub fn file(self, path: &str, mode: u32, data: &[u8]) -> Self {
        self.raw(tar::EntryType::Regular, path.as_bytes(), mode, b"", data)
    }

    pub fn symlink(self, path: &str, target: &str) -> Self {
        self.raw(
            tar::EntryType::Symlink,
            path.as_bytes(),
            0o777,
            target.as_bytes(),
            b"",
        )
    }

    pub fn hardlink(self, path: &str, target: &str) -> Self {
        self.raw(
            tar::EntryType::Link,
            path.as_bytes(),
            0o644,
            target.as_bytes(),
            b"",
        )
    }

    pub fn fifo(self, path: &str, mode: u32) -> Self {
        self.raw(tar::EntryType::Fifo, path.as_bytes(), mode, b"", b"")
    }

    pub fn device(mut self, path: &str, block: bool, major: u32, minor: u32, mode: u32) -> Self {
        let mut h = tar::Header::new_gnu();
        h.set_path(path).expect("path");
        h.set_entry_type(if block {
            tar::EntryType::Block
        } else {
            tar::EntryType::Char
        });
        h.set_mode(mode);
        h.set_mtime(MTIME);
        h.set_size(0);
        h.set_device_major(major).expect("major");
        h.set_device_minor(minor).expect("minor");
        h.set_cksum();
        self.b.append(&h, &b""[..]).expect("append");
        self
    }

    pub fn whiteout(self, path: &str) -> Self {
        self.file(path, 0o644, b"")
    }

    /// A PAX header (records `key=value`) for the next entry.
    pub fn pax(mut self, records: &[(&str, &[u8])]) -> Self {
        let mut body = Vec::new();
        for (k, v) in records {
            let n = k.len() + v.len() + 3;
            let mut len = n + n.to_string().len();
            if len.to_string().len() != n.to_string().len() {
                len = n + len.to_string().len();
            }
            body.extend_from_slice(format!("{len} {k}=").as_bytes());
            body.extend_from_slice(v);
            body.push(b'\n');
        }
        let mut h = tar::Header::new_ustar();
        h.set_path("PaxHeader").expect("path");
        h.set_entry_type(tar::EntryType::XHeader);
        h.set_size(body.len() as u64);
        h.set_cksum();
        self.b.append(&h, &body[..]).expect("append");
        self
    }

    pub fn tar(self) -> Vec<u8> {
        self.b.into_inner().expect("finish")
    }

    pub fn gzip(self) -> Vec<u8> {
        gzip(&self.tar())
    }

    pub fn zstd(self) -> Vec<u8> {
        zstd::encode_all(&self.tar()[..], 3).expect("zstd")
    }
}

pub fn gzip(data: &[u8]) -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(data).expect("gzip");
    gz.finish().expect("gzip")
}

pub fn sha256_hex(data: &[u8]) -> String {
    hex::encode(sha2::Sha256::digest(data))
}

/// A temp dir holding `dest/` (the target) and `canary/` beside it, with a
/// file in the canary to check that nothing outside `dest` changes.
pub struct Sandbox {
    pub tmp: tempfile::TempDir,
}

impl Sandbox {
    pub fn new() -> Self {
        let tmp = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(tmp.path().join("dest")).expect("dest");
        std::fs::create_dir(tmp.path().join("canary")).expect("canary");
        std::fs::write(tmp.path().join("canary/keep"), b"canary").expect("canary file");
        Sandbox { tmp }
    }

    pub fn dest(&self) -> PathBuf {
        self.tmp.path().join("dest")
    }

    pub fn canary(&self) -> PathBuf {
        self.tmp.path().join("canary")
    }

    pub fn dir(&self) -> cap_std::fs::Dir {
        cap_std::fs::Dir::open_ambient_dir(self.dest(), cap_std::ambient_authority())
            .expect("open dest")
    }

    /// Panics if anything beside `dest` changed.
    pub fn assert_canary(&self) {
        let names: Vec<String> = std::fs::read_dir(self.canary())
            .expect("canary")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["keep"], "something was written into the canary dir");
        assert_eq!(
            std::fs::read(self.canary().join("keep")).expect("canary file"),
            b"canary"
        );
        let mut top: Vec<String> = std::fs::read_dir(self.tmp.path())
            .expect("tmp")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        top.sort();
        assert_eq!(top, ["canary", "dest"], "something was written beside dest");
    }

    pub fn apply(
        &self,
        layer: &[u8],
        opts: &sifbox_image::layer::ApplyOptions,
    ) -> sifbox_image::layer::Result<sifbox_image::layer::LayerReport> {
        sifbox_image::layer::apply_layer(layer, &self.dir(), opts)
    }
}

impl Drop for Sandbox {
    /// Gives the owner access to every directory, so that the temp dir can
    /// be removed also by an unprivileged user after odd modes.
    fn drop(&mut self) {
        fn fix(dir: &Path) {
            use std::os::unix::fs::PermissionsExt;
            let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
            if let Ok(rd) = std::fs::read_dir(dir) {
                for e in rd.flatten() {
                    if e.file_type().is_ok_and(|t| t.is_dir()) {
                        fix(&e.path());
                    }
                }
            }
        }
        fix(&self.dest());
    }
}

impl Default for Sandbox {
    fn default() -> Self {
        Self::new()
    }
}

pub fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).expect("stat").mode() & 0o7777
}

/// Sorted relative paths of everything under `root`.
pub fn tree(root: &Path) -> Vec<String> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(dir).expect("read_dir") {
            let e = e.expect("entry");
            let p = e.path();
            out.push(
                p.strip_prefix(root)
                    .expect("prefix")
                    .to_string_lossy()
                    .into_owned(),
            );
            if e.file_type().expect("type").is_dir() {
                walk(root, &p, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(root, root, &mut out);
    out.sort();
    out
}

pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}
