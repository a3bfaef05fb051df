//! Malformed SIF and squashfs input: each gives a clear error, never a panic.

use crate::sif_util;

use std::fs::{self, File};
use std::io::Cursor;

use proptest::prelude::*;
use sif_util::make_tree;
use sifbox_image::sif::{read_meta, Arch, Partition, Sif, SifError, SifWriter, DETERMINISTIC_TIME};
use sifbox_image::squash::{self, PackOptions, SquashError, UnpackOptions};

/// deffile (id 1) + JSON (id 2) + a 5000-byte primary partition (id 3).
fn valid() -> Vec<u8> {
    let mut w = SifWriter::deterministic(DETERMINISTIC_TIME);
    w.add_deffile(b"Bootstrap: scratch\n".to_vec())
        .expect("deffile");
    w.add_json("j", b"{}".to_vec()).expect("json");
    w.add_partition(
        Cursor::new(vec![0x68u8; 5000]),
        Partition::primary_squashfs(Arch::AMD64),
    )
    .expect("partition");
    let mut out = Vec::new();
    w.write_to(&mut out).expect("write");
    out
}

fn parse(b: &[u8]) -> Result<usize, SifError> {
    read_meta(&mut Cursor::new(b)).map(|(_, d)| d.len())
}

fn put_i64(b: &mut [u8], at: usize, v: i64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

/// Start of descriptor `id` (1-based) in the file.
fn desc(id: usize) -> usize {
    4096 + (id - 1) * 585
}

fn field_error(r: Result<usize, SifError>, field: &str) {
    match r {
        Err(SifError::BadField { field: f, .. }) => assert!(f.contains(field), "{f} vs {field}"),
        other => panic!("expected a bad {field}, got {other:?}"),
    }
}

#[test]
fn valid_parses() {
    assert_eq!(parse(&valid()).expect("valid"), 3);
}

#[test]
fn truncated_files() {
    let b = valid();
    let mut lengths: Vec<usize> = (0..=200).collect();
    lengths.extend([
        1000,
        4095,
        4096,
        4096 + 584,
        4096 + 585,
        32_175,
        32_176,
        32_768,
        b.len() - 1,
    ]);
    for len in lengths {
        let r = parse(&b[..len]);
        match (len, &r) {
            (
                0..128,
                Err(SifError::Truncated {
                    what: "global header",
                    ..
                }),
            ) => {}
            (
                128..32_176,
                Err(SifError::Truncated {
                    what: "descriptor table",
                    ..
                }),
            ) => {}
            (32_176.., Err(SifError::BadField { .. } | SifError::ObjectOutside { .. })) => {}
            _ => panic!("length {len}: unexpected {r:?}"),
        }
        let msg = r.expect_err("truncated").to_string();
        assert!(!msg.is_empty());
    }
    // The same through a file.
    let tmp = tempfile::tempdir().expect("tmp");
    for len in [0, 10, 127, 128, 5000, b.len() - 1] {
        let path = tmp.path().join(format!("t{len}.sif"));
        fs::write(&path, &b[..len]).expect("write");
        let err = Sif::open(&path).expect_err("truncated file");
        assert!(!err.to_string().is_empty());
    }
}

#[test]
fn wrong_magic_and_version() {
    let mut b = valid();
    b[32..42].copy_from_slice(b"NOT_MAGIC\0");
    let e = parse(&b).expect_err("magic");
    assert!(
        matches!(&e, SifError::BadMagic { found } if found.starts_with("NOT_MAGIC")),
        "{e:?}"
    );
    assert!(e.to_string().contains("NOT_MAGIC"));

    let mut b = valid();
    b[42..45].copy_from_slice(b"02\0");
    let e = parse(&b).expect_err("version");
    assert!(
        matches!(&e, SifError::BadVersion { found } if found.starts_with("02")),
        "{e:?}"
    );

    let mut b = valid();
    b[45..48].copy_from_slice(b"x2\0");
    field_error(parse(&b), "header arch");
}

#[test]
fn absurd_counts() {
    for (at, v, field) in [
        (88, 0, "descriptors total"),
        (88, 1 << 40, "descriptors total"),
        (88, -1, "descriptors total"),
        (88, i64::MAX, "descriptors total"),
        (80, 49, "descriptors free"),
        (80, 44, "descriptors free"),
        (80, -5, "descriptors free"),
        (104, 48 * 585 + 1, "descriptors size"),
        (96, 64, "descriptors offset"),
        (96, -4096, "descriptors offset"),
        (112, 100, "data offset"),
        (120, i64::MAX, "data size"),
        (120, -1, "data size"),
    ] {
        let mut b = valid();
        put_i64(&mut b, at, v);
        field_error(parse(&b), field);
    }
    // Offset far past the end, and an offset that overflows with the size.
    let mut b = valid();
    put_i64(&mut b, 96, 1 << 50);
    assert!(matches!(
        parse(&b),
        Err(SifError::Truncated {
            what: "descriptor table",
            ..
        })
    ));
    let mut b = valid();
    put_i64(&mut b, 96, i64::MAX - 10);
    assert!(parse(&b).is_err());
}

#[test]
fn descriptors_pointing_outside() {
    let b0 = valid();
    let len = b0.len() as i64;
    // (field offset in descriptor, value)
    for (field, v) in [
        (17, len),
        (17, len - 10),
        (25, len),
        (25, i64::MAX),
        (17, i64::MAX),
        (17, 200),
        (17, 4096),
    ] {
        let mut b = b0.clone();
        put_i64(&mut b, desc(3) + field, v);
        match parse(&b) {
            Err(SifError::ObjectOutside { id: 3, .. }) => {}
            other => panic!("field {field} = {v}: {other:?}"),
        }
    }
    for field in [17, 25, 33] {
        let mut b = b0.clone();
        put_i64(&mut b, desc(2) + field, -1);
        field_error(parse(&b), "descriptor 2");
    }
    let mut b = b0.clone();
    put_i64(&mut b, desc(3) + 33, 10); // padded size below the size
    field_error(parse(&b), "size with padding");
}

#[test]
fn inconsistent_descriptors() {
    let b0 = valid();
    // Overlap: object 2 starts inside object 1.
    let mut b = b0.clone();
    let off1 = i64::from_le_bytes(b[desc(1) + 17..desc(1) + 25].try_into().expect("8"));
    put_i64(&mut b, desc(2) + 17, off1 + 1);
    assert!(
        matches!(parse(&b), Err(SifError::Overlap { a: 1, b: 2 })),
        "{:?}",
        parse(&b)
    );
    // Duplicate id.
    let mut b = b0.clone();
    put_u32(&mut b, desc(2) + 5, 1);
    assert!(matches!(parse(&b), Err(SifError::DuplicateId { id: 1 })));
    // Id zero.
    let mut b = b0.clone();
    put_u32(&mut b, desc(2) + 5, 0);
    field_error(parse(&b), "descriptor 2 id");
    // A used flag that is neither 0 nor 1.
    let mut b = b0.clone();
    b[desc(2) + 4] = 7;
    field_error(parse(&b), "used flag");
    // A second primary system partition.
    let mut b = b0.clone();
    put_u32(&mut b, desc(2), 0x4004);
    put_u32(&mut b, desc(2) + 201, 1);
    put_u32(&mut b, desc(2) + 205, 2);
    b[desc(2) + 209..desc(2) + 212].copy_from_slice(b"02\0");
    assert!(
        matches!(
            parse(&b),
            Err(SifError::TwoPrimary {
                first: 2,
                second: 3
            })
        ),
        "{:?}",
        parse(&b)
    );
    // A partition whose arch is not two digits.
    let mut b = b0.clone();
    b[desc(3) + 209..desc(3) + 212].copy_from_slice(b"\xff\xff\xff");
    field_error(parse(&b), "partition arch");
    // A used slot beyond the counted ones.
    let mut b = b0;
    let first = b[desc(1)..desc(2)].to_vec();
    b[desc(4)..desc(5)].copy_from_slice(&first);
    put_u32(&mut b, desc(4) + 5, 4);
    put_i64(&mut b, desc(4) + 25, 0);
    field_error(parse(&b), "descriptors free");
}

#[test]
fn object_reads_are_bounded() {
    let tmp = tempfile::tempdir().expect("tmp");
    let path = tmp.path().join("v.sif");
    fs::write(&path, valid()).expect("write");
    let sif = Sif::open(&path).expect("open");
    assert_eq!(
        sif.read_object(1, 100).expect("deffile"),
        b"Bootstrap: scratch\n"
    );
    assert!(matches!(
        sif.read_object(3, 4999),
        Err(SifError::TooLarge {
            id: 3,
            size: 5000,
            ..
        })
    ));
    assert!(matches!(
        sif.read_object(9, 100),
        Err(SifError::NoSuchObject { id: 9 })
    ));
}

/// A small image; level 0 stores the metadata uncompressed, so that
/// mutations reach the parser instead of failing the zlib checksum.
fn small_squashfs(level: u32) -> Vec<u8> {
    let tmp = tempfile::tempdir().expect("tmp");
    let tree = tmp.path().join("tree");
    make_tree(&tree, 20);
    let img = tmp.path().join("x.sqfs");
    let opts = PackOptions {
        compression_level: level,
        ..PackOptions::default()
    };
    squash::pack(&tree, &img, &opts).expect("pack");
    fs::read(&img).expect("read")
}

#[test]
fn squashfs_garbage_is_refused() {
    let tmp = tempfile::tempdir().expect("tmp");
    let img = tmp.path().join("g.sqfs");
    fs::write(&img, vec![0u8; 4096]).expect("write");
    assert!(matches!(
        squash::unpack(&img, &tmp.path().join("o1"), &UnpackOptions::for_caller()),
        Err(SquashError::NotSquashfs)
    ));
    let mut good = small_squashfs(9);
    good.truncate(50);
    fs::write(&img, &good).expect("write");
    assert!(matches!(
        squash::unpack(&img, &tmp.path().join("o2"), &UnpackOptions::for_caller()),
        Err(SquashError::Corrupt { .. })
    ));
    let mut xz = small_squashfs(9);
    xz[20] = 4; // compression id: xz
    fs::write(&img, &xz).expect("write");
    let e =
        squash::unpack(&img, &tmp.path().join("o3"), &UnpackOptions::for_caller()).expect_err("xz");
    assert!(e.to_string().contains("xz"), "{e}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..6000)) {
        let _ = parse(&bytes);
        // And with a valid header in front.
        let mut b = valid()[..128].to_vec();
        b.extend_from_slice(&bytes);
        let _ = parse(&b);
    }

    #[test]
    fn mutated_sif_never_panics(
        edits in prop::collection::vec((0usize..(4096 + 4 * 585), any::<u8>()), 1..24),
        far in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4),
        cut in prop::option::of(any::<prop::sample::Index>()),
    ) {
        let mut b = valid();
        for (at, v) in edits {
            // Structure lives in the header and the first descriptors.
            let at = if at < 4096 { at % 128 } else { at };
            b[at] = v;
        }
        for (i, v) in far {
            let at = i.index(b.len());
            b[at] = v;
        }
        if let Some(c) = cut {
            let at = c.index(b.len());
            b.truncate(at);
        }
        if let Ok((h, descs)) = read_meta(&mut Cursor::new(&b)) {
            prop_assert!(h.descriptors_total <= 4096);
            for d in descs {
                prop_assert!(d.offset.checked_add(d.size).is_some_and(|e| e <= b.len() as u64));
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn mutated_squashfs_never_panics(
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        tables in any::<bool>(),
        stored in any::<bool>(),
    ) {
        thread_local!(static IMAGES: [Vec<u8>; 2] = [small_squashfs(9), small_squashfs(0)]);
        let mut b = IMAGES.with(|i| i[usize::from(stored)].clone());
        // Half the cases aim at the superblock and the tables at the end.
        let bytes_used = u64::from_le_bytes(b[40..48].try_into().expect("8"));
        let inode_table = u64::from_le_bytes(b[64..72].try_into().expect("8"));
        let (lo, hi) = if tables {
            (usize::try_from(inode_table).expect("usize"), usize::try_from(bytes_used).expect("usize"))
        } else {
            (0, b.len())
        };
        for (i, v) in edits {
            let at = if i.index(4) == 0 { i.index(96) } else { lo + i.index(hi - lo) };
            b[at] = v;
        }
        let tmp = tempfile::tempdir().expect("tmp");
        let img = tmp.path().join("m.sqfs");
        fs::write(&img, &b).expect("write");
        let f = File::open(&img).expect("open");
        let len = b.len() as u64;
        let _ = squash::unpack_at(&f, 0, len, &tmp.path().join("out"), &UnpackOptions::for_caller());
        // Nothing may appear next to the destination.
        let names: Vec<_> = fs::read_dir(tmp.path()).expect("ls").map(|e| e.expect("e").file_name()).collect();
        prop_assert!(names.len() <= 2, "{names:?}");
    }
}
