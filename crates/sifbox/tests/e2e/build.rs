//! End-to-end tests of `sifbox build` (issue 5): a conformance suite with a
//! case for every instruction and flag, asserting the built image's files,
//! modes, owners and metadata; the cache; concurrent builds; failures; and
//! `apt-get install` in a Debian bookworm base.
//!
//! Most cases build on the busybox test rootfs, imported as `busybox` into
//! each test's own store. The apt case needs a Debian bookworm minbase
//! tarball (`$SIFBOX_TEST_DEBIAN_TAR`, default `target/bookworm-minbase.tar`,
//! made by scripts/bootstrap-base.sh) and the network to Debian's mirror.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::harness::{
    self, debian_tar, digest_of, free_port, host_arch, is_root, require, rootfs, run_tool, tempdir,
    Invocation, Output, Store, Tree,
};
use serde_json::Value;

/// How long a build of the busybox cases may take.
const BUILD_TIMEOUT: Duration = Duration::from_secs(120);

/// A test's store with the test rootfs imported as `busybox`, and a build
/// context.
struct Env {
    store: Store,
    ctx: Tree,
}

impl Env {
    /// A fresh store with the test rootfs imported as `busybox`.
    fn new() -> Env {
        let env = Env {
            store: Store::new("sifbox-build-cache."),
            ctx: Tree::temp("sifbox-build-ctx."),
        };
        env.store
            .import(rootfs(), "busybox")
            .timeout(BUILD_TIMEOUT)
            .output()
            .success();
        env
    }

    /// `sifbox ARGS...` with the store, under [`BUILD_TIMEOUT`].
    fn cmd(&self, args: &[&str]) -> Invocation<'_> {
        self.store.cmd(args).timeout(BUILD_TIMEOUT)
    }

    fn sifbox(&self, args: &[&str]) -> Output {
        self.cmd(args).output()
    }

    /// Writes a file of the context (parents made).
    fn file(&self, rel: &str, content: &str) {
        self.ctx.file(rel, content);
    }

    /// `sifbox build --progress plain ARGS... CONTEXT`.
    fn build(&self, args: &[&str]) -> Output {
        let ctx = self.ctx.path().display().to_string();
        let mut all = vec!["build", "--progress", "plain"];
        all.extend_from_slice(args);
        all.push(&ctx);
        self.sifbox(&all)
    }

    /// Asserts that the store lists `n` images.
    #[track_caller]
    fn assert_images(&self, n: usize) {
        let ls = self.sifbox(&["image", "ls", "--json"]).json();
        assert_eq!(ls["images"].as_array().map(Vec::len), Some(n), "{ls}");
    }

    /// Builds with `dockerfile` and returns the digest.
    fn build_ok(&self, dockerfile: &str, args: &[&str]) -> String {
        self.file("Dockerfile", dockerfile);
        self.build(args).digest()
    }

    /// Runs `sh -c script` in `image`; returns stdout.
    fn sh(&self, image: &str, script: &str) -> String {
        let out = self.sifbox(&["run", "--entrypoint", "", image, "sh", "-c", script]);
        out.success();
        out.stdout
    }

    /// The image's config as `sifbox image inspect` shows it.
    fn config(&self, image: &str) -> Value {
        let out = self.sifbox(&["image", "inspect", "--json", image]);
        out.success();
        out.json()["config"].clone()
    }
}

impl Drop for Env {
    /// Builds leave trees with files of the caller's subordinate ids, which
    /// only sifbox can remove: empty the store so that its temp dir goes.
    fn drop(&mut self) {
        if !std::thread::panicking() {
            self.store.empty();
        }
    }
}

/// A build that failed on the caller's input: exit 125, the last stderr
/// line is the one error (the progress lines before it stay).
#[track_caller]
fn input_error(out: &Output) -> &Output {
    out.code_is(125);
    let last = out.stderr.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("sifbox: error: "),
        "last stderr line: {last:?}\n{}",
        out.stderr
    );
    assert_eq!(out.stderr.matches("sifbox: ").count(), 1, "{}", out.stderr);
    out
}

/// Whether images this caller builds keep owners other than root in its
/// sandboxes: root's do, and so do those of a caller with a subordinate id
/// range (builds and sandboxes map it).
fn keeps_owners() -> bool {
    is_root() || harness::has_subid_range()
}

/// Lines of `stat -c '%n %a %u:%g %F'` as a map from name to the rest.
fn stats(text: &str) -> std::collections::BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(n, rest)| (n.to_string(), rest.to_string()))
        .collect()
}

#[test]
fn instructions_set_files_and_metadata() {
    let env = Env::new();
    let df = r#"# syntax=docker/dockerfile:1
ARG BASE=busybox
FROM $BASE AS main
ARG GREETING=hello
ARG UNUSED_LATER
ENV ONE=1 TWO="two words"
ENV THREE three and more
LABEL org.example.version="1.0" other=${GREETING}
MAINTAINER someone@example.org
WORKDIR /srv
WORKDIR app
WORKDIR $ONE/x
RUN echo "$GREETING $ONE $TWO $THREE $(pwd)" > /srv/run.txt \
    && echo continued >> /srv/run.txt
SHELL ["/bin/sh", "-ec"]
RUN test "$SHELL_CHECK" = "" && echo shell ok > /srv/shell.txt
EXPOSE 8080 53/udp
VOLUME ["/data"]
STOPSIGNAL SIGINT
HEALTHCHECK --interval=5s --retries=2 CMD cat /srv/run.txt
ONBUILD RUN echo triggered > /tmp/onbuild.txt
USER 1000:1000
ENTRYPOINT ["/bin/sh", "-c"]
CMD ["cat /srv/run.txt"]
"#;
    let d = env.build_ok(df, &["-t", "conf:1", "--build-arg", "GREETING=hi"]);
    let c = env.config("conf:1");
    assert_eq!(c["workdir"], "/srv/app/1/x");
    assert_eq!(c["user"], "1000:1000");
    assert_eq!(c["entrypoint"], serde_json::json!(["/bin/sh", "-c"]));
    assert_eq!(c["cmd"], serde_json::json!(["cat /srv/run.txt"]));
    let envs: Vec<&str> = c["env"]
        .as_array()
        .expect("env")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for want in ["ONE=1", "TWO=two words", "THREE=three and more"] {
        assert!(envs.contains(&want), "{want} not in {envs:?}");
    }
    assert!(
        !envs.iter().any(|e| e.starts_with("GREETING=")),
        "ARG leaked into the image env: {envs:?}"
    );
    assert_eq!(c["labels"]["org.example.version"], "1.0");
    assert_eq!(c["labels"]["other"], "hi");
    assert_eq!(c["labels"]["maintainer"], "someone@example.org");
    assert_eq!(
        c["exposed_ports"],
        serde_json::json!(["8080/tcp", "53/udp"])
    );
    assert_eq!(c["volumes"], serde_json::json!(["/data"]));
    assert_eq!(c["stop_signal"], "SIGINT");
    assert_eq!(
        c["healthcheck"]["Test"],
        serde_json::json!(["CMD-SHELL", "cat /srv/run.txt"])
    );
    assert_eq!(c["healthcheck"]["Interval"], 5_000_000_000u64);
    assert_eq!(c["healthcheck"]["Retries"], 2);
    assert_eq!(
        c["onbuild"],
        serde_json::json!(["RUN echo triggered > /tmp/onbuild.txt"])
    );
    assert_eq!(c["shell"], serde_json::json!(["/bin/sh", "-ec"]));
    // The image runs its entrypoint and cmd, as the user, in the workdir.
    let out = env.sifbox(&["run", &d]);
    out.success();
    assert_eq!(
        out.stdout,
        "hi 1 two words three and more /srv/app/1/x\ncontinued\n"
    );
    let out = env.sh("conf:1", "id -u; pwd; cat /srv/shell.txt");
    assert_eq!(out, "1000\n/srv/app/1/x\nshell ok\n");

    // ONBUILD triggers run in a build FROM the image, and only there.
    let d2 = env.build_ok(
        "FROM conf:1\nUSER 0\nRUN cat /tmp/onbuild.txt > /seen.txt\n",
        &["-t", "child"],
    );
    assert_eq!(env.sh(&d2, "cat /seen.txt"), "triggered\n");
    assert_eq!(env.config("child")["onbuild"], Value::Null);
}

#[test]
fn run_passes_its_arguments_to_the_entrypoint() {
    let env = Env::new();
    env.build_ok(
        "FROM busybox\nENTRYPOINT [\"/bin/echo\", \"ep\"]\nCMD [\"default\"]\n",
        &["-t", "ep"],
    );
    env.build_ok("FROM busybox\nCMD [\"echo\", \"cmd\"]\n", &["-t", "cmd"]);
    let run = |args: &[&str]| {
        let mut all = vec!["run"];
        all.extend_from_slice(args);
        let out = env.sifbox(&all);
        out.success();
        out.stdout
    };
    // The entrypoint, then the cmd or the arguments that replace it.
    assert_eq!(run(&["ep"]), "ep default\n");
    assert_eq!(run(&["ep", "a", "b"]), "ep a b\n");
    assert_eq!(run(&["ep", "--", "-n", "x"]), "ep -n x\n");
    // --entrypoint replaces it and drops the cmd, as docker run's does.
    assert_eq!(run(&["--entrypoint", "/bin/echo", "ep", "x"]), "x\n");
    assert_eq!(run(&["--entrypoint", "/bin/echo", "ep"]), "\n");
    assert_eq!(run(&["--entrypoint", "", "ep", "echo", "own"]), "own\n");
    // Without an entrypoint, the arguments are the command.
    assert_eq!(run(&["cmd"]), "cmd\n");
    assert_eq!(run(&["cmd", "echo", "other"]), "other\n");
    // Nothing to run: bad input.
    env.sifbox(&["run", "--entrypoint", "", "ep"])
        .code_is(harness::SIFBOX_ERROR)
        .stderr_has("no command given");
}

