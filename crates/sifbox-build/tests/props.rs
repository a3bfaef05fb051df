//! Property tests: arbitrary input to the Dockerfile parser, the lexer, the
//! planner and the .dockerignore matcher never panics, and what they return
//! keeps its promises. (The nightly-only fuzz target
//! `fuzz/fuzz_targets/dockerfile_parse.rs` does the same unguided.)

use proptest::prelude::*;
use sifbox_build::dockerfile::{self, Instr};
use sifbox_build::ignore::Ignore;
use sifbox_build::lex::{expand_heredoc, expand_word, expand_words};
use sifbox_build::plan::{self, Base, PlanOptions, Platform};

/// Lines that look like Dockerfile content, to get past the first checks.
fn dockerfile_line() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("FROM alpine AS a".to_owned()),
        Just("FROM a".to_owned()),
        Just("FROM scratch".to_owned()),
        Just("FROM $IMG AS b".to_owned()),
        Just("ARG IMG=alpine".to_owned()),
        Just("ARG X".to_owned()),
        Just("ENV X=${X:-1} Y=\"a b\"".to_owned()),
        Just("ENV Z $X".to_owned()),
        Just("RUN echo $X \\".to_owned()),
        Just("RUN <<EOF".to_owned()),
        Just("RUN <<-'EOF' cat".to_owned()),
        Just("EOF".to_owned()),
        Just("\tEOF".to_owned()),
        Just("COPY --from=a /x /y".to_owned()),
        Just("COPY --from=1 /x /y".to_owned()),
        Just("COPY <<EOF /f".to_owned()),
        Just("RUN --mount=type=cache,target=/c,from=b true".to_owned()),
        Just("WORKDIR /w/$X".to_owned()),
        Just("# comment".to_owned()),
        Just("# escape=`".to_owned()),
        Just(String::new()),
        Just("ONBUILD RUN x".to_owned()),
        Just("HEALTHCHECK --interval=1s CMD true".to_owned()),
        Just("CMD [\"a\"]".to_owned()),
        Just("EXPOSE $P 80".to_owned()),
        "[ -~\t]{0,40}",
    ]
}

