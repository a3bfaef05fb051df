//! Making a squashfs image from a directory tree.
//!
//! Three passes: scan the tree (lstat only, nothing followed), number the
//! inodes in the order they will be written, then stream file data through
//! a pool of compressing threads to an in-order writer, and finally build
//! the inode, directory, fragment and id tables in memory and append them.

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsStr;
use std::fs::{self, File};
use std::io::{self, BufWriter, Read, Seek, SeekFrom, Write};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};

use super::codec::Deflater;
use super::format::*;
use super::{PackOptions, PackStats, SquashError};

/// Index of an inode in [`Tree::inodes`].
pub(super) type Ino = usize;

#[derive(Debug)]
pub(super) struct Entry {
    pub(super) name: Vec<u8>,
    pub(super) inode: Ino,
}

#[derive(Debug)]
pub(super) enum Kind {
    Dir {
        entries: Vec<Entry>,
        parent: Ino,
        path: PathBuf,
    },
    File {
        path: PathBuf,
        size: u64,
    },
    Symlink(Vec<u8>),
    Block(u32),
    Char(u32),
    Fifo,
    Socket,
}

#[derive(Debug)]
pub(super) struct Inode {
    pub(super) kind: Kind,
    pub(super) mode: u16,
    pub(super) uid: u32,
    pub(super) gid: u32,
    pub(super) mtime: u32,
    /// Entries in the tree that name this inode.
    pub(super) links: u32,
    /// 1-based inode number; 0 until numbered.
    pub(super) number: u32,
}

/// The tree to write: inode 0 is the root directory.
#[derive(Debug, Default)]
pub(super) struct Tree {
    pub(super) inodes: Vec<Inode>,
}

pub(super) fn io_err<'p>(
    op: &'static str,
    path: &'p Path,
) -> impl FnOnce(io::Error) -> SquashError + 'p {
    move |source| {
        SquashError::Io(crate::IoAt {
            op,
            path: path.to_path_buf(),
            source,
        })
    }
}

fn clamp_time(secs: i64, clamp: Option<u32>) -> u32 {
    let t = u32::try_from(secs.max(0)).unwrap_or(u32::MAX);
    match clamp {
        Some(c) => t.min(c),
        None => t,
    }
}

impl Tree {
    fn inode_from(meta: &fs::Metadata, kind: Kind, opts: &PackOptions) -> Inode {
        let (uid, gid) = opts.force_owner.unwrap_or((meta.uid(), meta.gid()));
        Inode {
            kind,
            // The permission bits, setuid, setgid and sticky: 0o7777 fits in u16.
            mode: u16::try_from(meta.mode() & 0o7777).unwrap_or(0),
            uid,
            gid,
            mtime: clamp_time(meta.mtime(), opts.clamp_mtime),
            links: 1,
            number: 0,
        }
    }

    /// Reads the tree under `root` without following any symlink.
    fn scan(root: &Path, opts: &PackOptions) -> Result<Self, SquashError> {
        // The root itself may be reached through a symlink; nothing below it is followed.
        let meta = fs::metadata(root).map_err(io_err("stat", root))?;
        if !meta.is_dir() {
            return Err(SquashError::Input {
                path: root.to_path_buf(),
                what: "is not a directory".into(),
            });
        }
        let mut tree = Tree::default();
        let kind = Kind::Dir {
            entries: Vec::new(),
            parent: 0,
            path: root.to_path_buf(),
        };
        tree.inodes.push(Self::inode_from(&meta, kind, opts));
        let mut hard_links: HashMap<(u64, u64), Ino> = HashMap::new();
        let mut pending = vec![0usize];
        while let Some(dir) = pending.pop() {
            let dir_path = match &tree.inodes[dir].kind {
                Kind::Dir { path, .. } => path.clone(),
                _ => continue,
            };
            let mut names: Vec<Vec<u8>> = Vec::new();
            for item in fs::read_dir(&dir_path).map_err(io_err("read directory", &dir_path))? {
                let item = item.map_err(io_err("read directory", &dir_path))?;
                names.push(item.file_name().as_bytes().to_vec());
            }
            names.sort_unstable();
            let mut entries = Vec::with_capacity(names.len());
            for name in names {
                if name.len() > NAME_MAX {
                    return Err(SquashError::Input {
                        path: dir_path.join(OsStr::from_bytes(&name)),
                        what: format!("name longer than {NAME_MAX} bytes"),
                    });
                }
                let path = dir_path.join(OsStr::from_bytes(&name));
                let meta = fs::symlink_metadata(&path).map_err(io_err("stat", &path))?;
                let ft = meta.file_type();
                if !ft.is_dir() && meta.nlink() > 1 {
                    if let Some(&ino) = hard_links.get(&(meta.dev(), meta.ino())) {
                        tree.inodes[ino].links += 1;
                        entries.push(Entry { name, inode: ino });
                        continue;
                    }
                }
                let rdev = || {
                    let dev = meta.rdev();
                    encode_dev(rustix::fs::major(dev), rustix::fs::minor(dev))
                };
                let kind = if ft.is_dir() {
                    Kind::Dir {
                        entries: Vec::new(),
                        parent: dir,
                        path: path.clone(),
                    }
                } else if ft.is_file() {
                    Kind::File {
                        path: path.clone(),
                        size: meta.len(),
                    }
                } else if ft.is_symlink() {
                    let target = fs::read_link(&path).map_err(io_err("read link", &path))?;
                    Kind::Symlink(target.into_os_string().into_vec())
                } else if ft.is_block_device() {
                    Kind::Block(rdev())
                } else if ft.is_char_device() {
                    Kind::Char(rdev())
                } else if ft.is_fifo() {
                    Kind::Fifo
                } else if ft.is_socket() {
                    Kind::Socket
                } else {
                    return Err(SquashError::Input {
                        path,
                        what: "unknown file type".into(),
                    });
                };
                let is_dir = matches!(kind, Kind::Dir { .. });
                let ino = tree.inodes.len();
                tree.inodes.push(Self::inode_from(&meta, kind, opts));
                if is_dir {
                    pending.push(ino);
                } else if meta.nlink() > 1 {
                    hard_links.insert((meta.dev(), meta.ino()), ino);
                }
                entries.push(Entry { name, inode: ino });
            }
            if let Kind::Dir { entries: slot, .. } = &mut tree.inodes[dir].kind {
                *slot = entries;
            }
        }
        Ok(tree)
    }

