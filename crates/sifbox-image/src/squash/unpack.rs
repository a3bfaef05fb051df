//! Extracting a squashfs image into a directory, treating the image as
//! untrusted: every offset and size is checked before use, allocations are
//! bounded by the image size or fixed limits, and all writes go through a
//! `cap_std::fs::Dir` for the destination, so no name in the image can
//! reach outside it.

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Mutex};

use cap_std::ambient_authority;
use cap_std::fs::{Dir, OpenOptions};
use rustix::fs::{AtFlags, FileType, Gid, Mode, Timespec, Timestamps, Uid};

use super::codec::{InflateError, Inflater};
use super::format::*;
use super::{DeviceNodes, Owners, SquashError, UnpackOptions, UnpackStats};

/// Files with more blocks than this are refused (16 TiB at 1 MiB blocks),
/// which bounds the block list kept per file.
const MAX_FILE_BLOCKS: u64 = 1 << 24;
/// Symlink targets longer than this cannot be created on Linux anyway.
const MAX_SYMLINK: u32 = 4096;
/// Decompressed metadata blocks kept in memory at once.
const META_CACHE_BLOCKS: usize = 512;

pub(super) fn corrupt(what: impl Into<String>) -> SquashError {
    SquashError::Corrupt { what: what.into() }
}

/// The validated superblock and the bytes it lives in.
pub(super) struct Image<'f> {
    file: &'f File,
    base: u64,
    pub(super) sb: SuperBlock,
    ids: Vec<u32>,
    frag_index: Vec<u64>,
}

impl<'f> Image<'f> {
    /// Checks the superblock of the image at `base..base+len` in `file`.
    pub(super) fn open(file: &'f File, base: u64, len: u64) -> Result<Self, SquashError> {
        let mut raw = [0u8; SUPERBLOCK_SIZE];
        if len < SUPERBLOCK_SIZE as u64 {
            return Err(corrupt(format!(
                "{len} bytes is too short for a superblock"
            )));
        }
        file.read_exact_at(&mut raw, base).map_err(|e| {
            SquashError::Io(crate::IoAt {
                op: "read",
                path: "squashfs superblock".into(),
                source: e,
            })
        })?;
        let sb = SuperBlock::decode(&raw).ok_or(SquashError::NotSquashfs)?;
        if (sb.version_major, sb.version_minor) != (4, 0) {
            return Err(SquashError::Unsupported {
                what: format!("squashfs version {}.{}", sb.version_major, sb.version_minor),
            });
        }
        if Inflater::new(sb.compression).is_none() {
            let name = match sb.compression {
                2 => "lzma",
                3 => "lzo",
                COMP_XZ => "xz",
                5 => "lz4",
                _ => "unknown",
            };
            return Err(SquashError::Unsupported {
                what: format!(
                    "compression {} ({name}); sifbox reads gzip and zstd",
                    sb.compression
                ),
            });
        }
        let bs = sb.block_size;
        if !bs.is_power_of_two()
            || !(4096..=1 << 20).contains(&bs)
            || u32::from(sb.block_log) != bs.trailing_zeros()
        {
            return Err(corrupt(format!(
                "block size {bs} with log {}",
                sb.block_log
            )));
        }
        if sb.bytes_used > len {
            return Err(corrupt(format!(
                "bytes_used {} is past the end ({len} bytes)",
                sb.bytes_used
            )));
        }
        let end = sb.bytes_used;
        let inside = |name: &str, v: u64| {
            if v < SUPERBLOCK_SIZE as u64 || v >= end {
                Err(corrupt(format!("{name} start {v} is outside 96..{end}")))
            } else {
                Ok(())
            }
        };
        inside("inode table", sb.inode_table)?;
        inside("directory table", sb.dir_table)?;
        inside("id table", sb.id_table)?;
        if sb.inode_table >= sb.dir_table {
            return Err(corrupt(
                "the inode table does not precede the directory table",
            ));
        }
        if sb.inode_count == 0 || sb.id_count == 0 {
            return Err(corrupt("no inodes or no ids"));
        }
        let mut img = Self {
            file,
            base,
            sb,
            ids: Vec::new(),
            frag_index: Vec::new(),
        };
        img.ids = img
            .read_lookup(img.sb.id_table, u64::from(img.sb.id_count), 4, "id")?
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        if img.sb.fragment_count > 0 {
            inside("fragment table", img.sb.frag_table)?;
            // Fragment entries are read lazily; only their index is kept,
            // and it must fit in the image.
            let blocks = u64::from(img.sb.fragment_count).div_ceil(512);
            img.frag_index = img.read_index(img.sb.frag_table, blocks, "fragment")?;
        }
        Ok(img)
    }

    fn bytes_used(&self) -> u64 {
        self.sb.bytes_used
    }

    /// Reads `buf.len()` bytes at image offset `at`, which must lie within `bytes_used`.
    pub(super) fn read_at(&self, at: u64, buf: &mut [u8]) -> Result<(), SquashError> {
        let end = at.checked_add(buf.len() as u64);
        if end.is_none_or(|e| e > self.bytes_used()) {
            return Err(corrupt(format!(
                "read of {} bytes at {at} is past the end",
                buf.len()
            )));
        }
        let pos = self
            .base
            .checked_add(at)
            .ok_or_else(|| corrupt("image offset overflows"))?;
        self.file.read_exact_at(buf, pos).map_err(|e| {
            SquashError::Io(crate::IoAt {
                op: "read",
                path: "squashfs image".into(),
                source: e,
            })
        })
    }