#[test]
fn copy_and_add_follow_dockers_rules() {
    let env = Env::new();
    env.file("a.txt", "A\n");
    env.file("b.txt", "B\n");
    env.file("dir/x", "X\n");
    env.file("dir/sub/y", "Y\n");
    env.file("script.sh", "#!/bin/sh\necho script\n");
    env.ctx.mode("script.sh", 0o755);
    env.file("ignored.log", "no\n");
    env.file("keep/important.log", "yes\n");
    env.file("keep/other.log", "no\n");
    env.file(
        ".dockerignore",
        "# comment\n*.log\n**/*.log\n!keep/important.log\n",
    );
    env.ctx.symlink("link", "a.txt");
    // Tarballs for ADD to unpack (bzip2 and xz-utils make two of them).
    let src = Tree::temp("sifbox-build-tar.");
    src.file("t/inner/z", "Z\n");
    for (flag, name) in [
        ("-czf", "archive.tar.gz"),
        ("-cjf", "archive.tar.bz2"),
        ("-cJf", "archive.tar.xz"),
    ] {
        run_tool(
            Command::new("tar")
                .arg("-C")
                .arg(src.join("t"))
                .arg(flag)
                .arg(env.ctx.join(name))
                .arg("."),
        );
    }
    let df = r#"FROM busybox
COPY a.txt /one/
COPY a.txt /renamed.txt
COPY dir /dircontents
COPY *.txt /glob/
COPY ["a.txt", "b.txt", "/multi/"]
COPY --chmod=0600 a.txt /chmod.txt
COPY --chown=1000:1000 a.txt /chown.txt
COPY --chown=user a.txt /chown-name.txt
COPY script.sh /usr/local/bin/
COPY link /link
COPY . /ctx/
COPY --exclude=b.txt *.txt /excl/
WORKDIR /w
COPY a.txt rel.txt
ADD archive.tar.gz /unpacked/
ADD archive.tar.bz2 /unpacked-bz2/
ADD archive.tar.xz /unpacked-xz/
ADD a.txt /added.txt
"#;
    env.build_ok(df, &["-t", "copies"]);
    let out = env.sh(
        "copies",
        "cd / && for f in one/a.txt renamed.txt dircontents/x dircontents/sub/y glob/a.txt glob/b.txt \
         multi/a.txt multi/b.txt chmod.txt chown.txt chown-name.txt usr/local/bin/script.sh link \
         unpacked-bz2/inner/z unpacked-xz/inner/z \
         ctx/a.txt ctx/keep/important.log excl/a.txt w/rel.txt unpacked/inner/z added.txt; do \
         stat -c '%n %a %u:%g %F' $f; done; cat renamed.txt; cat link; cat unpacked/inner/z; script.sh; \
         ls /ctx | tr '\\n' ' '; echo; ls /ctx/keep; ls /excl; ls /dircontents | tr '\\n' ' '",
    );
    let s = stats(&out);
    for f in [
        "one/a.txt",
        "renamed.txt",
        "dircontents/x",
        "dircontents/sub/y",
        "glob/a.txt",
        "glob/b.txt",
        "multi/a.txt",
        "multi/b.txt",
        "ctx/a.txt",
        "ctx/keep/important.log",
        "excl/a.txt",
        "w/rel.txt",
        "added.txt",
    ] {
        assert_eq!(
            s.get(f).map(String::as_str),
            Some("644 0:0 regular file"),
            "{f} in\n{out}"
        );
    }
    assert_eq!(s["chmod.txt"], "600 0:0 regular file");
    assert_eq!(s["usr/local/bin/script.sh"], "755 0:0 regular file");
    // A source that is a symlink is followed, as Docker does.
    assert_eq!(s["link"], "644 0:0 regular file");
    for f in [
        "unpacked/inner/z",
        "unpacked-bz2/inner/z",
        "unpacked-xz/inner/z",
    ] {
        assert_eq!(s[f], "644 0:0 regular file", "{f}");
    }
    // Owners other than root survive where the caller can own files for
    // other ids: as root, or through a subordinate id range.
    if keeps_owners() {
        assert_eq!(s["chown.txt"], "644 1000:1000 regular file");
        assert_eq!(s["chown-name.txt"], "644 1000:1000 regular file");
    } else {
        assert_eq!(s["chown.txt"], "644 0:0 regular file");
    }
    let rest: Vec<&str> = out
        .lines()
        .filter(|l| !l.contains(" regular file") && !l.contains("symbolic"))
        .collect();
    assert_eq!(rest[..4], ["A", "A", "Z", "script"], "{out}");
    let ctx_list = rest[4];
    assert!(!ctx_list.contains("ignored.log"), "{out}");
    assert!(
        ctx_list.contains("Dockerfile") && ctx_list.contains("a.txt"),
        "{out}"
    );
    assert_eq!(rest[5], "important.log", "{out}");
    assert_eq!(rest[6], "a.txt", "{out}");
    assert_eq!(rest[7].trim(), "sub x", "{out}");
}

#[test]
fn heredocs_in_run_and_copy() {
    let env = Env::new();
    let df = "FROM busybox\nENV WHO=world\nRUN <<EOF\necho one > /h-run\necho two >> /h-run\nEOF\n\
RUN cat <<EOF > /h-shell\nhello $WHO\nEOF\n\
RUN <<-EOF\n\techo tabs > /h-tabs\n\tEOF\n\
COPY <<EOF /h-copy\nvalue ${WHO}\nEOF\n\
COPY <<\"EOF\" /h-literal\nvalue ${WHO}\nEOF\n\
RUN <<EOF\n#!/bin/sh\necho shebang > /h-shebang\nEOF\n";
    env.build_ok(df, &["-t", "here"]);
    let out = env.sh(
        "here",
        "cat /h-run /h-shell /h-tabs /h-copy /h-literal /h-shebang",
    );
    assert_eq!(
        out,
        "one\ntwo\nhello world\ntabs\nvalue world\nvalue ${WHO}\nshebang\n"
    );
}

#[test]
fn stages_target_and_copy_from() {
    let env = Env::new();
    let df = "FROM busybox AS builder\nRUN echo built > /out\n\
FROM busybox AS broken\nRUN exit 3\n\
FROM busybox\nCOPY --from=builder /out /from-name\nCOPY --from=0 /out /from-index\n\
COPY --from=busybox /etc/sifbox-test-rootfs /from-image\n";
    // The broken stage is not needed, so it never runs.
    env.build_ok(df, &["-t", "multi"]);
    let out = env.sh(
        "multi",
        "cat /from-name /from-index; test -e /from-image && echo image",
    );
    assert_eq!(out, "built\nbuilt\nimage\n");
    // --target builds that stage only.
    let d = env.build_ok(df, &["--target", "builder", "-t", "just-builder"]);
    assert_eq!(
        env.sh(&d, "cat /out; test -e /from-name || echo no-final"),
        "built\nno-final\n"
    );
    // Unknown target: a clear error.
    let out = env.build(&["--target", "nope"]);
    out.sifbox_error()
        .stderr_has("Dockerfile: --target nope: no stage has that name; stages: ");
    assert!(
        !out.stderr.contains(":0:") && !out.stderr.contains(": : "),
        "{}",
        out.stderr
    );
}

/// Cache mounts are kept apart by build context: one context's build
/// plants nothing in another's cache (the audit: a wheel), unless both
/// name the same `id=`.
#[test]
fn cache_mounts_are_per_context_unless_they_share_an_id() {
    let env = Env::new();
    let other = Tree::temp("sifbox-build-ctx2.");
    let df = "FROM busybox\nARG WHO\n\
RUN --mount=type=cache,target=/c echo $WHO >> /c/log && cp /c/log /seen\n\
RUN --mount=type=cache,id=shared,target=/s echo $WHO >> /s/log && cp /s/log /seen-shared\n";
    env.build_ok(df, &["--build-arg", "WHO=first", "-t", "first"]);
    other.file("Dockerfile", df);
    let ctx = other.path().display().to_string();
    env.sifbox(&[
        "build",
        "--progress",
        "plain",
        "--build-arg",
        "WHO=second",
        "-t",
        "second",
        &ctx,
    ])
    .success();
    assert_eq!(env.sh("second", "cat /seen"), "second\n");
    assert_eq!(env.sh("second", "cat /seen-shared"), "first\nsecond\n");
    // The same context again: its own cache is kept.
    env.build_ok(df, &["--build-arg", "WHO=third", "-t", "third"]);
    assert_eq!(env.sh("third", "cat /seen"), "first\nthird\n");
}

/// A step's layer holds at most `--layer-size` (the audit: a 1 GiB layer
/// was accepted): one that writes more fails naming the flag; one within
/// it keeps what it wrote (owners, modes, links, a deletion of the base's
/// file) once copied out of the bounded file system.
#[test]
fn step_layers_are_bounded_by_layer_size() {
    let env = Env::new();
    let df = "FROM busybox\nRUN dd if=/dev/zero of=/big bs=1M count=64\n";
    env.file("Dockerfile", df);
    let out = env.build(&["--layer-size", "32m"]);
    out.command_failed().stderr_has("--layer-size");
    let df = "FROM busybox\n\
RUN head -c 1048576 /dev/urandom > /f && chown 1000:1000 /f && chmod 640 /f && ln /f /h \
&& ln -s f /l && rm /etc/sifbox-test-rootfs && mkdir -p /d/e && head -c 8388608 /dev/zero > /d/e/z\n";
    env.build_ok(df, &["--layer-size", "32m", "-t", "kept"]);
    let got = env.sh(
        "kept",
        "stat -c '%s %a' /f; readlink /l; test -e /etc/sifbox-test-rootfs || echo gone; \
         stat -c %s /d/e/z; test /f -ef /h && echo linked",
    );
    assert_eq!(got, "1048576 640\nf\ngone\n8388608\nlinked\n");
    if keeps_owners() {
        assert_eq!(env.sh("kept", "stat -c %u:%g /f"), "1000:1000\n");
    }
    // Below the least: refused up front.
    input_error(&env.build(&["--layer-size", "1m"])).stderr_has("--layer-size");
}

/// `RUN --mount=type=tmpfs,size=1m` is a tmpfs of that size (the audit:
/// a host dir that took 300 MiB).
#[test]
fn tmpfs_mounts_are_real_and_bounded_by_their_size() {
    let env = Env::new();
    let df = "FROM busybox\n\
RUN --mount=type=tmpfs,target=/t,size=1m sh -c 'if head -c 2097152 /dev/zero > /t/big 2>/dev/null; \
then echo wrote; else echo full; fi > /result; grep -c \" /t tmpfs \" /proc/mounts >> /result'\n\
RUN --mount=type=tmpfs,target=/u sh -c 'head -c 2097152 /dev/zero > /u/big && echo wrote >> /result'\n";
    env.build_ok(df, &["-t", "tmpfs"]);
    assert_eq!(
        env.sh("tmpfs", "cat /result; ls /t /u | wc -l"),
        "full\n1\nwrote\n0\n"
    );
}

/// A file of 1 GiB holding 4 KiB of data keeps its holes through `COPY
/// --from` (the audit: 2 GB), and an image with a sparse file exports
/// (it failed: "GNU sparse files are not supported").
#[test]
fn copy_from_keeps_holes_and_sparse_files_export() {
    let env = Env::new();
    let df = "FROM busybox AS maker\n\
RUN dd if=/dev/urandom of=/s bs=4096 count=1 2>/dev/null && truncate -s 1G /s\n\
FROM busybox\n\
COPY --from=maker /s /s\n\
RUN stat -c '%s %b %B' /s > /s-stat && rm /s && truncate -s 10M /small-sparse\n";
    env.build_ok(df, &["-t", "sparse"]);
    let out = env.sh("sparse", "cat /s-stat; stat -c %s /small-sparse");
    let n: Vec<u64> = out
        .split_whitespace()
        .map(|n| n.parse().expect("number"))
        .collect();
    assert_eq!((n[0], n[3]), (1 << 30, 10 << 20), "{out}");
    assert!(
        n[1] * n[2] <= 1 << 20,
        "the copy takes {} bytes in its layer",
        n[1] * n[2]
    );
}