    pub(super) fn entries(&self, dir: Ino) -> &[Entry] {
        match &self.inodes[dir].kind {
            Kind::Dir { entries, .. } => entries,
            _ => &[],
        }
    }

    pub(super) fn is_dir(&self, ino: Ino) -> bool {
        matches!(self.inodes[ino].kind, Kind::Dir { .. })
    }

    /// Numbers inodes in the order [`MetaBuilder`] writes them: for each
    /// directory, its subdirectories (recursively), then its other children
    /// in name order, then the directory itself. Returns that order.
    pub(super) fn number(&mut self) -> Vec<Ino> {
        let mut order = Vec::with_capacity(self.inodes.len());
        // Iterative post-order: (dir, next entry index, phase).
        let mut stack: Vec<(Ino, usize, bool)> = vec![(0, 0, false)];
        while let Some(top) = stack.last_mut() {
            let (dir, idx, others_done) = *top;
            let entries = self.entries(dir);
            if !others_done {
                // Phase 1: descend into subdirectories one by one.
                if let Some(pos) = entries[idx..]
                    .iter()
                    .position(|e| self.is_dir(e.inode))
                    .map(|p| p + idx)
                {
                    top.1 = pos + 1;
                    let child = entries[pos].inode;
                    stack.push((child, 0, false));
                    continue;
                }
                top.2 = true;
                // Phase 2: the other children, first occurrence of each inode.
                let others: Vec<Ino> = entries
                    .iter()
                    .filter(|e| !self.is_dir(e.inode))
                    .map(|e| e.inode)
                    .collect();
                for ino in others {
                    if self.inodes[ino].number == 0 {
                        order.push(ino);
                        self.inodes[ino].number = u32::try_from(order.len()).unwrap_or(u32::MAX);
                    }
                }
            }
            order.push(dir);
            self.inodes[dir].number = u32::try_from(order.len()).unwrap_or(u32::MAX);
            stack.pop();
        }
        order
    }
}

/// Where a file's data went.
#[derive(Debug, Default, Clone)]
pub(super) struct FileData {
    /// Sequence numbers of its blocks, `None` for a hole (an all-zero block).
    pub(super) blocks: Vec<Option<usize>>,
    /// (fragment index, offset in the fragment block).
    pub(super) fragment: Option<(u32, u32)>,
    pub(super) size: u64,
}

struct Job {
    seq: usize,
    data: Vec<u8>,
}

struct Done {
    seq: usize,
    input: Vec<u8>,
    output: Vec<u8>,
    compressed: bool,
}

/// What the writer thread recorded for each block: (offset, size word).
struct Written {
    blocks: Vec<(u64, u32)>,
    end: u64,
    out: BufWriter<File>,
}

fn writer_thread(
    mut out: BufWriter<File>,
    start: u64,
    results: Receiver<Done>,
    buffers: SyncSender<Vec<u8>>,
) -> io::Result<Written> {
    let mut pos = start;
    let mut waiting: BTreeMap<usize, Done> = BTreeMap::new();
    let mut blocks: Vec<(u64, u32)> = Vec::new();
    for done in results {
        waiting.insert(done.seq, done);
        while let Some(done) = waiting.remove(&blocks.len()) {
            let (bytes, word) = if done.compressed {
                (&done.output, 0)
            } else {
                (&done.input, DATA_UNCOMPRESSED)
            };
            out.write_all(bytes)?;
            let len =
                u32::try_from(bytes.len()).map_err(|_| io::Error::other("block too large"))?;
            blocks.push((pos, len | word));
            pos += u64::from(len);
            // Hand the input buffer back; a closed channel means the reader stopped.
            let _ = buffers.try_send(done.input);
        }
    }
    Ok(Written {
        blocks,
        end: pos,
        out,
    })
}

fn worker_thread(jobs: &Mutex<Receiver<Job>>, results: &mpsc::Sender<Done>, level: u32) {
    let mut deflater = Deflater::new(level);
    loop {
        let job = {
            let Ok(rx) = jobs.lock() else { return };
            match rx.recv() {
                Ok(job) => job,
                Err(_) => return,
            }
        };
        let mut output = Vec::new();
        let compressed = deflater.compress(&job.data, &mut output);
        let done = Done {
            seq: job.seq,
            input: job.data,
            output,
            compressed,
        };
        if results.send(done).is_err() {
            return;
        }
    }
}

/// Reads file data in order and feeds the compressing pipeline.
struct Feeder<'a> {
    jobs: SyncSender<Job>,
    buffers: &'a Receiver<Vec<u8>>,
    seq: usize,
    block_size: usize,
    fragment: Vec<u8>,
    fragment_seqs: Vec<usize>,
    /// Files already stored, by size and SHA-256 of their content: an
    /// identical file reuses their data (as mksquashfs does).
    stored: HashMap<(u64, [u8; 32]), FileData>,
    scratch: Vec<u8>,
    /// Pool buffers taken but not sent (end of a file, a hole): used next,
    /// so that the pool never shrinks.
    spare: Vec<Vec<u8>>,
}

