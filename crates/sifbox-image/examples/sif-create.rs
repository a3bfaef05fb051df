//! `sif-create DIR OUT.sif`: packs DIR as a gzip squashfs and writes a SIF
//! with it as the primary system partition (host arch). Deterministic when
//! SOURCE_DATE_EPOCH is set. Used by scripts/bench-sif.sh.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::Instant;

use sifbox_image::sif::{Arch, Partition, SifWriter};
use sifbox_image::squash::{self, PackOptions};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [dir, out] = args.as_slice() else {
        return Err("usage: sif-create DIR OUT.sif".into());
    };
    let start = Instant::now();
    let out = Path::new(out);
    let tmp = PathBuf::from(format!("{}.sqfs.tmp", out.display()));
    let stats = squash::pack(Path::new(dir), &tmp, &PackOptions::from_env())?;
    let packed = start.elapsed();
    let mut w = SifWriter::from_env();
    w.add_partition(File::open(&tmp)?, Partition::primary_squashfs(Arch::host()))?;
    let len = w.write_to(File::create(out)?)?;
    std::fs::remove_file(&tmp)?;
    eprintln!(
        "sif-create: {} inodes, {} data bytes -> {} byte SIF; pack {:.2}s, total {:.2}s",
        stats.inodes,
        stats.data_bytes,
        len,
        packed.as_secs_f64(),
        start.elapsed().as_secs_f64()
    );
    Ok(())
}
