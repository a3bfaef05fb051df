//! Remaking a squashfs image with a few files changed or added, without
//! unpacking it or compressing its file data again: what a build whose
//! last stage only changes an image's metadata (LABEL, ENV, CMD...) or
//! only adds files (COPY, WORKDIR) does to make the new image from its
//! base's.
//!
//! The base's data region (superblock end to inode table: every data block
//! and fragment block, and a compressor options block if there is one) is
//! copied byte for byte to the same offsets, so every block and fragment
//! reference in the base's inodes stays valid. The directory tree and
//! inodes are read into a [`Tree`] as [`super::pack`] builds one from a
//! directory (hard links as one inode with several names), the edits are
//! applied to it, the data of the files they write is appended after the
//! copied region (small files in new fragment blocks, listed after the
//! base's), and the inode, directory, fragment and id tables and the
//! superblock are written by the same code as a fresh pack
//! ([`super::pack::write_tables`]). Old data of a replaced file stays in
//! the copied region, unreferenced.
//!
//! The base is read with the rules of [`super::unpack`] (every offset
//! checked), and every block its inodes and fragment table name must lie
//! inside the copied region. Same base, edits and options: same bytes.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use super::codec::Deflater;
use super::format::*;
use super::pack::{io_err, too_big, write_tables, Entry, FileData, Ino, Inode, Kind, Located};
use super::pack::{TableLayout, Tree};
use super::unpack::{check_name, corrupt, Image, InodeKind, Meta};
use super::{Attrs, Edit, FileSource, RemixOptions, RemixStats, SquashError};

/// Superblock flag: a compressor options block follows the superblock
/// (copied with the data region, so the flag is kept).
const FLAG_COMP_OPT: u16 = 1 << 10;

/// Permission bits of the directories and empty files that edits make
/// (what `mkdir` and `creat` give under the usual umask 022).
const NEW_DIR_MODE: u16 = 0o755;
const NEW_EMPTY_FILE_MODE: u16 = 0o644;

/// A directory of the new image with no entries yet, below `parent`.
fn empty_dir(parent: Ino) -> Kind {
    Kind::Dir {
        entries: Vec::new(),
        parent,
        path: PathBuf::new(),
    }
}

/// An edit that goes through what is not a directory in the base.
fn not_a_dir(shown: &Path) -> SquashError {
    unsupported(format!(
        "{} is not a directory in the base image",
        shown.display()
    ))
}

fn unsupported(what: impl Into<String>) -> SquashError {
    SquashError::Unsupported { what: what.into() }
}

/// The base's tree, read from its tables.
struct Base {
    tree: Tree,
    /// Where the data of each regular file of the base is.
    located: Located,
}

/// The size of a stored block (its word without the uncompressed bit),
/// checked to be a block at all.
fn stored_size(word: u32, block_size: u32) -> Result<u64, SquashError> {
    let size = word & !DATA_UNCOMPRESSED;
    if word >> 25 != 0 || size > block_size {
        return Err(corrupt(format!("block size word {word:#x}")));
    }
    Ok(u64::from(size))
}

