#!/usr/bin/env bash
# The main job on defaults: sets up (packages, a release build, the Debian
# bookworm base image `debian:bookworm` in the image store), runs the example
# task suite with `sifbox eval examples/tasks --agent oracle`, shows the
# summary and checks the rewards; then shows what a sifbox sandbox isolates,
# one `sifbox run` at a time on a busybox root filesystem, checking each
# claim as it goes.
#
# Usage: scripts/demo.sh     (as any user; package installs use sudo when not root)

# The sh -c scripts below are single-quoted on purpose: they expand inside the sandbox.
# shellcheck disable=SC2016
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
readonly REPO
cd "$REPO"

# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

explain() { printf '\n# %s\n' "$*"; }

fail() {
    echo "demo.sh: FAILED: $*" >&2
    exit 1
}

ROOTFS=$REPO/target/test-rootfs

# quote ARG: ARG as a shell word, quoted only when it needs to be.
quote() {
    if [[ $1 =~ ^[A-Za-z0-9_./:=@%+,-]+$ ]]; then
        printf '%s' "$1"
    else
        printf "'%s'" "${1//\'/\'\\\'\'}"
    fi
}

# sb ARGS...: shows and runs `sifbox run --rootfs ROOTFS ARGS...`. The
# command line goes to fd 3, the terminal, also when the output is captured.
sb() {
    local arg line
    line="\$ sifbox run --rootfs $(quote "$ROOTFS")"
    for arg in "$@"; do
        line+=" $(quote "$arg")"
    done
    printf '%s\n' "$line" >&3
    "$SIFBOX" run --rootfs "$ROOTFS" "$@" 3>&-
}
exec 3>&1

# Everything that may change when a sandbox writes where it must not.
fingerprint() {
    (cd "$ROOTFS" && find . -printf '%p %y %m %U:%G %s %T@ %l\n' | LC_ALL=C sort | sha256sum)
}

find_cargo demo.sh
SIFBOX=$(cargo_out_dir release "$REPO")/sifbox
echo "==== setting up ===="
bash "$REPO/scripts/install-deps.sh" run
cargo build --release -p sifbox
bash "$REPO/scripts/make-test-rootfs.sh" "$ROOTFS" >/dev/null
[[ -x $SIFBOX ]] || fail "$SIFBOX was not built"
bash "$REPO/scripts/bootstrap-base.sh" "$SIFBOX"

echo
echo "==== the main job: sifbox eval examples/tasks --agent oracle ===="
jobs_dir=$REPO/target/demo-jobs
job=demo-$(date -u +%Y%m%d-%H%M%S)
printf '$ sifbox eval examples/tasks --agent oracle --out %s --job %s\n' "$jobs_dir" "$job"
"$SIFBOX" eval "$REPO/examples/tasks" --agent oracle --out "$jobs_dir" --job "$job" ||
    fail "sifbox eval failed"
# The expected outcome of each example task with its own solution.
python3 - "$jobs_dir/$job" <<'PY' || fail "the example tasks did not give the expected rewards"
import json, pathlib, sys
job = pathlib.Path(sys.argv[1])
expected = {
    "background-service": (1.0, None),
    "compile-c": (1.0, None),
    "edit-files": (1.0, None),
    "failing-solution": (0.0, None),
    "no-network": (1.0, None),
    "verifier-timeout": (None, "verifier_timeout"),
}
bad = []
for task, want in expected.items():
    r = json.loads((job / f"{task}__1" / "result.json").read_text())
    got = (r["reward"], r["error_class"])
    if got != want:
        bad.append(f"{task}: expected {want}, got {got}")
if bad:
    sys.exit("\n".join(bad))
print(f"rewards as expected; results in {job}")
PY

work=$(mktemp -d "${TMPDIR:-/tmp}/sifbox-demo.XXXXXX")
marker="$HOME/.sifbox-demo-marker.$$"
cleanup() {
    rm -rf -- "$work"
    rm -f -- "$marker"
}
trap cleanup EXIT
trap 'echo "demo.sh: FAILED at line $LINENO" >&2' ERR

echo
echo "==== sifbox sandboxes: rootfs $ROOTFS, caller $(id -un) (uid $(id -u)) ===="

