#!/usr/bin/env bash
# The long-lived sandbox benchmark of issue 6 (item 8): `sifbox exec
# /bin/true` into a running sandbox vs host /bin/true vs bwrap, interleaved;
# start-to-ready; RSS/PSS of idle sandboxes. Installs what it needs (with
# sudo when not root), builds sifbox in release mode, builds the test rootfs,
# then runs scripts/bench-sandbox.py.
#
# Usage: scripts/bench-sandbox.sh [RUNS] [bench-sandbox.py options...]
#   RUNS defaults to 50; e.g. scripts/bench-sandbox.sh 100 --idle 200 --json target/bench-sandbox.json
# Figures measured so far, and what the design rests on: docs/benchmarks.md.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
readonly REPO
cd "$REPO"

runs=50
if [[ ${1:-} =~ ^[0-9]+$ ]]; then
    runs=$1
    shift
fi

# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
find_cargo bench-sandbox.sh

rootfs=$REPO/target/test-rootfs

echo "==== install-deps ===="
bash "$REPO/scripts/install-deps.sh" test
echo "==== cargo build --release -p sifbox ===="
cargo build --release -p sifbox
echo "==== test rootfs ===="
bash "$REPO/scripts/make-test-rootfs.sh" "$rootfs"
echo "==== benchmark ===="
exec python3 "$REPO/scripts/bench-sandbox.py" --runs "$runs" --rootfs "$rootfs" \
    --sifbox "$(cargo_out_dir release "$REPO")/sifbox" "$@"
