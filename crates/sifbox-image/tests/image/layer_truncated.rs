//! Tar streams that end early, read as Go's `archive/tar` (so containerd
//! and Docker) reads them: a stream may end at an entry-header boundary
//! without the end-of-archive blocks, or inside (or right at the start of)
//! the padding after the last entry's body, as umoci 0.4.7 writes small
//! layers; a body shorter than its header says, or a header cut short,
//! is an error. Plain, gzip and zstd streams alike.

use crate::layer_util as util;

use proptest::prelude::*;
use sifbox_image::layer::{ApplyOptions, Error};
use util::{Layer, Sandbox};

/// The three ways a layer arrives.
#[derive(Debug, Clone, Copy)]
enum Comp {
    Plain,
    Gzip,
    Zstd,
}

const COMPS: [Comp; 3] = [Comp::Plain, Comp::Gzip, Comp::Zstd];

fn compress(tar: &[u8], c: Comp) -> Vec<u8> {
    match c {
        Comp::Plain => tar.to_vec(),
        Comp::Gzip => util::gzip(tar),
        Comp::Zstd => zstd::encode_all(tar, 3).expect("zstd"),
    }
}

/// Where each entry of a tar of plain headers (no extension headers) ends:
/// (end of its body, end of its padding).
fn entry_ends(tar: &[u8]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut at = 0;
    while at + 512 <= tar.len() && tar[at..at + 512].iter().any(|b| *b != 0) {
        let field = &tar[at + 124..at + 136];
        let text: String = field
            .iter()
            .take_while(|b| **b != 0 && **b != b' ')
            .map(|b| char::from(*b))
            .collect();
        let size = usize::from_str_radix(&text, 8).expect("octal size");
        let body_end = at + 512 + size;
        let padded = body_end.div_ceil(512) * 512;
        out.push((body_end, padded));
        at = padded;
    }
    out
}

/// A small layer: a dir, a 700-byte file, an empty file, a 13-byte file last.
fn layer() -> Vec<u8> {
    Layer::new()
        .dir("d/", 0o755)
        .file("d/big", 0o644, &[b'b'; 700])
        .file("d/empty", 0o644, b"")
        .file("d/last", 0o644, b"hello, umoci\n")
        .tar()
}

fn applied(bytes: &[u8]) -> Result<Sandbox, Error> {
    let sb = Sandbox::new();
    sb.apply(bytes, &ApplyOptions::default())?;
    sb.assert_canary();
    Ok(sb)
}

#[test]
fn a_stream_ending_right_after_the_last_body_is_read_whole() {
    let tar = layer();
    let ends = entry_ends(&tar);
    assert_eq!(ends.len(), 4);
    let (body_end, padded) = ends[3];
    assert!(body_end < padded, "the last body needs padding");
    for c in COMPS {
        // No padding, no end blocks: what umoci 0.4.7 writes.
        for cut in [body_end, body_end + 1, padded - 1, padded] {
            let sb = applied(&compress(&tar[..cut], c))
                .unwrap_or_else(|e| panic!("{c:?}, cut at {cut}: {e}"));
            let d = sb.dest();
            assert_eq!(
                std::fs::read(d.join("d/last")).expect("last"),
                b"hello, umoci\n"
            );
            assert_eq!(std::fs::read(d.join("d/big")).expect("big"), [b'b'; 700]);
            assert!(d.join("d/empty").is_file());
        }
    }
}

#[test]
fn a_stream_ending_at_a_header_boundary_is_a_clean_end() {
    let tar = layer();
    let ends = entry_ends(&tar);
    for c in COMPS {
        // After the empty file: a header boundary, no end blocks.
        let cut = ends[2].1;
        let sb = applied(&compress(&tar[..cut], c))
            .unwrap_or_else(|e| panic!("{c:?}, cut at {cut}: {e}"));
        assert!(sb.dest().join("d/empty").is_file());
        assert!(!sb.dest().join("d/last").exists());
        // One end block of two.
        let cut = ends[3].1 + 512;
        applied(&compress(&tar[..cut], c)).unwrap_or_else(|e| panic!("{c:?}: {e}"));
    }
}