    fn read_index(&self, at: u64, count: u64, what: &str) -> Result<Vec<u64>, SquashError> {
        let bytes = count
            .checked_mul(8)
            .filter(|b| at.checked_add(*b).is_some_and(|e| e <= self.bytes_used()))
            .ok_or_else(|| corrupt(format!("{what} table index does not fit in the image")))?;
        let mut raw = vec![0u8; usize::try_from(bytes).map_err(|_| corrupt("index too large"))?];
        self.read_at(at, &mut raw)?;
        Ok(raw
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
            .collect())
    }

    /// Reads a whole lookup table (small ones only: ids).
    fn read_lookup(
        &self,
        at: u64,
        count: u64,
        size: u64,
        what: &str,
    ) -> Result<Vec<u8>, SquashError> {
        let total = count * size;
        let blocks = total.div_ceil(METADATA_SIZE as u64);
        let index = self.read_index(at, blocks, what)?;
        let mut out = Vec::new();
        let mut meta = Meta::new(self);
        for start in index {
            if start >= at {
                return Err(corrupt(format!(
                    "{what} table block at {start} is not before its index"
                )));
            }
            let block = meta.block(start, at)?;
            out.extend_from_slice(&block.data);
        }
        if (out.len() as u64) < total {
            return Err(corrupt(format!("{what} table is short")));
        }
        out.truncate(usize::try_from(total).unwrap_or(0));
        Ok(out)
    }
}

struct Block {
    data: Vec<u8>,
    next: u64,
}

/// Decompressed metadata blocks, cached by position.
pub(super) struct Meta<'a, 'f> {
    img: &'a Image<'f>,
    cache: HashMap<u64, Rc<Block>>,
    inflater: Inflater,
    raw: Vec<u8>,
}

impl<'a, 'f> Meta<'a, 'f> {
    pub(super) fn new(img: &'a Image<'f>) -> Self {
        let inflater = Inflater::new(img.sb.compression)
            .unwrap_or(Inflater::Gzip(flate2::Decompress::new(true)));
        Self {
            img,
            cache: HashMap::new(),
            inflater,
            raw: Vec::new(),
        }
    }

    /// The metadata block at image offset `at`, which must end by `limit`.
    fn block(&mut self, at: u64, limit: u64) -> Result<Rc<Block>, SquashError> {
        if let Some(b) = self.cache.get(&at) {
            return Ok(Rc::clone(b));
        }
        let mut head = [0u8; 2];
        self.img.read_at(at, &mut head)?;
        let head = u16::from_le_bytes(head);
        let size = usize::from(head & !META_UNCOMPRESSED);
        if size == 0 || size > METADATA_SIZE {
            return Err(corrupt(format!("metadata block at {at} has size {size}")));
        }
        let next = at + 2 + size as u64;
        if next > limit {
            return Err(corrupt(format!(
                "metadata block at {at} runs past its table"
            )));
        }
        self.raw.resize(size, 0);
        self.img.read_at(at + 2, &mut self.raw)?;
        let data = if head & META_UNCOMPRESSED != 0 {
            self.raw.clone()
        } else {
            let mut out = Vec::new();
            self.inflater
                .inflate(&self.raw, &mut out, METADATA_SIZE)
                .map_err(|e| corrupt(format!("metadata block at {at}: {}", inflate_msg(e))))?;
            out
        };
        if self.cache.len() >= META_CACHE_BLOCKS {
            self.cache.clear();
        }
        let block = Rc::new(Block { data, next });
        self.cache.insert(at, Rc::clone(&block));
        Ok(block)
    }
}

fn inflate_msg(e: InflateError) -> &'static str {
    match e {
        InflateError::Corrupt => "corrupt compressed data",
        InflateError::TooLarge => "decompresses to more than allowed",
        InflateError::Truncated => "compressed data ends early",
    }
}

/// A read position inside a metadata table.
struct Cursor {
    block: u64,
    offset: usize,
    /// End of the table this cursor may read.
    limit: u64,
}

impl Cursor {
    fn read(&mut self, meta: &mut Meta<'_, '_>, mut out: &mut [u8]) -> Result<(), SquashError> {
        while !out.is_empty() {
            let block = meta.block(self.block, self.limit)?;
            let avail = block.data.get(self.offset..).ok_or_else(|| {
                corrupt(format!(
                    "offset {} is past metadata block at {}",
                    self.offset, self.block
                ))
            })?;
            let n = avail.len().min(out.len());
            out[..n].copy_from_slice(&avail[..n]);
            out = &mut out[n..];
            self.offset += n;
            if self.offset == block.data.len() {
                self.block = block.next;
                self.offset = 0;
            }
        }
        Ok(())
    }

    fn u16(&mut self, meta: &mut Meta<'_, '_>) -> Result<u16, SquashError> {
        let mut b = [0u8; 2];
        self.read(meta, &mut b)?;
        Ok(u16::from_le_bytes(b))
    }

