//! Block compression: gzip (zlib streams, what squashfs calls "gzip") for
//! writing; gzip and zstd for reading.

use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};

use super::format::{COMP_GZIP, COMP_ZSTD};

/// A reusable zlib compressor.
pub(crate) struct Deflater {
    inner: Compress,
    store: bool,
}

impl Deflater {
    /// Level 1 to 9; 0 stores every block uncompressed.
    pub(crate) fn new(level: u32) -> Self {
        Self {
            inner: Compress::new(Compression::new(level), true),
            store: level == 0,
        }
    }

    /// Compresses `input` into `out` (cleared first). Returns `true` when the
    /// result is smaller than the input; otherwise the block should be stored
    /// as is and `out` holds nothing useful.
    pub(crate) fn compress(&mut self, input: &[u8], out: &mut Vec<u8>) -> bool {
        self.inner.reset();
        out.clear();
        // Room for strictly less than the input: if the stream does not end
        // within it, compressing does not pay.
        let room = input.len().saturating_sub(1);
        if room == 0 || self.store {
            return false;
        }
        out.reserve_exact(room);
        // With `Finish` and enough room zlib ends the stream in one call;
        // anything else means the output did not fit.
        matches!(
            self.inner.compress_vec(input, out, FlushCompress::Finish),
            Ok(Status::StreamEnd)
        ) && out.len() < input.len()
    }
}

/// Why a block did not decompress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum InflateError {
    /// The stream is not valid.
    Corrupt,
    /// It would produce more than the allowed size.
    TooLarge,
    /// It ends before its end marker.
    Truncated,
}

/// A reusable decompressor for the image's compressor.
pub(crate) enum Inflater {
    Gzip(Decompress),
    Zstd(zstd::bulk::Decompressor<'static>),
}

impl std::fmt::Debug for Inflater {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Gzip(_) => "Inflater::Gzip",
            Self::Zstd(_) => "Inflater::Zstd",
        })
    }
}

impl Inflater {
    /// `None` when sifbox cannot read this compressor.
    pub(crate) fn new(compression: u16) -> Option<Self> {
        match compression {
            COMP_GZIP => Some(Self::Gzip(Decompress::new(true))),
            COMP_ZSTD => zstd::bulk::Decompressor::new().ok().map(Self::Zstd),
            _ => None,
        }
    }

    /// Decompresses `input` into `out` (cleared first), producing at most `max` bytes.
    pub(crate) fn inflate(
        &mut self,
        input: &[u8],
        out: &mut Vec<u8>,
        max: usize,
    ) -> Result<(), InflateError> {
        out.clear();
        out.reserve_exact(max);
        match self {
            Self::Gzip(d) => {
                d.reset(true);
                match d.decompress_vec(input, out, FlushDecompress::Finish) {
                    Ok(Status::StreamEnd) if out.len() <= max => Ok(()),
                    Ok(Status::StreamEnd) => Err(InflateError::TooLarge),
                    Ok(_) if out.len() >= max => Err(InflateError::TooLarge),
                    Ok(_) => Err(InflateError::Truncated),
                    Err(_) => Err(InflateError::Corrupt),
                }
            }
            Self::Zstd(z) => match z.decompress_to_buffer(input, out) {
                Ok(_) if out.len() <= max => Ok(()),
                Ok(_) => Err(InflateError::TooLarge),
                Err(_) => Err(InflateError::Corrupt),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_incompressible() {
        let mut d = Deflater::new(9);
        let mut i = Inflater::new(COMP_GZIP).expect("gzip");
        let text = b"squashfs squashfs squashfs squashfs squashfs squashfs".repeat(100);
        let mut c = Vec::new();
        assert!(d.compress(&text, &mut c));
        assert!(c.len() < text.len());
        let mut back = Vec::new();
        i.inflate(&c, &mut back, text.len()).expect("inflate");
        assert_eq!(back, text);
        assert_eq!(
            i.inflate(&c, &mut back, text.len() - 1),
            Err(InflateError::TooLarge)
        );
        assert_eq!(
            i.inflate(&c[..c.len() / 2], &mut back, text.len()),
            Err(InflateError::Truncated)
        );
        assert_eq!(
            i.inflate(b"not zlib at all", &mut back, 100),
            Err(InflateError::Corrupt)
        );

        // Pseudo-random bytes do not compress: stored as is.
        let mut x = 0x1234_5678_u32;
        let noise: Vec<u8> = (0..4096)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                x.to_le_bytes()[0]
            })
            .collect();
        assert!(!d.compress(&noise, &mut c));
        assert!(!d.compress(&[], &mut c));
        assert!(!d.compress(&[1], &mut c));
    }
}
