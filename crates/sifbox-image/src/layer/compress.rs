//! Telling layer compressions apart by their first bytes, and decoding.

use std::io::{self, BufRead, BufReader, Chain, Cursor, Read};

use super::{Error, Result};

/// Compression of a layer or tarball.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    /// A plain tar.
    None,
    /// gzip (one or more members).
    Gzip,
    /// zstd (one or more frames).
    Zstd,
}

impl Compression {
    /// Tells the compression from the first bytes of a stream (at least 6
    /// when the stream has them).
    ///
    /// # Errors
    ///
    /// The name of a recognised but unsupported compression (xz, bzip2, lz4).
    pub fn detect(prefix: &[u8]) -> Result<Compression, &'static str> {
        if prefix.starts_with(&[0x1f, 0x8b]) {
            Ok(Compression::Gzip)
        } else if prefix.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
            Ok(Compression::Zstd)
        } else if prefix.starts_with(&[0xfd, b'7', b'z', b'X', b'Z', 0]) {
            Err("xz")
        } else if prefix.starts_with(b"BZh") {
            Err("bzip2")
        } else if prefix.starts_with(&[0x04, 0x22, 0x4d, 0x18]) {
            Err("lz4")
        } else {
            Ok(Compression::None)
        }
    }
}

const BUF: usize = 128 * 1024;
const SNIFF: usize = 6;

/// The source with its sniffed first bytes put back, buffered.
pub(crate) type Sniffed<R> = BufReader<Chain<Cursor<Vec<u8>>, R>>;

/// A decompressing reader chosen by the stream's first bytes.
pub(crate) enum Decoder<R: Read> {
    Plain(Sniffed<R>),
    Gzip(Box<flate2::bufread::MultiGzDecoder<Sniffed<R>>>),
    Zstd(zstd::stream::read::Decoder<'static, Sniffed<R>>),
}

impl<R: Read> std::fmt::Debug for Decoder<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Decoder({:?})", self.compression())
    }
}

impl<R: Read> Decoder<R> {
    pub fn new(mut inner: R) -> Result<Self> {
        let mut prefix = vec![0u8; SNIFF];
        let mut got = 0;
        while got < SNIFF {
            match inner.read(&mut prefix[got..]) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(source) => {
                    return Err(Error::Io {
                        what: "reading the start of the layer".into(),
                        source,
                    })
                }
            }
        }
        prefix.truncate(got);
        let compression = Compression::detect(&prefix).map_err(|name| Error::Malformed {
            offset: 0,
            reason: format!(
                "{name}-compressed data is not supported (use plain tar, gzip or zstd)"
            ),
        })?;
        let sniffed = BufReader::with_capacity(BUF, Cursor::new(prefix).chain(inner));
        Ok(match compression {
            Compression::None => Decoder::Plain(sniffed),
            Compression::Gzip => {
                Decoder::Gzip(Box::new(flate2::bufread::MultiGzDecoder::new(sniffed)))
            }
            Compression::Zstd => Decoder::Zstd(
                zstd::stream::read::Decoder::with_buffer(sniffed).map_err(|source| Error::Io {
                    what: "starting the zstd decoder".into(),
                    source,
                })?,
            ),
        })
    }

    pub fn compression(&self) -> Compression {
        match self {
            Decoder::Plain(_) => Compression::None,
            Decoder::Gzip(_) => Compression::Gzip,
            Decoder::Zstd(_) => Compression::Zstd,
        }
    }

    /// The compressed side, positioned after what the decoder consumed.
    pub fn into_inner(self) -> Sniffed<R> {
        match self {
            Decoder::Plain(r) => r,
            Decoder::Gzip(d) => d.into_inner(),
            Decoder::Zstd(d) => d.finish(),
        }
    }
}

impl<R: Read> Read for Decoder<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Decoder::Plain(r) => r.read(buf),
            Decoder::Gzip(d) => d.read(buf),
            Decoder::Zstd(d) => d.read(buf),
        }
    }
}

/// Reads `r` to its end, discarding the bytes.
pub(crate) fn drain<R: BufRead>(r: &mut R) -> io::Result<u64> {
    let mut total = 0u64;
    loop {
        let n = {
            let buf = match r.fill_buf() {
                Ok(b) => b,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            buf.len()
        };
        if n == 0 {
            return Ok(total);
        }
        r.consume(n);
        total += n as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn detects_and_decodes() {
        let data = b"hello layer".repeat(100);
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&data).expect("gz");
        let gz = gz.finish().expect("gz");
        let zs = zstd::encode_all(&data[..], 3).expect("zstd");
        for (bytes, want) in [
            (data.clone(), Compression::None),
            (gz, Compression::Gzip),
            (zs, Compression::Zstd),
        ] {
            let mut d = Decoder::new(&bytes[..]).expect("decoder");
            assert_eq!(d.compression(), want);
            let mut out = Vec::new();
            d.read_to_end(&mut out).expect("read");
            assert_eq!(out, data);
        }
        // Short inputs are plain.
        let mut d = Decoder::new(&b"ab"[..]).expect("decoder");
        let mut out = Vec::new();
        d.read_to_end(&mut out).expect("read");
        assert_eq!(out, b"ab");
        let err = Decoder::new(&[0xfd, b'7', b'z', b'X', b'Z', 0, 1][..]).expect_err("xz");
        assert!(err.to_string().contains("xz"), "{err}");
    }
}
