//! The Singularity Image Format, version "01": a reader that checks every
//! field before trusting it, and a writer that lays files out as Apptainer
//! and `siftool` do.
//!
//! A SIF file is a 128-byte global header, a table of fixed-size (585-byte)
//! descriptors at offset 4096, and the data objects they describe.
//! Partitions start on 4096-byte boundaries; other objects follow the
//! previous one directly. All integers are little endian.
//!
//! ```no_run
//! # use sifbox_image::sif::*;
//! # fn main() -> Result<(), SifError> {
//! let mut w = SifWriter::from_env();
//! w.add_deffile(b"Bootstrap: docker\nFrom: debian\n".to_vec())?;
//! let part = std::fs::File::open("rootfs.sqfs").expect("open");
//! w.add_partition(part, Partition::primary_squashfs(Arch::host()))?;
//! w.write_to(std::fs::File::create("image.sif").expect("create"))?;
//!
//! let sif = Sif::open("image.sif".as_ref())?;
//! let (offset, size) = sif.primary_partition().map(|d| (d.offset, d.size)).expect("rootfs");
//! # let _ = (offset, size); Ok(()) }
//! ```

use std::fmt;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Size of the global header.
pub const HEADER_SIZE: u64 = 128;
/// Size of one descriptor.
pub const DESCRIPTOR_SIZE: u64 = 585;
/// Where the writer puts the descriptor table.
pub const DESCRIPTORS_OFFSET: u64 = 4096;
/// Descriptor slots the writer reserves (as `siftool new`).
pub const DEFAULT_DESCRIPTORS: u64 = 48;
/// The most descriptor slots the reader accepts (2.4 MB of table).
pub const MAX_DESCRIPTORS: u64 = 4096;
/// Alignment of partition objects.
pub const PARTITION_ALIGN: u64 = 4096;
/// The created/modified time of deterministic files when no
/// `SOURCE_DATE_EPOCH` is given (Go's zero time, as the reference library).
pub const DETERMINISTIC_TIME: i64 = -62_135_596_800;
/// The launch script Apptainer writes at the start of its files.
pub const LAUNCH_SCRIPT: &[u8] = b"#!/usr/bin/env run-singularity\n";

const MAGIC: &[u8; 10] = b"SIF_MAGIC\0";
const VERSION: &[u8; 3] = b"01\0";
const GROUP_MASK: u32 = 0xf000_0000;
const NAME_LEN: usize = 128;
const EXTRA_LEN: usize = 384;

/// One clear error per problem; reader errors name the field and value.
#[derive(Debug, thiserror::Error)]
pub enum SifError {
    /// A system call on a path failed.
    #[error(transparent)]
    Io(#[from] crate::IoAt),
    #[error("not a SIF file: {len} bytes is shorter than the {what} ({need} bytes needed)")]
    Truncated {
        what: &'static str,
        need: u64,
        len: u64,
    },
    #[error("not a SIF file: magic is {found:?}, expected \"SIF_MAGIC\\0\"")]
    BadMagic { found: String },
    #[error("unsupported SIF version {found:?} (sifbox reads \"01\")")]
    BadVersion { found: String },
    #[error("corrupt SIF: {field} is {value}: {why}")]
    BadField {
        field: String,
        value: String,
        why: &'static str,
    },
    #[error("corrupt SIF: object {id} at {offset}+{size} lies outside the data ({why}, file is {len} bytes)")]
    ObjectOutside {
        id: u32,
        offset: u64,
        size: u64,
        len: u64,
        why: &'static str,
    },
    #[error("corrupt SIF: objects {a} and {b} overlap")]
    Overlap { a: u32, b: u32 },
    #[error("corrupt SIF: descriptor id {id} is used twice")]
    DuplicateId { id: u32 },
    #[error("SIF has two primary system partitions: objects {first} and {second}")]
    TwoPrimary { first: u32, second: u32 },
    #[error("SIF has no object {id}")]
    NoSuchObject { id: u32 },
    #[error("SIF object {id} is {size} bytes, more than the {limit} allowed")]
    TooLarge { id: u32, size: u64, limit: u64 },
    #[error("cannot write SIF: {what}")]
    Write { what: String },
}

/// What a data object holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DataType {
    Deffile,
    EnvVar,
    Labels,
    Partition,
    Signature,
    GenericJson,
    Generic,
    CryptoMessage,
    Sbom,
    OciRootIndex,
    OciBlob,
    /// A code this version does not know.
    Other(i32),
}

impl DataType {
    const KNOWN: [(DataType, i32); 11] = [
        (DataType::Deffile, 0x4001),
        (DataType::EnvVar, 0x4002),
        (DataType::Labels, 0x4003),
        (DataType::Partition, 0x4004),
        (DataType::Signature, 0x4005),
        (DataType::GenericJson, 0x4006),
        (DataType::Generic, 0x4007),
        (DataType::CryptoMessage, 0x4008),
        (DataType::Sbom, 0x4009),
        (DataType::OciRootIndex, 0x400A),
        (DataType::OciBlob, 0x400B),
    ];