    fn u32(&mut self, meta: &mut Meta<'_, '_>) -> Result<u32, SquashError> {
        let mut b = [0u8; 4];
        self.read(meta, &mut b)?;
        Ok(u32::from_le_bytes(b))
    }

    fn u64(&mut self, meta: &mut Meta<'_, '_>) -> Result<u64, SquashError> {
        let mut b = [0u8; 8];
        self.read(meta, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }
}

/// A directory entry as read: (name, inode reference, entry type).
pub(super) type RawEntry<'n> = (&'n [u8], u64, u16);

/// The position in a directory listing (see [`Image::listing`]).
pub(super) struct Listing {
    cursor: Cursor,
    /// Bytes of the listing not read yet.
    left: u64,
    /// Entries left under the current header.
    in_header: u32,
    inode_block: u32,
    name: [u8; NAME_MAX],
}

impl Listing {
    /// The next entry: (name, inode reference, entry type), or `None` at the end.
    pub(super) fn next(
        &mut self,
        meta: &mut Meta<'_, '_>,
    ) -> Result<Option<RawEntry<'_>>, SquashError> {
        let c = &mut self.cursor;
        if self.in_header == 0 {
            if self.left == 0 {
                return Ok(None);
            }
            if self.left < 12 {
                return Err(corrupt("directory listing ends inside a header"));
            }
            let count = c.u32(meta)?;
            self.inode_block = c.u32(meta)?;
            let _base = c.u32(meta)?;
            self.left -= 12;
            if usize::try_from(count).map_or(true, |c| c >= DIR_HEADER_MAX) {
                return Err(corrupt(format!(
                    "directory header with {} entries",
                    u64::from(count) + 1
                )));
            }
            self.in_header = count + 1;
        }
        if self.left < 8 {
            return Err(corrupt("directory listing ends inside an entry"));
        }
        let off = c.u16(meta)?;
        let _delta = c.u16(meta)?;
        let t = c.u16(meta)?;
        let len = usize::from(c.u16(meta)?) + 1;
        self.left -= 8;
        if len > NAME_MAX || (len as u64) > self.left {
            return Err(corrupt(format!("directory entry name of {len} bytes")));
        }
        c.read(meta, &mut self.name[..len])?;
        self.left -= len as u64;
        self.in_header -= 1;
        let r = (u64::from(self.inode_block) << 16) | u64::from(off);
        Ok(Some((&self.name[..len], r, t)))
    }
}

#[derive(Debug, Clone)]
pub(super) struct FileInfo {
    pub(super) start: u64,
    pub(super) size: u64,
    /// Block size words (size | uncompressed bit; 0 is a hole).
    pub(super) blocks: Vec<u32>,
    /// (fragment block start, its size word, offset of the tail in it).
    fragment: Option<(u64, u32, u32)>,
    /// (index in the fragment table, offset of the tail in that block).
    pub(super) fragment_ref: Option<(u32, u32)>,
}

#[derive(Debug)]
pub(super) enum InodeKind {
    Dir { block: u32, offset: u16, size: u32 },
    File(FileInfo),
    Symlink(Vec<u8>),
    Device { block: bool, rdev: u32 },
    Fifo,
    Socket,
}

#[derive(Debug)]
pub(super) struct InodeInfo {
    pub(super) kind: InodeKind,
    pub(super) basic_type: u16,
    pub(super) mode: u16,
    pub(super) uid: u32,
    pub(super) gid: u32,
    pub(super) mtime: u32,
}