#[test]
fn a_body_shorter_than_its_header_says_is_still_an_error() {
    let tar = layer();
    let ends = entry_ends(&tar);
    for c in COMPS {
        // One byte short of the last body; half-way through the big one;
        // inside a header.
        for cut in [ends[3].0 - 1, ends[0].1 + 512 + 350, ends[1].1 + 100] {
            let err = match applied(&compress(&tar[..cut], c)) {
                Ok(_) => panic!("{c:?}, cut at {cut}: accepted"),
                Err(e) => e,
            };
            let msg = err.to_string();
            assert!(matches!(err, Error::Malformed { .. }), "{c:?} {cut}: {msg}");
            assert!(
                msg.contains("truncated") || msg.contains("ends inside"),
                "{c:?} {cut}: {msg}"
            );
        }
    }
}

#[test]
fn a_skipped_body_cut_short_says_how_much_is_missing() {
    // A whiteout's body is not read by the applier but skipped by the
    // reader: cut five bytes short, it is refused all the same.
    let tar = Layer::new()
        .dir("d/", 0o755)
        .file("d/.wh.gone", 0o644, &[b'w'; 100])
        .tar();
    let ends = entry_ends(&tar);
    let err = applied(&tar[..ends[1].0 - 5]).err().expect("refused");
    let msg = err.to_string();
    assert!(matches!(err, Error::Malformed { .. }), "{msg}");
    assert!(
        msg.contains("truncated entry body") && msg.contains("5 bytes short"),
        "{msg}"
    );
    // Whole, without its padding: fine.
    applied(&tar[..ends[1].0]).expect("no padding is fine");
}

/// Files of these sizes under `f/`, as one layer, and where each ends.
fn files_layer(sizes: &[usize]) -> Vec<u8> {
    let mut l = Layer::new().dir("f/", 0o755);
    for (i, n) in sizes.iter().enumerate() {
        let body: Vec<u8> = (0..*n)
            .map(|j| ((i * 31 + j) % 251).to_le_bytes()[0])
            .collect();
        l = l.file(&format!("f/{i}"), 0o644, &body);
    }
    l.tar()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// Wherever a stream is cut, it is read as Go reads it: fine when the
    /// cut is at the start, at a header boundary, after an entry's body
    /// (in its padding), or after a whole end block; an error otherwise.
    /// What is read fine holds every entry whose body is complete.
    #[test]
    fn a_cut_anywhere_is_read_as_go_reads_it(
        sizes in proptest::collection::vec(0usize..1500, 1..5),
        cut in any::<prop::sample::Index>(),
        comp in 0usize..3,
    ) {
        let tar = files_layer(&sizes);
        let ends = entry_ends(&tar);
        let last = ends.last().map_or(0, |e| e.1);
        let n = cut.index(tar.len() + 1);
        let fine = n == 0
            || ends.iter().any(|(body, padded)| (*body..=*padded).contains(&n))
            || n >= last + 512;
        let c = COMPS[comp];
        match applied(&compress(&tar[..n], c)) {
            Ok(sb) => {
                prop_assert!(fine, "{c:?}: a cut at {n} was accepted ({ends:?})");
                // Entry 0 is the dir; file i is entry i + 1.
                for (i, size) in sizes.iter().enumerate() {
                    let p = sb.dest().join(format!("f/{i}"));
                    if ends[i + 1].0 <= n {
                        let got = std::fs::read(&p).expect("complete file");
                        prop_assert_eq!(got.len(), *size);
                    } else {
                        prop_assert!(!p.exists(), "{c:?}: f/{i} beyond a cut at {n}");
                    }
                }
            }
            Err(e) => {
                prop_assert!(!fine, "{c:?}: a cut at {n} was refused: {e} ({ends:?})");
            }
        }
    }
}