#[test]
fn run_mounts_and_network() {
    let env = Env::new();
    env.file("dir/x", "context file\n");
    let outside = tempdir("sifbox-build-secret.");
    let secret = outside.path().join("secret-value");
    std::fs::write(&secret, "s3cret\n").expect("secret");
    let secret_arg = format!("id=tok,src={}", secret.display());
    let df = "FROM busybox\nARG ROUND=1\n\
RUN --mount=type=secret,id=tok cp /run/secrets/tok /seen-secret\n\
RUN --mount=type=cache,target=/cache echo $ROUND >> /cache/log && cp /cache/log /cache-log\n\
RUN --mount=type=bind,source=dir,target=/mnt cat /mnt/x > /bound\n\
RUN --mount=type=bind,source=dir,target=/mnt,rw touch /mnt/new && ls /mnt > /bound-rw\n\
RUN --mount=type=tmpfs,target=/scratch touch /scratch/f && ls /scratch > /tmpfs-seen\n\
RUN --network=none ls /sys/class/net > /nets\n";
    env.build_ok(df, &["-t", "mounts", "--secret", &secret_arg]);
    let out = env.sh(
        "mounts",
        "cat /seen-secret /cache-log /bound /bound-rw /tmpfs-seen /nets; \
         ls /run/secrets 2>&1 | grep -c tok; ls /scratch 2>/dev/null | wc -l",
    );
    assert_eq!(out, "s3cret\n1\ncontext file\nnew\nx\nf\nlo\n0\n0\n");
    assert!(
        !env.ctx.path().join("dir/new").exists(),
        "a rw bind wrote to the context"
    );
    // The cache dir outlives the build: a second round sees the first.
    env.build_ok(
        df,
        &[
            "-t",
            "mounts2",
            "--secret",
            &secret_arg,
            "--build-arg",
            "ROUND=2",
        ],
    );
    assert_eq!(env.sh("mounts2", "cat /cache-log"), "1\n2\n");
    // A required secret that was not given is an error citing the line.
    env.file(
        "Dockerfile",
        "FROM busybox\nRUN --mount=type=secret,id=missing,required=true true\n",
    );
    let out = env.build(&[]);
    input_error(&out)
        .stderr_has("Dockerfile:2")
        .stderr_has("missing");
}

#[test]
fn cache_hits_edits_and_no_cache() {
    let env = Env::new();
    env.file("a.txt", "one\n");
    env.file("b.txt", "bee\n");
    let df = "FROM busybox\nRUN echo first > /first\nCOPY a.txt /a.txt\nRUN cat /a.txt > /copied\nCOPY b.txt /b.txt\n";
    let d1 = env.build_ok(df, &[]);
    // No change: every step is a cache hit, same image.
    let out = env.build(&[]);
    out.success();
    assert_eq!(digest_of(&out), d1);
    assert_eq!(out.stderr.matches(" CACHED").count(), 4, "{}", out.stderr);
    // Edit one file: the steps before it stay cached, the rest run.
    env.file("a.txt", "two\n");
    let out = env.build(&[]);
    out.success();
    assert_ne!(digest_of(&out), d1);
    assert_eq!(out.stderr.matches(" CACHED").count(), 1, "{}", out.stderr);
    assert_eq!(env.sh(&digest_of(&out), "cat /copied"), "two\n");
    // --no-cache runs everything.
    let out = env.build(&["--no-cache"]);
    out.success();
    assert_eq!(out.stderr.matches(" CACHED").count(), 0, "{}", out.stderr);
    // A file the .dockerignore excludes does not affect the cache.
    env.file(".dockerignore", "c.txt\n");
    env.file("Dockerfile", "FROM busybox\nCOPY . /ctx\n");
    let d = digest_of(env.build(&[]).success());
    env.file("c.txt", "ignored\n");
    assert_eq!(digest_of(env.build(&[]).success()), d);
}

/// `stat -c '%i %h'` of each of `names` in `image`: (inode, link count).
fn inodes(env: &Env, image: &str, names: &[&str]) -> Vec<(String, String)> {
    let mut args = vec!["run", image, "stat", "-c", "%i %h"];
    args.extend_from_slice(names);
    let out = env.sifbox(&args);
    out.success();
    out.stdout
        .lines()
        .map(|l| {
            let (i, h) = l.split_once(' ').expect("inode and link count");
            (i.to_string(), h.to_string())
        })
        .collect()
}

#[test]
fn hard_links_made_by_a_run_step_stay_one_inode() {
    let env = Env::new();
    // Two names in one step, a third in another directory of the same
    // step; a later step that leaves them alone.
    let digest = env.build_ok(
        "FROM busybox\nRUN echo x > /h1 && ln /h1 /h2 && mkdir /d && ln /h1 /d/h3\nRUN echo later > /later\n",
        &[],
    );
    let got = inodes(&env, &digest, &["/h1", "/h2", "/d/h3"]);
    assert_eq!(got.len(), 3, "{got:?}");
    assert!(
        got.iter().all(|(i, h)| *i == got[0].0 && h == "3"),
        "one inode with three names: {got:?}"
    );
    assert_eq!(env.sh(&digest, "cat /h2 /d/h3"), "x\nx\n");
    // The SIF holds the link too: exported, imported into another store
    // (unpacked from the squashfs there), it is still one inode.
    let scratch = tempdir("sifbox-build-sif.");
    let sif = scratch.path().join("hard-links.sif");
    env.sifbox(&["image", "export", &digest, sif.to_str().unwrap_or_default()])
        .success();
    let other = Store::new("sifbox-build-cache.");
    let imported = other.import(&sif, "links").output();
    imported.success();
    let out = other
        .cmd(["run", "links", "stat", "-c", "%i %h", "/h1", "/h2", "/d/h3"])
        .output();
    out.success();
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{}", out.stdout);
    assert!(
        lines.iter().all(|l| *l == lines[0] && l.ends_with(" 3")),
        "after export and import: {lines:?}"
    );
}

#[test]
fn concurrent_builds_run_each_step_once() {
    let env = Env::new();
    env.file(
        "Dockerfile",
        "FROM busybox\nRUN --mount=type=cache,id=count,target=/c sh -c 'echo x >> /c/n; sleep 1'\n\
RUN --mount=type=cache,id=count,target=/c wc -l < /c/n > /runs\n",
    );
    let ctx = env.ctx.path().display().to_string();
    let running: Vec<_> = (0..4)
        .map(|_| env.cmd(&["build", "--progress", "plain", &ctx]).spawn())
        .collect();
    let digests: Vec<String> = running.into_iter().map(|r| r.wait().digest()).collect();
    assert!(digests.windows(2).all(|w| w[0] == w[1]), "{digests:?}");
    assert_eq!(env.sh(&digests[0], "cat /runs"), "1\n");
    env.store.assert_tmp_empty();
}

#[test]
fn failing_run_reports_and_publishes_nothing() {
    let env = Env::new();
    env.file(
        "Dockerfile",
        "FROM busybox\nRUN echo ok > /ok\nRUN mkdir -p /home/user/d && touch /home/user/d/f && chown -R 1000:1000 /home/user && chmod 700 /home/user/d; echo line1; echo line2 >&2; exit 7\n",
    );
    let digests = |v: Value| -> Vec<Value> {
        v["images"]
            .as_array()
            .expect("images")
            .iter()
            .map(|i| i["digest"].clone())
            .collect()
    };
    let before = digests(env.sifbox(&["image", "ls", "--json"]).json());
    let out = env.build(&["-t", "never"]);
    out.code_is(1)
        .stderr_has("Dockerfile:3")
        .stderr_has("code 7")
        .stderr_has("line2");
    let after = digests(env.sifbox(&["image", "ls", "--json"]).json());
    assert_eq!(before, after, "a failed build published an image");
    env.store.assert_tmp_empty();
}

#[test]
fn bad_input_is_one_clear_error() {
    let env = Env::new();
    env.file("Dockerfile", "FROM busybox\nFROBNICATE now\n");
    env.build(&[]).sifbox_error().stderr_has("Dockerfile:2");
    env.file("Dockerfile", "FROM busybox\nCOPY missing.txt /\n");
    input_error(&env.build(&[]))
        .stderr_has("Dockerfile:2")
        .stderr_has("missing.txt");
    env.file("Dockerfile", "FROM no-such-image\n");
    input_error(&env.build(&[]))
        .stderr_has("Dockerfile:1")
        .stderr_has("no-such-image");
    env.sifbox(&["build", "/nonexistent/ctx"]).sifbox_error();
    env.file("Dockerfile", "FROM busybox\n");
    let ctx = env.ctx.path().display().to_string();
    env.sifbox(&["build", "--progress", "fancy", &ctx])
        .sifbox_error();
    env.build(&["--secret", "id=x"]).sifbox_error();
    // A RUN step that cannot start for sifbox's reasons (an unknown USER)
    // is sifbox's error, 125; one whose command is not found failed, 1.
    env.file("Dockerfile", "FROM busybox\nUSER nosuchuser\nRUN true\n");
    input_error(&env.build(&[])).stderr_has("Dockerfile:3: RUN true: user \"nosuchuser\"");
    // A step that failed on TLS verification hints at --host-ca.
    env.file(
        "Dockerfile",
        "FROM busybox\nRUN echo 'ssl.SSLCertVerificationError: [SSL: CERTIFICATE_VERIFY_FAILED]' && exit 1\n",
    );
    env.build(&[]).code_is(1).stderr_has("build with --host-ca");
    env.file("Dockerfile", "FROM busybox\nRUN no-such-command\n");
    env.build(&[])
        .code_is(1)
        .stderr_has("Dockerfile:2")
        .stderr_has("code 127");
    env.store.assert_tmp_empty();
}

#[test]
fn tags_output_file_and_dockerfile_flag() {
    let env = Env::new();
    env.file("other.Dockerfile", "FROM busybox\nRUN echo from-f > /f\n");
    let outside = tempdir("sifbox-build-out.");
    let sif = outside.path().join("out.sif");
    let df = env
        .ctx
        .path()
        .join("other.Dockerfile")
        .display()
        .to_string();
    let out = env.build(&[
        "-f",
        &df,
        "-t",
        "t1",
        "-t",
        "t2:v",
        "--output",
        &sif.display().to_string(),
    ]);
    out.success();
    let d = digest_of(&out);
    let ls = env.sifbox(&["image", "ls", "--json"]).json();
    let refs = ls["images"]
        .as_array()
        .expect("images")
        .iter()
        .find(|i| i["digest"] == d.as_str())
        .map(|i| i["refs"].clone())
        .expect("built image listed");
    assert_eq!(refs, serde_json::json!(["t1:latest", "t2:v"]));
    let list = run_tool(
        Command::new(require("siftool", "siftool"))
            .arg("list")
            .arg(&sif),
    );
    assert!(list.contains("FS"), "{list}");
    assert_eq!(env.sh(&sif.display().to_string(), "cat /f"), "from-f\n");
    // -f - reads the Dockerfile from stdin.
    let out = env
        .store
        .cmd([
            "build",
            "-q",
            "-f",
            "-",
            &env.ctx.path().display().to_string(),
        ])
        .stdin(b"FROM busybox\nRUN echo stdin > /s\n")
        .output();
    out.success();
    assert_eq!(env.sh(&digest_of(&out), "cat /s"), "stdin\n");
}