    /// The on-disk code (0x4001...).
    pub fn code(self) -> i32 {
        match self {
            Self::Other(c) => c,
            known => Self::KNOWN
                .iter()
                .find(|(t, _)| *t == known)
                .map_or(0, |(_, c)| *c),
        }
    }

    pub fn from_code(code: i32) -> Self {
        Self::KNOWN
            .iter()
            .find(|(_, c)| *c == code)
            .map_or(Self::Other(code), |(t, _)| *t)
    }
}

/// File system of a partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FsType {
    Squashfs,
    Ext3,
    ImmutableObject,
    Raw,
    EncryptedSquashfs,
    GocryptfsSquashfs,
    Other(i32),
}

impl FsType {
    pub fn code(self) -> i32 {
        match self {
            Self::Squashfs => 1,
            Self::Ext3 => 2,
            Self::ImmutableObject => 3,
            Self::Raw => 4,
            Self::EncryptedSquashfs => 5,
            Self::GocryptfsSquashfs => 6,
            Self::Other(c) => c,
        }
    }

    pub fn from_code(code: i32) -> Self {
        match code {
            1 => Self::Squashfs,
            2 => Self::Ext3,
            3 => Self::ImmutableObject,
            4 => Self::Raw,
            5 => Self::EncryptedSquashfs,
            6 => Self::GocryptfsSquashfs,
            c => Self::Other(c),
        }
    }
}

/// Role of a partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PartType {
    System,
    /// The root file system; at most one per file.
    PrimarySystem,
    Data,
    Overlay,
    Other(i32),
}

impl PartType {
    pub fn code(self) -> i32 {
        match self {
            Self::System => 1,
            Self::PrimarySystem => 2,
            Self::Data => 3,
            Self::Overlay => 4,
            Self::Other(c) => c,
        }
    }

    pub fn from_code(code: i32) -> Self {
        match code {
            1 => Self::System,
            2 => Self::PrimarySystem,
            3 => Self::Data,
            4 => Self::Overlay,
            c => Self::Other(c),
        }
    }
}

/// A SIF architecture code ("00" to "99" on disk).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Arch(pub u8);

impl Arch {
    pub const UNKNOWN: Arch = Arch(0);
    pub const I386: Arch = Arch(1);
    pub const AMD64: Arch = Arch(2);
    pub const ARM: Arch = Arch(3);
    pub const ARM64: Arch = Arch(4);
    pub const PPC64: Arch = Arch(5);
    pub const PPC64LE: Arch = Arch(6);
    pub const MIPS: Arch = Arch(7);
    pub const MIPSLE: Arch = Arch(8);
    pub const MIPS64: Arch = Arch(9);
    pub const MIPS64LE: Arch = Arch(10);
    pub const S390X: Arch = Arch(11);
    pub const RISCV64: Arch = Arch(12);
    pub const LOONG64: Arch = Arch(13);

    const NAMES: [&'static str; 14] = [
        "unknown", "386", "amd64", "arm", "arm64", "ppc64", "ppc64le", "mips", "mipsle", "mips64",
        "mips64le", "s390x", "riscv64", "loong64",
    ];

    /// The Go name (`amd64`, `arm64`, ...), or `None` for a code this
    /// version does not know.
    pub fn name(self) -> Option<&'static str> {
        Self::NAMES.get(usize::from(self.0)).copied()
    }

    /// The architecture named as Go does (`amd64`) or as Rust does (`x86_64`).
    pub fn from_name(name: &str) -> Option<Self> {
        let go = match name {
            "x86_64" => "amd64",
            "x86" | "i386" | "i686" => "386",
            "aarch64" => "arm64",
            "powerpc64" => "ppc64",
            "powerpc64le" => "ppc64le",
            "loongarch64" => "loong64",
            other => other,
        };
        let i = Self::NAMES.iter().position(|n| *n == go)?;
        u8::try_from(i).ok().map(Arch)
    }

    /// The architecture this program was built for.
    pub fn host() -> Self {
        let name = if cfg!(all(target_arch = "powerpc64", target_endian = "little")) {
            "ppc64le"
        } else if cfg!(all(target_arch = "mips64", target_endian = "little")) {
            "mips64le"
        } else if cfg!(all(target_arch = "mips", target_endian = "little")) {
            "mipsle"
        } else {
            std::env::consts::ARCH
        };
        Self::from_name(name).unwrap_or(Self::UNKNOWN)
    }

    fn encode(self) -> [u8; 3] {
        [b'0' + self.0 / 10 % 10, b'0' + self.0 % 10, 0]
    }

    fn decode(b: &[u8]) -> Option<Self> {
        match b {
            [t @ b'0'..=b'9', u @ b'0'..=b'9', 0] => Some(Arch((t - b'0') * 10 + (u - b'0'))),
            _ => None,
        }
    }
}

