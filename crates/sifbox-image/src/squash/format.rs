//! On-disk constants and structures of squashfs version 4.0 (little endian).
//!
//! Layout written by [`super::pack`] (the same order as mksquashfs, which
//! both the kernel and unsquashfs check):
//!
//! ```text
//! superblock (96) · data blocks and fragment blocks · inode table ·
//! directory table · fragment table (metadata blocks, then their u64 index) ·
//! id table (metadata blocks, then their u64 index) · zero padding to 4 KiB
//! ```

pub(crate) const MAGIC: u32 = 0x7371_7368; // "hsqs"
pub(crate) const SUPERBLOCK_SIZE: usize = 96;
pub(crate) const METADATA_SIZE: usize = 8192;
/// Bit 15 of a metadata block header: the block is stored uncompressed.
pub(crate) const META_UNCOMPRESSED: u16 = 1 << 15;
/// Bit 24 of a data block or fragment size: stored uncompressed.
pub(crate) const DATA_UNCOMPRESSED: u32 = 1 << 24;
pub(crate) const INVALID_FRAG: u32 = 0xffff_ffff;
pub(crate) const INVALID_XATTR: u32 = 0xffff_ffff;
pub(crate) const INVALID_TABLE: u64 = u64::MAX;
/// Directory headers cover at most this many entries.
pub(crate) const DIR_HEADER_MAX: usize = 256;
/// Names are 1 to 256 bytes long in squashfs (Linux allows 255).
pub(crate) const NAME_MAX: usize = 256;
pub(crate) const FRAGMENT_ENTRY_SIZE: usize = 16;

pub(crate) const COMP_GZIP: u16 = 1;
pub(crate) const COMP_XZ: u16 = 4;
pub(crate) const COMP_ZSTD: u16 = 6;

/// Superblock flag: identical files share their data.
pub(crate) const FLAG_DUPLICATES: u16 = 1 << 6;
/// Superblock flag: the image holds no extended attributes.
pub(crate) const FLAG_NO_XATTRS: u16 = 1 << 9;

// Inode types; directory entries always carry the basic one (1..=7).
pub(crate) const T_DIR: u16 = 1;
pub(crate) const T_FILE: u16 = 2;
pub(crate) const T_SYMLINK: u16 = 3;
pub(crate) const T_BLKDEV: u16 = 4;
pub(crate) const T_CHRDEV: u16 = 5;
pub(crate) const T_FIFO: u16 = 6;
pub(crate) const T_SOCKET: u16 = 7;
pub(crate) const T_LDIR: u16 = 8;
pub(crate) const T_LFILE: u16 = 9;
pub(crate) const T_LSYMLINK: u16 = 10;
pub(crate) const T_LBLKDEV: u16 = 11;
pub(crate) const T_LCHRDEV: u16 = 12;
pub(crate) const T_LFIFO: u16 = 13;
pub(crate) const T_LSOCKET: u16 = 14;

/// The superblock fields sifbox uses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct SuperBlock {
    pub inode_count: u32,
    pub mod_time: u32,
    pub block_size: u32,
    pub fragment_count: u32,
    pub compression: u16,
    pub block_log: u16,
    pub flags: u16,
    pub id_count: u16,
    pub version_major: u16,
    pub version_minor: u16,
    pub root_inode: u64,
    pub bytes_used: u64,
    pub id_table: u64,
    pub xattr_table: u64,
    pub inode_table: u64,
    pub dir_table: u64,
    pub frag_table: u64,
    pub export_table: u64,
}

impl SuperBlock {
    pub(crate) fn encode(&self) -> [u8; SUPERBLOCK_SIZE] {
        let mut b = [0u8; SUPERBLOCK_SIZE];
        let mut w = Put::new(&mut b);
        w.u32(MAGIC);
        w.u32(self.inode_count);
        w.u32(self.mod_time);
        w.u32(self.block_size);
        w.u32(self.fragment_count);
        w.u16(self.compression);
        w.u16(self.block_log);
        w.u16(self.flags);
        w.u16(self.id_count);
        w.u16(self.version_major);
        w.u16(self.version_minor);
        w.u64(self.root_inode);
        w.u64(self.bytes_used);
        w.u64(self.id_table);
        w.u64(self.xattr_table);
        w.u64(self.inode_table);
        w.u64(self.dir_table);
        w.u64(self.frag_table);
        w.u64(self.export_table);
        b
    }