/// Reads until `buf` is full or the file ends; returns the bytes read.
fn fill(file: &mut File, buf: &mut [u8], path: &Path) -> Result<usize, SquashError> {
    let mut filled = 0;
    while filled < buf.len() {
        match file.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io_err("read", path)(e)),
        }
    }
    Ok(filled)
}

impl Feeder<'_> {
    fn buffer(&mut self) -> Option<Vec<u8>> {
        let mut b = match self.spare.pop() {
            Some(b) => b,
            None => self.buffers.recv().ok()?,
        };
        b.clear();
        Some(b)
    }

    /// Sends one block; `false` when the pipeline stopped (its error is
    /// collected when joining the writer).
    fn send(&mut self, data: Vec<u8>) -> bool {
        let seq = self.seq;
        self.seq += 1;
        self.jobs.send(Job { seq, data }).is_ok()
    }

    fn flush_fragment(&mut self) -> bool {
        if self.fragment.is_empty() {
            return true;
        }
        let Some(next) = self.buffer() else {
            return false;
        };
        let full = std::mem::replace(&mut self.fragment, next);
        self.fragment_seqs.push(self.seq);
        self.send(full)
    }

    fn file(&mut self, path: &Path, size: u64) -> Result<Option<FileData>, SquashError> {
        let mut data = FileData {
            size,
            ..FileData::default()
        };
        if size == 0 {
            return Ok(Some(data));
        }
        let nofollow = i32::try_from(rustix::fs::OFlags::NOFOLLOW.bits()).unwrap_or(0);
        let mut file = fs::OpenOptions::new()
            .read(true)
            .custom_flags(nofollow)
            .open(path)
            .map_err(io_err("open", path))?;
        let changed = || SquashError::Input {
            path: path.to_path_buf(),
            what: "changed size while being packed".into(),
        };
        let block = self.block_size as u64;
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.resize(self.block_size, 0);
        if size < block {
            // A small file goes into the shared fragment block.
            let len = fill(&mut file, &mut scratch, path)?;
            if len as u64 != size {
                return Err(changed());
            }
            let key = (size, Sha256::digest(&scratch[..len]).into());
            if let Some(same) = self.stored.get(&key) {
                self.scratch = scratch;
                return Ok(Some(same.clone()));
            }
            if self.fragment.len() + len > self.block_size && !self.flush_fragment() {
                return Ok(None);
            }
            let offset = self.fragment.len();
            self.fragment.extend_from_slice(&scratch[..len]);
            self.scratch = scratch;
            let index = u32::try_from(self.fragment_seqs.len()).map_err(|_| changed())?;
            data.fragment = Some((index, u32::try_from(offset).map_err(|_| changed())?));
            self.stored.insert(key, data.clone());
            return Ok(Some(data));
        }
        // First pass: the content's hash, to find an identical file stored before.
        let mut hasher = Sha256::new();
        let mut seen = 0u64;
        loop {
            let n = fill(&mut file, &mut scratch, path)?;
            hasher.update(&scratch[..n]);
            seen += n as u64;
            if n < scratch.len() {
                break;
            }
        }
        self.scratch = scratch;
        if seen != size {
            return Err(changed());
        }
        let key = (size, hasher.finalize().into());
        if let Some(same) = self.stored.get(&key) {
            return Ok(Some(same.clone()));
        }
        file.seek(SeekFrom::Start(0))
            .map_err(io_err("seek in", path))?;
        let mut total = 0u64;
        loop {
            let Some(mut buf) = self.buffer() else {
                return Ok(None);
            };
            buf.resize(self.block_size, 0);
            let filled = fill(&mut file, &mut buf, path)?;
            buf.truncate(filled);
            if filled == 0 {
                self.spare.push(buf);
                break;
            }
            total += filled as u64;
            if total > size {
                return Err(changed());
            }
            if buf.iter().all(|&b| b == 0) {
                data.blocks.push(None);
                self.spare.push(buf);
            } else {
                data.blocks.push(Some(self.seq));
                if !self.send(buf) {
                    return Ok(None);
                }
            }
            if filled < self.block_size {
                break;
            }
        }
        if total != size {
            return Err(changed());
        }
        self.stored.insert(key, data.clone());
        Ok(Some(data))
    }
}

/// Accumulates a metadata table (inodes or directories) as compressed
/// 8 KiB blocks.
struct MetaWriter<'a> {
    out: Vec<u8>,
    current: Vec<u8>,
    deflater: &'a mut Deflater,
    scratch: Vec<u8>,
}

impl<'a> MetaWriter<'a> {
    fn new(deflater: &'a mut Deflater) -> Self {
        Self {
            out: Vec::new(),
            current: Vec::with_capacity(METADATA_SIZE),
            deflater,
            scratch: Vec::new(),
        }
    }

    /// (offset of the current block in the table, offset inside it).
    fn position(&self) -> (u64, u16) {
        (
            self.out.len() as u64,
            u16::try_from(self.current.len()).unwrap_or(u16::MAX),
        )
    }

    fn write(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let room = METADATA_SIZE - self.current.len();
            let n = room.min(bytes.len());
            self.current.extend_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
            if self.current.len() == METADATA_SIZE {
                self.flush();
            }
        }
    }

    fn flush(&mut self) {
        if self.current.is_empty() {
            return;
        }
        let len = self.current.len();
        if self.deflater.compress(&self.current, &mut self.scratch) {
            self.out
                .put_u16(u16::try_from(self.scratch.len()).unwrap_or(0));
            self.out.extend_from_slice(&self.scratch);
        } else {
            self.out
                .put_u16(u16::try_from(len).unwrap_or(0) | META_UNCOMPRESSED);
            self.out.extend_from_slice(&self.current);
        }
        self.current.clear();
    }

    fn finish(mut self) -> Vec<u8> {
        self.flush();
        self.out
    }
}