impl fmt::Debug for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => write!(f, "Arch({n})"),
            None => write!(f, "Arch({:02})", self.0),
        }
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => f.write_str(n),
            None => write!(f, "arch-{:02}", self.0),
        }
    }
}

/// The extra fields of a partition descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Partition {
    pub fs: FsType,
    pub part_type: PartType,
    pub arch: Arch,
}

impl Partition {
    /// A squashfs root file system for `arch`.
    pub fn primary_squashfs(arch: Arch) -> Self {
        Self {
            fs: FsType::Squashfs,
            part_type: PartType::PrimarySystem,
            arch,
        }
    }
}

/// What a descriptor's link field points at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Link {
    None,
    Object(u32),
    Group(u32),
}

/// The global header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// Architecture of the primary system partition (`Arch::UNKNOWN` when none).
    pub arch: Arch,
    /// The file's UUID (all zero in deterministic files).
    pub id: [u8; 16],
    /// Unix seconds.
    pub created: i64,
    pub modified: i64,
    pub descriptors_free: u64,
    pub descriptors_total: u64,
    pub descriptors_offset: u64,
    pub descriptors_size: u64,
    pub data_offset: u64,
    pub data_size: u64,
}

/// A used descriptor: one data object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Descriptor {
    pub data_type: DataType,
    /// 1-based; unique in the file.
    pub id: u32,
    pub group: Option<u32>,
    pub link: Link,
    /// Where the object's bytes start in the file.
    pub offset: u64,
    pub size: u64,
    /// `size` plus the alignment gap before the object.
    pub size_with_padding: u64,
    pub created: i64,
    pub modified: i64,
    pub uid: i64,
    pub gid: i64,
    /// The object's name (up to the first NUL; invalid UTF-8 replaced).
    pub name: String,
    /// For [`DataType::Partition`] objects.
    pub partition: Option<Partition>,
}

impl Descriptor {
    pub fn is_primary_partition(&self) -> bool {
        self.partition
            .is_some_and(|p| p.part_type == PartType::PrimarySystem)
    }
}

fn le_i64(b: &[u8], at: usize) -> i64 {
    let mut a = [0u8; 8];
    if let Some(s) = b.get(at..at + 8) {
        a.copy_from_slice(s);
    }
    i64::from_le_bytes(a)
}

fn le_u32(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    if let Some(s) = b.get(at..at + 4) {
        a.copy_from_slice(s);
    }
    u32::from_le_bytes(a)
}

fn le_i32(b: &[u8], at: usize) -> i32 {
    let mut a = [0u8; 4];
    if let Some(s) = b.get(at..at + 4) {
        a.copy_from_slice(s);
    }
    i32::from_le_bytes(a)
}

fn escaped(b: &[u8]) -> String {
    b.escape_ascii().to_string()
}

fn bad(field: impl Into<String>, value: impl fmt::Display, why: &'static str) -> SifError {
    SifError::BadField {
        field: field.into(),
        value: value.to_string(),
        why,
    }
}

/// A non-negative i64 field as u64.
fn count(field: &str, v: i64) -> Result<u64, SifError> {
    u64::try_from(v).map_err(|_| bad(field, v, "negative"))
}

/// Parses and checks the header and descriptor table of a SIF held by `r`.
/// Never panics and allocates at most the descriptor table
/// ([`MAX_DESCRIPTORS`] × 585 bytes), whatever the input.
pub fn read_meta<R: Read + Seek>(r: &mut R) -> Result<(Header, Vec<Descriptor>), SifError> {
    let io = |op| {
        move |source| {
            SifError::Io(crate::IoAt {
                op,
                path: PathBuf::from("SIF"),
                source,
            })
        }
    };
    let len = r.seek(SeekFrom::End(0)).map_err(io("seek in"))?;
    if len < HEADER_SIZE {
        return Err(SifError::Truncated {
            what: "global header",
            need: HEADER_SIZE,
            len,
        });
    }
    let mut h = [0u8; 128];
    r.seek(SeekFrom::Start(0)).map_err(io("seek in"))?;
    r.read_exact(&mut h).map_err(io("read"))?;
    let header = parse_header(&h, len)?;
    let (desc_off, desc_size) = (header.descriptors_offset, header.descriptors_size);
    // Checked not to overflow by `parse_header`.
    let table_end = desc_off + desc_size;

    // Bounded: at most MAX_DESCRIPTORS × 585 bytes, and inside the file.
    let mut table = vec![
        0u8;
        usize::try_from(desc_size).map_err(|_| bad(
            "descriptors size",
            desc_size,
            "too large"
        ))?
    ];
    r.seek(SeekFrom::Start(desc_off)).map_err(io("seek in"))?;
    r.read_exact(&mut table).map_err(io("read"))?;

    let mut descriptors: Vec<Descriptor> = Vec::new();
    for (slot, d) in table.chunks_exact(585).enumerate() {
        if let Some(descriptor) = parse_descriptor(slot, d, &descriptors, len, table_end)? {
            descriptors.push(descriptor);
        }
    }
    check_objects(
        &descriptors,
        header.descriptors_free,
        header.descriptors_total,
    )?;
    Ok((header, descriptors))
}

