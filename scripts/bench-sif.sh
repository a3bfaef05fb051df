#!/usr/bin/env bash
# Benchmark sifbox's SIF creation and extraction against the reference tools,
# on the same Debian minbase tree, in one run, interleaved:
#
#   create:  sifbox (pack + SIF)   vs  mksquashfs -comp gzip + siftool new/add
#   unpack:  sifbox (from the SIF) vs  unsquashfs (the same squashfs bytes)
#
# Prints per-round times, medians and ratios (sifbox / tools; below 1 means
# sifbox is faster). Needs mmdebstrap (or an existing tree in $TREE),
# squashfs-tools and siftool.
#
#   ROUNDS=5  BENCH_DIR=target/bench-sif  TREE=<dir>  scripts/bench-sif.sh
# Figures measured so far, and what the design rests on: docs/benchmarks.md.
set -euo pipefail

cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
source scripts/lib.sh
ROUNDS=${ROUNDS:-5}
BENCH_DIR=${BENCH_DIR:-$PWD/target/bench-sif}
TREE=${TREE:-$BENCH_DIR/minbase}
mkdir -p "$BENCH_DIR"

for tool in mksquashfs unsquashfs siftool; do
    command -v "$tool" >/dev/null || { echo "bench-sif: $tool is missing (apt-get install squashfs-tools siftool)" >&2; exit 1; }
done

if [ ! -d "$TREE" ]; then
    command -v mmdebstrap >/dev/null || { echo "bench-sif: mmdebstrap is missing; or set TREE=<rootfs dir>" >&2; exit 1; }
    mirror=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
    echo "bench-sif: building a Debian bookworm minbase tree in $TREE" >&2
    rm -rf "$TREE.tmp"
    mmdebstrap --variant=minbase --mode=unshare bookworm "$TREE.tmp" ${mirror:+"$mirror"} >&2
    mv "$TREE.tmp" "$TREE"
fi

cargo build --release -q -p sifbox-image --example sif-create --example sif-unpack
bin=$(cargo_out_dir release "$PWD")/examples

now() { date +%s.%N; }
# elapsed START -> seconds since START
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.3f", b - a }'; }
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else printf "%.3f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

work=$BENCH_DIR/run
rm -rf "$work"
mkdir -p "$work"
ours_create=() ; tools_create=() ; ours_unpack=() ; tools_unpack=()

create_ours() {
    rm -f "$work/ours.sif"
    sync
    local t; t=$(now)
    "$bin/sif-create" "$TREE" "$work/ours.sif" 2>/dev/null
    ours_create+=("$(elapsed "$t")")
}
create_tools() {
    rm -f "$work/tools.sif" "$work/tools.sqfs"
    sync
    local t; t=$(now)
    mksquashfs "$TREE" "$work/tools.sqfs" -comp gzip -noappend -no-progress -quiet >/dev/null
    siftool new "$work/tools.sif"
    siftool add --datatype 4 --parttype 2 --partfs 1 --partarch 2 "$work/tools.sif" "$work/tools.sqfs"
    tools_create+=("$(elapsed "$t")")
}
unpack_ours() {
    rm -rf "$work/out-ours"
    sync
    local t; t=$(now)
    "$bin/sif-unpack" "$work/ours.sif" "$work/out-ours" 2>/dev/null
    ours_unpack+=("$(elapsed "$t")")
}
unpack_tools() {
    rm -rf "$work/out-tools"
    sync
    local t; t=$(now)
    unsquashfs -no-progress -d "$work/out-tools" "$work/ours.sqfs" >/dev/null
    tools_unpack+=("$(elapsed "$t")")
}

for round in $(seq 1 "$ROUNDS"); do
    # Alternate who goes first, so neither always gets the warmer cache.
    if [ $((round % 2)) -eq 1 ]; then create_ours; create_tools; else create_tools; create_ours; fi
    # unsquashfs reads a plain image: the partition sifbox just wrote.
    if [ "$round" -eq 1 ]; then
        id=$(siftool list "$work/ours.sif" | awk '/FS \(Squashfs/ { print $1 }')
        siftool dump "$id" "$work/ours.sif" >"$work/ours.sqfs"
    fi
    if [ $((round % 2)) -eq 1 ]; then unpack_ours; unpack_tools; else unpack_tools; unpack_ours; fi
    echo "round $round: create sifbox ${ours_create[-1]}s tools ${tools_create[-1]}s | unpack sifbox ${ours_unpack[-1]}s unsquashfs ${tools_unpack[-1]}s"
done
rm -rf "$work/out-ours" "$work/out-tools"

m_oc=$(printf '%s\n' "${ours_create[@]}" | median)
m_tc=$(printf '%s\n' "${tools_create[@]}" | median)
m_ou=$(printf '%s\n' "${ours_unpack[@]}" | median)
m_tu=$(printf '%s\n' "${tools_unpack[@]}" | median)
size_tree=$(du -sb "$TREE" | cut -f1)
files=$(find "$TREE" | wc -l)
size_ours=$(stat -c %s "$work/ours.sif")
size_tools=$(stat -c %s "$work/tools.sif")
echo
echo "tree: $TREE ($files entries, $size_tree bytes); $(nproc) CPUs; $ROUNDS rounds, medians:"
awk -v a="$m_oc" -v b="$m_tc" -v s="$size_ours" -v u="$size_tools" 'BEGIN {
    printf "  create  sifbox %6.2fs   mksquashfs+siftool %6.2fs   ratio %.2fx   (SIF %d vs %d bytes, %.3fx)\n", a, b, a / b, s, u, s / u }'
awk -v a="$m_ou" -v b="$m_tu" 'BEGIN {
    printf "  unpack  sifbox %6.2fs   unsquashfs         %6.2fs   ratio %.2fx\n", a, b, a / b }'
