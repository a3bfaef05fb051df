//! Feeds arbitrary bytes to the Dockerfile parser and, when they parse, to
//! the planner and the stage walk; the same bytes go to the variable
//! lexer and the .dockerignore matcher. Any error is fine; a panic is not.
//! What a successful parse promises is checked: at least one stage, lines
//! inside the input, dependencies planned before the stages that need them.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sifbox_build::dockerfile::parse;
use sifbox_build::ignore::Ignore;
use sifbox_build::lex::{expand_heredoc, expand_word, expand_words};
use sifbox_build::plan::{plan, PlanOptions};

fuzz_target!(|data: &[u8]| {
    let lines = data.split(|&b| b == b'\n').count();
    if let Ok(df) = parse(data) {
        assert!(!df.stages.is_empty());
        for st in &df.stages {
            assert!(st.line >= 1 && st.line <= lines);
            for inst in &st.instructions {
                assert!(inst.line > st.line && inst.end_line >= inst.line);
                assert!(inst.end_line <= lines);
            }
        }
        if let Ok(p) = plan(&df, &PlanOptions::default()) {
            let order: Vec<usize> = p.stages.iter().map(|s| s.index).collect();
            assert_eq!(order.last(), Some(&p.target));
            for (pos, s) in p.stages.iter().enumerate() {
                for d in &s.stage_deps {
                    let dpos = order.iter().position(|o| o == d);
                    assert!(dpos.is_some_and(|dp| dp < pos));
                }
                let mut env = p.stage_env(Vec::new());
                for inst in &s.instructions {
                    if env.apply(inst).is_err() {
                        break;
                    }
                }
            }
        }
    }
    let text = String::from_utf8_lossy(data);
    let env: Vec<(String, String)> = vec![("a".into(), "x y".into()), ("b".into(), String::new())];
    for escape in ['\\', '`'] {
        let _ = expand_word(&text, &env, escape);
        let _ = expand_words(&text, &env, escape);
        let _ = expand_heredoc(&text, &env, escape);
    }
    if let Ok(ig) = Ignore::parse(&text) {
        for path in ["a", "a/b", "a/b/c.md", "Dockerfile"] {
            let _ = ig.is_excluded(path, false);
            let _ = ig.may_reinclude_below(path);
        }
    }
});