/// Reads every directory and inode of `img` reachable from the root.
fn read_tree(img: &Image<'_>) -> Result<Base, SquashError> {
    let sb = &img.sb;
    let data_end = sb.inode_table;
    let mut meta = Meta::new(img);
    let (root, (block, offset, size)) = img.root_dir(&mut meta)?;
    let mut tree = Tree::default();
    tree.inodes.push(Inode {
        kind: empty_dir(0),
        mode: root.mode,
        uid: root.uid,
        gid: root.gid,
        mtime: root.mtime,
        links: 1,
        number: 0,
    });
    let mut located: Located = HashMap::new();
    // Inodes other than directories, by reference: a second name is a hard link.
    let mut by_ref: HashMap<u64, Ino> = HashMap::new();
    let mut seen_dirs: HashSet<u64> = HashSet::from([sb.root_inode]);
    let mut pending: Vec<(Ino, PathBuf, u32, u16, u32)> =
        vec![(0, PathBuf::from("/"), block, offset, size)];
    while let Some((dir, shown, block, offset, size)) = pending.pop() {
        let mut listing = img.listing(block, offset, size)?;
        let mut entries: Vec<Entry> = Vec::new();
        while let Some((name, r, entry_type)) = listing.next(&mut meta)? {
            let path = shown.join(check_name(&shown, name)?);
            let name = name.to_vec();
            if let Some(&ino) = by_ref.get(&r) {
                tree.inodes[ino].links += 1;
                entries.push(Entry { name, inode: ino });
                continue;
            }
            let info = img.inode(&mut meta, r)?;
            if info.basic_type != entry_type {
                return Err(corrupt(format!(
                    "{}: entry type {entry_type} but inode type {}",
                    path.display(),
                    info.basic_type
                )));
            }
            let ino = tree.inodes.len();
            let kind = match info.kind {
                InodeKind::Dir {
                    block,
                    offset,
                    size,
                } => {
                    if !seen_dirs.insert(r) {
                        return Err(corrupt(format!(
                            "{}: directory appears twice (a loop)",
                            path.display()
                        )));
                    }
                    pending.push((ino, path, block, offset, size));
                    empty_dir(dir)
                }
                InodeKind::File(f) => {
                    let mut stored = 0u64;
                    for &w in &f.blocks {
                        stored += stored_size(w, sb.block_size)?;
                    }
                    let inside = f.start >= SUPERBLOCK_SIZE as u64
                        && f.start.checked_add(stored).is_some_and(|e| e <= data_end);
                    if stored > 0 && !inside {
                        return Err(corrupt(format!(
                            "{}: data at {}..+{stored} is outside the data region",
                            path.display(),
                            f.start
                        )));
                    }
                    let data = FileData {
                        blocks: f
                            .blocks
                            .iter()
                            .map(|&w| (w & !DATA_UNCOMPRESSED != 0).then_some(0))
                            .collect(),
                        fragment: f.fragment_ref,
                        size: f.size,
                    };
                    located.insert(ino, (f.start, f.blocks, data));
                    by_ref.insert(r, ino);
                    Kind::File {
                        path: PathBuf::new(),
                        size: f.size,
                    }
                }
                other => {
                    by_ref.insert(r, ino);
                    match other {
                        InodeKind::Symlink(target) => Kind::Symlink(target),
                        InodeKind::Device { block: true, rdev } => Kind::Block(rdev),
                        InodeKind::Device { block: false, rdev } => Kind::Char(rdev),
                        InodeKind::Fifo => Kind::Fifo,
                        InodeKind::Socket => Kind::Socket,
                        InodeKind::Dir { .. } | InodeKind::File(_) => {
                            return Err(corrupt("inode kinds mixed up"));
                        }
                    }
                }
            };
            tree.inodes.push(Inode {
                kind,
                mode: info.mode,
                uid: info.uid,
                gid: info.gid,
                mtime: info.mtime,
                links: 1,
                number: 0,
            });
            entries.push(Entry { name, inode: ino });
        }
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        if let Some(w) = entries.windows(2).find(|w| w[0].name == w[1].name) {
            return Err(corrupt(format!(
                "{}: two entries of that name",
                shown
                    .join(String::from_utf8_lossy(&w[0].name).as_ref())
                    .display()
            )));
        }
        if let Kind::Dir { entries: slot, .. } = &mut tree.inodes[dir].kind {
            *slot = entries;
        }
    }
    Ok(Base { tree, located })
}

/// Applies edits to a base tree.
struct Editor<'a> {
    tree: &'a mut Tree,
    located: &'a mut Located,
    /// Regular files whose data the edits give, by inode.
    fresh: &'a mut BTreeMap<Ino, (String, FileSource)>,
    opts: &'a RemixOptions,
    /// Files of several names written in place.
    rewritten_links: u64,
}