impl Image<'_> {
    fn id(&self, index: u16) -> Result<u32, SquashError> {
        self.ids
            .get(usize::from(index))
            .copied()
            .ok_or_else(|| corrupt(format!("id index {index} is outside the id table")))
    }

    /// The fragment table's entry `index`: (start of the block, its size word).
    pub(super) fn fragment(
        &self,
        meta: &mut Meta<'_, '_>,
        index: u32,
    ) -> Result<(u64, u32), SquashError> {
        if index >= self.sb.fragment_count {
            return Err(corrupt(format!(
                "fragment {index} of {}",
                self.sb.fragment_count
            )));
        }
        let block = self.frag_index[usize::try_from(index / 512).unwrap_or(usize::MAX)];
        if block >= self.sb.frag_table {
            return Err(corrupt("fragment table block is not before its index"));
        }
        let mut c = Cursor {
            block,
            offset: usize::try_from(index % 512).unwrap_or(0) * FRAGMENT_ENTRY_SIZE,
            limit: self.sb.frag_table,
        };
        let start = c.u64(meta)?;
        let size = c.u32(meta)?;
        Ok((start, size))
    }

    /// Reads the inode at reference `r` ((block << 16) | offset).
    /// The root inode, and where its directory listing is (block, offset,
    /// size); a root that is not a directory is corrupt.
    pub(super) fn root_dir(
        &self,
        meta: &mut Meta<'_, '_>,
    ) -> Result<(InodeInfo, (u32, u16, u32)), SquashError> {
        let root = self.inode(meta, self.sb.root_inode)?;
        let InodeKind::Dir {
            block,
            offset,
            size,
        } = root.kind
        else {
            return Err(corrupt("the root inode is not a directory"));
        };
        Ok((root, (block, offset, size)))
    }

    pub(super) fn inode(&self, meta: &mut Meta<'_, '_>, r: u64) -> Result<InodeInfo, SquashError> {
        let block = self
            .sb
            .inode_table
            .checked_add(r >> 16)
            .filter(|b| *b < self.sb.dir_table)
            .ok_or_else(|| corrupt(format!("inode reference {r:#x} is outside the inode table")))?;
        let mut c = Cursor {
            block,
            offset: usize::try_from(r & 0xffff).unwrap_or(0),
            limit: self.sb.dir_table,
        };
        let t = c.u16(meta)?;
        let mode = c.u16(meta)?;
        let uid = self.id(c.u16(meta)?)?;
        let gid = self.id(c.u16(meta)?)?;
        let mtime = c.u32(meta)?;
        let _number = c.u32(meta)?;
        let bs = u64::from(self.sb.block_size);
        let (kind, basic_type) = match t {
            T_DIR => {
                let block = c.u32(meta)?;
                let _nlink = c.u32(meta)?;
                let size = u32::from(c.u16(meta)?);
                let offset = c.u16(meta)?;
                let _parent = c.u32(meta)?;
                (
                    InodeKind::Dir {
                        block,
                        offset,
                        size,
                    },
                    T_DIR,
                )
            }
            T_LDIR => {
                let _nlink = c.u32(meta)?;
                let size = c.u32(meta)?;
                let block = c.u32(meta)?;
                let _parent = c.u32(meta)?;
                let _index_count = c.u16(meta)?;
                let offset = c.u16(meta)?;
                let _xattr = c.u32(meta)?;
                (
                    InodeKind::Dir {
                        block,
                        offset,
                        size,
                    },
                    T_DIR,
                )
            }
            T_FILE | T_LFILE => {
                let (start, frag, frag_offset, size) = if t == T_FILE {
                    let start = u64::from(c.u32(meta)?);
                    let frag = c.u32(meta)?;
                    let off = c.u32(meta)?;
                    let size = u64::from(c.u32(meta)?);
                    (start, frag, off, size)
                } else {
                    let start = c.u64(meta)?;
                    let size = c.u64(meta)?;
                    let _sparse = c.u64(meta)?;
                    let _nlink = c.u32(meta)?;
                    let frag = c.u32(meta)?;
                    let off = c.u32(meta)?;
                    let _xattr = c.u32(meta)?;
                    (start, frag, off, size)
                };
                let count = if frag == INVALID_FRAG {
                    size.div_ceil(bs)
                } else {
                    size / bs
                };
                if count > MAX_FILE_BLOCKS {
                    return Err(SquashError::Unsupported {
                        what: format!("a file of {size} bytes"),
                    });
                }
                let mut blocks = Vec::with_capacity(usize::try_from(count.min(4096)).unwrap_or(0));
                for _ in 0..count {
                    blocks.push(c.u32(meta)?);
                }
                let (fragment, fragment_ref) = if frag == INVALID_FRAG {
                    (None, None)
                } else {
                    let (fstart, fsize) = self.fragment(meta, frag)?;
                    (
                        Some((fstart, fsize, frag_offset)),
                        Some((frag, frag_offset)),
                    )
                };
                (
                    InodeKind::File(FileInfo {
                        start,
                        size,
                        blocks,
                        fragment,
                        fragment_ref,
                    }),
                    T_FILE,
                )
            }
            T_SYMLINK | T_LSYMLINK => {
                let _nlink = c.u32(meta)?;
                let len = c.u32(meta)?;
                if len == 0 || len > MAX_SYMLINK {
                    return Err(corrupt(format!("symlink target of {len} bytes")));
                }
                let mut target = vec![0u8; usize::try_from(len).unwrap_or(0)];
                c.read(meta, &mut target)?;
                (InodeKind::Symlink(target), T_SYMLINK)
            }
            T_BLKDEV | T_CHRDEV | T_LBLKDEV | T_LCHRDEV => {
                let _nlink = c.u32(meta)?;
                let rdev = c.u32(meta)?;
                let block = t == T_BLKDEV || t == T_LBLKDEV;
                (
                    InodeKind::Device { block, rdev },
                    if block { T_BLKDEV } else { T_CHRDEV },
                )
            }
            T_FIFO | T_LFIFO => (InodeKind::Fifo, T_FIFO),
            T_SOCKET | T_LSOCKET => (InodeKind::Socket, T_SOCKET),
            other => return Err(corrupt(format!("inode type {other} at reference {r:#x}"))),
        };
        Ok(InodeInfo {
            kind,
            basic_type,
            mode: mode & 0o7777,
            uid,
            gid,
            mtime,
        })
    }

    /// A reader of the entries of a directory, one at a time (memory does
    /// not grow with the size a listing claims).
    pub(super) fn listing(
        &self,
        block: u32,
        offset: u16,
        size: u32,
    ) -> Result<Listing, SquashError> {
        if size < 3 {
            return Err(corrupt(format!("directory size {size}")));
        }
        let start = self
            .sb
            .dir_table
            .checked_add(u64::from(block))
            .filter(|b| *b < self.bytes_used())
            .ok_or_else(|| corrupt(format!("directory block {block} is outside the table")))?;
        Ok(Listing {
            cursor: Cursor {
                block: start,
                offset: usize::from(offset),
                limit: self.table_end_after_dirs(),
            },
            left: u64::from(size - 3),
            in_header: 0,
            inode_block: 0,
            name: [0u8; NAME_MAX],
        })
    }

    /// Directory listings may not read into the tables that follow.
    fn table_end_after_dirs(&self) -> u64 {
        let mut end = self.bytes_used();
        for t in [
            self.sb.id_table,
            self.sb.frag_table,
            self.sb.export_table,
            self.sb.xattr_table,
        ] {
            if t > self.sb.dir_table && t < end {
                end = t;
            }
        }
        if self.sb.fragment_count > 0 {
            if let Some(first) = self.frag_index.first() {
                if *first > self.sb.dir_table && *first < end {
                    end = *first;
                }
            }
        }
        end
    }
}