/// Lays out a table of fixed-size records as metadata blocks followed by
/// the u64 index of those blocks. Returns (bytes, offset of the index in
/// them); `base` is where the bytes will start in the image.
fn lookup_table(records: &[u8], base: u64, deflater: &mut Deflater) -> (Vec<u8>, u64) {
    let mut blocks = Vec::new();
    let mut index = Vec::new();
    let mut scratch = Vec::new();
    for chunk in records.chunks(METADATA_SIZE) {
        index.push(base + blocks.len() as u64);
        if deflater.compress(chunk, &mut scratch) {
            blocks.put_u16(u16::try_from(scratch.len()).unwrap_or(0));
            blocks.extend_from_slice(&scratch);
        } else {
            blocks.put_u16(u16::try_from(chunk.len()).unwrap_or(0) | META_UNCOMPRESSED);
            blocks.extend_from_slice(chunk);
        }
    }
    let index_at = base + blocks.len() as u64;
    for i in index {
        blocks.put_u64(i);
    }
    (blocks, index_at)
}

struct Ids {
    list: Vec<u32>,
    map: HashMap<u32, u16>,
}

impl Ids {
    fn index(&mut self, id: u32) -> Result<u16, SquashError> {
        if let Some(&i) = self.map.get(&id) {
            return Ok(i);
        }
        let i = u16::try_from(self.list.len()).map_err(|_| SquashError::Input {
            path: PathBuf::new(),
            what: "more than 65536 distinct owner ids".into(),
        })?;
        self.list.push(id);
        self.map.insert(id, i);
        Ok(i)
    }
}

pub(super) fn too_big(what: &str) -> SquashError {
    SquashError::Input {
        path: PathBuf::new(),
        what: format!("{what} exceeds the squashfs limits"),
    }
}

/// Builds the inode and directory tables.
struct MetaBuilder<'t, 'd> {
    tree: &'t Tree,
    files: &'t Located,
    inodes: MetaWriter<'d>,
    dirs: MetaWriter<'d>,
    ids: Ids,
    /// Inode reference ((block << 16) | offset) of each written inode.
    refs: HashMap<Ino, u64>,
    block_size: u32,
}

impl MetaBuilder<'_, '_> {
    fn header(&mut self, ino: Ino, kind: u16) -> Result<Vec<u8>, SquashError> {
        let node = &self.tree.inodes[ino];
        let mut b = Vec::with_capacity(64);
        b.put_u16(kind);
        b.put_u16(node.mode);
        b.put_u16(self.ids.index(node.uid)?);
        b.put_u16(self.ids.index(node.gid)?);
        b.put_u32(node.mtime);
        b.put_u32(node.number);
        Ok(b)
    }

    fn emit(&mut self, ino: Ino, bytes: &[u8]) -> Result<(), SquashError> {
        let (block, offset) = self.inodes.position();
        if block > u64::from(u32::MAX) {
            return Err(too_big("the inode table"));
        }
        self.refs.insert(ino, (block << 16) | u64::from(offset));
        self.inodes.write(bytes);
        Ok(())
    }

    fn write_leaf(&mut self, ino: Ino) -> Result<(), SquashError> {
        let node = &self.tree.inodes[ino];
        let links = node.links;
        let b = match &node.kind {
            Kind::Dir { .. } => return Ok(()),
            Kind::File { .. } => {
                let Some((start, words, data)) = self.files.get(&ino) else {
                    return Err(too_big("a file"));
                };
                let (frag, frag_offset) = data.fragment.unwrap_or((INVALID_FRAG, 0));
                let holes = data.blocks.iter().filter(|b| b.is_none()).count() as u64;
                let sparse = (holes * u64::from(self.block_size)).min(data.size);
                let basic = links == 1
                    && sparse == 0
                    && u32::try_from(data.size).is_ok()
                    && u32::try_from(*start).is_ok();
                let mut b;
                if basic {
                    b = self.header(ino, T_FILE)?;
                    b.put_u32(u32::try_from(*start).unwrap_or(0));
                    b.put_u32(frag);
                    b.put_u32(frag_offset);
                    b.put_u32(u32::try_from(data.size).unwrap_or(0));
                } else {
                    b = self.header(ino, T_LFILE)?;
                    b.put_u64(*start);
                    b.put_u64(data.size);
                    b.put_u64(sparse);
                    b.put_u32(links);
                    b.put_u32(frag);
                    b.put_u32(frag_offset);
                    b.put_u32(INVALID_XATTR);
                }
                for w in words {
                    b.put_u32(*w);
                }
                b
            }
            Kind::Symlink(target) => {
                let mut b = self.header(ino, T_SYMLINK)?;
                b.put_u32(links);
                b.put_u32(u32::try_from(target.len()).map_err(|_| too_big("a symlink"))?);
                b.extend_from_slice(target);
                b
            }
            Kind::Block(dev) | Kind::Char(dev) => {
                let t = if matches!(node.kind, Kind::Block(_)) {
                    T_BLKDEV
                } else {
                    T_CHRDEV
                };
                let mut b = self.header(ino, t)?;
                b.put_u32(links);
                b.put_u32(*dev);
                b
            }
            Kind::Fifo | Kind::Socket => {
                let t = if matches!(node.kind, Kind::Fifo) {
                    T_FIFO
                } else {
                    T_SOCKET
                };
                let mut b = self.header(ino, t)?;
                b.put_u32(links);
                b
            }
        };
        self.emit(ino, &b)
    }

