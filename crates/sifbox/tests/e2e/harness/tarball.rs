//! Tar streams made entry by entry, for `sifbox cp -`: ordinary ones, and
//! hostile ones whose names a well-behaved archiver would never write
//! (`../x`, `/abs`).

/// A tar stream being made.
pub struct Tarball {
    b: tar::Builder<Vec<u8>>,
}

impl std::fmt::Debug for Tarball {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tarball")
    }
}

impl Default for Tarball {
    fn default() -> Self {
        Tarball::new()
    }
}

impl Tarball {
    pub fn new() -> Tarball {
        Tarball {
            b: tar::Builder::new(Vec::new()),
        }
    }

    fn header(kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_size(size);
        h.set_mtime(1_600_000_000);
        h
    }

    pub fn dir(mut self, name: &str, mode: u32) -> Self {
        let mut h = Self::header(tar::EntryType::Directory, mode, 0);
        self.b
            .append_data(&mut h, name, std::io::empty())
            .expect("dir entry");
        self
    }

    pub fn file(mut self, name: &str, mode: u32, data: &[u8]) -> Self {
        let mut h = Self::header(tar::EntryType::Regular, mode, data.len() as u64);
        self.b.append_data(&mut h, name, data).expect("file entry");
        self
    }

    pub fn symlink(mut self, name: &str, target: &str) -> Self {
        let mut h = Self::header(tar::EntryType::Symlink, 0o777, 0);
        self.b
            .append_link(&mut h, name, target)
            .expect("symlink entry");
        self
    }

    pub fn hardlink(mut self, name: &str, target: &str) -> Self {
        let mut h = Self::header(tar::EntryType::Link, 0o644, 0);
        self.b
            .append_link(&mut h, name, target)
            .expect("hard link entry");
        self
    }

    /// A file entry whose name is written into the header as it is
    /// (`../../etc/x`, `/etc/x`), which the tar crate would refuse.
    pub fn raw_file(mut self, name: &str, data: &[u8]) -> Self {
        assert!(name.len() < 100, "a raw name fits the old header");
        let mut h = tar::Header::new_old();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_mode(0o644);
        h.set_size(data.len() as u64);
        h.set_mtime(1_600_000_000);
        h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
        h.set_cksum();
        self.b.append(&h, data).expect("raw entry");
        self
    }

    pub fn bytes(self) -> Vec<u8> {
        self.b.into_inner().expect("tar stream")
    }
}
