//! Content digests (`sha256:<hex>`, `sha512:<hex>`) and a hashing reader:
//! the one digest type of sifbox, for OCI blobs and the store's keys alike.

use std::fmt;
use std::io::{self, Read};
use std::str::FromStr;

use sha2::Digest as _;

/// A digest algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Algorithm {
    /// SHA-256 (64 hex digits).
    Sha256,
    /// SHA-512 (128 hex digits).
    Sha512,
}

impl Algorithm {
    fn name(self) -> &'static str {
        match self {
            Algorithm::Sha256 => "sha256",
            Algorithm::Sha512 => "sha512",
        }
    }

    fn hex_len(self) -> usize {
        match self {
            Algorithm::Sha256 => 64,
            Algorithm::Sha512 => 128,
        }
    }
}

/// A content digest in OCI form, `algorithm:lowercase-hex`. Parsing checks
/// the algorithm and the hex length, so the hex part is safe as a file name.
/// The image store names images by their SHA-256 digest.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest {
    /// `algorithm:hex`.
    text: String,
    algorithm: Algorithm,
}

impl Digest {
    fn new(algorithm: Algorithm, hex: &str) -> Digest {
        Digest {
            text: format!("{}:{hex}", algorithm.name()),
            algorithm,
        }
    }

    /// The algorithm.
    #[must_use]
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// The lowercase hex digits.
    #[must_use]
    pub fn hex(&self) -> &str {
        &self.text[self.algorithm.name().len() + 1..]
    }

    /// `algorithm:hex`.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// A SHA-256 digest (`sha256:` and 64 lowercase hex digits), as the
    /// store's keys are; anything else is `None`.
    #[must_use]
    pub fn parse_sha256(s: &str) -> Option<Digest> {
        s.parse::<Digest>()
            .ok()
            .filter(|d| d.algorithm == Algorithm::Sha256)
    }

    /// The SHA-256 digest of a file's contents, streamed.
    pub fn sha256_of_file(path: &std::path::Path) -> io::Result<Digest> {
        let mut f = std::fs::File::open(path)?;
        let mut h = Hasher::new(Algorithm::Sha256);
        let mut buf = vec![0u8; 1 << 16];
        loop {
            let n = f.read(&mut buf)?;
            if n == 0 {
                break;
            }
            h.update(&buf[..n]);
        }
        Ok(h.finish())
    }

    /// The SHA-256 digest of `data`.
    #[must_use]
    pub fn sha256_of(data: &[u8]) -> Digest {
        let mut h = Hasher::new(Algorithm::Sha256);
        h.update(data);
        h.finish()
    }

    /// Where an OCI image layout keeps this blob: `blobs/<alg>/<hex>`.
    #[must_use]
    pub fn blob_path(&self) -> String {
        format!("blobs/{}/{}", self.algorithm.name(), self.hex())
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl FromStr for Digest {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (alg, hex) = s
            .split_once(':')
            .ok_or_else(|| format!("digest {s:?} has no algorithm"))?;
        let algorithm = match alg {
            "sha256" => Algorithm::Sha256,
            "sha512" => Algorithm::Sha512,
            _ => return Err(format!("digest {s:?}: unsupported algorithm {alg:?}")),
        };
        if hex.len() != algorithm.hex_len()
            || !hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return Err(format!(
                "digest {s:?}: expected {} lowercase hex digits",
                algorithm.hex_len()
            ));
        }
        Ok(Digest::new(algorithm, hex))
    }
}

/// An incremental hash of either algorithm.
#[derive(Debug, Clone)]
pub(crate) enum Hasher {
    Sha256(sha2::Sha256),
    Sha512(sha2::Sha512),
}

impl Hasher {
    pub fn new(algorithm: Algorithm) -> Self {
        match algorithm {
            Algorithm::Sha256 => Hasher::Sha256(sha2::Sha256::new()),
            Algorithm::Sha512 => Hasher::Sha512(sha2::Sha512::new()),
        }
    }

    pub fn update(&mut self, data: &[u8]) {
        match self {
            Hasher::Sha256(h) => h.update(data),
            Hasher::Sha512(h) => h.update(data),
        }
    }

    pub fn finish(self) -> Digest {
        let (algorithm, hex) = match self {
            Hasher::Sha256(h) => (Algorithm::Sha256, hex::encode(h.finalize())),
            Hasher::Sha512(h) => (Algorithm::Sha512, hex::encode(h.finalize())),
        };
        Digest::new(algorithm, &hex)
    }
}

/// Hashes (when asked to) and counts what is read through it.
#[derive(Debug)]
pub(crate) struct HashingReader<R> {
    inner: R,
    hasher: Option<Hasher>,
    bytes: u64,
}

impl<R: Read> HashingReader<R> {
    pub fn new(inner: R, algorithm: Option<Algorithm>) -> Self {
        HashingReader {
            inner,
            hasher: algorithm.map(Hasher::new),
            bytes: 0,
        }
    }

    /// The digest (when hashing) and the byte count.
    pub fn finish(self) -> (Option<Digest>, u64) {
        (self.hasher.map(Hasher::finish), self.bytes)
    }

    pub fn into_parts(self) -> (R, Option<Digest>, u64) {
        let bytes = self.bytes;
        (self.inner, self.hasher.map(Hasher::finish), bytes)
    }
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if let Some(h) = &mut self.hasher {
            h.update(&buf[..n]);
        }
        self.bytes += n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_hash() {
        let d = Digest::sha256_of(b"");
        assert_eq!(
            d.to_string(),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(d.to_string().parse::<Digest>(), Ok(d.clone()));
        assert_eq!(d.blob_path(), format!("blobs/sha256/{}", d.hex()));
        assert!("sha256:abc".parse::<Digest>().is_err());
        assert!("md5:d41d8cd98f00b204e9800998ecf8427e"
            .parse::<Digest>()
            .is_err());
        assert!(format!("sha256:{}", "A".repeat(64))
            .parse::<Digest>()
            .is_err());
        assert!(format!("sha256:../{}", "a".repeat(61))
            .parse::<Digest>()
            .is_err());
        assert!(format!("sha512:{}", "0".repeat(128))
            .parse::<Digest>()
            .is_ok());
        let mut r = HashingReader::new(&b"abc"[..], Some(Algorithm::Sha256));
        std::io::copy(&mut r, &mut std::io::sink()).expect("copy");
        let (digest, n) = r.finish();
        assert_eq!(n, 3);
        assert_eq!(digest, Some(Digest::sha256_of(b"abc")));
    }
}