explain "Identity: the command runs as root inside, and that root is the caller (uid $(id -u)) outside, with no host privilege."
out=$(sb -- sh -c 'id; echo "uid_map:$(cat /proc/self/uid_map)"') || fail "sifbox run failed"
printf '%s\n' "$out"
[[ $out == uid=0* ]] || fail "expected uid 0 inside the sandbox"

explain "Hostname: the sandbox has its own (the host is $(hostname))."
out=$(sb --hostname sifbox-demo -- hostname) || fail "sifbox run --hostname failed"
printf '%s\n' "$out"
[[ $out == sifbox-demo ]] || fail "expected hostname sifbox-demo, got '$out'"

explain "Processes: only the sandbox's own are visible (the host has $(ps -e --no-headers | wc -l))."
sb -- ps || fail "sifbox run ps failed"

explain "Environment: clean; SIFBOX_DEMO_SECRET is set on the host but does not reach the sandbox, --env does."
export SIFBOX_DEMO_SECRET=host-only-value
out=$(sb --env GREETING=hello -- env) || fail "sifbox run --env failed"
printf '%s\n' "$out" | LC_ALL=C sort
[[ $out != *SIFBOX_DEMO_SECRET* ]] || fail "a host variable reached the sandbox"
[[ $out == *GREETING=hello* ]] || fail "--env GREETING=hello did not reach the sandbox"

if [[ $HOME == /root ]]; then
    explain "Files: the host's /root (the caller's home, where $marker was just created) does not reach the sandbox."
else
    explain "Files: the caller's home ($HOME, where $marker was just created) and the host's /root do not reach the sandbox."
fi
echo "secret" >"$marker"
sb -- sh -c 'r=$(ls -A /root); echo "/root inside holds: ${r:-nothing}"; echo "/home inside holds: $(ls -A /home)"; if [ -e "$1" ]; then echo "$1 is visible"; exit 1; fi; echo "$1: not there"' sh "$marker" ||
    fail "a host file is visible in the sandbox"

explain "Root filesystem: writes land in a throw-away layer; the source tree stays byte for byte as it was."
before=$(fingerprint)
sb -- sh -c 'echo written-inside >/hello-from-sandbox && cat /hello-from-sandbox && rm /bin/ls && echo "removed /bin/ls inside"' ||
    fail "writing to / inside the sandbox failed"
after=$(fingerprint)
[[ $before == "$after" ]] || fail "the source rootfs changed"
[[ ! -e $ROOTFS/hello-from-sandbox && -L $ROOTFS/bin/ls ]] || fail "the source rootfs changed"
echo "source rootfs unchanged (sha256 of its listing: ${after%% *})"

explain "Network: with --net none the sandbox has only its own loopback (the host has $(tail -n +3 /proc/net/dev | wc -l) interfaces)."
out=$(sb --net none -- cat /proc/net/dev) || fail "sifbox run --net none failed"
printf '%s\n' "$out"
ifaces=$(printf '%s\n' "$out" | tail -n +3 | cut -d: -f1 | tr -d ' ')
[[ $ifaces == lo ]] || fail "expected only lo with --net none, got: $ifaces"

explain "Bind mounts: a host directory can be shared read-only with --bind SRC:DST:ro."
mkdir "$work/shared"
echo "hello from the host" >"$work/shared/hello.txt"
sb --bind "$work/shared:/data:ro" -- sh -c 'cat /data/hello.txt; if touch /data/new 2>/dev/null; then echo "write to /data succeeded"; exit 1; fi; echo "write to /data refused: read-only"' ||
    fail "the read-only bind was writable"
[[ ! -e $work/shared/new ]] || fail "the sandbox wrote into the read-only bind"

explain "Exit codes: the command's own status comes back to the caller."
rc=0
sb -- sh -c 'exit 42' || rc=$?
echo "exit code: $rc"
((rc == 42)) || fail "expected exit code 42, got $rc"

echo
echo "demo ok"
echo "the sifbox binary it used: $SIFBOX (\`cargo install --path crates/sifbox\` puts one in ~/.cargo/bin)"
