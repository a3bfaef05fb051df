//! Sparse files in tar streams, and the limits on what a copy writes.
//!
//! A file with holes (found with `SEEK_DATA`/`SEEK_HOLE`) is sent as a PAX
//! sparse entry in GNU's format 1.0, which GNU tar and libarchive read: a
//! PAX header with `GNU.sparse.major=1`, `GNU.sparse.minor=0`,
//! `GNU.sparse.name` (the real name) and `GNU.sparse.realsize`, then a
//! regular entry whose data is the map (decimal lines: the number of
//! extents, then each extent's offset and length, padded to a block) and
//! then the extents' data one after another. Unpacking writes each extent
//! at its offset and sets the size, so holes stay holes: a 1 GB file with
//! 4 KiB of data travels and lands as 4 KiB.
//!
//! [`Limits`] bound what a copy writes: the bytes of file data (holes cost
//! nothing) and the number of entries, counted as the stream goes
//! ([`Budget`]); passing either fails the copy with [`LimitExceeded`].

use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use rustix::fs::SeekFrom;
use rustix::io::Errno;

/// How much a copy may write: file data (bytes actually stored; holes are
/// free) and entries (files, directories, links).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_bytes: u64,
    pub max_entries: u64,
}

/// 16 GiB of data: more than any file a task's output or an agent's tree
/// needs, less than a host's free disk is likely to be.
pub const DEFAULT_MAX_BYTES: u64 = 16 << 30;
/// A million entries: a checkout of a large monorepo, not an inode table.
pub const DEFAULT_MAX_ENTRIES: u64 = 1_000_000;

impl Limits {
    /// No limit: unpacking inside a sandbox, whose own disk bounds it.
    pub const UNLIMITED: Limits = Limits {
        max_bytes: u64::MAX,
        max_entries: u64::MAX,
    };
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_bytes: DEFAULT_MAX_BYTES,
            max_entries: DEFAULT_MAX_ENTRIES,
        }
    }
}

/// Which limit a copy passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    Bytes,
    Entries,
}

/// A copy passed one of its [`Limits`]: the error inside the
/// `std::io::Error` a transfer returns, so that a caller can tell it apart
/// (`sifbox cp` names its flag).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitExceeded {
    pub which: Limit,
    pub limit: u64,
}

impl std::fmt::Display for LimitExceeded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.which {
            Limit::Bytes => write!(
                f,
                "the copy passed its limit of {} bytes of file data",
                self.limit
            ),
            Limit::Entries => write!(f, "the copy passed its limit of {} entries", self.limit),
        }
    }
}

impl std::error::Error for LimitExceeded {}

impl LimitExceeded {
    /// The `LimitExceeded` inside `e`, however deep it is wrapped.
    pub fn find(e: &(dyn std::error::Error + 'static)) -> Option<LimitExceeded> {
        let mut cur = Some(e);
        while let Some(err) = cur {
            if let Some(l) = err.downcast_ref::<LimitExceeded>() {
                return Some(*l);
            }
            if let Some(io) = err.downcast_ref::<std::io::Error>() {
                if let Some(l) = io.get_ref().and_then(|i| i.downcast_ref::<LimitExceeded>()) {
                    return Some(*l);
                }
            }
            cur = err.source();
        }
        None
    }
}

/// What a copy has written so far, against its [`Limits`].
#[derive(Debug)]
pub struct Budget {
    limits: Limits,
    bytes: u64,
    entries: u64,
}

impl Budget {
    pub fn new(limits: Limits) -> Budget {
        Budget {
            limits,
            bytes: 0,
            entries: 0,
        }
    }

    /// One more entry.
    pub fn entry(&mut self) -> std::io::Result<()> {
        self.entries += 1;
        if self.entries > self.limits.max_entries {
            return Err(exceeded(Limit::Entries, self.limits.max_entries));
        }
        Ok(())
    }

