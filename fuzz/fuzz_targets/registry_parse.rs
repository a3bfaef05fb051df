//! Feeds arbitrary bytes to everything a pull parses from a registry or a
//! user: `WWW-Authenticate` challenges, image references, manifests and
//! indexes (and the platform pick), error bodies. Any error is fine; a
//! panic is not. A reference that parses must print as one that parses the
//! same; a challenge's scheme is lowercase.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sifbox_image::layer::Manifest;
use sifbox_registry::challenge;
use sifbox_registry::client::registry_message;
use sifbox_registry::Reference;

fuzz_target!(|data: &[u8]| {
    for c in challenge::parse(data) {
        assert_eq!(c.scheme, c.scheme.to_ascii_lowercase());
    }
    if let Ok(s) = std::str::from_utf8(data) {
        if let Ok(r) = Reference::parse(s) {
            assert_eq!(Reference::parse(&r.to_string()).ok(), Some(r));
        }
    }
    let _ = Manifest::parse(data, "fuzz");
    let _ = Manifest::select(data, None, "fuzz");
    assert!(!registry_message(data).contains('\n'));
});
