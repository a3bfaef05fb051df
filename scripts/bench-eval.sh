#!/usr/bin/env bash
# The eval benchmark of issue 7: 100 rollouts of a trivial task (the oracle
# runs `true`, the verifier writes reward 1) with --jobs 2, on the Debian
# bookworm base; prints the per-rollout overhead of sifbox (median, p95)
# and the throughput. Installs what it needs (with sudo when not root),
# builds sifbox in release mode and bootstraps the base image into a store
# of its own (target/bench-eval/), then runs scripts/bench-eval.py.
#
# Usage: scripts/bench-eval.sh [bench-eval.py options...]
#   e.g. scripts/bench-eval.sh --rollouts 100 --jobs 2 --json target/bench-eval.json
#        scripts/bench-eval.sh --rollouts 96 --layers tmpfs,disk   (as root: the two writable layers)
#        scripts/bench-eval.sh --examples examples/tasks           (the suite, cold store, -j 1 vs -j 2, -k 3)
# Figures measured so far, and what the design rests on: docs/benchmarks.md.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
readonly REPO
cd "$REPO"

# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
find_cargo bench-eval.sh

work=$REPO/target/bench-eval
mkdir -p "$work"
export SIFBOX_CACHE=$work/cache

echo "==== install-deps ===="
bash "$REPO/scripts/install-deps.sh" test
echo "==== cargo build --release -p sifbox ===="
cargo build --release -p sifbox
echo "==== base image ===="
sifbox=$(cargo_out_dir release "$REPO")/sifbox
bash "$REPO/scripts/bootstrap-base.sh" "$sifbox"
echo "==== benchmark ===="
exec python3 "$REPO/scripts/bench-eval.py" --sifbox "$sifbox" \
    --work "$work" "$@"