    /// `n` more bytes of file data: checked before they are written.
    pub fn bytes(&mut self, n: u64) -> std::io::Result<()> {
        self.bytes = self.bytes.saturating_add(n);
        if self.bytes > self.limits.max_bytes {
            return Err(exceeded(Limit::Bytes, self.limits.max_bytes));
        }
        Ok(())
    }
}

fn exceeded(which: Limit, limit: u64) -> std::io::Error {
    std::io::Error::other(LimitExceeded { which, limit })
}

// ---------------------------------------------------------------------------
// Writing
// ---------------------------------------------------------------------------

/// The data extents (offset, length) of the first `size` bytes of `f`, or
/// `None` when it has no hole (or its file system cannot say). A file that
/// is all hole has the one empty extent `(size, 0)`, as GNU tar writes it.
pub fn extents(f: &File, size: u64) -> std::io::Result<Option<Vec<(u64, u64)>>> {
    if size == 0 {
        return Ok(None);
    }
    let mut out = Vec::new();
    let mut off = 0u64;
    while off < size {
        let data = match rustix::fs::seek(f, SeekFrom::Data(off)) {
            Ok(d) => d,
            // No data after `off`: the rest is a hole.
            Err(Errno::NXIO) => break,
            Err(Errno::INVAL | Errno::OPNOTSUPP) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        if data >= size {
            break;
        }
        let hole = match rustix::fs::seek(f, SeekFrom::Hole(data)) {
            Ok(h) => h.min(size),
            Err(Errno::NXIO) => size,
            Err(e) => return Err(e.into()),
        };
        if hole <= data {
            // The file changed under us; send it whole.
            return Ok(None);
        }
        out.push((data, hole - data));
        off = hole;
    }
    if out.as_slice() == [(0, size)] {
        return Ok(None);
    }
    if out.is_empty() {
        out.push((size, 0));
    }
    Ok(Some(out))
}

/// One PAX record: `LEN key=value\n`, LEN counting the whole record.
fn pax_record(out: &mut Vec<u8>, key: &str, value: &[u8]) {
    let body = key.len() + value.len() + 3; // ' ', '=', '\n'
    let mut len = body + body.to_string().len();
    if len.to_string().len() + body != len {
        len += 1;
    }
    out.extend_from_slice(len.to_string().as_bytes());
    out.push(b' ');
    out.extend_from_slice(key.as_bytes());
    out.push(b'=');
    out.extend_from_slice(value);
    out.push(b'\n');
}

/// The map that opens a sparse entry's data, padded to a block.
fn map_block(extents: &[(u64, u64)]) -> Vec<u8> {
    let mut m = format!("{}\n", extents.len()).into_bytes();
    for (off, len) in extents {
        m.extend_from_slice(format!("{off}\n{len}\n").as_bytes());
    }
    m.resize(m.len().div_ceil(512) * 512, 0);
    m
}

/// Appends a sparse entry named `name` of `real_size` bytes whose extents
/// are `extents` and whose data (the extents' bytes, one after another)
/// comes from `data`, with the owner, mode and time of `meta_from`.
pub fn append_sparse<W: Write>(
    b: &mut tar::Builder<W>,
    meta_from: &tar::Header,
    name: &Path,
    real_size: u64,
    extents: &[(u64, u64)],
    data: impl Read,
) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let mut pax = Vec::new();
    pax_record(&mut pax, "GNU.sparse.major", b"1");
    pax_record(&mut pax, "GNU.sparse.minor", b"0");
    pax_record(&mut pax, "GNU.sparse.name", name.as_os_str().as_bytes());
    pax_record(
        &mut pax,
        "GNU.sparse.realsize",
        real_size.to_string().as_bytes(),
    );
    let mut x = tar::Header::new_ustar();
    x.set_entry_type(tar::EntryType::XHeader);
    x.set_path("././@PaxHeader")?;
    x.set_mode(0o644);
    x.set_mtime(meta_from.mtime().unwrap_or(0));
    x.set_size(pax.len() as u64);
    x.set_cksum();
    b.append(&x, &pax[..])?;
    let map = map_block(extents);
    let stored: u64 = extents.iter().map(|e| e.1).sum();
    let mut h = meta_from.clone();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_size(map.len() as u64 + stored);
    // Exactly `stored` bytes, whatever `data` does.
    let body = (&map[..]).chain(data.take(stored).chain(std::io::repeat(0)).take(stored));
    let short = Path::new("GNUSparseFile.0").join(name.file_name().unwrap_or_default());
    b.append_data(&mut h, short, body)
}

/// Reads the extents of `f` one after another (what a sparse entry sends),
/// short reads padded with zeros.
struct ExtentReader<'a> {
    f: &'a File,
    extents: std::vec::IntoIter<(u64, u64)>,
    cur: Option<(u64, u64)>,
}

