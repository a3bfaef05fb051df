//! A streaming tar reader with bounded extension headers.
//!
//! Understands ustar, GNU (`L`/`K` long names, base-256 numbers) and PAX
//! (`x` local records; `g` global records are read and ignored). Rejects
//! sparse files, multi-volume members and unknown entry types.
//!
//! Where a stream may end, Go's `archive/tar` (so containerd's and Docker's
//! reading of layers) is the rule: at an entry-header boundary, with or
//! without the two zero blocks of the end-of-archive marker; or inside the
//! padding that rounds the last entry's body up to 512 bytes (umoci 0.4.7
//! writes layers that stop right after the last body). A body shorter than
//! its header's size, or a header cut short, is still an error.

use std::io::{self, Read};

use super::{Error, Result};

const BLOCK: usize = 512;
/// Largest GNU long name or long link accepted.
pub(crate) const MAX_LONG_NAME: u64 = 64 * 1024;
/// Largest PAX extended header accepted.
pub(crate) const MAX_PAX: u64 = 1024 * 1024;

/// What an entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    File,
    HardLink,
    Symlink,
    Char,
    Block,
    Dir,
    Fifo,
}

/// One tar member, with its extension headers folded in.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    /// Offset of its first header (extension headers included).
    pub offset: u64,
    pub kind: Kind,
    pub path: Vec<u8>,
    pub link: Vec<u8>,
    /// Bytes of body that follow (0 for header-only kinds).
    pub size: u64,
    pub mode: u32,
    pub uid: u64,
    pub gid: u64,
    pub mtime: i64,
    pub major: u32,
    pub minor: u32,
    pub xattrs: Vec<(Vec<u8>, Vec<u8>)>,
}

impl Entry {
    /// The entry's name for messages.
    pub fn display(&self) -> String {
        String::from_utf8_lossy(&self.path).into_owned()
    }
}

/// Values of a PAX extended header that matter here.
#[derive(Debug, Default)]
struct Pax {
    path: Option<Vec<u8>>,
    link: Option<Vec<u8>>,
    size: Option<u64>,
    uid: Option<u64>,
    gid: Option<u64>,
    mtime: Option<i64>,
    xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    sparse: bool,
}

/// Reads entries one at a time; between calls to [`TarReader::next_entry`]
/// it reads as the current entry's body.
#[derive(Debug)]
pub(crate) struct TarReader<R> {
    inner: R,
    pos: u64,
    remaining: u64,
    padding: u64,
    done: bool,
}

fn malformed(offset: u64, reason: impl Into<String>) -> Error {
    Error::Malformed {
        offset,
        reason: reason.into(),
    }
}

impl<R: Read> TarReader<R> {
    pub fn new(inner: R) -> Self {
        TarReader {
            inner,
            pos: 0,
            remaining: 0,
            padding: 0,
            done: false,
        }
    }

    pub fn into_inner(self) -> R {
        self.inner
    }