/// Rejects names that are not a single, plain path component.
pub(super) fn check_name<'n>(dir: &Path, name: &'n [u8]) -> Result<&'n OsStr, SquashError> {
    let why = if name.is_empty() {
        Some("empty name")
    } else if name == b"." || name == b".." {
        Some("dot or dot-dot name")
    } else if name.contains(&b'/') {
        Some("name contains a slash")
    } else if name.contains(&0) {
        Some("name contains a NUL byte")
    } else {
        None
    };
    match why {
        Some(why) => Err(SquashError::UnsafeEntry {
            path: dir.join(OsStr::from_bytes(name)).display().to_string(),
            why,
        }),
        None => Ok(OsStr::from_bytes(name)),
    }
}

struct Attrs {
    mode: u16,
    uid: u32,
    gid: u32,
    mtime: u32,
}

struct FileJob {
    path: PathBuf,
    info: FileInfo,
    attrs: Attrs,
}

fn io_at<'p>(op: &'static str, path: &'p Path) -> impl FnOnce(io::Error) -> SquashError + 'p {
    move |source| {
        SquashError::Io(crate::IoAt {
            op,
            path: path.to_path_buf(),
            source,
        })
    }
}

fn errno_at<'p>(
    op: &'static str,
    path: &'p Path,
) -> impl FnOnce(rustix::io::Errno) -> SquashError + 'p {
    move |e| {
        SquashError::Io(crate::IoAt {
            op,
            path: path.to_path_buf(),
            source: e.into(),
        })
    }
}

fn times(mtime: u32) -> Timestamps {
    let t = Timespec {
        tv_sec: i64::from(mtime),
        tv_nsec: 0,
    };
    Timestamps {
        last_access: t,
        last_modification: t,
    }
}

fn target_owner(opts: &UnpackOptions, uid: u32, gid: u32) -> Option<(Uid, Gid)> {
    match opts.owners {
        Owners::Preserve => Some((Uid::from_raw(uid), Gid::from_raw(gid))),
        Owners::Caller => None,
        Owners::Fixed { uid, gid } => Some((Uid::from_raw(uid), Gid::from_raw(gid))),
    }
}

/// Sets owner, mode and time of an open file or directory.
fn apply_fd(
    fd: impl AsFd,
    a: &Attrs,
    opts: &UnpackOptions,
    path: &Path,
) -> Result<(), SquashError> {
    if let Some((u, g)) = target_owner(opts, a.uid, a.gid) {
        rustix::fs::fchown(&fd, Some(u), Some(g)).map_err(errno_at("chown", path))?;
    }
    rustix::fs::fchmod(&fd, Mode::from_raw_mode(u32::from(a.mode)))
        .map_err(errno_at("chmod", path))?;
    rustix::fs::futimens(&fd, &times(a.mtime)).map_err(errno_at("set times of", path))?;
    Ok(())
}

/// Sets owner, mode (unless a symlink) and time of `name` in `dir`, not following it.
fn apply_at(
    dir: &Dir,
    name: &OsStr,
    a: &Attrs,
    symlink: bool,
    opts: &UnpackOptions,
    path: &Path,
) -> Result<(), SquashError> {
    if let Some((u, g)) = target_owner(opts, a.uid, a.gid) {
        rustix::fs::chownat(dir, name, Some(u), Some(g), AtFlags::SYMLINK_NOFOLLOW)
            .map_err(errno_at("chown", path))?;
    }
    if !symlink {
        rustix::fs::chmodat(
            dir,
            name,
            Mode::from_raw_mode(u32::from(a.mode)),
            AtFlags::empty(),
        )
        .map_err(errno_at("chmod", path))?;
    }
    rustix::fs::utimensat(dir, name, &times(a.mtime), AtFlags::SYMLINK_NOFOLLOW)
        .map_err(errno_at("set times of", path))?;
    Ok(())
}

/// Opens (creating when missing) the destination, which must be empty.
fn open_dest(dest: &Path) -> Result<Dir, SquashError> {
    match std::fs::create_dir(dest) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io_at("create", dest)(e)),
    }
    let dir = Dir::open_ambient_dir(dest, ambient_authority()).map_err(io_at("open", dest))?;
    if dir.entries().map_err(io_at("read", dest))?.next().is_some() {
        return Err(SquashError::DestNotEmpty {
            path: dest.to_path_buf(),
        });
    }
    Ok(dir)
}