/// The global header (`h`, the file's first 128 bytes; `len`, the file's
/// length), checked: the magic, the version, the descriptor table and the
/// data inside the file.
fn parse_header(h: &[u8; 128], len: u64) -> Result<Header, SifError> {
    if &h[32..42] != MAGIC {
        return Err(SifError::BadMagic {
            found: escaped(&h[32..42]),
        });
    }
    if &h[42..45] != VERSION {
        return Err(SifError::BadVersion {
            found: escaped(&h[42..45]),
        });
    }
    let arch = Arch::decode(&h[45..48]).ok_or_else(|| {
        bad(
            "header arch",
            format!("{:?}", escaped(&h[45..48])),
            "not two digits and a NUL",
        )
    })?;
    let mut id = [0u8; 16];
    id.copy_from_slice(&h[48..64]);
    let free = count("descriptors free", le_i64(h, 80))?;
    let total = count("descriptors total", le_i64(h, 88))?;
    let desc_off = count("descriptors offset", le_i64(h, 96))?;
    let desc_size = count("descriptors size", le_i64(h, 104))?;
    let data_off = count("data offset", le_i64(h, 112))?;
    let data_size = count("data size", le_i64(h, 120))?;
    if total == 0 {
        return Err(bad("descriptors total", total, "no descriptor slots"));
    }
    if total > MAX_DESCRIPTORS {
        return Err(bad(
            "descriptors total",
            total,
            "more than 4096 descriptors",
        ));
    }
    if free > total {
        return Err(bad("descriptors free", free, "more than descriptors total"));
    }
    if desc_size != total * DESCRIPTOR_SIZE {
        return Err(bad(
            "descriptors size",
            desc_size,
            "not descriptors total × 585",
        ));
    }
    if desc_off < HEADER_SIZE {
        return Err(bad(
            "descriptors offset",
            desc_off,
            "inside the global header",
        ));
    }
    let table_end = desc_off
        .checked_add(desc_size)
        .ok_or_else(|| bad("descriptors offset", desc_off, "overflows"))?;
    if table_end > len {
        return Err(SifError::Truncated {
            what: "descriptor table",
            need: table_end,
            len,
        });
    }
    if data_off < table_end {
        return Err(bad(
            "data offset",
            data_off,
            "inside the header or descriptor table",
        ));
    }
    match data_off.checked_add(data_size) {
        Some(end) if end <= len => {}
        _ => {
            return Err(bad(
                "data size",
                data_size,
                "data runs past the end of the file",
            ))
        }
    }
    let header = Header {
        arch,
        id,
        created: le_i64(h, 64),
        modified: le_i64(h, 72),
        descriptors_free: free,
        descriptors_total: total,
        descriptors_offset: desc_off,
        descriptors_size: desc_size,
        data_offset: data_off,
        data_size,
    };
    Ok(header)
}

/// The descriptor in `slot` (`d`, its 585 bytes), checked against the file
/// (`len`, the end of the descriptor table) and the descriptors before it;
/// None for an unused slot.
fn parse_descriptor(
    slot: usize,
    d: &[u8],
    descriptors: &[Descriptor],
    len: u64,
    table_end: u64,
) -> Result<Option<Descriptor>, SifError> {
    let field = |name: &str| format!("descriptor {} {name}", slot + 1);
    match d[4] {
        0 => return Ok(None),
        1 => {}
        other => return Err(bad(field("used flag"), other, "not 0 or 1")),
    }
    let id = le_u32(d, 5);
    if id == 0 {
        return Err(bad(field("id"), 0, "ids start at 1"));
    }
    if descriptors.iter().any(|x| x.id == id) {
        return Err(SifError::DuplicateId { id });
    }
    let data_type = DataType::from_code(le_i32(d, 0));
    let group_raw = le_u32(d, 9);
    let group = Some(group_raw & !GROUP_MASK).filter(|g| *g != 0);
    let link_raw = le_u32(d, 13);
    let link = if link_raw == 0 {
        Link::None
    } else if link_raw & GROUP_MASK == GROUP_MASK {
        Link::Group(link_raw & !GROUP_MASK)
    } else {
        Link::Object(link_raw)
    };
    let offset = count(&field("offset"), le_i64(d, 17))?;
    let size = count(&field("size"), le_i64(d, 25))?;
    let size_with_padding = count(&field("size with padding"), le_i64(d, 33))?;
    let outside = |why| SifError::ObjectOutside {
        id,
        offset,
        size,
        len,
        why,
    };
    match offset.checked_add(size) {
        Some(end) if end <= len => {}
        _ => return Err(outside("past the end of the file")),
    }
    if size > 0 && offset < table_end {
        return Err(outside("inside the header or descriptor table"));
    }
    if size_with_padding < size {
        return Err(bad(
            field("size with padding"),
            size_with_padding,
            "smaller than size",
        ));
    }
    let name_raw = &d[73..73 + NAME_LEN];
    let name_end = name_raw.iter().position(|b| *b == 0).unwrap_or(NAME_LEN);
    let name = String::from_utf8_lossy(&name_raw[..name_end]).into_owned();
    let extra = &d[201..201 + EXTRA_LEN];
    let partition = if data_type == DataType::Partition {
        let arch = Arch::decode(&extra[8..11]).ok_or_else(|| {
            bad(
                field("partition arch"),
                format!("{:?}", escaped(&extra[8..11])),
                "not two digits and a NUL",
            )
        })?;
        Some(Partition {
            fs: FsType::from_code(le_i32(extra, 0)),
            part_type: PartType::from_code(le_i32(extra, 4)),
            arch,
        })
    } else {
        None
    };
    Ok(Some(Descriptor {
        data_type,
        id,
        group,
        link,
        offset,
        size,
        size_with_padding,
        created: le_i64(d, 41),
        modified: le_i64(d, 49),
        uid: le_i64(d, 57),
        gid: le_i64(d, 65),
        name,
        partition,
    }))
}