impl Editor<'_> {
    /// The inode named `name` in the directory `dir`.
    fn find(&self, dir: Ino, name: &[u8]) -> Option<Ino> {
        let entries = self.tree.entries(dir);
        entries
            .binary_search_by(|e| e.name.as_slice().cmp(name))
            .ok()
            .map(|i| entries[i].inode)
    }

    /// Adds a new inode named `name` to `dir` (which then has the edits'
    /// time, as a directory an entry was added to has).
    fn add(&mut self, dir: Ino, name: &[u8], kind: Kind, mode: u16) -> Ino {
        let (uid, gid) = self.opts.owner;
        let attrs = Attrs {
            mode,
            uid,
            gid,
            mtime: self.opts.time,
        };
        let ino = self.add_as(dir, name, kind, attrs);
        self.tree.inodes[dir].mtime = self.opts.time;
        ino
    }

    /// Adds a new inode named `name` to `dir` with `attrs`, leaving the
    /// times of `dir` alone.
    fn add_as(&mut self, dir: Ino, name: &[u8], kind: Kind, attrs: Attrs) -> Ino {
        let ino = self.tree.inodes.len();
        self.tree.inodes.push(Inode {
            kind,
            mode: attrs.mode & 0o7777,
            uid: attrs.uid,
            gid: attrs.gid,
            mtime: attrs.mtime.min(self.opts.time),
            links: 1,
            number: 0,
        });
        let parent = &mut self.tree.inodes[dir];
        if let Kind::Dir { entries, .. } = &mut parent.kind {
            let at = entries
                .binary_search_by(|e| e.name.as_slice().cmp(name))
                .unwrap_or_else(|i| i);
            entries.insert(
                at,
                Entry {
                    name: name.to_vec(),
                    inode: ino,
                },
            );
        }
        ino
    }

    /// The directory `name` in `dir`, made when missing.
    fn dir(&mut self, dir: Ino, name: &[u8], shown: &Path) -> Result<Ino, SquashError> {
        match self.find(dir, name) {
            Some(ino) if self.tree.is_dir(ino) => Ok(ino),
            Some(_) => Err(not_a_dir(shown)),
            None => {
                let kind = empty_dir(dir);
                Ok(self.add(dir, name, kind, NEW_DIR_MODE))
            }
        }
    }

    /// The directory at `names` (below the root), which must be there:
    /// what [`Edit::DirAs`] and [`Edit::NewFile`] add entries to.
    fn existing_dir(&self, names: &[&[u8]]) -> Result<Ino, SquashError> {
        let mut dir = 0;
        let mut at = PathBuf::from("/");
        for name in names {
            at.push(String::from_utf8_lossy(name).as_ref());
            match self.find(dir, name) {
                Some(ino) if self.tree.is_dir(ino) => dir = ino,
                Some(_) => return Err(not_a_dir(&at)),
                None => {
                    return Err(unsupported(format!(
                        "{} is missing (an edit with attributes makes no parents)",
                        at.display()
                    )))
                }
            }
        }
        Ok(dir)
    }

    /// [`Edit::DirAs`] at `names` (the root when there are none).
    fn dir_as(&mut self, names: &[&[u8]], shown: &Path, attrs: &Attrs) -> Result<(), SquashError> {
        let (dir, found) = match names.split_last() {
            None => (0, Some(0)),
            Some((last, parents)) => {
                let dir = self.existing_dir(parents)?;
                (dir, self.find(dir, last))
            }
        };
        match found {
            Some(ino) if self.tree.is_dir(ino) => {
                let node = &mut self.tree.inodes[ino];
                let had = (node.mode, node.uid, node.gid);
                let want = (attrs.mode & 0o7777, attrs.uid, attrs.gid);
                if had != want {
                    return Err(unsupported(format!(
                        "{} is a directory of mode {:o} owned by {}:{} in the base image, not {:o} {}:{}",
                        shown.display(),
                        had.0,
                        had.1,
                        had.2,
                        want.0,
                        want.1,
                        want.2
                    )));
                }
                node.mtime = attrs.mtime.min(self.opts.time);
            }
            Some(_) => return Err(not_a_dir(shown)),
            None => {
                let kind = empty_dir(dir);
                let name = names.last().copied().unwrap_or_default();
                self.add_as(dir, name, kind, *attrs);
            }
        }
        Ok(())
    }

    fn apply(&mut self, edit: &Edit) -> Result<(), SquashError> {
        let path = edit.path();
        let mut names: Vec<&[u8]> = Vec::new();
        let mut shown = PathBuf::from("/");
        for c in path.split('/').filter(|c| !c.is_empty()) {
            check_name(&shown, c.as_bytes())?;
            shown.push(c);
            names.push(c.as_bytes());
        }
        if let Edit::DirAs { attrs, .. } = edit {
            return self.dir_as(&names, &shown, attrs);
        }
        let Some((last, parents)) = names.split_last() else {
            return Err(SquashError::Input {
                path: PathBuf::from(path),
                what: "an edit names no entry".into(),
            });
        };
        match edit {
            Edit::NewFile { data, attrs, .. } => {
                let dir = self.existing_dir(parents)?;
                if self.find(dir, last).is_some() {
                    return Err(unsupported(format!(
                        "{} is in the base image already (a new file replaces nothing)",
                        shown.display()
                    )));
                }
                let kind = Kind::File {
                    path: PathBuf::new(),
                    size: data.len(),
                };
                let ino = self.add_as(dir, last, kind, *attrs);
                self.fresh.insert(ino, (path.to_string(), data.clone()));
                return Ok(());
            }
            Edit::DirAs { .. }
            | Edit::Dir { .. }
            | Edit::File { .. }
            | Edit::FileIfMissing { .. } => {}
        }
        let mut dir = 0;
        let mut at = PathBuf::from("/");
        for name in parents {
            at.push(String::from_utf8_lossy(name).as_ref());
            dir = self.dir(dir, name, &at)?;
        }
        match edit {
            Edit::Dir { .. } => {
                self.dir(dir, last, &shown)?;
            }
            Edit::FileIfMissing { .. } => {
                if self.find(dir, last).is_none() {
                    let ino = self.add(
                        dir,
                        last,
                        Kind::File {
                            path: PathBuf::new(),
                            size: 0,
                        },
                        NEW_EMPTY_FILE_MODE,
                    );
                    self.fresh
                        .insert(ino, (path.to_string(), FileSource::Bytes(Vec::new())));
                }
            }
            Edit::File { data, mode, .. } => {
                let kind = Kind::File {
                    path: PathBuf::new(),
                    size: data.len() as u64,
                };
                let mode = mode & 0o7777;
                let ino = match self.find(dir, last) {
                    Some(ino) if matches!(self.tree.inodes[ino].kind, Kind::File { .. }) => {
                        // Written in place, as writing through an existing
                        // file does: every name of it sees the new bytes,
                        // and it keeps its owner.
                        let node = &mut self.tree.inodes[ino];
                        if node.links > 1 {
                            self.rewritten_links += 1;
                        }
                        node.kind = kind;
                        node.mode = mode;
                        node.mtime = self.opts.time;
                        self.located.remove(&ino);
                        ino
                    }
                    Some(_) => {
                        return Err(unsupported(format!(
                            "{} is not a regular file in the base image",
                            shown.display()
                        )))
                    }
                    None => self.add(dir, last, kind, mode),
                };
                self.fresh
                    .insert(ino, (path.to_string(), FileSource::Bytes(data.clone())));
            }
            Edit::DirAs { .. } | Edit::NewFile { .. } => {}
        }
        Ok(())
    }
}