/// Refuses the directory inode `r` (at `shown`) when the walk has met it
/// before: a loop.
pub(super) fn first_visit(
    seen: &mut HashSet<u64>,
    r: u64,
    shown: &Path,
) -> Result<(), SquashError> {
    if seen.insert(r) {
        return Ok(());
    }
    Err(corrupt(format!(
        "{}: directory appears twice (a loop)",
        shown.display()
    )))
}

/// Runs `walk` on this thread while `threads` others (0: one per CPU) take
/// the batches of jobs it sends and call `work` on each, with a state
/// `worker` makes per thread. The first error, of the walk or of a job,
/// stops both sides and is the result; dropping the sender the walk is
/// given ends the threads once they have drained the queue.
pub(super) fn in_batches<J: Send, S, T>(
    threads: usize,
    worker: impl Fn() -> S + Sync,
    work: impl Fn(&mut S, &J) -> Result<(), SquashError> + Sync,
    walk: impl FnOnce(mpsc::Sender<Vec<J>>, &AtomicBool) -> Result<T, SquashError>,
) -> Result<T, SquashError> {
    let threads = match threads {
        0 => std::thread::available_parallelism().map_or(1, usize::from),
        n => n,
    };
    let (tx, rx) = mpsc::channel::<Vec<J>>();
    let rx = Mutex::new(rx);
    let failed = AtomicBool::new(false);
    let first_error: Mutex<Option<SquashError>> = Mutex::new(None);
    let walked = std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                let mut state = worker();
                loop {
                    let batch = match rx.lock() {
                        Ok(guard) => guard.recv(),
                        Err(_) => return,
                    };
                    let Ok(batch) = batch else { return };
                    for job in &batch {
                        if failed.load(Ordering::Relaxed) {
                            return;
                        }
                        if let Err(e) = work(&mut state, job) {
                            failed.store(true, Ordering::Relaxed);
                            if let Ok(mut slot) = first_error.lock() {
                                slot.get_or_insert(e);
                            }
                            return;
                        }
                    }
                }
            });
        }
        let result = walk(tx, &failed);
        if result.is_err() {
            failed.store(true, Ordering::Relaxed);
        }
        result
    });
    if let Ok(Some(e)) = first_error.into_inner() {
        return Err(e);
    }
    walked
}

pub(super) fn unpack(
    file: &File,
    base: u64,
    len: u64,
    dest: &Path,
    opts: &UnpackOptions,
) -> Result<UnpackStats, SquashError> {
    let img = Image::open(file, base, len)?;
    let root = open_dest(dest)?;
    // The walk (this thread) creates directories, symlinks and special files
    // and hands regular files, in batches, to writer threads as it goes; a
    // file's directory always exists before its batch is sent.
    let walked = in_batches(
        opts.threads,
        || FileWriter::new(&img),
        |w, job: &FileJob| w.write(&root, dest, job, opts),
        |send, failed| {
            let walk = Walk {
                img: &img,
                root: &root,
                dest,
                opts,
                send,
                failed,
                batch: Vec::new(),
                batch_bytes: 0,
                stats: UnpackStats::default(),
            };
            // Dropping the sender ends the writers once they drain the queue.
            let Walked {
                stats,
                links,
                dirs,
                root_attrs,
            } = walk.run()?;
            Ok((stats, links, dirs, root_attrs))
        },
    );
    let (mut stats, links, dirs, root_attrs) = walked?;
    for (src, dst) in &links {
        root.hard_link(src, &root, dst)
            .map_err(io_at("hard link", &dest.join(dst)))?;
        stats.hard_links += 1;
    }
    for (rel, attrs) in dirs.iter().rev() {
        // cap-std opens directories O_PATH: set attributes through ".".
        let d = root.open_dir(rel).map_err(io_at("open", &dest.join(rel)))?;
        apply_at(&d, OsStr::new("."), attrs, false, opts, &dest.join(rel))?;
    }
    apply_at(&root, OsStr::new("."), &root_attrs, false, opts, dest)?;
    Ok(stats)
}

/// Regular files per batch handed to a writer thread, and bytes.
const BATCH_FILES: usize = 64;
const BATCH_BYTES: u64 = 8 << 20;

/// The directory walk of [`unpack`].
struct Walk<'a, 'f> {
    img: &'a Image<'f>,
    root: &'a Dir,
    dest: &'a Path,
    opts: &'a UnpackOptions,
    send: mpsc::Sender<Vec<FileJob>>,
    failed: &'a AtomicBool,
    batch: Vec<FileJob>,
    batch_bytes: u64,
    stats: UnpackStats,
}

/// What the walk leaves for the end: hard links to make and directory
/// attributes to set (after all their contents exist).
struct Walked {
    stats: UnpackStats,
    links: Vec<(PathBuf, PathBuf)>,
    dirs: Vec<(PathBuf, Attrs)>,
    root_attrs: Attrs,
}

impl Walk<'_, '_> {
    fn flush(&mut self) -> Result<(), SquashError> {
        if self.batch.is_empty() {
            return Ok(());
        }
        let batch = std::mem::take(&mut self.batch);
        self.batch_bytes = 0;
        // A closed queue means every writer stopped on an error, reported by the caller.
        let _ = self.send.send(batch);
        Ok(())
    }