    /// Writes the listing of `dir` (its children's inodes are written) and
    /// returns (block, offset, size) as stored in the directory inode.
    fn write_listing(&mut self, dir: Ino) -> Result<(u64, u16, u32), SquashError> {
        let (block, offset) = self.dirs.position();
        let entries = self.tree.entries(dir);
        let inodes = &self.tree.inodes;
        let reference = |e: &Entry| {
            self.refs
                .get(&e.inode)
                .copied()
                .ok_or_else(|| too_big("a directory"))
        };
        let mut buf = Vec::new();
        let mut i = 0;
        while i < entries.len() {
            let first = reference(&entries[i])?;
            let first_block = first >> 16;
            let base = inodes[entries[i].inode].number;
            let mut j = i;
            let mut bytes = 12usize;
            while j < entries.len() && j - i < DIR_HEADER_MAX {
                let r = reference(&entries[j])?;
                let delta = i64::from(inodes[entries[j].inode].number) - i64::from(base);
                let size = 8 + entries[j].name.len();
                if r >> 16 != first_block
                    || i16::try_from(delta).is_err()
                    || (j > i && bytes + size > METADATA_SIZE)
                {
                    break;
                }
                bytes += size;
                j += 1;
            }
            buf.put_u32(u32::try_from(j - i - 1).unwrap_or(0));
            buf.put_u32(u32::try_from(first_block).map_err(|_| too_big("the inode table"))?);
            buf.put_u32(base);
            for e in &entries[i..j] {
                let node = &inodes[e.inode];
                let r = reference(e)?;
                let delta = i64::from(node.number) - i64::from(base);
                buf.put_u16(u16::try_from(r & 0xffff).unwrap_or(0));
                buf.extend_from_slice(&i16::try_from(delta).unwrap_or(0).to_le_bytes());
                buf.put_u16(basic_type(&node.kind));
                let len = e
                    .name
                    .len()
                    .checked_sub(1)
                    .and_then(|l| u16::try_from(l).ok());
                buf.put_u16(len.ok_or_else(|| too_big("a name"))?);
                buf.extend_from_slice(&e.name);
            }
            i = j;
        }
        self.dirs.write(&buf);
        let size = u32::try_from(buf.len() + 3).map_err(|_| too_big("a directory"))?;
        Ok((block, offset, size))
    }

    fn write_dir(&mut self, dir: Ino, root_parent: u32) -> Result<(), SquashError> {
        let entries = self.tree.entries(dir);
        let leaves: Vec<Ino> = entries
            .iter()
            .map(|e| e.inode)
            .filter(|&i| !self.tree.is_dir(i))
            .collect();
        let subdirs = entries.len() - leaves.len();
        for ino in leaves {
            if !self.refs.contains_key(&ino) {
                self.write_leaf(ino)?;
            }
        }
        let (block, offset, size) = self.write_listing(dir)?;
        let block = u32::try_from(block).map_err(|_| too_big("the directory table"))?;
        let nlink = u32::try_from(subdirs + 2).map_err(|_| too_big("a directory"))?;
        let parent = match &self.tree.inodes[dir].kind {
            Kind::Dir { parent, .. } if dir != 0 => self.tree.inodes[*parent].number,
            _ => root_parent,
        };
        let b = match u16::try_from(size) {
            Ok(size16) => {
                let mut b = self.header(dir, T_DIR)?;
                b.put_u32(block);
                b.put_u32(nlink);
                b.put_u16(size16);
                b.put_u16(offset);
                b.put_u32(parent);
                b
            }
            Err(_) => {
                let mut b = self.header(dir, T_LDIR)?;
                b.put_u32(nlink);
                b.put_u32(size);
                b.put_u32(block);
                b.put_u32(parent);
                b.put_u16(0); // no directory index
                b.put_u16(offset);
                b.put_u32(INVALID_XATTR);
                b
            }
        };
        self.emit(dir, &b)
    }

    /// Writes every inode and listing in the order of [`Tree::number`].
    fn build(&mut self, root_parent: u32) -> Result<(), SquashError> {
        let mut stack: Vec<(Ino, usize)> = vec![(0, 0)];
        while let Some(top) = stack.last_mut() {
            let (dir, idx) = *top;
            let entries = self.tree.entries(dir);
            if let Some(pos) = entries[idx..]
                .iter()
                .position(|e| self.tree.is_dir(e.inode))
                .map(|p| p + idx)
            {
                top.1 = pos + 1;
                stack.push((entries[pos].inode, 0));
                continue;
            }
            self.write_dir(dir, root_parent)?;
            stack.pop();
        }
        Ok(())
    }
}

fn basic_type(kind: &Kind) -> u16 {
    match kind {
        Kind::Dir { .. } => T_DIR,
        Kind::File { .. } => T_FILE,
        Kind::Symlink(_) => T_SYMLINK,
        Kind::Block(_) => T_BLKDEV,
        Kind::Char(_) => T_CHRDEV,
        Kind::Fifo => T_FIFO,
        Kind::Socket => T_SOCKET,
    }
}

/// Packs `dir` into a new squashfs image at `out`.
pub(super) fn pack(dir: &Path, out: &Path, opts: &PackOptions) -> Result<PackStats, SquashError> {
    let block_size = opts.block_size;
    if !block_size.is_power_of_two() || !(4096..=1 << 20).contains(&block_size) {
        return Err(SquashError::Input {
            path: PathBuf::new(),
            what: format!("block size {block_size} is not a power of two from 4096 to 1048576"),
        });
    }
    if opts.compression_level > 9 {
        return Err(SquashError::Input {
            path: PathBuf::new(),
            what: format!("gzip level {} is not in 0..=9", opts.compression_level),
        });
    }
    let tree = Tree::scan(dir, opts)?;
    write_tree(tree, out, opts)
}