#[test]
fn single_id_mapping_fakes_chown_and_setuid() {
    let env = Env::new();
    let d = env.build_ok(
        "FROM busybox\nRUN touch /f && chown 1234:1234 /f && chown -h 5:5 /f && su -s /bin/sh user -c 'id -u > /who' && echo ok > /done\n",
        &["--userns", "single"],
    );
    assert_eq!(env.sh(&d, "cat /done"), "ok\n");
}

/// The same context on the same base, built into two empty stores (at
/// different times, the context's files touched in between) gives the same
/// image, byte for byte: files the steps wrote get the base's time, and
/// SOURCE_DATE_EPOCH (environment or build arg) sets the clamp instead.
#[test]
fn builds_are_reproducible() {
    let a = Env::new();
    let b = Env::new();
    let df =
        "FROM busybox AS builder\nRUN mkdir /out && echo built > /out/a && date > /out/when.txt\n\
COPY f.txt /out/\nFROM busybox\nCOPY --from=builder /out/a /out/f.txt /opt/out/\n\
RUN echo x > /x && mkdir -p /var/d && touch /var/d/y\nLABEL a=b\n";
    a.file("f.txt", "context\n");
    let first = a.build_ok(df, &[]);
    std::thread::sleep(Duration::from_millis(1100));
    b.file("f.txt", "context\n");
    let second = b.build_ok(df, &[]);
    assert_eq!(first, second, "the same context gave two images");
    // The tree sandboxes run shows the times the SIF has: the base's.
    let times = a.sh(
        &first,
        "stat -c %Y /x /opt/out/a /var/d/y /bin/busybox | sort -u",
    );
    assert_eq!(times.lines().count(), 1, "{times}");
    // Rebuilt without the cache, in the same store: the same image.
    let again = a.build_ok(df, &["--no-cache"]);
    assert_eq!(again, first);
    // SOURCE_DATE_EPOCH, as a build arg or from the environment.
    let epoch = "1700000000";
    let by_arg = a.build_ok(df, &["--build-arg", &format!("SOURCE_DATE_EPOCH={epoch}")]);
    assert_ne!(by_arg, first);
    assert_eq!(a.sh(&by_arg, "stat -c %Y /x"), format!("{epoch}\n"));
    let ctx = b.ctx.path().display().to_string();
    let by_env = b
        .store
        .cmd(["build", "-q", &ctx])
        .env("SOURCE_DATE_EPOCH", epoch)
        .timeout(BUILD_TIMEOUT)
        .output();
    by_env.success();
    assert_eq!(digest_of(&by_env), by_arg);
    input_error(&a.build(&["--build-arg", "SOURCE_DATE_EPOCH=yesterday"]))
        .stderr_has("SOURCE_DATE_EPOCH=yesterday: not a time");
}

/// `sifbox build --progress plain CONTEXT` of `env` with the builder's
/// debug log on stderr (what the export did).
fn build_logged(env: &Env) -> Output {
    let ctx = env.ctx.path().display().to_string();
    env.cmd(&["build", "--progress", "plain", &ctx])
        .env("SIFBOX_LOG", "sifbox_build=debug")
        .output()
}

/// The export's debug line of a build that remade the base's SIF.
const REMIXED: &str = "export: metadata only, remade";
/// The export's debug line of a build that packed a snapshot.
const SNAPSHOT: &str = "export: snapshot unpacked";

/// Issue 15: a target stage that only sets metadata on a stored image
/// (LABEL, EXPOSE, ENV, CMD, a WORKDIR that exists) is exported by
/// remaking the base's SIF, without a snapshot or a pack. The image runs,
/// shows its metadata in `image inspect` and in `/.singularity.d`, keeps
/// every file of its base as it was (modes, owners, sizes, times, hard
/// links), and the same build in another store gives the same digest.
#[test]
fn metadata_only_builds_remake_the_base_image() {
    let a = Env::new();
    // A base with a hard link and a file of another owner, made by a
    // step (a full export).
    let base = a.build_ok(
        "FROM busybox\nRUN echo x > /h1 && ln /h1 /h2 && mkdir -p /srv/d && ln /h1 /srv/d/h3 \
         && echo own > /srv/own && chown 1000:1000 /srv/own && chmod 4750 /srv/own\n",
        &["-t", "base"],
    );
    let df = "FROM base\nLABEL org.example.tier=fast other=\"two words\"\nEXPOSE 8080 53/udp\n\
              ENV GREETING=hi\nWORKDIR /srv/d\nCMD [\"cat\", \"/.singularity.d/labels.json\"]\n";
    a.file("Dockerfile", df);
    let out = build_logged(&a);
    out.success();
    assert!(out.stderr.contains(REMIXED), "no remix: {}", out.stderr);
    assert!(!out.stderr.contains(SNAPSHOT), "a snapshot: {}", out.stderr);
    let d = digest_of(&out);
    assert_ne!(d, base);

    // The metadata, as sifbox and as Apptainer's files say it.
    let c = a.config(&d);
    assert_eq!(c["labels"]["org.example.tier"], "fast");
    assert_eq!(c["labels"]["other"], "two words");
    assert_eq!(
        c["exposed_ports"],
        serde_json::json!(["8080/tcp", "53/udp"])
    );
    assert_eq!(c["workdir"], "/srv/d");
    let run = a.sifbox(&["run", &d]);
    run.success();
    let labels: Value = serde_json::from_str(&run.stdout).expect("labels.json");
    assert_eq!(
        labels,
        serde_json::json!({"org.example.tier": "fast", "other": "two words"})
    );
    assert_eq!(
        a.sh(
            &d,
            ". /.singularity.d/env/10-docker2singularity.sh; echo $GREETING; pwd"
        ),
        "hi\n/srv/d\n"
    );
    // Every file of the base, as the base has it. (Link counts are left
    // out: the base's tree shares its unchanged files with the busybox
    // import's, which the store does; the image's own hard links are
    // checked below.)
    let list = "find /bin /etc /h1 /h2 /srv -exec stat -c '%n %a %u:%g %s %Y %F' {} + | sort";
    assert_eq!(a.sh(&d, list), a.sh(&base, list));
    let got = inodes(&a, &d, &["/h1", "/h2", "/srv/d/h3"]);
    assert!(
        got.iter().all(|(i, h)| *i == got[0].0 && h == "3"),
        "one inode with three names: {got:?}"
    );

    // Reproducible: the same in another store.
    let b = Env::new();
    let base_b = b.build_ok(
        "FROM busybox\nRUN echo x > /h1 && ln /h1 /h2 && mkdir -p /srv/d && ln /h1 /srv/d/h3 \
         && echo own > /srv/own && chown 1000:1000 /srv/own && chmod 4750 /srv/own\n",
        &["-t", "base"],
    );
    assert_eq!(base_b, base);
    assert_eq!(b.build_ok(df, &[]), d);

    // A WORKDIR that makes a directory is a layer that only adds: the
    // base is remade with it (issue 16).
    a.file("Dockerfile", "FROM base\nWORKDIR /new/dir\nLABEL a=b\n");
    let out = build_logged(&a);
    out.success();
    assert!(out.stderr.contains(ADDED), "{}", out.stderr);
    assert!(!out.stderr.contains(SNAPSHOT), "{}", out.stderr);
    assert_eq!(a.sh(&digest_of(&out), "pwd"), "/new/dir\n");
}

/// The export's debug line of a build whose layers were written into the
/// base's SIF.
const ADDED: &str = "export: files added, remade";
/// The export's debug line of a build that made the image's tree from
/// its base's.
const RELINKED: &str = "export: tree made from the base's:";

/// What a sandbox of `image` shows of every entry but /dev, /proc and
/// /sys (whose mount points the snapshot path takes from the sandbox's
/// mounts) and the root (the sandbox's writable layer's): name, mode,
/// owner, size (not of dirs: the file system's business), time, type, and
/// the bytes of each file. (Link counts are left out: trees share files
/// with their base.)
fn listing(env: &Env, image: &str) -> String {
    env.sh(
        image,
        "find / -mindepth 1 \\( -path /proc -o -path /sys -o -path /dev \\) -prune -o \
         ! -type d -exec stat -c '%n %a %u:%g %s %Y %F' {} + -o \
         -type d -exec stat -c '%n %a %u:%g - %Y %F' {} + | sort; \
         find / \\( -path /proc -o -path /sys -o -path /dev \\) -prune -o -type f \
         -exec md5sum {} + | sort",
    )
}