impl Read for ExtentReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            let (off, left) = match self.cur {
                Some(c) if c.1 > 0 => c,
                _ => match self.extents.next() {
                    Some(e) => {
                        self.cur = Some(e);
                        continue;
                    }
                    None => return Ok(0),
                },
            };
            let want = usize::try_from(left).unwrap_or(usize::MAX).min(buf.len());
            let mut n = self.f.read_at(&mut buf[..want], off)?;
            if n == 0 {
                // The file shrank: zeros, as a plain entry pads.
                buf[..want].fill(0);
                n = want;
            }
            self.cur = Some((off + n as u64, left - n as u64));
            return Ok(n);
        }
    }
}

/// Appends the regular file `f` (`size` bytes, header `h` with its
/// metadata) as `name`: a sparse entry when it has holes, else a plain one
/// of exactly `size` bytes whatever the file does meanwhile.
pub fn append_file<W: Write>(
    b: &mut tar::Builder<W>,
    h: &mut tar::Header,
    name: &Path,
    f: &File,
    size: u64,
) -> std::io::Result<()> {
    if let Some(ext) = extents(f, size)? {
        let data = ExtentReader {
            f,
            extents: ext.clone().into_iter(),
            cur: None,
        };
        return append_sparse(b, h, name, size, &ext, data);
    }
    let data = ReadAt { f, at: 0 }
        .take(size)
        .chain(std::io::repeat(0))
        .take(size);
    b.append_data(h, name, data)
}

/// Reads `f` from `at` on with `pread`, whatever its file offset.
struct ReadAt<'a> {
    f: &'a File,
    at: u64,
}

impl Read for ReadAt<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.f.read_at(buf, self.at)?;
        self.at += n as u64;
        Ok(n)
    }
}

// ---------------------------------------------------------------------------
// Reading
// ---------------------------------------------------------------------------

/// What the PAX header of a sparse entry says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sparse {
    /// The file's real name.
    pub name: PathBuf,
    /// Its size, holes included.
    pub real_size: u64,
}

/// Whether `entry` is a sparse entry of format 1.0 (and what it says), or
/// not sparse. Older PAX sparse formats (0.0, 0.1) are refused.
pub fn sparse_of(entry: &mut tar::Entry<'_, impl Read>) -> std::io::Result<Option<Sparse>> {
    use std::os::unix::ffi::OsStrExt;
    let Some(exts) = entry.pax_extensions()? else {
        return Ok(None);
    };
    let (mut major, mut minor, mut name, mut size, mut any) = (None, None, None, None, false);
    for e in exts {
        let e = e?;
        let Ok(key) = e.key() else { continue };
        if !key.starts_with("GNU.sparse.") {
            continue;
        }
        any = true;
        let v = e.value_bytes();
        match key {
            "GNU.sparse.major" => major = Some(v.to_vec()),
            "GNU.sparse.minor" => minor = Some(v.to_vec()),
            "GNU.sparse.name" => name = Some(PathBuf::from(std::ffi::OsStr::from_bytes(v))),
            "GNU.sparse.realsize" => size = Some(number(v)?),
            _ => {}
        }
    }
    if !any {
        return Ok(None);
    }
    if major.as_deref() != Some(b"1") || minor.as_deref() != Some(b"0") {
        return Err(std::io::Error::other(
            "a PAX sparse entry of a format other than 1.0 (GNU tar's --sparse-version=1.0 is \
             read): not supported",
        ));
    }
    let name =
        name.ok_or_else(|| std::io::Error::other("a sparse entry with no GNU.sparse.name"))?;
    let real_size =
        size.ok_or_else(|| std::io::Error::other("a sparse entry with no GNU.sparse.realsize"))?;
    Ok(Some(Sparse { name, real_size }))
}

fn number(v: &[u8]) -> std::io::Result<u64> {
    std::str::from_utf8(v)
        .ok()
        .filter(|s| !s.is_empty() && s.len() <= 20 && s.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other("a sparse map with a bad number"))
}