    fn run(mut self) -> Result<Walked, SquashError> {
        let img = self.img;
        let (root, dest, opts) = (self.root, self.dest, self.opts);
        let mut meta = Meta::new(img);
        let (root_info, (block, offset, size)) = img.root_dir(&mut meta)?;
        let root_attrs = Attrs {
            mode: root_info.mode,
            uid: root_info.uid,
            gid: root_info.gid,
            mtime: root_info.mtime,
        };
        let mut seen_dirs: HashSet<u64> = HashSet::from([img.sb.root_inode]);
        let mut seen_nodes: HashMap<u64, PathBuf> = HashMap::new();
        // Directories in creation order (attributes applied last, in reverse).
        let mut dirs: Vec<(PathBuf, Attrs)> = Vec::new();
        let mut pending: Vec<(PathBuf, u32, u16, u32)> =
            vec![(PathBuf::new(), block, offset, size)];
        let mut links: Vec<(PathBuf, PathBuf)> = Vec::new();

        while let Some((rel, block, offset, size)) = pending.pop() {
            if self.failed.load(Ordering::Relaxed) {
                break;
            }
            let mut listing = img.listing(block, offset, size)?;
            let dir = if rel.as_os_str().is_empty() {
                root.try_clone().map_err(io_at("open", dest))?
            } else {
                root.open_dir(&rel)
                    .map_err(io_at("open", &dest.join(&rel)))?
            };
            let shown = dest.join(&rel);
            while let Some((name, r, entry_type)) = listing.next(&mut meta)? {
                let name = check_name(&shown, name)?;
                let path = rel.join(name);
                let full = dest.join(&path);
                let info = img.inode(&mut meta, r)?;
                if info.basic_type != entry_type {
                    return Err(corrupt(format!(
                        "{}: entry type {entry_type} but inode type {}",
                        full.display(),
                        info.basic_type
                    )));
                }
                let attrs = Attrs {
                    mode: info.mode,
                    uid: info.uid,
                    gid: info.gid,
                    mtime: info.mtime,
                };
                if let InodeKind::Dir {
                    block,
                    offset,
                    size,
                } = info.kind
                {
                    first_visit(&mut seen_dirs, r, &full)?;
                    dir.create_dir(name)
                        .map_err(io_at("create directory", &full))?;
                    self.stats.dirs += 1;
                    dirs.push((path.clone(), attrs));
                    pending.push((path, block, offset, size));
                    continue;
                }
                if let Some(first) = seen_nodes.get(&r) {
                    links.push((first.clone(), path));
                    continue;
                }
                seen_nodes.insert(r, path.clone());
                match info.kind {
                    InodeKind::Dir { .. } => {}
                    InodeKind::File(f) => {
                        self.stats.files += 1;
                        self.stats.bytes += f.size;
                        self.batch_bytes += f.size;
                        self.batch.push(FileJob {
                            path,
                            info: f,
                            attrs,
                        });
                        if self.batch.len() >= BATCH_FILES || self.batch_bytes >= BATCH_BYTES {
                            self.flush()?;
                        }
                    }
                    InodeKind::Symlink(target) => {
                        if target.contains(&0) {
                            return Err(corrupt(format!(
                                "{}: symlink target contains NUL",
                                full.display()
                            )));
                        }
                        dir.symlink_contents(OsStr::from_bytes(&target), name)
                            .map_err(io_at("create symlink", &full))?;
                        apply_at(&dir, name, &attrs, true, opts, &full)?;
                        self.stats.symlinks += 1;
                    }
                    InodeKind::Device { .. } if opts.devices == DeviceNodes::Skip => {
                        tracing::debug!(path = %full.display(), "device node left out");
                        seen_nodes.remove(&r);
                        self.stats.skipped_devices += 1;
                    }
                    InodeKind::Device { block, rdev } => {
                        let (major, minor) = decode_dev(rdev);
                        let ft = if block {
                            FileType::BlockDevice
                        } else {
                            FileType::CharacterDevice
                        };
                        let made = rustix::fs::mknodat(
                            &dir,
                            name,
                            ft,
                            Mode::from_raw_mode(0o600),
                            rustix::fs::makedev(major, minor),
                        );
                        match made {
                            Ok(()) => {
                                apply_at(&dir, name, &attrs, false, opts, &full)?;
                                self.stats.devices += 1;
                            }
                            Err(rustix::io::Errno::PERM | rustix::io::Errno::ACCESS)
                                if opts.devices == DeviceNodes::SkipIfDenied =>
                            {
                                tracing::debug!(path = %full.display(), "device node not created (no privilege)");
                                seen_nodes.remove(&r);
                                self.stats.skipped_devices += 1;
                            }
                            Err(e) => return Err(errno_at("create device node", &full)(e)),
                        }
                    }
                    InodeKind::Fifo | InodeKind::Socket => {
                        let ft = if matches!(info.kind, InodeKind::Fifo) {
                            FileType::Fifo
                        } else {
                            FileType::Socket
                        };
                        rustix::fs::mknodat(&dir, name, ft, Mode::from_raw_mode(0o600), 0)
                            .map_err(errno_at("create special file", &full))?;
                        apply_at(&dir, name, &attrs, false, opts, &full)?;
                        self.stats.specials += 1;
                    }
                }
            }
            // Small files of one directory share fragment blocks: keep them together.
            self.flush()?;
        }
        self.flush()?;
        Ok(Walked {
            stats: self.stats,
            links,
            dirs,
            root_attrs,
        })
    }
}