/// Issue 16: a target stage whose layers only add regular files and
/// directories to a stored image (COPY of context files, WORKDIR) is
/// exported by remaking the base's SIF with them, without a snapshot or a
/// pack; the image is the one the snapshot path makes (files, modes,
/// owners, sizes, times, contents) but for /dev, /proc and /sys; the same
/// build in another store gives the same digest. Builds that change the
/// base (a deletion, a symlink, a file over one of the base's, another
/// owner without a mapping that shows it) take the snapshot path and are
/// right too; an older SOURCE_DATE_EPOCH clamps the base's times as well.
#[test]
fn builds_that_only_add_files_remake_the_base_image() {
    let a = Env::new();
    // Context files older and newer than the clamp (the base's time), of
    // several modes, a dir tree, a file of several blocks.
    a.file("old.txt", "old\n");
    a.file("new.txt", "new\n");
    a.file("tree/sub/run.sh", "#!/bin/sh\necho hi\n");
    a.file("tree/sub/secret", "s\n");
    a.ctx.dir("tree/empty");
    let big: String = (0..300_000u32)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    a.file("big.bin", &big);
    let set = |rel: &str, mode: u32, mtime: i64| {
        let p = a.ctx.path().join(rel);
        std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(mode))
            .expect("chmod");
        let t = std::time::UNIX_EPOCH + Duration::from_secs(mtime.unsigned_abs());
        std::fs::File::open(&p)
            .and_then(|f| f.set_modified(t))
            .expect("mtime");
    };
    set("tree/sub/run.sh", 0o755, 1_500_000_000);
    set("tree/sub/secret", 0o600, 1_500_000_001);
    set("tree/sub", 0o750, 1_500_000_002);
    set("tree/empty", 0o700, 1_500_000_003);
    set("old.txt", 0o644, 1_000_000_000);
    set("new.txt", 0o664, 4_000_000_000);
    let body = "WORKDIR /app/work\nCOPY old.txt new.txt ./\nCOPY tree /opt/tree/\n\
                COPY big.bin /opt/\nLABEL x=y\n";
    a.file("Dockerfile", &format!("FROM busybox\n{body}"));
    let out = build_logged(&a);
    out.success();
    assert!(out.stderr.contains(ADDED), "no remix: {}", out.stderr);
    assert!(!out.stderr.contains(SNAPSHOT), "a snapshot: {}", out.stderr);
    // Its tree, made from the base's by links, at build time.
    assert!(out.stderr.contains(RELINKED), "{}", out.stderr);
    let fast = digest_of(&out);
    let tree = |d: &str| {
        a.store
            .path()
            .join("rootfs")
            .join(format!("sha256-{}", d.trim_start_matches("sha256:")))
    };
    let busybox = a.sifbox(&["image", "inspect", "--json", "busybox"]).json()["image"]["digest"]
        .as_str()
        .expect("digest")
        .to_string();
    {
        use std::os::unix::fs::MetadataExt;
        let ino = |p: std::path::PathBuf| std::fs::symlink_metadata(p).expect("stat").ino();
        let probe = "usr/bin/sifbox-probe";
        assert_eq!(
            ino(tree(&fast).join(probe)),
            ino(tree(&busybox).join(probe))
        );
    }
    // The same tree as the store unpacks from the SIF.
    let linked = listing(&a, &fast);
    std::fs::rename(tree(&fast), a.store.path().join("tmp/linked-tree")).expect("move");
    assert_eq!(listing(&a, &fast), linked);
    assert!(tree(&fast).is_dir());
    // The same with a file added and removed again (a deletion: the
    // snapshot path).
    a.file(
        "Dockerfile",
        &format!("FROM busybox\nCOPY old.txt /zz-gone\nRUN rm /zz-gone\n{body}"),
    );
    let out = build_logged(&a);
    out.success();
    assert!(out.stderr.contains(SNAPSHOT), "{}", out.stderr);
    assert!(!out.stderr.contains(ADDED), "{}", out.stderr);
    let full = digest_of(&out);
    let got = listing(&a, &fast);
    assert_eq!(got, listing(&a, &full));
    // What the files are: the clamp is the base's time.
    let clamp = a.sh("busybox", "stat -c %Y /bin/busybox");
    let clamp = clamp.trim();
    let want = [
        format!("/app 755 0:0 {clamp} directory"),
        format!("/app/work 755 0:0 {clamp} directory"),
        "/app/work/old.txt 644 0:0 1000000000 regular file".to_string(),
        format!("/app/work/new.txt 664 0:0 {clamp} regular file"),
        "/opt/tree/sub 750 0:0 1500000002 directory".to_string(),
        "/opt/tree/sub/run.sh 755 0:0 1500000000 regular file".to_string(),
        "/opt/tree/sub/secret 600 0:0 1500000001 regular file".to_string(),
        "/opt/tree/empty 700 0:0 1500000003 directory".to_string(),
        format!("/opt/big.bin 644 0:0 {clamp} regular file"),
    ];
    for w in &want {
        let (name, rest) = w.split_once(' ').expect("name");
        let (mode_owner, tail) = rest.split_once(" ").expect("mode");
        let (owner, tail) = tail.split_once(' ').expect("owner");
        let line = got
            .lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no {name} in\n{got}"));
        let f: Vec<&str> = line.split(' ').collect();
        // name mode owner size time type...
        assert_eq!(
            format!("{} {} {} {}", f[1], f[2], f[4], f[5..].join(" ")),
            format!("{mode_owner} {owner} {tail}"),
            "{line}"
        );
    }
    assert_eq!(
        a.sh(&fast, "md5sum < /opt/big.bin"),
        a.sh(&full, "md5sum < /opt/big.bin")
    );
    assert_eq!(a.sh(&fast, "pwd; /opt/tree/sub/run.sh"), "/app/work\nhi\n");
    // Reproducible: the same in another store.
    let b = Env::new();
    for f in ["old.txt", "new.txt", "tree", "big.bin", "Dockerfile"] {
        run_tool(
            Command::new("cp")
                .arg("-a")
                .arg(a.ctx.path().join(f))
                .arg(b.ctx.path()),
        );
    }
    b.file("Dockerfile", &format!("FROM busybox\n{body}"));
    assert_eq!(b.build_ok(&format!("FROM busybox\n{body}"), &[]), fast);

    // Each change to the base: the snapshot path, and the right image.
    std::os::unix::fs::symlink("old.txt", a.ctx.path().join("tree/link")).expect("symlink");
    let cases: [(&str, &str, &str); 4] = [
        (
            "FROM busybox\nRUN rm /etc/hostname\nCOPY old.txt /x\n",
            "test -e /etc/hostname || echo gone",
            "gone\n",
        ),
        (
            "FROM busybox\nCOPY tree /t/\n",
            "readlink /t/link",
            "old.txt\n",
        ),
        (
            "FROM busybox\nCOPY new.txt /etc/hostname\n",
            "cat /etc/hostname",
            "new\n",
        ),
        (
            "FROM busybox\nCOPY --chown=1000:1001 old.txt /o.txt\n",
            "stat -c %u:%g /o.txt",
            if keeps_owners() {
                "1000:1001\n"
            } else {
                "0:0\n"
            },
        ),
    ];
    for (i, (df, script, want)) in cases.iter().enumerate() {
        a.file("Dockerfile", df);
        let out = build_logged(&a);
        out.success();
        // Root's builds keep owners as they are: another owner is one the
        // remix writes. Without a subordinate range the file is the
        // caller's (root's in the image) either way.
        let remixed = i == 3 && (is_root() || !keeps_owners());
        assert_eq!(out.stderr.contains(ADDED), remixed, "{df}: {}", out.stderr);
        assert_eq!(
            out.stderr.contains(SNAPSHOT),
            !remixed,
            "{df}: {}",
            out.stderr
        );
        assert_eq!(a.sh(&digest_of(&out), script), *want, "{df}");
    }
    // An older SOURCE_DATE_EPOCH clamps the base's times too (so the tree
    // is the SIF's unpacked, not the base's linked).
    std::fs::remove_file(a.ctx.path().join("tree/link")).expect("rm");
    a.file("Dockerfile", &format!("FROM busybox\n{body}"));
    let ctx = a.ctx.path().display().to_string();
    let out = a
        .cmd(&[
            "build",
            "--progress",
            "plain",
            "--build-arg",
            "SOURCE_DATE_EPOCH=1200000000",
            &ctx,
        ])
        .env("SIFBOX_LOG", "sifbox_build=debug")
        .output();
    out.success();
    assert!(out.stderr.contains(ADDED), "{}", out.stderr);
    assert!(
        out.stderr
            .contains("tree not made from the base's: the clamp changed times of the base"),
        "{}",
        out.stderr
    );
    let old = digest_of(&out);
    assert_eq!(
        a.sh(
            &old,
            "stat -c %Y /bin/busybox /app/work/new.txt /app/work/old.txt /opt/tree/sub"
        ),
        "1200000000\n1200000000\n1000000000\n1200000000\n"
    );
}

/// Issue 16 on the example suite's Debian base: edit-files (`WORKDIR` +
/// `COPY`) is remade from the base's SIF, its tree is made from the
/// imported base's (whose times are its SIF's: the import clamps the tree
/// it keeps), and that tree is the one the store unpacks from the SIF.
#[test]
fn an_example_task_image_is_remade_with_its_tree() {
    let tar = debian_tar();
    let tasks = match std::env::var_os("SIFBOX_TEST_TASKS").filter(|v| !v.is_empty()) {
        Some(p) => std::path::PathBuf::from(p),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/tasks"),
    };
    let store = Store::new("sifbox-remix-task.");
    store
        .import(&tar, "debian:bookworm")
        .timeout(BUILD_TIMEOUT)
        .output()
        .success();
    let ctx = tasks.join("edit-files/environment").display().to_string();
    let out = store
        .cmd(["build", "--progress", "plain", &ctx])
        .env("SIFBOX_LOG", "sifbox_build=debug")
        .timeout(BUILD_TIMEOUT)
        .output();
    out.success();
    assert!(out.stderr.contains(ADDED), "{}", out.stderr);
    assert!(out.stderr.contains(RELINKED), "{}", out.stderr);
    let d = digest_of(&out);
    let sh = |script: &str| {
        let o = store
            .cmd(["run", "--entrypoint", "", &d, "sh", "-c", script])
            .timeout(BUILD_TIMEOUT)
            .output();
        o.success();
        o.stdout
    };
    let list =
        "find / -mindepth 1 -xdev \\( -path /proc -o -path /sys -o -path /dev \\) -prune -o \
                ! -type d -exec stat -c '%n %a %u:%g %s %Y %F' {} + -o \
                -type d -exec stat -c '%n %a %u:%g %Y %F' {} + | sort | md5sum; \
                stat -c '%n %a %Y' /etc /app /app/config.ini";
    let linked = sh(list);
    let tree = store
        .path()
        .join("rootfs")
        .join(format!("sha256-{}", d.trim_start_matches("sha256:")));
    std::fs::rename(&tree, store.path().join("tmp/linked-tree")).expect("move");
    assert_eq!(sh(list), linked);
    store.empty();
}

/// The example tasks whose steps write no dates into files, each built
/// twice into two stores: the same images.
#[test]
fn example_task_images_are_reproducible() {
    let tar = debian_tar();
    let tasks = match std::env::var_os("SIFBOX_TEST_TASKS").filter(|v| !v.is_empty()) {
        Some(p) => std::path::PathBuf::from(p),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/tasks"),
    };
    let stores = [Store::new("sifbox-repro-a."), Store::new("sifbox-repro-b.")];
    for s in &stores {
        s.import(&tar, "debian:bookworm")
            .timeout(BUILD_TIMEOUT)
            .output()
            .success();
    }
    // compile-c runs apt-get, whose logs and caches carry dates.
    let names = [
        "background-service",
        "edit-files",
        "failing-solution",
        "no-network",
        "verifier-timeout",
    ];
    for name in names {
        let ctx = tasks.join(name).join("environment");
        let digests: Vec<String> = stores
            .iter()
            .map(|s| {
                s.cmd(["build", "-q", &ctx.display().to_string()])
                    .timeout(BUILD_TIMEOUT)
                    .output()
                    .digest()
            })
            .collect();
        assert_eq!(digests[0], digests[1], "{name}");
    }
}