/// The used descriptors against the header's count of free slots, and the
/// objects' spans: no two overlap, at most one primary partition.
fn check_objects(descriptors: &[Descriptor], free: u64, total: u64) -> Result<(), SifError> {
    let used = descriptors.len() as u64;
    if free != total - used {
        return Err(bad(
            "descriptors free",
            free,
            "does not match the unused descriptor slots",
        ));
    }
    let mut spans: Vec<(u64, u64, u32)> = descriptors
        .iter()
        .filter(|d| d.size > 0)
        .map(|d| (d.offset, d.offset + d.size, d.id))
        .collect();
    spans.sort_unstable();
    for w in spans.windows(2) {
        if w[1].0 < w[0].1 {
            return Err(SifError::Overlap {
                a: w[0].2,
                b: w[1].2,
            });
        }
    }
    let mut primary: Option<u32> = None;
    for d in descriptors.iter().filter(|d| d.is_primary_partition()) {
        if let Some(first) = primary {
            return Err(SifError::TwoPrimary {
                first,
                second: d.id,
            });
        }
        primary = Some(d.id);
    }
    Ok(())
}

/// An open, validated SIF file.
#[derive(Debug)]
pub struct Sif {
    file: File,
    path: PathBuf,
    header: Header,
    descriptors: Vec<Descriptor>,
}

impl Sif {
    /// Opens and validates the SIF at `path` (see [`read_meta`]).
    pub fn open(path: &Path) -> Result<Self, SifError> {
        let file = File::open(path).map_err(|source| {
            SifError::Io(crate::IoAt {
                op: "open",
                path: path.to_path_buf(),
                source,
            })
        })?;
        Self::from_file(file, path)
    }

    /// Validates an already open SIF; `path` is used in messages.
    pub fn from_file(mut file: File, path: &Path) -> Result<Self, SifError> {
        let (header, descriptors) = read_meta(&mut file).map_err(|e| match e {
            SifError::Io(crate::IoAt { op, source, .. }) => SifError::Io(crate::IoAt {
                op,
                path: path.to_path_buf(),
                source,
            }),
            other => other,
        })?;
        Ok(Self {
            file,
            path: path.to_path_buf(),
            header,
            descriptors,
        })
    }

    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The used descriptors, in table order.
    pub fn descriptors(&self) -> &[Descriptor] {
        &self.descriptors
    }

    pub fn descriptor(&self, id: u32) -> Option<&Descriptor> {
        self.descriptors.iter().find(|d| d.id == id)
    }

    /// The root file system partition, if any. Its bytes are
    /// `offset..offset + size` of [`Sif::file`].
    pub fn primary_partition(&self) -> Option<&Descriptor> {
        self.descriptors.iter().find(|d| d.is_primary_partition())
    }

    /// The bytes of object `id`, refusing objects larger than `limit`.
    pub fn read_object(&self, id: u32, limit: u64) -> Result<Vec<u8>, SifError> {
        let d = self.descriptor(id).ok_or(SifError::NoSuchObject { id })?;
        if d.size > limit {
            return Err(SifError::TooLarge {
                id,
                size: d.size,
                limit,
            });
        }
        let mut buf = vec![
            0u8;
            usize::try_from(d.size).map_err(|_| SifError::TooLarge {
                id,
                size: d.size,
                limit
            })?
        ];
        self.file
            .read_exact_at(&mut buf, d.offset)
            .map_err(|source| {
                SifError::Io(crate::IoAt {
                    op: "read",
                    path: self.path.clone(),
                    source,
                })
            })?;
        Ok(buf)
    }