    /// Parses the fields; returns `None` when the magic is wrong.
    pub(crate) fn decode(b: &[u8; SUPERBLOCK_SIZE]) -> Option<Self> {
        let mut r = Get::new(b);
        if r.u32()? != MAGIC {
            return None;
        }
        Some(Self {
            inode_count: r.u32()?,
            mod_time: r.u32()?,
            block_size: r.u32()?,
            fragment_count: r.u32()?,
            compression: r.u16()?,
            block_log: r.u16()?,
            flags: r.u16()?,
            id_count: r.u16()?,
            version_major: r.u16()?,
            version_minor: r.u16()?,
            root_inode: r.u64()?,
            bytes_used: r.u64()?,
            id_table: r.u64()?,
            xattr_table: r.u64()?,
            inode_table: r.u64()?,
            dir_table: r.u64()?,
            frag_table: r.u64()?,
            export_table: r.u64()?,
        })
    }
}

/// Writes little-endian values into a fixed buffer (sizes are known statically).
pub(crate) struct Put<'a> {
    buf: &'a mut [u8],
    pos: usize,
}

impl<'a> Put<'a> {
    pub(crate) fn new(buf: &'a mut [u8]) -> Self {
        Self { buf, pos: 0 }
    }
    fn bytes(&mut self, v: &[u8]) {
        // Callers size the buffer for what they put; a short buffer is a
        // programming error caught by the tests, never by input.
        if let Some(dst) = self.buf.get_mut(self.pos..self.pos + v.len()) {
            dst.copy_from_slice(v);
        }
        self.pos += v.len();
    }
    pub(crate) fn u16(&mut self, v: u16) {
        self.bytes(&v.to_le_bytes());
    }
    pub(crate) fn u32(&mut self, v: u32) {
        self.bytes(&v.to_le_bytes());
    }
    pub(crate) fn u64(&mut self, v: u64) {
        self.bytes(&v.to_le_bytes());
    }
}

/// Reads little-endian values from a slice; every read is bounds checked.
#[derive(Debug, Clone)]
pub(crate) struct Get<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Get<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }
    pub(crate) fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.pos.checked_add(n)?;
        let s = self.buf.get(self.pos..end)?;
        self.pos = end;
        Some(s)
    }
    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N)?.try_into().ok()
    }
    pub(crate) fn u16(&mut self) -> Option<u16> {
        self.array().map(u16::from_le_bytes)
    }
    pub(crate) fn u32(&mut self) -> Option<u32> {
        self.array().map(u32::from_le_bytes)
    }
    pub(crate) fn u64(&mut self) -> Option<u64> {
        self.array().map(u64::from_le_bytes)
    }
}

/// Append helpers for growable buffers.
pub(crate) trait PutVec {
    fn put_u16(&mut self, v: u16);
    fn put_u32(&mut self, v: u32);
    fn put_u64(&mut self, v: u64);
}

impl PutVec for Vec<u8> {
    fn put_u16(&mut self, v: u16) {
        self.extend_from_slice(&v.to_le_bytes());
    }
    fn put_u32(&mut self, v: u32) {
        self.extend_from_slice(&v.to_le_bytes());
    }
    fn put_u64(&mut self, v: u64) {
        self.extend_from_slice(&v.to_le_bytes());
    }
}

/// Linux's "new" device number encoding, which squashfs stores.
pub(crate) fn encode_dev(major: u32, minor: u32) -> u32 {
    (minor & 0xff) | ((major & 0xfff) << 8) | ((minor & !0xff) << 12)
}

/// The inverse of [`encode_dev`]: `(major, minor)`.
pub(crate) fn decode_dev(dev: u32) -> (u32, u32) {
    let major = (dev & 0xf_ff00) >> 8;
    let minor = (dev & 0xff) | ((dev >> 12) & 0xf_ff00);
    (major, minor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn superblock_round_trip() {
        let sb = SuperBlock {
            inode_count: 7,
            mod_time: 9,
            block_size: 131_072,
            fragment_count: 2,
            compression: COMP_GZIP,
            block_log: 17,
            flags: FLAG_NO_XATTRS,
            id_count: 1,
            version_major: 4,
            version_minor: 0,
            root_inode: 0x1234,
            bytes_used: 5000,
            id_table: 4990,
            xattr_table: INVALID_TABLE,
            inode_table: 100,
            dir_table: 200,
            frag_table: 300,
            export_table: INVALID_TABLE,
        };
        let b = sb.encode();
        assert_eq!(&b[..4], b"hsqs");
        assert_eq!(SuperBlock::decode(&b), Some(sb));
    }

    #[test]
    fn device_numbers() {
        for (maj, min) in [(0, 0), (1, 3), (8, 17), (4095, 0xfffff), (259, 70000)] {
            assert_eq!(decode_dev(encode_dev(maj, min)), (maj, min));
        }
        // /dev/null is 1:3 -> 0x103
        assert_eq!(encode_dev(1, 3), 0x103);
    }

    #[test]
    fn get_is_bounded() {
        let mut g = Get::new(&[1, 2, 3]);
        assert_eq!(g.u16(), Some(0x0201));
        assert_eq!(g.u16(), None);
        assert_eq!(g.take(usize::MAX), None);
    }
}