/// Per-thread state for reading files' data: buffers and the last fragment
/// block. `unpack` writes what it reads; `super::verify` only checks it.
pub(super) struct FileWriter<'a, 'f> {
    img: &'a Image<'f>,
    inflater: Inflater,
    raw: Vec<u8>,
    out: Vec<u8>,
    fragment: Option<(u64, Vec<u8>)>,
}

impl<'a, 'f> FileWriter<'a, 'f> {
    pub(super) fn new(img: &'a Image<'f>) -> Self {
        let inflater = Inflater::new(img.sb.compression)
            .unwrap_or(Inflater::Gzip(flate2::Decompress::new(true)));
        Self {
            img,
            inflater,
            raw: Vec::new(),
            out: Vec::new(),
            fragment: None,
        }
    }

    /// Reads one stored block (`word` = size | uncompressed bit) into `self.out`,
    /// which must come to `expect` bytes (or at most that many for fragments).
    fn load(
        &mut self,
        at: u64,
        word: u32,
        expect: usize,
        exact: bool,
        what: &Path,
    ) -> Result<(), SquashError> {
        let size = word & !DATA_UNCOMPRESSED;
        if word >> 25 != 0 || size > self.img.sb.block_size {
            return Err(corrupt(format!(
                "{}: block size word {word:#x}",
                what.display()
            )));
        }
        self.raw.resize(usize::try_from(size).unwrap_or(0), 0);
        self.img.read_at(at, &mut self.raw)?;
        if word & DATA_UNCOMPRESSED != 0 {
            std::mem::swap(&mut self.raw, &mut self.out);
        } else {
            self.inflater
                .inflate(&self.raw, &mut self.out, expect)
                .map_err(|e| {
                    corrupt(format!(
                        "{}: data block at {at}: {}",
                        what.display(),
                        inflate_msg(e)
                    ))
                })?;
        }
        if (exact && self.out.len() != expect) || self.out.len() > expect {
            return Err(corrupt(format!(
                "{}: block at {at} holds {} bytes, expected {expect}",
                what.display(),
                self.out.len()
            )));
        }
        Ok(())
    }

    fn write(
        &mut self,
        root: &Dir,
        dest: &Path,
        job: &FileJob,
        opts: &UnpackOptions,
    ) -> Result<(), SquashError> {
        let full = dest.join(&job.path);
        let file = root
            .open_with(&job.path, OpenOptions::new().write(true).create_new(true))
            .map_err(io_at("create", &full))?
            .into_std();
        let info = &job.info;
        let written = self.read_file(info, &full, |piece, at| {
            file.write_all_at(piece, at).map_err(io_at("write", &full))
        })?;
        if written != info.size {
            file.set_len(info.size).map_err(io_at("extend", &full))?;
        }
        apply_fd(&file, &job.attrs, opts, &full)
    }

    /// Decompresses every stored block of the file `info` (`what` names it
    /// in errors) and its tail in a fragment, checking each against the
    /// sizes the inode gives, and hands each piece to `put` with its offset
    /// in the file. Holes are not handed out. Returns where the last piece
    /// ended.
    pub(super) fn read_file(
        &mut self,
        info: &FileInfo,
        what: &Path,
        mut put: impl FnMut(&[u8], u64) -> Result<(), SquashError>,
    ) -> Result<u64, SquashError> {
        let bs = u64::from(self.img.sb.block_size);
        let mut pos = info.start;
        let mut written = 0u64;
        for (i, &word) in info.blocks.iter().enumerate() {
            let at = i as u64 * bs;
            let expect = usize::try_from((info.size - at).min(bs)).unwrap_or(0);
            let size = u64::from(word & !DATA_UNCOMPRESSED);
            if size == 0 {
                continue; // a hole
            }
            self.load(pos, word, expect, true, what)?;
            put(&self.out, at)?;
            pos = pos
                .checked_add(size)
                .ok_or_else(|| corrupt("block positions overflow"))?;
            written = at + expect as u64;
        }
        if let Some((fstart, fword, foffset)) = info.fragment {
            let tail_at = info.blocks.len() as u64 * bs;
            let tail = usize::try_from(info.size.saturating_sub(tail_at)).unwrap_or(0);
            if self.fragment.as_ref().is_none_or(|(at, _)| *at != fstart) {
                let block = usize::try_from(bs).unwrap_or(0);
                self.load(fstart, fword, block, false, what)?;
                self.fragment = Some((fstart, std::mem::take(&mut self.out)));
            }
            let data = self
                .fragment
                .as_ref()
                .map(|(_, d)| d.as_slice())
                .unwrap_or_default();
            let from = usize::try_from(foffset).unwrap_or(usize::MAX);
            let piece = from
                .checked_add(tail)
                .and_then(|end| data.get(from..end))
                .ok_or_else(|| corrupt(format!("{}: tail outside its fragment", what.display())))?;
            put(piece, tail_at)?;
            written = info.size;
        }
        Ok(written)
    }
}