fn check_dockerfile(src: &str) {
    let lines = src.split('\n').count();
    match dockerfile::parse_str(src) {
        Ok(df) => {
            assert!(!df.stages.is_empty());
            let mut last = 0;
            for (i, st) in df.stages.iter().enumerate() {
                assert_eq!(st.index, i);
                assert!(st.line >= 1 && st.line <= lines);
                assert!(st.line > last, "stages in file order");
                last = st.line;
                for inst in &st.instructions {
                    assert!(inst.line > st.line && inst.line <= lines);
                    assert!(inst.end_line >= inst.line && inst.end_line <= lines);
                    assert!(!inst.original.is_empty());
                    let kw = inst.keyword();
                    assert!(inst.original.to_ascii_uppercase().starts_with(kw));
                    if let Instr::Copy(c) | Instr::Add(c) = &inst.kind {
                        assert!(!c.sources.is_empty());
                    }
                }
            }
            assert!(matches!(df.directives.escape, '\\' | '`'));
            // Planning either works or says why; never panics.
            let opts = PlanOptions {
                build_args: [("X".to_owned(), "v".to_owned())].into_iter().collect(),
                target: None,
                target_platform: Platform::host(),
                build_platform: Platform::host(),
            };
            if let Ok(p) = plan::plan(&df, &opts) {
                let order: Vec<usize> = p.stages.iter().map(|s| s.index).collect();
                assert_eq!(order.last(), Some(&p.target));
                for (pos, s) in p.stages.iter().enumerate() {
                    for d in &s.stage_deps {
                        let dpos = order.iter().position(|o| o == d).expect("dep planned");
                        assert!(dpos < pos, "dependencies first");
                    }
                    if let Base::Stage(b) = s.base {
                        assert!(b < s.index);
                    }
                    let mut env = p.stage_env(Vec::new());
                    for inst in &s.instructions {
                        if env.apply(inst).is_err() {
                            break;
                        }
                    }
                    let _ = env.run_env();
                }
            }
        }
        Err(e) => {
            let msg = e.to_string();
            assert!(msg.starts_with("Dockerfile"), "{msg}");
            assert!(e.line <= lines);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn parser_never_panics_on_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        let _ = dockerfile::parse(&bytes);
    }

    #[test]
    fn parser_keeps_promises(src in "\\PC{0,400}") {
        check_dockerfile(&src);
    }

    #[test]
    fn parser_keeps_promises_on_plausible_files(
        lines in proptest::collection::vec(dockerfile_line(), 0..24),
        crlf in any::<bool>(),
    ) {
        let sep = if crlf { "\r\n" } else { "\n" };
        check_dockerfile(&lines.join(sep));
    }

    #[test]
    fn lexer_never_panics(s in "\\PC{0,200}", escape in prop_oneof![Just('\\'), Just('`')]) {
        let env: Vec<(String, String)> = vec![
            ("a".into(), "x y".into()),
            ("b".into(), String::new()),
            ("c".into(), "/usr/lib/x.tar.gz".into()),
        ];
        let w = expand_word(&s, &env, escape);
        let ws = expand_words(&s, &env, escape);
        prop_assert_eq!(w.is_ok(), ws.is_ok());
        let _ = expand_heredoc(&s, &env, escape);
        if let Ok(words) = ws {
            for word in &words {
                // A split word never holds unquoted whitespace at its ends
                // unless quoting put it there.
                if !s.contains(['"', '\'', escape]) {
                    prop_assert!(!word.starts_with(char::is_whitespace));
                    prop_assert!(!word.is_empty());
                }
            }
        }
    }

    #[test]
    fn lexer_is_identity_on_plain_text(s in "[a-zA-Z0-9_./:,=+@%-]{0,60}") {
        let env: Vec<(String, String)> = vec![("a".into(), "1".into())];
        prop_assert_eq!(expand_word(&s, &env, '\\'), Ok(s.clone()));
        prop_assert_eq!(expand_heredoc(&s, &env, '\\'), Ok(s.clone()));
    }

    #[test]
    fn lexer_splits_like_whitespace_on_plain_words(
        words in proptest::collection::vec("[a-z0-9/._-]{1,8}", 0..6),
        gap in "[ \t]{1,3}",
    ) {
        let s = words.join(&gap);
        prop_assert_eq!(expand_words(&s, &(), '\\').expect("plain"), words);
    }

    #[test]
    fn quoting_a_word_keeps_it(s in "[^'\\\\]{0,40}") {
        // Single quotes keep anything but a single quote literally.
        let env: Vec<(String, String)> = vec![("a".into(), "1".into())];
        let quoted = format!("'{s}'");
        prop_assert_eq!(expand_word(&quoted, &env, '\\'), Ok(s.clone()));
    }

    #[test]
    fn ignore_never_panics(text in "\\PC{0,200}", path in "\\PC{0,60}") {
        if let Ok(ig) = Ignore::parse(&text) {
            let _ = ig.is_excluded(&path, false);
            let _ = ig.may_reinclude_below(&path);
        }
    }

    /// The walker's shortcut is sound: when a directory is excluded and no
    /// exception may include anything below it, nothing below it is
    /// included.
    #[test]
    fn reinclude_check_is_sound(
        pats in proptest::collection::vec(
            ("!?", "(a|b|\\*|\\?|\\*\\*|\\[ab\\]|\\[\\^a\\])(/(a|b|\\*|\\?|\\*\\*|\\[ab\\]))*"), 1..5),
        dir in "(a|b|ab)(/(a|b|ab)){0,2}",
        below in "(a|b|ab)(/(a|b|ab)){0,2}",
    ) {
        let text: Vec<String> = pats.iter().map(|(bang, p)| format!("{bang}{p}")).collect();
        let ig = Ignore::parse(&text.join("\n")).expect("valid patterns");
        let child = format!("{dir}/{below}");
        if ig.is_excluded(&dir, true) && !ig.may_reinclude_below(&dir) {
            prop_assert!(ig.is_excluded(&child, false), "{:?}: {} excluded, {} not", text, dir, child);
        }
        // A path below an excluded directory stays excluded unless an
        // exception applies.
        if ig.is_excluded(&dir, true) && !text.iter().any(|t| t.starts_with('!')) {
            prop_assert!(ig.is_excluded(&child, false));
        }
    }
}