    fn read_raw(&mut self, buf: &mut [u8]) -> Result<usize> {
        loop {
            match self.inner.read(buf) {
                Ok(n) => {
                    self.pos += n as u64;
                    return Ok(n);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(source) => {
                    return Err(Error::Io {
                        what: format!("reading the tar stream at byte {}", self.pos),
                        source,
                    })
                }
            }
        }
    }

    /// Fills `buf`; `Ok(false)` on a clean end of stream before any byte.
    fn read_block(&mut self, buf: &mut [u8; BLOCK]) -> Result<bool> {
        let start = self.pos;
        let mut got = 0;
        while got < BLOCK {
            let n = self.read_raw(&mut buf[got..])?;
            if n == 0 {
                if got == 0 {
                    return Ok(false);
                }
                return Err(malformed(start, "truncated header"));
            }
            got += n;
        }
        Ok(true)
    }

    fn skip(&mut self, mut n: u64) -> Result<()> {
        let mut buf = [0u8; 8192];
        while n > 0 {
            let want = usize::try_from(n.min(buf.len() as u64)).unwrap_or(buf.len());
            let got = self.read_raw(&mut buf[..want])?;
            if got == 0 {
                return Err(malformed(self.pos, "truncated entry body"));
            }
            n -= got as u64;
        }
        Ok(())
    }

    /// Reads an extension body of `size` bytes (at most `limit`) plus its
    /// padding.
    fn read_extension(
        &mut self,
        offset: u64,
        size: u64,
        limit: u64,
        what: &str,
    ) -> Result<Vec<u8>> {
        if size > limit {
            return Err(malformed(
                offset,
                format!("{what} of {size} bytes (more than {limit})"),
            ));
        }
        let len = usize::try_from(size).map_err(|_| malformed(offset, "size out of range"))?;
        let mut data = vec![0u8; len];
        let mut got = 0;
        while got < len {
            let n = self.read_raw(&mut data[got..])?;
            if n == 0 {
                return Err(malformed(offset, format!("truncated {what}")));
            }
            got += n;
        }
        self.skip(pad(size))?;
        Ok(data)
    }

    /// Skips what is left of the current entry's body, then its padding.
    /// The stream may end inside the padding (not inside the body): that is
    /// the end of the archive, as Go's reader takes it.
    pub fn finish_entry(&mut self) -> Result<()> {
        let (body, padding) = (self.remaining, self.padding);
        self.remaining = 0;
        self.padding = 0;
        let start = self.pos;
        self.skip(body).map_err(|e| match e {
            Error::Malformed { .. } => malformed(
                start,
                format!(
                    "truncated entry body: the stream ends {} bytes short of the size its \
                     header gives",
                    body - (self.pos - start)
                ),
            ),
            other => other,
        })?;
        if self.skip_padding(padding)? {
            self.done = true;
        }
        Ok(())
    }

    /// Skips up to `n` bytes of padding; `true` when the stream ended first.
    fn skip_padding(&mut self, mut n: u64) -> Result<bool> {
        let mut buf = [0u8; BLOCK];
        while n > 0 {
            let want = usize::try_from(n.min(BLOCK as u64)).unwrap_or(BLOCK);
            let got = self.read_raw(&mut buf[..want])?;
            if got == 0 {
                return Ok(true);
            }
            n -= got as u64;
        }
        Ok(false)
    }

    /// The next member, or `None` at the end of the archive.
    pub fn next_entry(&mut self) -> Result<Option<Entry>> {
        if self.done {
            return Ok(None);
        }
        self.finish_entry()?;
        if self.done {
            // The stream ended in the last entry's padding.
            return Ok(None);
        }
        let first = self.pos;
        let mut long_name: Option<Vec<u8>> = None;
        let mut long_link: Option<Vec<u8>> = None;
        let mut pax: Option<Pax> = None;
        let mut header = [0u8; BLOCK];
        loop {
            let offset = self.pos;
            let pending = long_name.is_some() || long_link.is_some() || pax.is_some();
            if !self.read_block(&mut header)? || header.iter().all(|b| *b == 0) {
                self.done = true;
                if pending {
                    return Err(malformed(
                        first,
                        "extension header not followed by an entry",
                    ));
                }
                return Ok(None);
            }
            check_checksum(&header).map_err(|r| malformed(offset, r))?;
            let typeflag = header[156];
            let size = parse_number(&header[124..136])
                .and_then(|v| u64::try_from(v).map_err(|_| "negative size".to_string()))
                .map_err(|r| malformed(offset, format!("size field: {r}")))?;
            match typeflag {
                b'L' => {
                    if long_name.is_some() {
                        return Err(malformed(offset, "two GNU long names for one entry"));
                    }
                    let v = self.read_extension(offset, size, MAX_LONG_NAME, "GNU long name")?;
                    long_name = Some(trim_nul(&v).to_vec());
                }
                b'K' => {
                    if long_link.is_some() {
                        return Err(malformed(offset, "two GNU long links for one entry"));
                    }
                    let v = self.read_extension(offset, size, MAX_LONG_NAME, "GNU long link")?;
                    long_link = Some(trim_nul(&v).to_vec());
                }
                b'x' | b'X' => {
                    if pax.is_some() {
                        return Err(malformed(offset, "two PAX headers for one entry"));
                    }
                    let v = self.read_extension(offset, size, MAX_PAX, "PAX header")?;
                    pax = Some(parse_pax(&v).map_err(|r| malformed(offset, r))?);
                }
                b'g' => {
                    self.read_extension(offset, size, MAX_PAX, "PAX global header")?;
                }
                b'V' => {
                    // A volume label: no file.
                    self.skip(size.saturating_add(pad(size)))?;
                }
                _ => {
                    let entry = self.build_entry(
                        first,
                        offset,
                        &header,
                        size,
                        long_name.take(),
                        long_link.take(),
                        pax.take(),
                    )?;
                    self.remaining = entry.size;
                    self.padding = pad(entry.size);
                    return Ok(Some(entry));
                }
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn build_entry(
        &self,
        first: u64,
        offset: u64,
        h: &[u8; BLOCK],
        size: u64,
        long_name: Option<Vec<u8>>,
        long_link: Option<Vec<u8>>,
        pax: Option<Pax>,
    ) -> Result<Entry> {
        let pax = pax.unwrap_or_default();
        let magic = &h[257..265];
        let posix = &magic[..6] == b"ustar\0";
        let gnu = magic == b"ustar  \0";
        let path = if let Some(p) = pax.path {
            p
        } else if let Some(p) = long_name {
            p
        } else {
            let name = trim_nul(&h[0..100]);
            let prefix = if posix {
                // The star format keeps times after a shorter prefix.
                if &h[508..512] == b"tar\0" {
                    trim_nul(&h[345..476])
                } else {
                    trim_nul(&h[345..500])
                }
            } else {
                &[]
            };
            if prefix.is_empty() {
                name.to_vec()
            } else {
                let mut p = prefix.to_vec();
                p.push(b'/');
                p.extend_from_slice(name);
                p
            }
        };
        let name_for = |reason: String| Error::Rejected {
            entry: String::from_utf8_lossy(&path).into_owned(),
            reason,
        };
        let bad = |field: &str, r: String| {
            malformed(
                offset,
                format!(
                    "entry `{}`: {field} field: {r}",
                    String::from_utf8_lossy(&path)
                ),
            )
        };
        let link = pax
            .link
            .or(long_link)
            .unwrap_or_else(|| trim_nul(&h[157..257]).to_vec());
        let typeflag = h[156];
        let kind = match typeflag {
            b'0' | b'\0' | b'7' => {
                if path.ends_with(b"/") {
                    Kind::Dir
                } else {
                    Kind::File
                }
            }
            b'1' => Kind::HardLink,
            b'2' => Kind::Symlink,
            b'3' => Kind::Char,
            b'4' => Kind::Block,
            b'5' => Kind::Dir,
            b'6' => Kind::Fifo,
            b'S' => return Err(name_for("GNU sparse files are not supported".into())),
            b'M' => return Err(name_for("multi-volume archives are not supported".into())),
            other => {
                return Err(name_for(format!(
                    "unsupported tar entry type {:?}",
                    char::from(other)
                )))
            }
        };
        if pax.sparse {
            return Err(name_for("PAX sparse files are not supported".into()));
        }
        let size = match kind {
            Kind::File => pax.size.unwrap_or(size),
            _ => 0,
        };
        let mode = parse_number(&h[100..108])
            .map_err(|r| bad("mode", r))?
            .rem_euclid(0o10000);
        let mode = u32::try_from(mode).map_err(|_| bad("mode", "out of range".into()))?;
        let uid = match pax.uid {
            Some(v) => v,
            None => parse_number(&h[108..116])
                .and_then(|v| u64::try_from(v).map_err(|_| "negative".to_string()))
                .map_err(|r| bad("uid", r))?,
        };
        let gid = match pax.gid {
            Some(v) => v,
            None => parse_number(&h[116..124])
                .and_then(|v| u64::try_from(v).map_err(|_| "negative".to_string()))
                .map_err(|r| bad("gid", r))?,
        };
        let mtime = match pax.mtime {
            Some(v) => v,
            None => parse_number(&h[136..148]).map_err(|r| bad("mtime", r))?,
        };
        let (major, minor) = if (posix || gnu) && matches!(kind, Kind::Char | Kind::Block) {
            let major = parse_number(&h[329..337])
                .and_then(|v| u32::try_from(v).map_err(|_| "out of range".to_string()))
                .map_err(|r| bad("device major", r))?;
            let minor = parse_number(&h[337..345])
                .and_then(|v| u32::try_from(v).map_err(|_| "out of range".to_string()))
                .map_err(|r| bad("device minor", r))?;
            (major, minor)
        } else {
            (0, 0)
        };
        Ok(Entry {
            offset: first,
            kind,
            path,
            link,
            size,
            mode,
            uid,
            gid,
            mtime,
            major,
            minor,
            xattrs: pax.xattrs,
        })
    }
}

impl<R: Read> Read for TarReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.remaining == 0 || buf.is_empty() {
            return Ok(0);
        }
        let want = usize::try_from(self.remaining.min(buf.len() as u64)).unwrap_or(buf.len());
        let n = loop {
            match self.inner.read(&mut buf[..want]) {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        };
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "tar stream ends inside an entry's body",
            ));
        }
        self.pos += n as u64;
        self.remaining -= n as u64;
        Ok(n)
    }
}