/// Writes the image of a scanned (or, in tests, hand-made) tree.
fn write_tree(mut tree: Tree, out: &Path, opts: &PackOptions) -> Result<PackStats, SquashError> {
    let block_size = opts.block_size;
    let block_len = usize::try_from(block_size).map_err(|_| too_big("the block size"))?;
    let order = tree.number();
    let inode_count = u32::try_from(order.len()).map_err(|_| too_big("the number of inodes"))?;

    let file = File::create(out).map_err(io_err("create", out))?;
    let mut w = BufWriter::with_capacity(1 << 20, file);
    w.write_all(&[0u8; SUPERBLOCK_SIZE])
        .map_err(io_err("write", out))?;

    let threads = match opts.threads {
        0 => std::thread::available_parallelism().map_or(1, usize::from),
        n => n,
    };
    let in_flight = threads * 4;
    let (buf_tx, buf_rx) = mpsc::sync_channel::<Vec<u8>>(in_flight);
    for _ in 0..in_flight {
        let _ = buf_tx.try_send(Vec::with_capacity(block_len));
    }
    let (job_tx, job_rx) = mpsc::sync_channel::<Job>(threads);
    let job_rx = Arc::new(Mutex::new(job_rx));
    let (done_tx, done_rx) = mpsc::channel::<Done>();

    let (files, fragment_seqs, written) = std::thread::scope(|s| {
        let writer = s.spawn(move || writer_thread(w, SUPERBLOCK_SIZE as u64, done_rx, buf_tx));
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                let done_tx = done_tx.clone();
                let job_rx = Arc::clone(&job_rx);
                let level = opts.compression_level;
                s.spawn(move || worker_thread(&job_rx, &done_tx, level))
            })
            .collect();
        // Only the workers hold the job queue's receiver and the results'
        // senders: when the writer fails, the workers stop, and then so does
        // every send of the feeder (no thread waits forever).
        drop(done_tx);
        drop(job_rx);
        let mut feeder = Feeder {
            jobs: job_tx,
            buffers: &buf_rx,
            seq: 0,
            block_size: block_len,
            fragment: Vec::with_capacity(block_len),
            fragment_seqs: Vec::new(),
            stored: HashMap::new(),
            scratch: Vec::new(),
            spare: Vec::new(),
        };
        let mut files: HashMap<Ino, FileData> = HashMap::new();
        let mut result = Ok(());
        for &ino in &order {
            if let Kind::File { path, size } = &tree.inodes[ino].kind {
                match feeder.file(path, *size) {
                    Ok(Some(data)) => {
                        files.insert(ino, data);
                    }
                    Ok(None) => break,
                    Err(e) => {
                        result = Err(e);
                        break;
                    }
                }
            }
        }
        if result.is_ok() {
            feeder.flush_fragment();
        }
        let fragment_seqs = std::mem::take(&mut feeder.fragment_seqs);
        let sent = feeder.seq;
        drop(feeder);
        for worker in workers {
            let _ = worker.join();
        }
        let written = match writer.join() {
            Ok(Ok(w)) => Ok(w),
            Ok(Err(e)) => Err(io_err("write", out)(e)),
            Err(_) => Err(io_err("write", out)(io::Error::other(
                "writer thread panicked",
            ))),
        };
        let written = result.and(written)?;
        if written.blocks.len() != sent {
            return Err(io_err("write", out)(io::Error::other(
                "data pipeline stopped early",
            )));
        }
        Ok::<_, SquashError>((files, fragment_seqs, written))
    })?;

    let Written {
        blocks,
        end: data_end,
        out: w,
    } = written;
    let mut located: Located = HashMap::with_capacity(files.len());
    let mut data_bytes = 0u64;
    for (ino, data) in files {
        let mut start = None;
        let mut words = Vec::with_capacity(data.blocks.len());
        for b in &data.blocks {
            match b {
                None => words.push(0),
                Some(seq) => {
                    let (off, word) = blocks[*seq];
                    start.get_or_insert(off);
                    words.push(word);
                }
            }
        }
        data_bytes += data.size;
        located.insert(ino, (start.unwrap_or(data_end), words, data));
    }
    let mut fragment_records = Vec::with_capacity(fragment_seqs.len() * FRAGMENT_ENTRY_SIZE);
    for seq in &fragment_seqs {
        let (off, word) = blocks[*seq];
        fragment_records.put_u64(off);
        fragment_records.put_u32(word);
        fragment_records.put_u32(0);
    }

    let newest = tree.inodes.iter().map(|i| i.mtime).max().unwrap_or(0);
    let layout = TableLayout {
        level: opts.compression_level,
        block_size,
        mkfs_time: opts.mkfs_time.unwrap_or(newest),
        extra_flags: 0,
    };
    let fragment_count =
        u32::try_from(fragment_seqs.len()).map_err(|_| too_big("the fragment count"))?;
    let padded = write_tables(
        &tree,
        inode_count,
        &located,
        (&fragment_records, fragment_count),
        data_end,
        w,
        out,
        &layout,
    )?;
    Ok(PackStats {
        inodes: inode_count,
        data_bytes,
        image_bytes: padded,
        fragments: fragment_count,
    })
}

/// Where a regular file's data lies: its first block, the size words of
/// its blocks (0 for a hole) and what [`FileData`] says of it.
pub(super) type Located = HashMap<Ino, (u64, Vec<u32>, FileData)>;