/// Reads the map at the start of a sparse entry's data (`entry_size`
/// bytes in all): the extents, checked to be in order, apart, inside
/// `real_size`, and to account for the rest of the data exactly.
pub fn read_map(
    data: &mut impl Read,
    entry_size: u64,
    real_size: u64,
) -> std::io::Result<Vec<(u64, u64)>> {
    let bad = |why: &str| std::io::Error::other(format!("a bad sparse map: {why}"));
    let mut buf: Vec<u8> = Vec::new();
    let mut pos = 0usize;
    let mut next = |data: &mut dyn Read| -> std::io::Result<u64> {
        loop {
            if let Some(nl) = buf[pos..].iter().position(|&b| b == b'\n') {
                let v = number(&buf[pos..pos + nl])?;
                pos += nl + 1;
                return Ok(v);
            }
            if buf.len() - pos > 20 || buf.len() as u64 + 512 > entry_size {
                return Err(bad("a line too long, or longer than the entry"));
            }
            let mut block = [0u8; 512];
            data.read_exact(&mut block)?;
            buf.extend_from_slice(&block);
        }
    };
    let count = next(data)?;
    // Each extent takes at least four bytes of the map.
    if count.saturating_mul(4) > entry_size {
        return Err(bad("more extents than the entry holds"));
    }
    let mut extents = Vec::new();
    let mut end = 0u64;
    let mut stored = 0u64;
    for _ in 0..count {
        let off = next(data)?;
        let len = next(data)?;
        let stop = off
            .checked_add(len)
            .filter(|&s| s <= real_size)
            .ok_or_else(|| bad("an extent past the file's size"))?;
        if off < end {
            return Err(bad("extents out of order or overlapping"));
        }
        end = stop;
        stored += len;
        extents.push((off, len));
    }
    let map_len = buf.len() as u64;
    if map_len.checked_add(stored) != Some(entry_size) {
        return Err(bad("the extents do not add up to the entry's data"));
    }
    Ok(extents)
}

/// Writes a sparse entry's extents (`data`, after [`read_map`]) into `out`
/// at their offsets and sets its size to `real_size`: the holes stay holes.
pub fn write_extents(
    data: &mut impl Read,
    extents: &[(u64, u64)],
    real_size: u64,
    out: &File,
    budget: &mut Budget,
) -> std::io::Result<()> {
    let mut buf = vec![0u8; 64 << 10];
    for &(off, len) in extents {
        budget.bytes(len)?;
        let mut done = 0u64;
        while done < len {
            let want = usize::try_from(len - done)
                .unwrap_or(usize::MAX)
                .min(buf.len());
            data.read_exact(&mut buf[..want])?;
            out.write_all_at(&buf[..want], off + done)?;
            done += want as u64;
        }
    }
    out.set_len(real_size)
}