/// Bytes of padding after a body of `size` bytes.
fn pad(size: u64) -> u64 {
    (BLOCK as u64 - size % BLOCK as u64) % BLOCK as u64
}

fn trim_nul(b: &[u8]) -> &[u8] {
    match b.iter().position(|c| *c == 0) {
        Some(i) => &b[..i],
        None => b,
    }
}

fn check_checksum(h: &[u8; BLOCK]) -> std::result::Result<(), String> {
    let want = parse_number(&h[148..156])
        .map_err(|r| format!("not a tar header (checksum field: {r})"))?;
    let mut unsigned: i64 = 0;
    let mut signed: i64 = 0;
    for (i, b) in h.iter().enumerate() {
        let b = if (148..156).contains(&i) { b' ' } else { *b };
        unsigned += i64::from(b);
        signed += i64::from(i8::from_ne_bytes([b]));
    }
    if want == unsigned || want == signed {
        Ok(())
    } else {
        Err(format!(
            "header checksum mismatch (recorded {want}, computed {unsigned})"
        ))
    }
}

/// Parses a numeric header field: octal ASCII (space or NUL padded) or
/// GNU base-256 (first byte's high bit set; `0xff` first means negative).
pub(crate) fn parse_number(field: &[u8]) -> std::result::Result<i64, String> {
    let Some(&first) = field.first() else {
        return Ok(0);
    };
    if first & 0x80 != 0 {
        let negative = first & 0x40 != 0;
        // Two's complement over the field's bits, the marker bit excluded.
        let mut value: i128 = i128::from(first & 0x7f);
        if negative {
            value -= 0x80;
        }
        for b in &field[1..] {
            value = value
                .checked_mul(256)
                .and_then(|v| v.checked_add(i128::from(*b)))
                .ok_or_else(|| "base-256 number out of range".to_string())?;
            if value.abs() > i128::from(i64::MAX) {
                return Err("base-256 number out of range".into());
            }
        }
        return i64::try_from(value).map_err(|_| "base-256 number out of range".into());
    }
    let text = trim_nul(field);
    let text: &[u8] = {
        let start = text.iter().position(|c| *c != b' ').unwrap_or(text.len());
        let end = text
            .iter()
            .rposition(|c| *c != b' ')
            .map_or(start, |e| e + 1);
        &text[start..end.max(start)]
    };
    if text.is_empty() {
        return Ok(0);
    }
    let mut value: i64 = 0;
    for c in text {
        if !(b'0'..=b'7').contains(c) {
            return Err(format!(
                "not an octal number: {:?}",
                String::from_utf8_lossy(text)
            ));
        }
        value = value
            .checked_mul(8)
            .and_then(|v| v.checked_add(i64::from(c - b'0')))
            .ok_or_else(|| "octal number out of range".to_string())?;
    }
    Ok(value)
}

