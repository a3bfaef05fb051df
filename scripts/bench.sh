#!/usr/bin/env bash
# The start-up benchmark of issue 2: host /bin/true vs bwrap vs `sifbox run`,
# interleaved, on the busybox test root filesystem. Installs what it needs
# (with sudo when not root), builds sifbox in release mode, builds the
# rootfs, then runs scripts/bench.py.
#
# Usage: scripts/bench.sh [RUNS] [bench.py options...]   (RUNS defaults to 50)
#   e.g. scripts/bench.sh 100 --json target/bench.json
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
find_cargo bench.sh

rootfs=$REPO/target/test-rootfs

echo "==== install-deps ===="
bash "$REPO/scripts/install-deps.sh" test
echo "==== cargo build --release -p sifbox ===="
cargo build --release -p sifbox
echo "==== test rootfs ===="
bash "$REPO/scripts/make-test-rootfs.sh" "$rootfs"
echo "==== benchmark ===="
exec python3 "$REPO/scripts/bench.py" --runs "$runs" --rootfs "$rootfs" \
    --sifbox "$(cargo_out_dir release "$REPO")/sifbox" "$@"
