//! Property tests of what a registry (or a user) hands the pull code as
//! untrusted text: `WWW-Authenticate` headers, image references, manifests
//! and error bodies. None of the parsers panics on any input, and the
//! well-formed inputs they are given come back as they went in.

use proptest::prelude::*;
use sifbox_image::layer::Manifest;
use sifbox_registry::challenge;
use sifbox_registry::client::registry_message;
use sifbox_registry::Reference;

fn param_value() -> impl Strategy<Value = String> {
    // Printable ASCII, quotes and backslashes included (escaped below).
    proptest::string::string_regex("[ -~]{0,40}").expect("regex")
}

fn quote(v: &str) -> String {
    let mut out = String::from("\"");
    for c in v.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn challenge_parser_takes_any_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        let _ = challenge::parse(&bytes);
    }

    #[test]
    fn challenges_round_trip(
        schemes in proptest::collection::vec(prop_oneof![Just("Bearer"), Just("Basic"), Just("Digest")], 1..3),
        params in proptest::collection::vec(
            proptest::collection::vec(("[a-z][a-z0-9_]{0,8}", param_value()), 1..4), 3),
        spaces in proptest::collection::vec(prop_oneof![Just(""), Just(" "), Just("  ")], 4),
    ) {
        let mut header = String::new();
        for (i, s) in schemes.iter().enumerate() {
            if i > 0 {
                header.push(',');
                header.push_str(spaces[0]);
            }
            header.push_str(s);
            header.push(' ');
            for (j, (k, v)) in params[i].iter().enumerate() {
                if j > 0 {
                    header.push_str(spaces[1]);
                    header.push(',');
                    header.push_str(spaces[2]);
                }
                header.push_str(k);
                header.push('=');
                header.push_str(&quote(v));
            }
        }
        let parsed = challenge::parse(header.as_bytes());
        prop_assert_eq!(parsed.len(), schemes.len(), "{}", header);
        for (i, ch) in parsed.iter().enumerate() {
            prop_assert_eq!(&ch.scheme, &schemes[i].to_ascii_lowercase());
            let want: Vec<(String, String)> = params[i].clone();
            prop_assert_eq!(&ch.params, &want, "{}", header);
        }
    }

    #[test]
    fn reference_parser_takes_any_text(s in "\\PC{0,80}") {
        if let Ok(r) = Reference::parse(&s) {
            // Whatever parses prints as something that parses the same.
            prop_assert_eq!(Reference::parse(&r.to_string()).ok(), Some(r));
        }
    }

    #[test]
    fn references_round_trip(
        registry in prop_oneof![
            Just(None),
            "[a-z][a-z0-9]{0,8}\\.[a-z]{2,4}".prop_map(Some),
            ("[a-z]{1,8}\\.[a-z]{2,3}", 1u16..65535).prop_map(|(h, p)| Some(format!("{h}:{p}"))),
            (1u16..65535).prop_map(|p| Some(format!("127.0.0.1:{p}"))),
        ],
        path in proptest::collection::vec("[a-z0-9]{1,6}([._-][a-z0-9]{1,6}){0,2}", 1..4),
        tag in proptest::option::of("[A-Za-z0-9_][A-Za-z0-9_.-]{0,20}"),
        digest in proptest::option::of("[0-9a-f]{64}"),
    ) {
        // Without a registry, a first component with a '.' would name one.
        prop_assume!(registry.is_some() || !path[0].contains('.'));
        let mut s = String::new();
        if let Some(r) = &registry {
            s.push_str(r);
            s.push('/');
        }
        s.push_str(&path.join("/"));
        if let Some(t) = &tag {
            s.push(':');
            s.push_str(t);
        }
        if let Some(d) = &digest {
            s.push_str("@sha256:");
            s.push_str(d);
        }
        let r = Reference::parse(&s).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let want_registry = registry.clone().unwrap_or_else(|| "docker.io".into());
        prop_assert_eq!(r.registry(), want_registry.as_str());
        let repo = path.join("/");
        if registry.is_none() && path.len() == 1 {
            prop_assert_eq!(r.repository().to_string(), format!("library/{repo}"));
        } else {
            prop_assert_eq!(r.repository(), repo.as_str());
        }
        let want_tag = match (&tag, &digest) {
            (Some(t), _) => Some(t.clone()),
            (None, None) => Some("latest".to_string()),
            (None, Some(_)) => None,
        };
        prop_assert_eq!(r.tag().map(str::to_string), want_tag);
        prop_assert_eq!(r.digest().map(str::to_string), digest.map(|d| format!("sha256:{d}")));
        prop_assert_eq!(Reference::parse(&r.to_string()).ok(), Some(r));
    }

    #[test]
    fn manifest_parser_and_error_bodies_take_any_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        let _ = Manifest::parse(&bytes, "manifest");
        let _ = Manifest::select(&bytes, None, "index");
        let m = registry_message(&bytes);
        prop_assert!(!m.contains('\n'));
    }

    #[test]
    fn manifest_like_json_never_panics(
        schema in 0u32..4,
        n in 0usize..4,
        size in -5i64..5,
        media in prop_oneof![
            Just("application/vnd.oci.image.layer.v1.tar+gzip"),
            Just("application/vnd.oci.image.layer.v1.tar+encrypted"),
            Just("text/plain"),
            Just(""),
        ],
        arch in prop_oneof![Just("amd64"), Just("arm64"), Just("unknown")],
    ) {
        let d = format!("sha256:{}", "a".repeat(64));
        let descs: Vec<serde_json::Value> = (0..n)
            .map(|_| serde_json::json!({"mediaType": media, "digest": d, "size": size,
                                       "platform": {"os": "linux", "architecture": arch}}))
            .collect();
        let index = serde_json::json!({"schemaVersion": schema, "manifests": descs});
        let manifest = serde_json::json!({"schemaVersion": schema,
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": d, "size": size},
            "layers": descs});
        for doc in [index, manifest] {
            let b = doc.to_string().into_bytes();
            let _ = Manifest::parse(&b, "m");
            let _ = Manifest::select(&b, Some(&"linux/arm64".parse().expect("platform")), "m");
        }
    }
}