    /// When the image was made, in Unix seconds, from the file itself (so
    /// the same bytes give the same time in every store): the header's
    /// time where the writer kept one (Apptainer, `SOURCE_DATE_EPOCH`),
    /// else, for a deterministic file (whose header has Go's zero time),
    /// its root file system's: the squashfs creation time, which sifbox
    /// sets to the newest file's time in the image (the clamp).
    pub fn image_time(&self) -> Option<i64> {
        let header = self.header.created;
        if header > 0 {
            return Some(header);
        }
        let part = self.primary_partition()?;
        let mut sb = [0u8; 12];
        self.file.read_exact_at(&mut sb, part.offset).ok()?;
        if &sb[..4] != b"hsqs" {
            return None;
        }
        let t = u32::from_le_bytes([sb[8], sb[9], sb[10], sb[11]]);
        (t > 0).then_some(i64::from(t))
    }

    /// The open file, for streaming an object by its offset and size.
    pub fn file(&self) -> &File {
        &self.file
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// A source the writer can read and measure.
pub trait ReadSeek: Read + Seek {}
impl<T: Read + Seek> ReadSeek for T {}

enum Source<'a> {
    Bytes(Vec<u8>),
    Stream(Box<dyn ReadSeek + 'a>),
}

struct Object<'a> {
    data_type: DataType,
    name: String,
    partition: Option<Partition>,
    source: Source<'a>,
    size: u64,
}

/// Builds a SIF file: add objects, then [`SifWriter::write_to`].
///
/// Every object goes into group 1, as Apptainer's builds do. Objects are
/// written in the order added.
pub struct SifWriter<'a> {
    objects: Vec<Object<'a>>,
    id: [u8; 16],
    time: i64,
}

impl fmt::Debug for SifWriter<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SifWriter")
            .field("objects", &self.objects.len())
            .field("id", &self.id)
            .field("time", &self.time)
            .finish()
    }
}

impl Default for SifWriter<'_> {
    fn default() -> Self {
        Self::new()
    }
}

