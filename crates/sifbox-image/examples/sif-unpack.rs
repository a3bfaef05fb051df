//! `sif-unpack IMAGE.sif DEST`: extracts the primary system partition of a
//! SIF into DEST (owners kept when run as root, else everything owned by
//! the caller). Used by scripts/bench-sif.sh.

use std::path::Path;
use std::time::Instant;

use sifbox_image::sif::Sif;
use sifbox_image::squash::{self, UnpackOptions};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [image, dest] = args.as_slice() else {
        return Err("usage: sif-unpack IMAGE.sif DEST".into());
    };
    let start = Instant::now();
    let sif = Sif::open(Path::new(image))?;
    let part = sif
        .primary_partition()
        .ok_or("no primary system partition")?;
    let opts = if rustix::process::geteuid().is_root() {
        UnpackOptions::default()
    } else {
        UnpackOptions::for_caller()
    };
    let stats = squash::unpack_at(sif.file(), part.offset, part.size, Path::new(dest), &opts)?;
    eprintln!(
        "sif-unpack: {stats:?} in {:.2}s",
        start.elapsed().as_secs_f64()
    );
    Ok(())
}
