#!/usr/bin/env bash
# The whole test suite of sifbox: set-up, lints, build, the test root
# filesystem, then all tests as root and the end-to-end tests again as the
# unprivileged user sbtest. This is README's test command and what CI runs.
#
# Usage: scripts/test.sh        (as root; re-runs itself with sudo otherwise)
#
# Every step runs even when an earlier one failed, except those that need what
# failed (no tests without a build); the exit status is non-zero if any step
# failed, and the last line sums up.
set -euo pipefail

readonly TEST_USER=sbtest

if [[ $(id -u) -ne 0 ]]; then
    if command -v sudo >/dev/null 2>&1; then
        echo "test.sh: not root: re-running with sudo" >&2
        exec sudo -- bash "$0" "$@"
    fi
    echo "test.sh: error: must run as root (it installs packages, creates the user $TEST_USER and runs the suite as root and as $TEST_USER), and sudo is not installed" >&2
    exit 1
fi

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
readonly REPO
ROOTFS=${SIFBOX_TEST_ROOTFS:-$REPO/target/test-rootfs}
[[ $ROOTFS == /* ]] || ROOTFS=$PWD/$ROOTFS
export SIFBOX_TEST_ROOTFS=$ROOTFS
# The Debian bookworm minbase that the example tasks start from
# (scripts/bootstrap-base.sh makes it once per machine).
BASE_TAR=${SIFBOX_TEST_DEBIAN_TAR:-$REPO/target/bookworm-minbase.tar}
export SIFBOX_TEST_DEBIAN_TAR=$BASE_TAR
# The same with the real programs of the seccomp compatibility tests.
COMPAT_TAR=${SIFBOX_TEST_COMPAT_TAR:-$REPO/target/bookworm-compat.tar}
export SIFBOX_TEST_COMPAT_TAR=$COMPAT_TAR
cd "$REPO"

# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
find_cargo test.sh

USER_DIR=""

cleanup() {
    if [[ -n $USER_DIR && -d $USER_DIR ]]; then
        rm -rf --one-file-system -- "$USER_DIR"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

SECONDS=0
declare -a RESULTS=()
FAILED=0

header() {
    printf '\n==== %s ====\n' "$*"
}

# step NAME COMMAND...: runs COMMAND under a header and records its result.
step() {
    local name=$1 start=$SECONDS rc=0
    shift
    header "$name"
    "$@" || rc=$?
    if ((rc == 0)); then
        RESULTS+=("$name: ok")
        printf -- '---- %s: ok (%ds)\n' "$name" $((SECONDS - start))
    else
        RESULTS+=("$name: FAILED")
        FAILED=1
        printf -- '---- %s: FAILED with exit code %d (%ds)\n' "$name" "$rc" $((SECONDS - start))
    fi
    return "$rc"
}

skip() {
    RESULTS+=("$1: skipped")
    FAILED=1
    header "$1"
    printf -- '---- %s: skipped (%s)\n' "$1" "$2"
}

shell_lint() {
    local scripts=()
    local f
    for f in scripts/*.sh .ci/run; do
        [[ -f $f ]] && scripts+=("$f")
    done
    shellcheck --severity=warning "${scripts[@]}"
}

root_tests() {
    if cargo nextest --version >/dev/null 2>&1; then
        cargo nextest run --workspace --no-fail-fast
    else
        echo "cargo-nextest not found: using cargo test"
        cargo test --workspace --no-fail-fast
    fi
}

# Prints the paths of the end-to-end test binaries that cargo built, one per
# line: the integration tests of the sifbox package, which are one binary,
# e2e (crates/sifbox/tests/e2e/main.rs, a module per suite).
e2e_binaries() {
    cargo test -p sifbox --tests --no-run --message-format=json |
        python3 -c '
import json, sys
exes = []
for line in sys.stdin:
    try:
        msg = json.loads(line)
    except ValueError:
        continue
    target = msg.get("target", {})
    if (msg.get("reason") == "compiler-artifact" and "test" in target.get("kind", [])
            and msg.get("executable") and msg.get("package_id", "").find("sifbox-engine") < 0):
        exes.append(msg["executable"])
if not exes:
    sys.exit("test.sh: cargo built no end-to-end test binary")
print("\n".join(exes))
'
}

# Tests that measure CPU time run by themselves, after the others (as
# .config/nextest.toml has them run as root): beside other tests they would
# get less of the CPU than they measure. The user-wide pids cap's test too:
# its small cap is the user's, for every sandbox running beside it.
readonly ALONE_TESTS=(limits::cpus_caps_busy_loops limits::the_user_pids_cap_bounds_two_sandboxes_together)

# as_test_user EXE ARGS...: runs the test binary EXE (in $USER_DIR) as the
# unprivileged user, with a clean environment.
as_test_user() {
    (
        cd "$USER_DIR" &&
            runuser -u "$TEST_USER" -- env -i \
                PATH=/usr/bin:/bin \
                HOME="$(getent passwd "$TEST_USER" | cut -d: -f6)" \
                RUST_BACKTRACE=1 \
                SIFBOX_BIN="$USER_DIR/sifbox" \
                SIFBOX_TEST_ROOTFS="$USER_DIR/rootfs" \
                SIFBOX_TEST_DEBIAN_TAR="$USER_DIR/base.tar" \
                SIFBOX_TEST_COMPAT_TAR="$USER_DIR/compat.tar" \
                SIFBOX_TEST_TASKS="$USER_DIR/tasks" \
                SIFBOX_TEST_CORPUS="$USER_DIR/corpus" \
                "$@"
    )
}

# Runs the end-to-end tests as the unprivileged user, from copies under
# /var/tmp: the repository may sit under /root, which that user cannot read.
user_tests() {
    local exes target_dir exe t rc=0
    local skips=()
    for t in "${ALONE_TESTS[@]}"; do
        skips+=(--skip "$t")
    done
    exes=$(e2e_binaries) || return 1
    # cargo's target dir (CARGO_TARGET_DIR or .cargo/config may move it).
    target_dir=$(cargo metadata --format-version 1 --no-deps |
        python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])') || return 1
    USER_DIR=$(mktemp -d /var/tmp/sifbox-usertest.XXXXXX) || return 1
    chmod 0755 "$USER_DIR" || return 1
    install -m 0755 "$(CARGO_TARGET_DIR=$target_dir cargo_out_dir debug "$REPO")/sifbox" "$USER_DIR/sifbox" || return 1
    cp -a "$ROOTFS" "$USER_DIR/rootfs" || return 1
    # The Debian base of the apt and example-suite tests, and the example
    # tasks (the repository may not be readable by the user).
    if [[ -f $BASE_TAR ]]; then
        cp -- "$BASE_TAR" "$USER_DIR/base.tar" || return 1
    fi
    if [[ -f $COMPAT_TAR ]]; then
        cp -- "$COMPAT_TAR" "$USER_DIR/compat.tar" || return 1
    fi
    cp -a "$REPO/examples/tasks" "$USER_DIR/tasks" || return 1
    cp -a "$REPO/crates/sifbox/tests/e2e/tasks" "$USER_DIR/corpus" || return 1
    chmod -R a+rX "$USER_DIR/tasks" "$USER_DIR/corpus" || return 1
    # The user's sandboxes map its own id to root: files owned by ids outside
    # its mapping would show as nobody and could not be copied up.
    chown -R -h "$TEST_USER:$TEST_USER" "$USER_DIR/rootfs" || return 1
    while IFS= read -r exe; do
        [[ -n $exe ]] || continue
        local name
        name=$(basename "$exe" | sed 's/-[0-9a-f]*$//')
        # The unit tests of the CLI binary itself need nothing of the user.
        [[ $name == sifbox ]] && continue
        install -m 0755 "$exe" "$USER_DIR/$name" || return 1
        echo "running $name as $TEST_USER ($(id -u "$TEST_USER")) in $USER_DIR"
        as_test_user "$USER_DIR/$name" --test-threads=2 "${skips[@]}" || rc=1
        echo "running ${ALONE_TESTS[*]} of $name alone as $TEST_USER"
        as_test_user "$USER_DIR/$name" --test-threads=1 --exact "${ALONE_TESTS[@]}" || rc=1
    done <<<"$exes"
    return "$rc"
}

host_info() {
    echo "kernel $(uname -r), $(nproc) cores, $(id -un) in $REPO"
    cargo --version
    rustc --version
    if cargo nextest --version >/dev/null 2>&1; then cargo nextest --version | head -n1; fi
}

step "host" host_info || true
if ! step "install-deps" bash "$REPO/scripts/install-deps.sh" test; then
    echo "test.sh: FAILED: could not install the dependencies (see above)"
    exit 1
fi
step "shellcheck" shell_lint || true
step "cargo fmt" cargo fmt --all -- --check || true
step "cargo clippy" cargo clippy --workspace --all-targets -- -D warnings || true

built=0
rootfs=0
step "cargo build" cargo build --workspace && built=1
if [[ ! -f $REPO/scripts/make-test-rootfs.sh ]]; then
    skip "test rootfs" "scripts/make-test-rootfs.sh is missing"
else
    step "test rootfs" bash "$REPO/scripts/make-test-rootfs.sh" "$ROOTFS" && rootfs=1
fi

# Tests that need it fail (with a message) when it could not be made; the
# others run regardless.
step "base image" env SIFBOX_BASE_TAR="$BASE_TAR" SIFBOX_COMPAT_TAR="$COMPAT_TAR" \
    bash "$REPO/scripts/bootstrap-base.sh" || true

if ((built && rootfs)); then
    step "tests as root" root_tests || true
    step "e2e tests as $TEST_USER" user_tests || true
else
    skip "tests as root" "the build or the test rootfs failed"
    skip "e2e tests as $TEST_USER" "the build or the test rootfs failed"
fi

header "summary"
printf '  %s\n' "${RESULTS[@]}"
total="$((SECONDS / 60))m$((SECONDS % 60))s"
if ((FAILED)); then
    echo "test.sh: FAILED after $total: $(printf '%s; ' "${RESULTS[@]}" | sed 's/; $//')"
    exit 1
fi
echo "test.sh: all steps passed in $total (tests as root and as $TEST_USER)"
