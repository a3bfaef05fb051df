//! Feeds arbitrary bytes to the SIF parser (in memory) and, when they
//! parse, checks what it promises: every object lies inside the input and
//! the descriptor count stays bounded. Any error is fine; a panic is not.
#![no_main]

use std::io::Cursor;

use libfuzzer_sys::fuzz_target;
use sifbox_image::sif::{read_meta, MAX_DESCRIPTORS};

fuzz_target!(|data: &[u8]| {
    if let Ok((header, descriptors)) = read_meta(&mut Cursor::new(data)) {
        assert!(header.descriptors_total <= MAX_DESCRIPTORS);
        assert!(descriptors.len() as u64 <= header.descriptors_total);
        for d in &descriptors {
            let end = d.offset.checked_add(d.size).expect("no overflow");
            assert!(end <= data.len() as u64);
        }
        assert!(
            descriptors
                .iter()
                .filter(|d| d.is_primary_partition())
                .count()
                <= 1
        );
    }
});