/// Writes the data of new files after the copied region: blocks for files
/// of a block or more, fragments (after the base's) for smaller ones.
/// Identical contents are stored once.
struct DataWriter<'a> {
    w: &'a mut BufWriter<File>,
    out: &'a Path,
    pos: u64,
    block_size: usize,
    deflater: Deflater,
    scratch: Vec<u8>,
    fragment: Vec<u8>,
    /// New fragment blocks: (offset, size word).
    fragments: Vec<(u64, u32)>,
    first_fragment: u32,
}

impl DataWriter<'_> {
    /// Writes one block, compressed when that is smaller; returns its size word.
    fn block(&mut self, data: &[u8]) -> Result<u32, SquashError> {
        let (bytes, flag) = if self.deflater.compress(data, &mut self.scratch) {
            (self.scratch.as_slice(), 0)
        } else {
            (data, DATA_UNCOMPRESSED)
        };
        self.w.write_all(bytes).map_err(io_err("write", self.out))?;
        let len = u32::try_from(bytes.len()).map_err(|_| too_big("a block"))?;
        self.pos += u64::from(len);
        Ok(len | flag)
    }

    fn flush_fragment(&mut self) -> Result<(), SquashError> {
        if self.fragment.is_empty() {
            return Ok(());
        }
        let at = self.pos;
        let data = std::mem::take(&mut self.fragment);
        let word = self.block(&data)?;
        self.fragments.push((at, word));
        self.fragment = data;
        self.fragment.clear();
        Ok(())
    }

    fn file(&mut self, path: &str, src: &FileSource) -> Result<Stored, SquashError> {
        let size = src.len();
        let start = self.pos;
        if size == 0 {
            return Ok((start, Vec::new(), FileData::default()));
        }
        if size < self.block_size as u64 {
            let mut data = vec![0u8; usize::try_from(size).unwrap_or(0)];
            read_all(path, src, 0, &mut data)?;
            if self.fragment.len() + data.len() > self.block_size {
                self.flush_fragment()?;
            }
            let offset = u32::try_from(self.fragment.len()).map_err(|_| too_big("a fragment"))?;
            let index = u32::try_from(self.fragments.len())
                .ok()
                .and_then(|n| self.first_fragment.checked_add(n))
                .ok_or_else(|| too_big("the fragment count"))?;
            self.fragment.extend_from_slice(&data);
            let fd = FileData {
                blocks: Vec::new(),
                fragment: Some((index, offset)),
                size,
            };
            return Ok((start, Vec::new(), fd));
        }
        let block = self.block_size as u64;
        let mut words = Vec::with_capacity(usize::try_from(size.div_ceil(block)).unwrap_or(0));
        let mut chunk = vec![0u8; self.block_size];
        let mut at = 0u64;
        while at < size {
            let n = usize::try_from((size - at).min(block)).unwrap_or(self.block_size);
            read_all(path, src, at, &mut chunk[..n])?;
            words.push(self.block(&chunk[..n])?);
            at += n as u64;
        }
        let fd = FileData {
            blocks: words.iter().map(|_| Some(0)).collect(),
            fragment: None,
            size,
        };
        Ok((start, words, fd))
    }
}