#[test]
fn apt_get_install_in_debian_bookworm() {
    let tar = debian_tar();
    let env = Env::new();
    env.store
        .import(&tar, "debian:bookworm")
        .timeout(BUILD_TIMEOUT)
        .output()
        .success();
    env.file(
        "Dockerfile",
        "FROM debian:bookworm\nRUN apt-get update && apt-get install -y --no-install-recommends hello \
&& rm -rf /var/lib/apt/lists/*\nRUN useradd -m alice && install -o alice -m 0600 /dev/null /home/alice/secret\nCMD [\"hello\"]\n",
    );
    for userns in ["auto", "single"] {
        let out = env
            .store
            .cmd([
                "build",
                "--progress",
                "plain",
                "--userns",
                userns,
                "-t",
                "hello",
                &env.ctx.path().display().to_string(),
            ])
            .timeout(Duration::from_secs(600))
            .output();
        out.success();
        let run = env.sifbox(&["run", "hello"]);
        run.success();
        assert_eq!(run.stdout, "Hello, world!\n");
        let owner = env.sh("hello", "stat -c '%U %a' /home/alice/secret");
        if keeps_owners() && userns == "auto" {
            assert_eq!(owner, "alice 600\n");
        } else {
            assert!(owner.ends_with(" 600\n"), "{owner}");
        }
    }
}

/// A static HTTP server on 127.0.0.1 (python3's), stopped when dropped.
struct HttpServer {
    child: std::process::Child,
    port: u16,
}