impl<'a> SifWriter<'a> {
    /// A writer with a random UUID and the current time.
    pub fn new() -> Self {
        let mut id = [0u8; 16];
        let filled =
            rustix::rand::getrandom(&mut id, rustix::rand::GetRandomFlags::empty()).unwrap_or(0);
        if filled < id.len() {
            // No kernel randomness: fall back on the clock and pid, still unique enough.
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos());
            id[..16].copy_from_slice(&(now ^ (u128::from(std::process::id()) << 64)).to_le_bytes());
        }
        id[6] = (id[6] & 0x0f) | 0x40; // version 4
        id[8] = (id[8] & 0x3f) | 0x80; // RFC 4122 variant
        let time = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
        Self {
            objects: Vec::new(),
            id,
            time,
        }
    }

    /// Deterministic when `SOURCE_DATE_EPOCH` is set (see
    /// [`SifWriter::deterministic`] with that time), else [`SifWriter::new`].
    pub fn from_env() -> Self {
        match std::env::var("SOURCE_DATE_EPOCH")
            .ok()
            .and_then(|v| v.trim().parse::<i64>().ok())
        {
            Some(t) => Self::deterministic(t),
            None => Self::new(),
        }
    }

    /// A writer whose output depends only on its objects: a zero UUID and
    /// `time` (use [`DETERMINISTIC_TIME`] for none) as every time stamp.
    pub fn deterministic(time: i64) -> Self {
        Self {
            objects: Vec::new(),
            id: [0u8; 16],
            time,
        }
    }

    fn push(&mut self, o: Object<'a>) -> Result<u32, SifError> {
        if o.name.len() > NAME_LEN {
            return Err(SifError::Write {
                what: format!("object name of {} bytes (at most 128)", o.name.len()),
            });
        }
        if self.objects.len() as u64 >= MAX_DESCRIPTORS {
            return Err(SifError::Write {
                what: "more than 4096 objects".into(),
            });
        }
        if o.partition
            .is_some_and(|p| p.part_type == PartType::PrimarySystem)
            && self.objects.iter().any(|x| {
                x.partition
                    .is_some_and(|p| p.part_type == PartType::PrimarySystem)
            })
        {
            return Err(SifError::Write {
                what: "a second primary system partition".into(),
            });
        }
        self.objects.push(o);
        u32::try_from(self.objects.len()).map_err(|_| SifError::Write {
            what: "too many objects".into(),
        })
    }

    /// Adds an object held in memory; returns its id.
    pub fn add_bytes(
        &mut self,
        data_type: DataType,
        name: &str,
        bytes: Vec<u8>,
    ) -> Result<u32, SifError> {
        let size = bytes.len() as u64;
        self.push(Object {
            data_type,
            name: name.to_owned(),
            partition: None,
            source: Source::Bytes(bytes),
            size,
        })
    }

    /// Adds the definition file the image was built from.
    pub fn add_deffile(&mut self, bytes: Vec<u8>) -> Result<u32, SifError> {
        self.add_bytes(DataType::Deffile, "", bytes)
    }

    /// Adds labels (a JSON object).
    pub fn add_labels(&mut self, json: Vec<u8>) -> Result<u32, SifError> {
        self.add_bytes(DataType::Labels, "", json)
    }

    /// Adds a generic JSON object named `name`.
    pub fn add_json(&mut self, name: &str, json: Vec<u8>) -> Result<u32, SifError> {
        self.add_bytes(DataType::GenericJson, name, json)
    }

    /// Adds a partition read from `source` (from its start to its end at
    /// the time of this call), aligned to 4096 bytes. A primary system
    /// partition's arch becomes the header's.
    pub fn add_partition(
        &mut self,
        mut source: impl Read + Seek + 'a,
        partition: Partition,
    ) -> Result<u32, SifError> {
        let size = source.seek(SeekFrom::End(0)).map_err(|source| {
            SifError::Io(crate::IoAt {
                op: "measure",
                path: "partition source".into(),
                source,
            })
        })?;
        self.push(Object {
            data_type: DataType::Partition,
            name: String::new(),
            partition: Some(partition),
            source: Source::Stream(Box::new(source)),
            size,
        })
    }

    /// Writes the file to `out` (sequentially; no seeking) and returns its length.
    pub fn write_to<W: Write>(self, mut out: W) -> Result<u64, SifError> {
        let wio = |source| {
            SifError::Io(crate::IoAt {
                op: "write",
                path: "SIF output".into(),
                source,
            })
        };
        let to_i64 = |v: u64| {
            i64::try_from(v).map_err(|_| SifError::Write {
                what: format!("offset {v} too large"),
            })
        };
        let used = self.objects.len() as u64;
        let total = used.max(DEFAULT_DESCRIPTORS);
        let desc_size = total * DESCRIPTOR_SIZE;
        let data_off = DESCRIPTORS_OFFSET + desc_size;

        // Layout: (offset, size with padding) of each object.
        let mut layout = Vec::with_capacity(self.objects.len());
        let mut pos = data_off;
        for o in &self.objects {
            let offset = if o.data_type == DataType::Partition {
                pos.div_ceil(PARTITION_ALIGN) * PARTITION_ALIGN
            } else {
                pos
            };
            let end = offset.checked_add(o.size).ok_or_else(|| SifError::Write {
                what: "object too large".into(),
            })?;
            layout.push((offset, end - pos));
            pos = end;
        }
        let arch = self
            .objects
            .iter()
            .filter_map(|o| o.partition)
            .find(|p| p.part_type == PartType::PrimarySystem)
            .map_or(Arch::UNKNOWN, |p| p.arch);

        let mut h = [0u8; 128];
        h[..LAUNCH_SCRIPT.len()].copy_from_slice(LAUNCH_SCRIPT);
        h[32..42].copy_from_slice(MAGIC);
        h[42..45].copy_from_slice(VERSION);
        h[45..48].copy_from_slice(&arch.encode());
        h[48..64].copy_from_slice(&self.id);
        let fields = [
            self.time,
            self.time,
            to_i64(total - used)?,
            to_i64(total)?,
            to_i64(DESCRIPTORS_OFFSET)?,
            to_i64(desc_size)?,
            to_i64(data_off)?,
            to_i64(pos - data_off)?,
        ];
        for (i, v) in fields.iter().enumerate() {
            h[64 + i * 8..72 + i * 8].copy_from_slice(&v.to_le_bytes());
        }
        out.write_all(&h).map_err(wio)?;
        out.write_all(&vec![
            0u8;
            usize::try_from(DESCRIPTORS_OFFSET - HEADER_SIZE)
                .unwrap_or(0)
        ])
        .map_err(wio)?;

        let mut table = vec![
            0u8;
            usize::try_from(desc_size).map_err(|_| SifError::Write {
                what: "table too large".into()
            })?
        ];
        for (i, (o, (offset, padded))) in self.objects.iter().zip(&layout).enumerate() {
            let d = &mut table[i * 585..(i + 1) * 585];
            let id = u32::try_from(i + 1).unwrap_or(u32::MAX);
            d[0..4].copy_from_slice(&o.data_type.code().to_le_bytes());
            d[4] = 1;
            d[5..9].copy_from_slice(&id.to_le_bytes());
            d[9..13].copy_from_slice(&(1 | GROUP_MASK).to_le_bytes());
            // 13..17: no link
            d[17..25].copy_from_slice(&to_i64(*offset)?.to_le_bytes());
            d[25..33].copy_from_slice(&to_i64(o.size)?.to_le_bytes());
            d[33..41].copy_from_slice(&to_i64(*padded)?.to_le_bytes());
            d[41..49].copy_from_slice(&self.time.to_le_bytes());
            d[49..57].copy_from_slice(&self.time.to_le_bytes());
            // 57..73: uid and gid 0
            d[73..73 + o.name.len()].copy_from_slice(o.name.as_bytes());
            if let Some(p) = o.partition {
                d[201..205].copy_from_slice(&p.fs.code().to_le_bytes());
                d[205..209].copy_from_slice(&p.part_type.code().to_le_bytes());
                d[209..212].copy_from_slice(&p.arch.encode());
            }
        }
        out.write_all(&table).map_err(wio)?;

        let mut written = data_off;
        for (o, (offset, _)) in self.objects.into_iter().zip(layout) {
            let gap = offset - written;
            out.write_all(&vec![0u8; usize::try_from(gap).unwrap_or(0)])
                .map_err(wio)?;
            match o.source {
                Source::Bytes(b) => out.write_all(&b).map_err(wio)?,
                Source::Stream(mut s) => {
                    s.seek(SeekFrom::Start(0)).map_err(|source| {
                        SifError::Io(crate::IoAt {
                            op: "read",
                            path: "partition source".into(),
                            source,
                        })
                    })?;
                    let copied = io::copy(&mut s.take(o.size), &mut out).map_err(wio)?;
                    if copied != o.size {
                        return Err(SifError::Write {
                            what: format!(
                                "partition source shrank from {} to {copied} bytes",
                                o.size
                            ),
                        });
                    }
                }
            }
            written = offset + o.size;
        }
        out.flush().map_err(wio)?;
        Ok(written)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    fn sample() -> Vec<u8> {
        let mut w = SifWriter::deterministic(DETERMINISTIC_TIME);
        w.add_deffile(b"Bootstrap: scratch\n".to_vec())
            .expect("deffile");
        w.add_json("oci-config.json", b"{\"a\":1}".to_vec())
            .expect("json");
        w.add_partition(
            Cursor::new(vec![7u8; 5000]),
            Partition::primary_squashfs(Arch::AMD64),
        )
        .expect("part");
        let mut out = Vec::new();
        w.write_to(&mut out).expect("write");
        out
    }

    #[test]
    fn layout_matches_siftool() {
        let b = sample();
        let (h, d) = read_meta(&mut Cursor::new(&b)).expect("valid");
        assert_eq!(h.arch, Arch::AMD64);
        assert_eq!(h.id, [0u8; 16]);
        assert_eq!(h.created, DETERMINISTIC_TIME);
        assert_eq!((h.descriptors_total, h.descriptors_free), (48, 45));
        assert_eq!(h.descriptors_offset, 4096);
        assert_eq!(h.data_offset, 4096 + 48 * 585);
        assert_eq!(d.len(), 3);
        assert_eq!(d[0].offset, 32176);
        assert_eq!(d[1].offset, 32176 + 19);
        assert_eq!(d[1].name, "oci-config.json");
        assert_eq!(d[2].offset, 32768);
        assert_eq!(d[2].size_with_padding, 32768 - (32176 + 19 + 7) + 5000);
        assert_eq!(d[2].group, Some(1));
        assert_eq!(b.len() as u64, 32768 + 5000);
        assert_eq!(h.data_size, b.len() as u64 - h.data_offset);
        assert!(d[2].is_primary_partition());
        assert_eq!(&b[..LAUNCH_SCRIPT.len()], LAUNCH_SCRIPT);
    }

    #[test]
    fn second_primary_refused() {
        let mut w = SifWriter::new();
        w.add_partition(
            Cursor::new(vec![1u8]),
            Partition::primary_squashfs(Arch::ARM64),
        )
        .expect("first");
        assert!(matches!(
            w.add_partition(
                Cursor::new(vec![1u8]),
                Partition::primary_squashfs(Arch::ARM64)
            ),
            Err(SifError::Write { .. })
        ));
        assert_ne!(w.id, [0u8; 16]);
    }

    #[test]
    fn arch_codes() {
        assert_eq!(Arch::from_name("x86_64"), Some(Arch::AMD64));
        assert_eq!(Arch::AMD64.encode(), *b"02\0");
        assert_eq!(Arch::decode(b"13\0"), Some(Arch::LOONG64));
        assert_eq!(Arch::decode(b"1\0\0"), None);
        assert_eq!(Arch(42).name(), None);
        assert_ne!(Arch::host(), Arch::UNKNOWN);
    }

    #[test]
    fn data_type_codes() {
        for (t, c) in DataType::KNOWN {
            assert_eq!(t.code(), c);
            assert_eq!(DataType::from_code(c), t);
        }
        assert_eq!(DataType::from_code(7), DataType::Other(7));
    }
}