/// Where a new file's data went: start, block words, fragment.
type Stored = (u64, Vec<u32>, FileData);

fn changed(path: &str) -> SquashError {
    SquashError::Input {
        path: PathBuf::from(path),
        what: "changed size while being read".into(),
    }
}

/// Fills `buf` with the bytes of `src` from offset `at`: all of them, or
/// the source changed.
fn read_all(path: &str, src: &FileSource, at: u64, buf: &mut [u8]) -> Result<(), SquashError> {
    match src {
        FileSource::Bytes(b) => {
            let from = usize::try_from(at).map_err(|_| changed(path))?;
            let bytes = b.get(from..from + buf.len()).ok_or_else(|| changed(path))?;
            buf.copy_from_slice(bytes);
        }
        FileSource::Open(f) => {
            use std::os::unix::fs::FileExt;
            f.as_file().read_exact_at(buf, at).map_err(|e| {
                if e.kind() == std::io::ErrorKind::UnexpectedEof {
                    changed(path)
                } else {
                    SquashError::Io(crate::IoAt {
                        op: "read",
                        path: PathBuf::from(path),
                        source: e,
                    })
                }
            })?;
        }
    }
    Ok(())
}

/// A key naming a source's content: its size and SHA-256 (read through
/// once; a file that has grown is refused).
fn content_key(path: &str, src: &FileSource) -> Result<(u64, [u8; 32]), SquashError> {
    use sha2::{Digest as _, Sha256};
    let size = src.len();
    let mut h = Sha256::new();
    match src {
        FileSource::Bytes(b) => h.update(b),
        FileSource::Open(f) => {
            let mut buf = vec![0u8; usize::try_from(size.min(1 << 20)).unwrap_or(1 << 20)];
            let mut at = 0u64;
            while at < size {
                let n = usize::try_from((size - at).min(buf.len() as u64)).unwrap_or(buf.len());
                read_all(path, src, at, &mut buf[..n])?;
                h.update(&buf[..n]);
                at += n as u64;
            }
            use std::os::unix::fs::FileExt;
            let mut one = [0u8; 1];
            if f.as_file().read_at(&mut one, size).map_err(|e| {
                SquashError::Io(crate::IoAt {
                    op: "read",
                    path: PathBuf::from(path),
                    source: e,
                })
            })? != 0
            {
                return Err(changed(path));
            }
        }
    }
    Ok((size, h.finalize().into()))
}