/// Copies a plain entry's data into `out`, counted against `budget` as it
/// goes.
pub fn write_plain(
    data: &mut impl Read,
    out: &mut File,
    budget: &mut Budget,
) -> std::io::Result<()> {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match data.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        budget.bytes(n as u64)?;
        out.write_all(&buf[..n])?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn sparse_file(dir: &Path) -> (PathBuf, u64) {
        let p = dir.join("s");
        let f = File::create(&p).expect("create");
        let size = 64 << 20;
        f.write_all_at(b"head", 0).expect("write");
        f.write_all_at(&[7u8; 4096], 32 << 20).expect("write");
        f.set_len(size).expect("truncate");
        (p, size)
    }

    #[test]
    fn pax_records_count_their_own_length() {
        for v in ["", "x", &"y".repeat(85), &"z".repeat(990)] {
            let mut r = Vec::new();
            pax_record(&mut r, "GNU.sparse.name", v.as_bytes());
            let s = String::from_utf8(r.clone()).expect("utf8");
            let (len, _) = s.split_once(' ').expect("len");
            assert_eq!(len.parse::<usize>().expect("num"), r.len(), "{s:?}");
        }
    }

    #[test]
    fn a_sparse_file_round_trips_with_its_holes() {
        let t = tempfile::tempdir().expect("tempdir");
        let (p, size) = sparse_file(t.path());
        let f = File::open(&p).expect("open");
        let Some(ext) = extents(&f, size).expect("extents") else {
            eprintln!("skipped: this file system reports no holes");
            return;
        };
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_metadata(&f.metadata().expect("stat"));
        append_file(&mut b, &mut h, Path::new("dir/s"), &f, size).expect("append");
        let tarball = b.into_inner().expect("tar");
        assert!(tarball.len() < 64 << 10, "{} bytes sent", tarball.len());
        assert!(ext.len() >= 2);
        let mut ar = tar::Archive::new(&tarball[..]);
        let mut e = ar
            .entries()
            .expect("entries")
            .next()
            .expect("one")
            .expect("entry");
        let sp = sparse_of(&mut e).expect("pax").expect("sparse");
        assert_eq!(
            sp,
            Sparse {
                name: "dir/s".into(),
                real_size: size
            }
        );
        let entry_size = e.size();
        let map = read_map(&mut e, entry_size, size).expect("map");
        assert_eq!(map, ext);
        let out_p = t.path().join("out");
        let out = File::create(&out_p).expect("create");
        let mut budget = Budget::new(Limits::default());
        write_extents(&mut e, &map, size, &out, &mut budget).expect("write");
        let md = std::fs::metadata(&out_p).expect("stat");
        assert_eq!(md.len(), size);
        assert!(md.blocks() * 512 < 1 << 20, "{} blocks", md.blocks());
        assert_eq!(
            std::fs::read(&out_p).expect("read"),
            std::fs::read(&p).expect("read")
        );
    }

    #[test]
    fn bad_maps_are_refused() {
        let cases: &[(&[u8], u64, u64)] = &[
            (b"2\n0\n10\n5\n10\n", 512 + 20, 100), // overlapping
            (b"1\n90\n20\n", 512 + 20, 100),       // past the end
            (b"1\n0\n10\n", 512 + 11, 100),        // does not add up
            (b"99999999999\n", 512, 100),          // too many
            (b"x\n", 512, 100),                    // not a number
        ];
        for (map, entry_size, real) in cases {
            let mut block = map.to_vec();
            block.resize(4096, 0);
            let r = read_map(&mut &block[..], *entry_size, *real);
            assert!(r.is_err(), "{:?} accepted", String::from_utf8_lossy(map));
        }
        // A line with no end never reads past the entry.
        let block = vec![b'1'; 4096];
        assert!(read_map(&mut &block[..], 4096, 100).is_err());
    }

    mod prop {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(512))]

            /// Any bytes as a map: an error or extents that are in order,
            /// apart, inside the size and account for the entry exactly;
            /// never a panic.
            #[test]
            fn read_map_takes_any_bytes(
                data in proptest::collection::vec(any::<u8>(), 0..2048),
                entry_size in 0u64..4096,
                real_size in 0u64..1 << 40,
            ) {
                if let Ok(ext) = read_map(&mut &data[..], entry_size, real_size) {
                    let mut end = 0;
                    let mut stored = 0;
                    for (off, len) in &ext {
                        prop_assert!(*off >= end && off + len <= real_size);
                        end = off + len;
                        stored += len;
                    }
                    prop_assert!(stored <= entry_size);
                }
            }

            /// Maps the writer makes read back as they were.
            #[test]
            fn maps_round_trip(
                gaps in proptest::collection::vec((0u64..1 << 30, 0u64..1 << 20), 0..64),
            ) {
                let mut ext = Vec::new();
                let mut at = 0;
                for (gap, len) in gaps {
                    ext.push((at + gap, len));
                    at += gap + len;
                }
                let map = map_block(&ext);
                let stored: u64 = ext.iter().map(|e| e.1).sum();
                let got = read_map(&mut &map[..], map.len() as u64 + stored, at)
                    .expect("map");
                prop_assert_eq!(got, ext);
            }
        }
    }

    #[test]
    fn the_budget_stops_at_its_limits() {
        let mut b = Budget::new(Limits {
            max_bytes: 10,
            max_entries: 2,
        });
        b.bytes(10).expect("at the limit");
        let e = b.bytes(1).expect_err("past it");
        let l = LimitExceeded::find(&e).expect("typed");
        assert_eq!(
            l,
            LimitExceeded {
                which: Limit::Bytes,
                limit: 10
            }
        );
        b.entry().expect("1");
        b.entry().expect("2");
        assert!(b.entry().is_err());
    }
}