impl HttpServer {
    fn serve(dir: &Path) -> HttpServer {
        let port = free_port();
        let child = Command::new("python3")
            .args([
                "-m",
                "http.server",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
            ])
            .current_dir(dir)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("python3 (apt install python3)");
        let up = harness::eventually(Duration::from_secs(10), || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
        assert!(up, "the test HTTP server did not start");
        HttpServer { child, port }
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn add_downloads_urls() {
    let env = Env::new();
    let www = tempdir("sifbox-build-www.");
    std::fs::write(www.path().join("file.txt"), "remote\n").expect("write");
    let srv = HttpServer::serve(www.path());
    let url = format!("http://127.0.0.1:{}/file.txt", srv.port);
    let df = format!(
        "FROM busybox\nADD {url} /dl/\nADD --chmod=644 {url} /named.txt\n\
ADD --checksum=sha256:8b1a4b2b4a2d9e2a7cb4b1cbbbd5c8ba5e83b4a05e0c0c4b8a8d6b1b0b7e1c3f {url} /never\n"
    );
    env.file("Dockerfile", &df);
    // A wrong --checksum is refused, citing the line.
    input_error(&env.build(&[]))
        .stderr_has("Dockerfile:4")
        .stderr_has("checksum");
    let ok = df.lines().take(3).collect::<Vec<_>>().join("\n") + "\n";
    env.build_ok(&ok, &["-t", "dl"]);
    let out = env.sh(
        "dl",
        "stat -c '%n %a %u' /dl/file.txt /named.txt; cat /dl/file.txt",
    );
    assert_eq!(out, "/dl/file.txt 600 0\n/named.txt 644 0\nremote\n");
}

/// A base whose config has no PATH (here one imported from a root file
/// system) gets Docker's default: `ENV PATH=/opt/bin:$PATH` extends it, and
/// the image runs `sh` from it.
#[test]
fn a_base_without_path_gets_dockers_default() {
    let env = Env::new();
    env.build_ok("FROM busybox\nENV PATH=/opt/bin:$PATH\n", &["-t", "pathy"]);
    assert_eq!(
        env.sh("pathy", "echo $PATH"),
        "/opt/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n"
    );
}

/// `--host-ca CONTEXT` builds CONTEXT with the host's default bundle: the
/// flag's own value is only ever `--host-ca=FILE`, so it cannot swallow
/// the context.
#[test]
fn host_ca_before_the_context_does_not_swallow_it() {
    let env = Env::new();
    let host = std::fs::read_to_string("/etc/ssl/certs/ca-certificates.crt")
        .expect("the host's CA bundle (ca-certificates)");
    let first = host.lines().next().unwrap_or_default().to_string();
    env.file(
        "Dockerfile",
        "FROM busybox\nRUN head -n1 \"$SSL_CERT_FILE\" > /ca-seen\n",
    );
    let out = env.build(&["-t", "hostca", "--host-ca"]);
    out.success();
    assert_eq!(env.sh("hostca", "cat /ca-seen"), format!("{first}\n"));
}

#[test]
fn platform_args_user_names_link_and_host_ca() {
    let env = Env::new();
    env.file("a.txt", "A\n");
    let ca = tempdir("sifbox-build-ca.");
    let bundle = ca.path().join("ca.crt");
    std::fs::write(&bundle, "-----BEGIN CERTIFICATE-----\nfake\n").expect("ca");
    let df = "FROM busybox\nARG TARGETARCH\nARG TARGETPLATFORM\n\
RUN echo $TARGETARCH $TARGETPLATFORM > /platform\n\
COPY --link a.txt /linked.txt\n\
RUN cat \"$SSL_CERT_FILE\" | head -n1 > /ca-seen\n\
USER user\nRUN id -un > /tmp/who\nUSER root\nRUN cp /tmp/who /who\n";
    let arch = host_arch();
    env.build_ok(
        df,
        &["-t", "plat", &format!("--host-ca={}", bundle.display())],
    );
    let out = env.sh(
        "plat",
        "cat /platform /linked.txt /ca-seen /who; test -e /run/sifbox && echo leaked || echo clean",
    );
    assert_eq!(
        out,
        format!("{arch} linux/{arch}\nA\n-----BEGIN CERTIFICATE-----\nuser\nclean\n")
    );
}

/// The TMPDIR a build ran with is empty: its scratch went to the store.
fn assert_nothing_in_tmpdir(tmp: &Path) {
    let in_tmp: Vec<_> = std::fs::read_dir(tmp)
        .expect("tmpdir")
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(in_tmp.is_empty(), "left in TMPDIR: {in_tmp:?}");
}

/// A build's scratch (a secret given by value, a tmpfs mount, a copy of
/// the context for a bind mount) lives in the store's tmp/, not in TMPDIR,
/// and goes with the build, files of other ids that a step wrote into its
/// tmpfs mount too: an unprivileged caller could not remove those itself.
#[test]
fn a_builds_scratch_goes_with_it() {
    let env = Env::new();
    let tmp = tempdir("sifbox-build-tmpdir.");
    env.file("data.txt", "data\n");
    env.file(
        "Dockerfile",
        "FROM busybox\nRUN --mount=type=secret,id=token --mount=type=tmpfs,target=/scratch \
--mount=type=bind,source=data.txt,target=/data.txt \
test \"$(cat /run/secrets/token)\" = hunter2 && grep -q data /data.txt \
&& mkdir /scratch/d && touch /scratch/d/f && chown -R 1000:1000 /scratch/d && chmod 700 /scratch/d\n",
    );
    let ctx = env.ctx.path().display().to_string();
    env.store
        .cmd([
            "build",
            "-q",
            "--secret",
            "id=token,env=SIFBOX_TEST_TOKEN",
            &ctx,
        ])
        .env("TMPDIR", tmp.path())
        .env("SIFBOX_TEST_TOKEN", "hunter2")
        .timeout(BUILD_TIMEOUT)
        .output()
        .success();
    assert_nothing_in_tmpdir(tmp.path());
    env.store.assert_tmp_empty();
}

#[test]
fn interrupted_build_leaves_nothing_after_gc() {
    let env = Env::new();
    let marker = harness::unique_number();
    let tmp = tempdir("sifbox-build-tmpdir.");
    // Files of another id, which an unprivileged caller cannot remove on
    // the host, are written before the build is killed; and the step has
    // every kind of scratch a build makes: a secret given by value, a
    // tmpfs mount (written by another id too), a copy of the context.
    env.file("data.txt", "data\n");
    env.file(
        "Dockerfile",
        &format!(
            "FROM busybox\nRUN --mount=type=secret,id=token --mount=type=tmpfs,target=/scratch \
--mount=type=bind,source=data.txt,target=/data.txt \
mkdir -p /home/user/d /scratch/d && touch /home/user/d/f /scratch/d/f \
&& chown -R 1000:1000 /home/user /scratch/d && chmod 700 /home/user/d /scratch/d && sleep {marker}\n"
        ),
    );
    let ctx = env.ctx.path().display().to_string();
    let running = env
        .store
        .cmd([
            "build",
            "--progress",
            "plain",
            "--secret",
            "id=token,env=SIFBOX_TEST_TOKEN",
            &ctx,
        ])
        .env("TMPDIR", tmp.path())
        .env("SIFBOX_TEST_TOKEN", "hunter2")
        .no_clean_check()
        .spawn();
    let started = harness::eventually(Duration::from_secs(20), || {
        !harness::processes_with_arg(&marker.to_string()).is_empty()
    });
    assert!(started, "the RUN step never started");
    running.signal(rustix::process::Signal::KILL);
    let _ = running.wait();
    let gone = harness::eventually(Duration::from_secs(10), || {
        harness::processes_with_arg(&marker.to_string()).is_empty()
    });
    assert!(gone, "the build's sandbox outlived it");
    // Nothing of it went to TMPDIR, where no gc would find it: the
    // scratch, the secret's copy with it, is in the store's tmp/.
    assert_nothing_in_tmpdir(tmp.path());
    let left = env.store.tmp_entries();
    assert!(
        left.iter().any(|e| e.starts_with("build-")),
        "the build's scratch is not in the store's tmp/: {left:?}"
    );
    env.sifbox(&["gc"]).success();
    env.store.assert_tmp_empty();
    env.store.sb.assert_clean();
    env.assert_images(1);
}

/// Ctrl-C, SIGTERM or SIGHUP during a build: it says it was interrupted,
/// exits 128+N and leaves nothing (no scratch dir, no store tmp, no
/// sandbox, no step process) without a gc. While it runs, its step's
/// sandbox is not one of the user's in `sifbox ps` (`ps --all` shows it).
#[test]
fn interrupted_build_removes_what_it_made() {
    use rustix::process::Signal;
    let env = Env::new();
    let tmp = tempdir("sifbox-build-tmpdir.");
    let ctx = env.ctx.path().display().to_string();
    for (i, (sig, code, name)) in [
        (Signal::INT, 130, "SIGINT"),
        (Signal::TERM, 143, "SIGTERM"),
        (Signal::HUP, 129, "SIGHUP"),
    ]
    .into_iter()
    .enumerate()
    {
        let marker = harness::unique_number();
        env.file(
            "Dockerfile",
            &format!("FROM busybox\nRUN echo {i} && sleep {marker}\n"),
        );
        let running = env
            .store
            .cmd(["build", "--progress", "plain", &ctx])
            .env("TMPDIR", tmp.path())
            .no_clean_check()
            .spawn();
        let started = harness::eventually(Duration::from_secs(20), || {
            !harness::processes_with_arg(&marker.to_string()).is_empty()
        });
        assert!(started, "the RUN step never started");
        if i == 0 {
            let ps = env.store.cmd(["ps", "--json"]).no_clean_check().output();
            assert_eq!(
                ps.json()["sandboxes"],
                serde_json::json!([]),
                "{}",
                ps.stdout
            );
            let all = env
                .store
                .cmd(["ps", "--all", "--json"])
                .no_clean_check()
                .output();
            let listed = all.json()["sandboxes"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            assert_eq!(listed.len(), 1, "{}", all.stdout);
            assert_eq!(listed[0]["hidden"], true, "{}", all.stdout);
        }
        running.signal(sig);
        let out = running.wait();
        out.code_is(code).stderr_has(&format!(
            "sifbox: error: the build was interrupted by {name}"
        ));
        assert!(
            harness::processes_with_arg(&marker.to_string()).is_empty(),
            "the step outlived the build"
        );
        let left: Vec<_> = std::fs::read_dir(tmp.path()).expect("tmpdir").collect();
        assert!(left.is_empty(), "{left:?}");
        env.store.assert_tmp_empty();
        env.store.sb.assert_clean();
    }
    env.assert_images(1);
}

#[test]
fn gc_build_cache_empties_layers_and_cache_mounts() {
    let env = Env::new();
    let df = "FROM busybox\nRUN --mount=type=cache,target=/c touch /c/x && mkdir -p /home/user/d \
&& chown -R 1000:1000 /home/user && chmod 700 /home/user/d\n";
    env.build_ok(df, &[]);
    let layers = || -> Vec<String> {
        let mut v = env.store.entries("layers");
        v.retain(|n| n != "empty");
        v
    };
    assert!(!layers().is_empty());
    env.sifbox(&["gc", "--build-cache"]).success();
    assert!(layers().is_empty(), "{:?}", layers());
    let cache_dirs = std::fs::read_dir(env.store.path().join("build-cache"))
        .map(|rd| rd.count())
        .unwrap_or(0);
    assert_eq!(cache_dirs, 0);
    // The next build runs every step again.
    let out = env.build(&[]);
    out.success();
    assert_eq!(out.stderr.matches(" CACHED").count(), 0, "{}", out.stderr);
}

#[test]
fn scratch_stage_bases_substitution_and_escape_directive() {
    let env = Env::new();
    env.file("hello.txt", "hello\n");
    // FROM scratch holds only what is copied into it (and Apptainer's
    // metadata layout); a later stage builds FROM an earlier one by name.
    let df = "# escape=`\n\
FROM scratch AS files\n\
COPY hello.txt /data/hello.txt\n\
FROM busybox AS tools\n\
ARG UNSET\n\
ARG SET=value\n\
ENV A=${UNSET:-fallback} B=${SET:+replaced} C=`$SET D=${SET}\n\
RUN echo \"$A $B $C $D $HTTP_PROXY\" > /subst && `\n\
    echo continued >> /subst\n\
FROM tools\n\
COPY --from=files /data /data\n";
    env.build_ok(
        df,
        &[
            "-t",
            "scratchy",
            "--build-arg",
            "HTTP_PROXY=http://proxy.invalid:3128",
        ],
    );
    assert_eq!(
        env.sh("scratchy", "cat /subst /data/hello.txt"),
        "fallback replaced $SET value http://proxy.invalid:3128\ncontinued\nhello\n"
    );
    // The proxy arg reached RUN without being declared, and is not in the
    // image's config.
    let c = env.config("scratchy");
    let envs = c["env"].to_string();
    assert!(!envs.contains("proxy.invalid"), "{envs}");
    // The scratch stage alone: just the copied file and Apptainer's layout.
    let d = env.build_ok(df, &["--target", "files"]);
    // Unpacking it for a run makes the store's copy of its tree.
    // (There is no program in it to run: the command fails, the tree stays.)
    let _ = env.sifbox(&["run", &d, "/data/hello.txt"]);
    let rootfs = env.store.tree_of(&d);
    let mut top: Vec<String> = std::fs::read_dir(&rootfs)
        .expect("unpacked rootfs")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    top.sort();
    // Apptainer's base layout (as `apptainer build` makes it) and the copy.
    assert_eq!(
        top,
        [
            ".singularity.d",
            "data",
            "dev",
            "etc",
            "home",
            "proc",
            "root",
            "sys",
            "tmp",
            "var"
        ],
        "{}",
        rootfs.display()
    );
    let mut etc: Vec<String> = std::fs::read_dir(rootfs.join("etc"))
        .expect("etc")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    etc.sort();
    assert_eq!(etc, ["hosts", "resolv.conf"]);
}

#[test]
fn a_non_root_user_owns_what_the_build_gave_it() {
    let env = Env::new();
    let d = env.build_ok(
        "FROM busybox\nRUN mkdir -p /home/u/private && chown -R 1000:1000 /home/u && chmod 700 /home/u/private \
&& echo mine > /home/u/private/f && chown 1000:1000 /home/u/private/f\nUSER 1000\n",
        &["-t", "owned"],
    );
    let script = "id -u; touch /home/u/x && cat /home/u/private/f && stat -c '%u:%g' /home/u/x";
    let out = env.sifbox(&["run", "owned", "sh", "-c", script]);
    if keeps_owners() {
        out.success();
        assert_eq!(out.stdout, "1000\nmine\n1000:1000\n");
    } else {
        // One id only: the tree is root's, and so USER 1000 cannot write.
        out.command_failed();
    }
    // Removing the image and collecting leaves nothing of its tree.
    env.sifbox(&["image", "rm", "owned"]).success();
    env.sifbox(&["gc"]).success();
    env.store.assert_tmp_empty();
    let rootfs = env.store.tree_of(&d);
    assert!(!rootfs.exists(), "{} is left", rootfs.display());
}

// ---- A hostile build context (issue 12) ----
//
// The context is made by someone else (an agent, a sandbox): symlinks out
// of it and aliases of it must not let a build read host files. A decoy dir
// outside the context holds a marker; no build may copy, bind or hash it,
// and the marker must never reach an image or the build's output.

/// The marker in the decoy files outside the context.
const DECOY_MARKER: &str = "SIFBOX-DECOY-a91c3e-OUTSIDE-THE-CONTEXT";

/// A decoy dir outside `env`'s context, `secret` and `sub/secret` holding
/// the marker; the context gets symlinks to it every way there is.
fn hostile_context(env: &Env) -> Tree {
    let decoy = Tree::temp("sifbox-build-decoy.");
    decoy
        .file("secret", DECOY_MARKER)
        .file("sub/secret", DECOY_MARKER);
    env.file("a.txt", "A\n");
    env.file("dir/deep/f", "F\n");
    // A relative way out from a subdirectory.
    let depth = env.ctx.join("dir").components().count() - 1;
    let rel_out = "../".repeat(depth)
        + decoy
            .path()
            .to_str()
            .expect("utf-8")
            .trim_start_matches('/');
    env.ctx
        .symlink("abs", decoy.path())
        .symlink("abs-file", decoy.join("secret"))
        .symlink("up", "../../../../../../../../..")
        .symlink("dir/out", &rel_out)
        .symlink("loop1", "loop2")
        .symlink("loop2", "loop1");
    decoy
}

/// Asserts that nothing of the decoy is in `out` (stdout and stderr).
#[track_caller]
fn no_marker(out: &Output) {
    assert!(
        !out.stdout.contains(DECOY_MARKER) && !out.stderr.contains(DECOY_MARKER),
        "the decoy leaked:\n{}\n{}",
        out.stdout,
        out.stderr
    );
}

#[test]
fn hostile_context_symlinks_reach_nothing_outside() {
    let env = Env::new();
    let decoy = hostile_context(&env);
    let d = decoy.path().display().to_string();
    // Every way out is not found: one clear error, nothing copied.
    for src in [
        "abs/secret".to_string(),
        "abs/sub/secret".into(),
        "abs".into(),
        "abs-file".into(),
        format!("up{d}/secret"),
        format!("up/{d}"),
        "dir/out/secret".into(),
        "dir/out".into(),
        "ab*/secret".into(),
        "dir/ou*/secret".into(),
        "abs/*".into(),
    ] {
        env.file("Dockerfile", &format!("FROM busybox\nCOPY {src} /x/\n"));
        let out = env.build(&[]);
        no_marker(&out);
        input_error(&out).stderr_has("Dockerfile:2");
    }
    // Nor can a bind mount of the context reach it.
    for src in ["abs", "abs-file", "dir/out", &format!("up{d}")] {
        env.file(
            "Dockerfile",
            &format!("FROM busybox\nRUN --mount=type=bind,source={src},target=/m cat /m/secret /m > /leak\n"),
        );
        let out = env.build(&[]);
        no_marker(&out);
        input_error(&out).stderr_has("Dockerfile:2");
    }
    // A symlink loop is an error, not a hang.
    env.file("Dockerfile", "FROM busybox\nCOPY loop1 /x\n");
    input_error(&env.build(&[])).stderr_has("symlinks");
    // A heredoc named like a path does not write outside the build's dir.
    let target = decoy.path().join("written-by-heredoc");
    env.file(
        "Dockerfile",
        &format!(
            "FROM busybox\nCOPY <<{} /x\nhello\n{}\n",
            target.display(),
            target.display()
        ),
    );
    input_error(&env.build(&[])).stderr_has("heredoc");
    assert!(!target.exists(), "a heredoc was written outside");
    // The whole context copies: the links as links, nothing of the decoy.
    let df = "FROM busybox\nCOPY . /ctx/\nCOPY dir /d/\n\
RUN --mount=type=bind,target=/c cp -a /c /bound\n";
    env.file("Dockerfile", df);
    let out = env.build(&["-t", "hostile-ctx:1"]);
    no_marker(&out);
    out.success();
    let out = env.sifbox(&[
        "run",
        "hostile-ctx:1",
        "sh",
        "-c",
        "grep -rl SIFBOX-DECOY /ctx /d /bound; readlink /ctx/abs; readlink /d/out; readlink /bound/abs; \
         cat /ctx/abs/secret /bound/abs/secret /d/out/secret 2>&1; true",
    ]);
    out.success();
    no_marker(&out);
    let links: Vec<&str> = out.stdout.lines().take(3).collect();
    assert_eq!(links[0], d, "{}", out.stdout);
    assert!(
        links[1].ends_with(d.trim_start_matches('/')),
        "{}",
        out.stdout
    );
    assert_eq!(links[2], d, "{}", out.stdout);
}

#[test]
fn hostile_context_alias_does_not_bypass_dockerignore() {
    let env = Env::new();
    env.file("a.txt", "A\n");
    env.file("secret", DECOY_MARKER);
    env.file("sub/secret", "not excluded\n");
    env.file(".dockerignore", "secret\n");
    env.ctx.symlink("alias", ".").symlink("root", "/");
    for src in [
        "secret",
        "alias/secret",
        "alias/alias/secret",
        "root/secret",
        "alias/secre?",
    ] {
        env.file("Dockerfile", &format!("FROM busybox\nCOPY {src} /x\n"));
        let out = env.build(&[]);
        no_marker(&out);
        input_error(&out).stderr_has("Dockerfile:2");
    }
    env.file(
        "Dockerfile",
        "FROM busybox\nRUN --mount=type=bind,source=alias/secret,target=/m cat /m > /leak\n",
    );
    input_error(&env.build(&[])).stderr_has("Dockerfile:2");
    // Copying or binding the alias gives the context as Docker sends it.
    let df =
        "FROM busybox\nCOPY alias /all/\nCOPY root/ /root-alias/\nCOPY alias/*/secret /glob/\n\
RUN --mount=type=bind,target=/c cp -a /c /bound\n\
RUN --mount=type=bind,source=alias,target=/c cp -a /c /bound-alias\n";
    env.file("Dockerfile", df);
    let out = env.build(&["-t", "aliased"]);
    no_marker(&out);
    out.success();
    let out = env.sifbox(&[
        "run",
        "aliased",
        "sh",
        "-c",
        "for d in /all /root-alias /bound /bound-alias; do test -e $d/secret && echo $d/secret; \
         cat $d/a.txt $d/sub/secret; done; cat /glob/secret; grep -rl SIFBOX-DECOY /all /root-alias /glob /bound /bound-alias; true",
    ]);
    out.success();
    no_marker(&out);
    assert_eq!(
        out.stdout,
        "A\nnot excluded\n".repeat(4) + "not excluded\n",
        "{}",
        out.stdout
    );
}

#[test]
fn hostile_context_symlinks_inside_it_still_work() {
    let env = Env::new();
    env.file("a.txt", "A\n");
    env.file("dir/deep/f", "F\n");
    env.ctx
        .symlink("link", "a.txt")
        .symlink("link2", "link")
        .symlink("deep-abs", "/dir/deep")
        .symlink("dir/f-link", "deep/f")
        .symlink("dir/up-a", "../../../../../../a.txt");
    let df = "FROM busybox AS stage\nRUN echo staged > /real && ln -s /real /lnk && mkdir /d && ln -s /d /dl && echo in-d > /d/x\n\
FROM busybox\n\
COPY link /l\nCOPY link2 /l2\nCOPY lin* /globbed/\nCOPY deep-abs/f /through-abs\nCOPY deep-abs /deep-contents/\n\
COPY dir /dir/\nCOPY dir/up-a /up-a\n\
COPY --from=stage /lnk /from-link\nCOPY --from=stage /dl /from-dir-link/\n\
RUN --mount=type=bind,source=link,target=/m cat /m > /bound-link\n";
    env.file("Dockerfile", df);
    env.build(&["-t", "inside"]).success();
    let out = env.sh(
        "inside",
        "cd /; for f in l l2 globbed/link globbed/link2 through-abs deep-contents/f dir/f-link up-a from-link \
         from-dir-link/x bound-link; do stat -c '%n %F' $f; done; \
         cat l l2 globbed/link through-abs deep-contents/f up-a from-link from-dir-link/x bound-link; \
         readlink dir/f-link; readlink dir/up-a",
    );
    let s = stats(&out);
    for f in [
        "l",
        "l2",
        "globbed/link",
        "globbed/link2",
        "through-abs",
        "deep-contents/f",
        "up-a",
        "from-link",
        "from-dir-link/x",
        "bound-link",
    ] {
        assert_eq!(
            s.get(f).map(String::as_str),
            Some("regular file"),
            "{f} in\n{out}"
        );
    }
    // Inside a copied directory a symlink stays a symlink.
    assert_eq!(s["dir/f-link"], "symbolic link", "{out}");
    let rest: Vec<&str> = out.lines().filter(|l| !l.contains(' ')).collect();
    assert_eq!(
        rest,
        [
            "A",
            "A",
            "A",
            "F",
            "F",
            "A",
            "staged",
            "in-d",
            "A",
            "deep/f",
            "../../../../../../a.txt"
        ],
        "{out}"
    );
}

#[test]
fn hostile_stage_passwd_symlink_reads_no_host_file() {
    let env = Env::new();
    let decoy = tempdir("sifbox-build-decoy.");
    let host_passwd = decoy.path().join("passwd");
    std::fs::write(&host_passwd, "hostonly:x:4242:4242::/:/bin/sh\n").expect("write");
    env.file("a.txt", "A\n");
    // A step points the image's /etc/passwd at a host file: `--chown` by
    // name resolves it inside the image, where it points to nothing.
    env.file(
        "Dockerfile",
        &format!(
            "FROM busybox\nRUN ln -sf {} /etc/passwd\nCOPY --chown=hostonly a.txt /x\n",
            host_passwd.display()
        ),
    );
    input_error(&env.build(&[]))
        .stderr_has("Dockerfile:3")
        .stderr_has("hostonly");
    // A symlink inside the image is followed inside it.
    env.build_ok(
        "FROM busybox\nRUN cp /etc/passwd /etc/passwd.real && \
echo 'imguser:x:4343:4343::/:/bin/sh' >> /etc/passwd.real && ln -sf passwd.real /etc/passwd\n\
COPY --chown=imguser a.txt /owned\n",
        &["-t", "chowned"],
    );
    let want = if keeps_owners() { "4343\n" } else { "0\n" };
    assert_eq!(env.sh("chowned", "stat -c %u /owned"), want);
}

#[test]
fn hostile_step_removes_no_host_file_through_its_mount_points() {
    let env = Env::new();
    let decoy = tempdir("sifbox-build-decoy.");
    std::fs::create_dir(decoy.path().join("x")).expect("mkdir");
    std::fs::write(decoy.path().join("e"), "").expect("write");
    env.file("a.txt", "A\n");
    // The step moves away the directory holding its mount points and puts
    // a symlink to the host in its place: the mount points sifbox made are
    // removed after the step, and must be removed inside the layer only.
    let df = format!(
        "FROM busybox\nRUN --mount=type=tmpfs,target=/stubs/x --mount=type=bind,source=a.txt,target=/stubs/e \
mv /stubs /moved && ln -s {} /stubs\n",
        decoy.path().display()
    );
    env.build_ok(&df, &["-t", "stubs"]);
    assert!(decoy.path().join("x").is_dir(), "a host dir was removed");
    assert!(decoy.path().join("e").is_file(), "a host file was removed");
    // Without the trick, the mount points are gone from the image.
    env.build_ok(
        "FROM busybox\nRUN --mount=type=tmpfs,target=/stubs/x --mount=type=bind,source=a.txt,target=/stubs/e true\n",
        &["-t", "stubs2"],
    );
    assert_eq!(env.sh("stubs2", "test -e /stubs || echo gone"), "gone\n");
}

/// A step plants symlinks to host paths in its tmpfs mount (whose dir is
/// the build's scratch on the host), some in a dir of another id that only
/// a sandbox can remove: removing the scratch removes the links, never
/// what they point at, and leaves nothing.
#[test]
fn hostile_step_removes_no_host_file_through_its_scratch() {
    let env = Env::new();
    let decoy = tempdir("sifbox-build-decoy.");
    std::fs::create_dir(decoy.path().join("x")).expect("mkdir");
    std::fs::write(decoy.path().join("x/keep"), "").expect("write");
    std::fs::write(decoy.path().join("e"), "").expect("write");
    let d = decoy.path().display();
    let df = format!(
        "FROM busybox\nRUN --mount=type=tmpfs,target=/s \
ln -s {d} /s/dir && ln -s {d}/e /s/file && ln -s {d}/x/keep /s/keep \
&& mkdir /s/other && ln -s {d} /s/other/dir && ln -s {d}/x /s/other/x \
&& chown -hR 1000:1000 /s/other && chmod 500 /s/other\n"
    );
    env.build_ok(&df, &["-t", "scratch-links"]);
    assert!(
        decoy.path().join("x/keep").is_file(),
        "a host file was removed"
    );
    assert!(decoy.path().join("e").is_file(), "a host file was removed");
    env.store.assert_tmp_empty();
}

/// A built image's tree shares the files it did not change with the tree
/// of its base (hard links, one copy on disk), keeps its own where it
/// changed them, and neither tree sees a sandbox's writes to the other.
/// (On the main branch of before, every built image had a full copy.)
#[test]
fn a_built_image_shares_unchanged_files_with_its_base() {
    use std::os::unix::fs::MetadataExt;
    let env = Env::new();
    env.file("new.txt", "new\n");
    let d = env.build_ok(
        "FROM busybox\nCOPY new.txt /etc/new.txt\nRUN echo changed > /etc/sifbox-test-rootfs\n",
        &["-t", "shared:1"],
    );
    // The base is unpacked (a run), and so is the built image (its export).
    env.sh("busybox", "true");
    let ls: Value = env.sifbox(&["image", "ls", "--json"]).json();
    let digest_of_name = |n: &str| {
        ls["images"]
            .as_array()
            .and_then(|a| {
                a.iter().find(|i| {
                    i["refs"]
                        .as_array()
                        .is_some_and(|r| r.iter().any(|x| x == n))
                })
            })
            .and_then(|i| i["digest"].as_str())
            .unwrap_or_else(|| panic!("no image {n}: {ls}"))
            .trim_start_matches("sha256:")
            .to_string()
    };
    let tree = |hex: &str| {
        env.store
            .path()
            .join("rootfs")
            .join(format!("sha256-{hex}"))
    };
    let (base, built) = (
        tree(&digest_of_name("busybox:latest")),
        tree(d.trim_start_matches("sha256:")),
    );
    let ino = |p: &Path| std::fs::symlink_metadata(p).expect("stat").ino();
    // Not a program the shell runs (which would be busy to write).
    let busybox = "usr/bin/sifbox-probe";
    assert_eq!(
        ino(&base.join(busybox)),
        ino(&built.join(busybox)),
        "{busybox} not shared"
    );
    assert_ne!(
        ino(&base.join("etc/sifbox-test-rootfs")),
        ino(&built.join("etc/sifbox-test-rootfs"))
    );
    assert_eq!(
        env.sh("shared:1", "cat /etc/sifbox-test-rootfs /etc/new.txt"),
        "changed\nnew\n"
    );
    assert_eq!(
        env.sh("busybox", "cat /etc/sifbox-test-rootfs"),
        "sifbox-test-rootfs v1\n"
    );
    // A sandbox's write to a shared file reaches neither tree.
    env.sh("shared:1", &format!("echo x >> /{busybox}"));
    assert_eq!(
        std::fs::metadata(base.join(busybox)).expect("stat").len(),
        std::fs::metadata(rootfs().join(busybox))
            .expect("stat")
            .len()
    );
    // Removing the base keeps the built image whole.
    env.sifbox(&["image", "rm", "busybox"]).success();
    env.sifbox(&["gc"]).success();
    assert_eq!(
        env.sh("shared:1", &format!("test -s /{busybox} && echo ok")),
        "ok\n"
    );
}