pub(super) fn remix(
    file: &File,
    base: u64,
    len: u64,
    edits: &[Edit],
    opts: &RemixOptions,
    out: &Path,
) -> Result<RemixStats, SquashError> {
    if opts.compression_level > 9 {
        return Err(SquashError::Input {
            path: PathBuf::new(),
            what: format!("gzip level {} is not in 0..=9", opts.compression_level),
        });
    }
    let img = Image::open(file, base, len)?;
    let sb = img.sb.clone();
    if sb.compression != COMP_GZIP {
        return Err(unsupported(format!(
            "remaking an image of compression {} (sifbox writes gzip only)",
            sb.compression
        )));
    }
    if sb.xattr_table != INVALID_TABLE {
        return Err(unsupported(
            "remaking an image with extended attributes (sifbox writes none)",
        ));
    }
    let data_end = sb.inode_table;
    let Base {
        mut tree,
        mut located,
    } = read_tree(&img)?;
    let mut meta = Meta::new(&img);
    let mut fragment_records =
        Vec::with_capacity(usize::try_from(sb.fragment_count).unwrap_or(0) * FRAGMENT_ENTRY_SIZE);
    for i in 0..sb.fragment_count {
        let (start, word) = img.fragment(&mut meta, i)?;
        let size = stored_size(word, sb.block_size)?;
        if start < SUPERBLOCK_SIZE as u64 || start.checked_add(size).is_none_or(|e| e > data_end) {
            return Err(corrupt(format!(
                "fragment {i} at {start}..+{size} is outside the data region"
            )));
        }
        fragment_records.put_u64(start);
        fragment_records.put_u32(word);
        fragment_records.put_u32(0);
    }
    drop(meta);

    // No entry newer than the edits' time (the build's clamp), as a
    // fresh pack with that clamp would have it.
    let mut clamped = 0u64;
    for node in &mut tree.inodes {
        if node.mtime > opts.time {
            node.mtime = opts.time;
            clamped += 1;
        }
    }
    let mut fresh: BTreeMap<Ino, (String, FileSource)> = BTreeMap::new();
    let mut editor = Editor {
        tree: &mut tree,
        located: &mut located,
        fresh: &mut fresh,
        opts,
        rewritten_links: 0,
    };
    for e in edits {
        editor.apply(e)?;
    }
    let rewritten_links = editor.rewritten_links;

    let f = File::create(out).map_err(io_err("create", out))?;
    let mut w = BufWriter::with_capacity(1 << 20, f);
    w.write_all(&[0u8; SUPERBLOCK_SIZE])
        .map_err(io_err("write", out))?;
    // The data region, as it is.
    let mut buf = vec![0u8; 1 << 20];
    let mut at = SUPERBLOCK_SIZE as u64;
    while at < data_end {
        let n = usize::try_from((data_end - at).min(buf.len() as u64)).unwrap_or(buf.len());
        img.read_at(at, &mut buf[..n])?;
        w.write_all(&buf[..n]).map_err(io_err("write", out))?;
        at += n as u64;
    }
    let copied_bytes = data_end - SUPERBLOCK_SIZE as u64;

    let mut data = DataWriter {
        w: &mut w,
        out,
        pos: data_end,
        block_size: usize::try_from(sb.block_size).unwrap_or(1 << 17),
        deflater: Deflater::new(opts.compression_level),
        scratch: Vec::new(),
        fragment: Vec::new(),
        fragments: Vec::new(),
        first_fragment: sb.fragment_count,
    };
    let mut same: HashMap<(u64, [u8; 32]), Stored> = HashMap::new();
    let mut new_bytes = 0u64;
    for (ino, (path, src)) in &fresh {
        let key = content_key(path, src)?;
        let stored = match same.get(&key) {
            Some(s) => s.clone(),
            None => {
                let s = data.file(path, src)?;
                same.insert(key, s.clone());
                new_bytes += src.len();
                s
            }
        };
        let (start, words, mut fd) = stored;
        fd.size = src.len();
        located.insert(*ino, (start, words, fd));
    }
    data.flush_fragment()?;
    let new_end = data.pos;
    for (at, word) in std::mem::take(&mut data.fragments) {
        fragment_records.put_u64(at);
        fragment_records.put_u32(word);
        fragment_records.put_u32(0);
    }
    let fragment_count = u32::try_from(fragment_records.len() / FRAGMENT_ENTRY_SIZE)
        .map_err(|_| too_big("the fragment count"))?;

    let order = tree.number();
    let inode_count = u32::try_from(order.len()).map_err(|_| too_big("the number of inodes"))?;
    let layout = TableLayout {
        level: opts.compression_level,
        block_size: sb.block_size,
        mkfs_time: opts.time,
        extra_flags: sb.flags & FLAG_COMP_OPT,
    };
    let image_bytes = write_tables(
        &tree,
        inode_count,
        &located,
        (&fragment_records, fragment_count),
        new_end,
        w,
        out,
        &layout,
    )?;
    Ok(RemixStats {
        inodes: inode_count,
        copied_bytes,
        new_bytes,
        image_bytes,
        clamped,
        rewritten_links,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::squash::{pack, unpack, PackOptions, UnpackOptions};

    fn opts() -> RemixOptions {
        RemixOptions {
            time: 2_000_000_000,
            owner: (0, 0),
            compression_level: 6,
        }
    }

    fn base(dir: &Path) -> (PathBuf, u64) {
        let src = dir.join("src");
        std::fs::create_dir_all(src.join("etc")).expect("mkdir");
        std::fs::write(src.join("etc/file"), b"x").expect("write");
        std::os::unix::fs::symlink("etc", src.join("link")).expect("symlink");
        let img = dir.join("base.sqfs");
        pack(&src, &img, &PackOptions::default()).expect("pack");
        let len = std::fs::metadata(&img).expect("stat").len();
        (img, len)
    }

    fn try_edit(edit: Edit) -> Result<RemixStats, SquashError> {
        let t = tempfile::tempdir().expect("tmp");
        let (img, len) = base(t.path());
        let f = File::open(&img).expect("open");
        remix(&f, 0, len, &[edit], &opts(), &t.path().join("out.sqfs"))
    }

    #[test]
    fn edits_through_or_onto_other_kinds_are_unsupported() {
        for (edit, what) in [
            (
                Edit::File {
                    path: "etc/file/x".into(),
                    data: b"y".to_vec(),
                    mode: 0o644,
                },
                "/etc/file is not a directory",
            ),
            (
                Edit::File {
                    path: "link/x".into(),
                    data: Vec::new(),
                    mode: 0o644,
                },
                "/link is not a directory",
            ),
            (
                Edit::File {
                    path: "etc".into(),
                    data: Vec::new(),
                    mode: 0o644,
                },
                "/etc is not a regular file",
            ),
            (
                Edit::Dir {
                    path: "etc/file".into(),
                },
                "/etc/file is not a directory",
            ),
        ] {
            let r = try_edit(edit);
            assert!(
                matches!(&r, Err(SquashError::Unsupported { what: w }) if w.starts_with(what)),
                "{what}: {r:?}"
            );
        }
    }

    #[test]
    fn hostile_edit_names_are_refused() {
        for bad in ["../x", "a/../b", "./x"] {
            let r = try_edit(Edit::Dir { path: bad.into() });
            assert!(
                matches!(r, Err(SquashError::UnsafeEntry { .. })),
                "{bad}: {r:?}"
            );
        }
        let r = try_edit(Edit::Dir { path: "/".into() });
        assert!(matches!(r, Err(SquashError::Input { .. })), "{r:?}");
    }

    #[test]
    fn a_base_with_xattrs_is_unsupported() {
        let t = tempfile::tempdir().expect("tmp");
        let (img, len) = base(t.path());
        let mut b = std::fs::read(&img).expect("read");
        let mut sb = SuperBlock::decode(b[..SUPERBLOCK_SIZE].try_into().expect("96")).expect("sb");
        sb.xattr_table = 4096;
        b[..SUPERBLOCK_SIZE].copy_from_slice(&sb.encode());
        std::fs::write(&img, &b).expect("write");
        let f = File::open(&img).expect("open");
        let r = remix(&f, 0, len, &[], &opts(), &t.path().join("out"));
        assert!(matches!(r, Err(SquashError::Unsupported { .. })), "{r:?}");
    }

    #[test]
    fn no_edits_gives_the_same_tree() {
        let t = tempfile::tempdir().expect("tmp");
        let (img, len) = base(t.path());
        let f = File::open(&img).expect("open");
        let out = t.path().join("out.sqfs");
        let stats = remix(&f, 0, len, &[], &opts(), &out).expect("remix");
        assert_eq!(stats.inodes, 4);
        assert_eq!(stats.new_bytes, 0);
        unpack(&out, &t.path().join("x"), &UnpackOptions::for_caller()).expect("unpack");
        assert_eq!(
            std::fs::read(t.path().join("x/etc/file")).expect("read"),
            b"x"
        );
    }
}