/// How [`write_tables`] writes the tables and the superblock.
pub(super) struct TableLayout {
    /// gzip level of the metadata blocks.
    pub(super) level: u32,
    pub(super) block_size: u32,
    /// The superblock's modification time.
    pub(super) mkfs_time: u32,
    /// Superblock flags to set besides "no xattrs" and "duplicates".
    pub(super) extra_flags: u16,
}

/// Appends the inode, directory, fragment and id tables of a numbered
/// `tree` (see [`Tree::number`]) to `w`, which holds the superblock's room
/// and the data up to `data_end`, pads the image to 4 KiB and writes the
/// superblock. `fragments` are the fragment table's records (16 bytes
/// each) and their count. Returns the padded size.
#[allow(clippy::too_many_arguments)]
pub(super) fn write_tables(
    tree: &Tree,
    inode_count: u32,
    located: &Located,
    fragments: (&[u8], u32),
    data_end: u64,
    mut w: BufWriter<File>,
    out: &Path,
    layout: &TableLayout,
) -> Result<u64, SquashError> {
    let (fragment_records, fragment_count) = fragments;
    let block_size = layout.block_size;
    let mut inode_deflater = Deflater::new(layout.level);
    let mut dir_deflater = Deflater::new(layout.level);
    let mut builder = MetaBuilder {
        tree,
        files: located,
        inodes: MetaWriter::new(&mut inode_deflater),
        dirs: MetaWriter::new(&mut dir_deflater),
        ids: Ids {
            list: Vec::new(),
            map: HashMap::new(),
        },
        refs: HashMap::with_capacity(tree.inodes.len()),
        block_size,
    };
    builder.build(inode_count + 1)?;
    let root_ref = builder.refs.get(&0).copied().unwrap_or(0);
    let ids = std::mem::take(&mut builder.ids.list);
    let inode_table = builder.inodes.finish();
    let dir_table = builder.dirs.finish();

    let mut deflater = Deflater::new(layout.level);
    let inode_start = data_end;
    let dir_start = inode_start + inode_table.len() as u64;
    let frag_start = dir_start + dir_table.len() as u64;
    let (frag_bytes, frag_index) = lookup_table(fragment_records, frag_start, &mut deflater);
    let id_start = frag_start + frag_bytes.len() as u64;
    let mut id_records = Vec::with_capacity(ids.len() * 4);
    for id in &ids {
        id_records.put_u32(*id);
    }
    let (id_bytes, id_index) = lookup_table(&id_records, id_start, &mut deflater);
    let bytes_used = id_start + id_bytes.len() as u64;
    for part in [&inode_table, &dir_table, &frag_bytes, &id_bytes] {
        w.write_all(part).map_err(io_err("write", out))?;
    }
    let padded = bytes_used.div_ceil(4096) * 4096;
    let pad = usize::try_from(padded - bytes_used).unwrap_or(0);
    w.write_all(&vec![0u8; pad]).map_err(io_err("write", out))?;

    let sb = SuperBlock {
        inode_count,
        mod_time: layout.mkfs_time,
        block_size,
        fragment_count,
        compression: COMP_GZIP,
        block_log: u16::try_from(block_size.trailing_zeros()).unwrap_or(17),
        flags: FLAG_NO_XATTRS | FLAG_DUPLICATES | layout.extra_flags,
        id_count: u16::try_from(ids.len()).map_err(|_| too_big("the id count"))?,
        version_major: 4,
        version_minor: 0,
        root_inode: root_ref,
        bytes_used,
        id_table: id_index,
        xattr_table: INVALID_TABLE,
        inode_table: inode_start,
        dir_table: dir_start,
        frag_table: frag_index,
        export_table: INVALID_TABLE,
    };
    w.seek(SeekFrom::Start(0)).map_err(io_err("seek", out))?;
    w.write_all(&sb.encode()).map_err(io_err("write", out))?;
    w.flush().map_err(io_err("write", out))?;
    Ok(padded)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::squash::{unpack, UnpackOptions};

    fn dir(entries: Vec<Entry>, parent: Ino) -> Inode {
        Inode {
            kind: Kind::Dir {
                entries,
                parent,
                path: PathBuf::new(),
            },
            mode: 0o755,
            uid: 0,
            gid: 0,
            mtime: 1,
            links: 1,
            number: 0,
        }
    }

    fn leaf(kind: Kind) -> Inode {
        Inode {
            kind,
            mode: 0o644,
            uid: 0,
            gid: 0,
            mtime: 1,
            links: 1,
            number: 0,
        }
    }

    fn entry(name: &[u8], inode: Ino) -> Entry {
        Entry {
            name: name.to_vec(),
            inode,
        }
    }

    /// Packs a hand-made tree (names are not checked when packing this way)
    /// and unpacks it into `base/out`.
    fn attempt(tree: Tree, base: &Path) -> Result<super::super::UnpackStats, SquashError> {
        let img = base.join("img.sqfs");
        write_tree(tree, &img, &PackOptions::default()).expect("pack");
        unpack(&img, &base.join("out"), &UnpackOptions::for_caller())
    }

    #[test]
    fn hostile_names_are_refused() {
        // (An empty name cannot be encoded: the format stores length - 1.)
        for bad in [&b".."[..], b".", b"a/b", b"/etc", b"x\0y", b"../../etc"] {
            let tmp = tempfile::tempdir().expect("tmp");
            let tree = Tree {
                inodes: vec![dir(vec![entry(bad, 1)], 0), leaf(Kind::Fifo)],
            };
            let r = attempt(tree, tmp.path());
            assert!(
                matches!(r, Err(SquashError::UnsafeEntry { .. })),
                "{bad:?}: {r:?}"
            );
            // Nothing was created next to the destination.
            let names: Vec<_> = fs::read_dir(tmp.path())
                .expect("ls")
                .map(|e| e.expect("e").file_name())
                .collect();
            assert_eq!(names.len(), 2, "{names:?}");
        }
    }

    #[test]
    fn no_writing_through_symlinks() {
        // "link" -> the outside, then a directory of the same name holding a
        // file, and a file of the same name: both must fail, nothing outside.
        let tmp = tempfile::tempdir().expect("tmp");
        let outside = tmp.path().join("outside");
        fs::create_dir(&outside).expect("outside");
        let src = tmp.path().join("payload");
        fs::write(&src, b"pwned").expect("payload");
        let target = outside.as_os_str().as_bytes().to_vec();
        for second in [0, 1] {
            let mut inodes = vec![
                dir(vec![entry(b"link", 1), entry(b"link", 2)], 0),
                leaf(Kind::Symlink(target.clone())),
            ];
            if second == 0 {
                inodes.push(dir(vec![entry(b"pwn", 3)], 0));
                inodes.push(leaf(Kind::File {
                    path: src.clone(),
                    size: 5,
                }));
            } else {
                inodes.push(leaf(Kind::File {
                    path: src.clone(),
                    size: 5,
                }));
            }
            let base = tmp.path().join(format!("case{second}"));
            fs::create_dir(&base).expect("base");
            let r = attempt(Tree { inodes }, &base);
            assert!(r.is_err(), "case {second}: {r:?}");
            assert_eq!(
                fs::read_dir(&outside).expect("ls").count(),
                0,
                "wrote outside"
            );
        }
    }

    #[test]
    fn absolute_and_dotdot_symlink_targets_stay_links() {
        let tmp = tempfile::tempdir().expect("tmp");
        let inodes = vec![
            dir(vec![entry(b"abs", 1), entry(b"up", 2)], 0),
            leaf(Kind::Symlink(b"/etc/shadow".to_vec())),
            leaf(Kind::Symlink(b"../../..".to_vec())),
        ];
        attempt(Tree { inodes }, tmp.path()).expect("unpack");
        let out = tmp.path().join("out");
        assert_eq!(
            fs::read_link(out.join("abs")).expect("abs"),
            Path::new("/etc/shadow")
        );
        assert_eq!(
            fs::read_link(out.join("up")).expect("up"),
            Path::new("../../..")
        );
    }

    #[test]
    fn directory_loops_are_refused() {
        // Root holds one directory "d"; patch its entry to point back at the
        // root inode (metadata is stored uncompressed at level 0).
        let tmp = tempfile::tempdir().expect("tmp");
        let tree = Tree {
            inodes: vec![dir(vec![entry(b"d", 1)], 0), dir(vec![], 0)],
        };
        let img = tmp.path().join("img.sqfs");
        let opts = PackOptions {
            compression_level: 0,
            ..PackOptions::default()
        };
        write_tree(tree, &img, &opts).expect("pack");
        let mut b = fs::read(&img).expect("read");
        let sb = SuperBlock::decode(b[..SUPERBLOCK_SIZE].try_into().expect("96")).expect("sb");
        let dir_table = usize::try_from(sb.dir_table).expect("usize");
        // Entry: offset u16, delta i16, type u16 = 1, size u16 = 0, name "d".
        let at = b[dir_table..]
            .windows(5)
            .position(|w| w == [1, 0, 0, 0, b'd'])
            .expect("entry")
            + dir_table;
        let root_offset = u16::try_from(sb.root_inode & 0xffff).expect("u16");
        let root_block = u32::try_from(sb.root_inode >> 16).expect("u32");
        b[at - 4..at - 2].copy_from_slice(&root_offset.to_le_bytes());
        b[at - 12..at - 8].copy_from_slice(&root_block.to_le_bytes());
        fs::write(&img, &b).expect("write");
        let r = unpack(&img, &tmp.path().join("out"), &UnpackOptions::for_caller());
        assert!(
            matches!(&r, Err(SquashError::Corrupt { what }) if what.contains("loop")),
            "{r:?}"
        );
    }

    #[test]
    fn a_failing_output_is_an_error_not_a_hang() {
        // Enough incompressible data to fill every queue of the pipeline.
        let tmp = tempfile::tempdir().expect("tmp");
        let mut x = 0x2545_f491_4f6c_dd1d_u64;
        let noise: Vec<u8> = (0..12 << 20)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x.to_le_bytes()[0]
            })
            .collect();
        fs::write(tmp.path().join("noise"), &noise).expect("noise");
        let opts = PackOptions {
            compression_level: 1,
            ..PackOptions::default()
        };
        let r = pack(tmp.path(), Path::new("/dev/full"), &opts);
        assert!(matches!(&r, Err(SquashError::Io(_))), "{r:?}");
    }

    #[test]
    fn options_are_checked() {
        let tmp = tempfile::tempdir().expect("tmp");
        let bad_block = PackOptions {
            block_size: 5000,
            ..PackOptions::default()
        };
        assert!(pack(tmp.path(), &tmp.path().join("x"), &bad_block).is_err());
        let bad_level = PackOptions {
            compression_level: 10,
            ..PackOptions::default()
        };
        assert!(pack(tmp.path(), &tmp.path().join("x"), &bad_level).is_err());
        let file = tmp.path().join("file");
        fs::write(&file, b"x").expect("file");
        assert!(matches!(
            pack(&file, &tmp.path().join("x"), &PackOptions::default()),
            Err(SquashError::Input { .. })
        ));
    }
}