fn parse_decimal_u64(v: &[u8], key: &str) -> std::result::Result<u64, String> {
    std::str::from_utf8(v)
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .ok_or_else(|| format!("PAX {key} is not a number"))
}

/// `mtime` in PAX may carry a fraction and a sign: keep whole seconds.
fn parse_pax_time(v: &[u8]) -> std::result::Result<i64, String> {
    let s = std::str::from_utf8(v).map_err(|_| "PAX mtime is not text".to_string())?;
    let whole = s.split('.').next().unwrap_or("");
    whole
        .parse::<i64>()
        .map_err(|_| format!("PAX mtime {s:?} is not a number"))
}

fn parse_pax(data: &[u8]) -> std::result::Result<Pax, String> {
    let mut pax = Pax::default();
    let mut rest = data;
    while !rest.is_empty() {
        // Some writers pad the header with NULs.
        if rest.iter().all(|b| *b == 0) {
            break;
        }
        let sp = rest
            .iter()
            .take(20)
            .position(|b| *b == b' ')
            .ok_or("PAX record without a length")?;
        let len: usize = std::str::from_utf8(&rest[..sp])
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or("PAX record length is not a number")?;
        if len <= sp + 1 || len > rest.len() {
            return Err("PAX record length out of range".into());
        }
        let record = &rest[sp + 1..len];
        let Some((&b'\n', record)) = record.split_last() else {
            return Err("PAX record does not end with a newline".into());
        };
        let eq = record
            .iter()
            .position(|b| *b == b'=')
            .ok_or("PAX record without `=`")?;
        let (key, value) = (&record[..eq], &record[eq + 1..]);
        match key {
            b"path" => pax.path = (!value.is_empty()).then(|| value.to_vec()),
            b"linkpath" => pax.link = (!value.is_empty()).then(|| value.to_vec()),
            b"size" => pax.size = Some(parse_decimal_u64(value, "size")?),
            b"uid" => pax.uid = Some(parse_decimal_u64(value, "uid")?),
            b"gid" => pax.gid = Some(parse_decimal_u64(value, "gid")?),
            b"mtime" => pax.mtime = Some(parse_pax_time(value)?),
            _ => {
                if let Some(name) = key.strip_prefix(b"SCHILY.xattr.") {
                    pax.xattrs.push((name.to_vec(), value.to_vec()));
                } else if key.starts_with(b"GNU.sparse.") {
                    pax.sparse = true;
                }
            }
        }
        rest = &rest[len..];
    }
    Ok(pax)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers() {
        assert_eq!(parse_number(b"0000644\0"), Ok(0o644));
        assert_eq!(parse_number(b"  755 \0"), Ok(0o755));
        assert_eq!(parse_number(b"\0\0\0\0"), Ok(0));
        assert!(parse_number(b"12a\0").is_err());
        let mut big = [0u8; 12];
        big[0] = 0x80;
        big[11] = 5;
        big[10] = 1;
        assert_eq!(parse_number(&big), Ok(261));
        let neg = [0xffu8; 12];
        assert_eq!(parse_number(&neg), Ok(-1));
        let mut huge = [0xffu8; 12];
        huge[0] = 0x80;
        assert!(parse_number(&huge).is_err());
        assert!(parse_number(b"77777777777777777777777").is_err());
    }

    fn record(kv: &[u8]) -> Vec<u8> {
        let n = kv.len() + 2;
        let mut len = n + n.to_string().len();
        if len.to_string().len() != n.to_string().len() {
            len = n + len.to_string().len();
        }
        let mut r = format!("{len} ").into_bytes();
        r.extend_from_slice(kv);
        r.push(b'\n');
        assert_eq!(r.len(), len);
        r
    }

    #[test]
    fn pax_records() {
        let mut buf = Vec::new();
        for kv in [
            &b"path=a/long/nm"[..],
            b"linkpath=target",
            b"size=123456",
            b"mtime=1700000000.123456789",
            b"SCHILY.xattr.user.k=v\xff\x00z",
            b"uname=someone",
        ] {
            buf.extend_from_slice(&record(kv));
        }
        let pax = parse_pax(&buf).expect("parses");
        assert_eq!(pax.path.as_deref(), Some(&b"a/long/nm"[..]));
        assert_eq!(pax.link.as_deref(), Some(&b"target"[..]));
        assert_eq!(pax.size, Some(123_456));
        assert_eq!(pax.mtime, Some(1_700_000_000));
        assert_eq!(
            pax.xattrs,
            vec![(b"user.k".to_vec(), b"v\xff\x00z".to_vec())]
        );
        assert!(!pax.sparse);
        assert!(
            parse_pax(&record(b"GNU.sparse.map=1"))
                .expect("parses")
                .sparse
        );
        assert!(parse_pax(b"99 path=x\n").is_err());
        assert!(parse_pax(b"x path=x\n").is_err());
        assert!(parse_pax(b"9 pathx\n").is_err());
        assert!(parse_pax(b"11 path=x\n").is_err());
        assert_eq!(
            parse_pax(b"10 path=x\n").expect("exact").path.as_deref(),
            Some(&b"x"[..])
        );
        assert!(parse_pax(&record(b"size=-1")).is_err());
    }

    #[test]
    fn empty_and_truncated_streams() {
        let mut t = TarReader::new(&b""[..]);
        assert!(t.next_entry().expect("empty is fine").is_none());
        let mut t = TarReader::new(&[0u8; 100][..]);
        assert!(matches!(t.next_entry(), Err(Error::Malformed { .. })));
        let mut t = TarReader::new(&[0u8; 1024][..]);
        assert!(t.next_entry().expect("end marker").is_none());
    }

    /// One file of `n` bytes, as the tar crate writes it (padded, two end
    /// blocks).
    fn one_file(n: usize) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_ustar();
        h.set_size(n as u64);
        h.set_mode(0o644);
        h.set_cksum();
        b.append_data(&mut h, "f", &vec![b'x'; n][..])
            .expect("append");
        b.into_inner().expect("finish")
    }

    #[test]
    fn the_stream_may_end_in_the_padding_of_the_last_body() {
        let tar = one_file(700);
        for cut in [512 + 700, 512 + 701, 1535, 1536] {
            let mut t = TarReader::new(&tar[..cut]);
            let e = t.next_entry().expect("header").expect("an entry");
            assert_eq!(e.size, 700);
            let mut body = Vec::new();
            t.read_to_end(&mut body).expect("body");
            assert_eq!(body.len(), 700);
            assert!(t.next_entry().expect("a clean end").is_none(), "{cut}");
            assert!(t.next_entry().expect("still the end").is_none());
        }
        // Skipped rather than read: the same.
        let mut t = TarReader::new(&tar[..512 + 700]);
        t.next_entry().expect("header").expect("an entry");
        assert!(t.next_entry().expect("a clean end").is_none());
    }

    #[test]
    fn a_body_cut_short_is_an_error_read_or_skipped() {
        let tar = one_file(700);
        let mut t = TarReader::new(&tar[..512 + 699]);
        t.next_entry().expect("header").expect("an entry");
        let mut body = Vec::new();
        let err = t.read_to_end(&mut body).expect_err("short body");
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
        let mut t = TarReader::new(&tar[..512 + 600]);
        t.next_entry().expect("header").expect("an entry");
        let err = t.next_entry().expect_err("short body");
        assert!(err.to_string().contains("100 bytes short"), "{err}");
    }

    #[test]
    fn oversized_long_name_is_refused_before_reading() {
        let mut h = tar::Header::new_gnu();
        h.as_gnu_mut().expect("gnu").name[..13].copy_from_slice(b"././@LongLink");
        h.set_entry_type(tar::EntryType::GNULongName);
        h.set_size(1 << 40);
        h.set_cksum();
        let mut t = TarReader::new(&h.as_bytes()[..]);
        let err = t.next_entry().expect_err("refused");
        assert!(err.to_string().contains("GNU long name"), "{err}");
    }
}
