//! Local archives that `ADD` unpacks: tar, plain or compressed with gzip,
//! zstd, bzip2 or xz (told from their first bytes, as Docker does).

use std::fs::File;
use std::io::{self, BufReader, Read};
use std::os::unix::fs::FileExt;

use rustix::pipe::{pipe_with, PipeFlags};

const BZIP2_MAGIC: &[u8] = b"BZh";
const XZ_MAGIC: &[u8] = &[0xfd, b'7', b'z', b'X', b'Z', 0];

/// The file `f` (opened by the caller, at its start) decompressed.
pub fn open(f: File) -> io::Result<Box<dyn Read + Send>> {
    let mut head = [0u8; 6];
    // Read at an offset: the file's position stays at its start.
    let n = f.read_at(&mut head, 0)?;
    let head = &head[..n];
    if head.starts_with(BZIP2_MAGIC) {
        return Ok(Box::new(bzip2::read::MultiBzDecoder::new(BufReader::new(
            f,
        ))));
    }
    if head.starts_with(XZ_MAGIC) {
        // lzma-rs writes what it decodes: a thread feeds a pipe. When the
        // reader stops early, the writer gets EPIPE and ends.
        let (r, w) = pipe_with(PipeFlags::CLOEXEC)?;
        std::thread::spawn(move || {
            let mut input = BufReader::new(f);
            let mut out = File::from(w);
            if let Err(e) = lzma_rs::xz_decompress(&mut input, &mut out) {
                tracing::debug!("xz: {e}");
            }
        });
        return Ok(Box::new(File::from(r)));
    }
    let d = sifbox_image::layer::decompressed(f).map_err(io::Error::other)?;
    Ok(Box::new(d))
}

/// Whether the file `f` is a tar archive (after decompression).
pub fn is_tar(f: File) -> bool {
    let Ok(mut d) = open(f) else {
        return false;
    };
    let mut head = [0u8; 512];
    let mut got = 0;
    while got < head.len() {
        match d.read(&mut head[got..]) {
            Ok(0) | Err(_) => break,
            Ok(n) => got += n,
        }
    }
    got == 512 && &head[257..262] == b"ustar"
}
