#!/usr/bin/env bash
# Benchmark `sifbox pull` against `skopeo copy` + `umoci unpack`, on the same
# ~200 MB three-layer image (a Debian bookworm minbase, then copies of its
# /usr/bin and /usr/sbin under /opt), served by a local docker-registry on
# 127.0.0.1, in one run, interleaved:
#
#   sifbox:  sifbox pull into an empty store (download, verify, unpack the
#            layers, pack the SIF, keep the unpacked tree: a runnable image)
#   tools:   skopeo copy docker://... oci:DIR  +  umoci unpack --rootless
#            (download, verify, unpack into a runtime bundle)
#
# Prints per-round times, medians and the ratio (sifbox / tools; below 1
# means sifbox is faster). Needs docker-registry, skopeo, umoci, and
# mmdebstrap (or an existing tree in $TREE); scripts/install-deps.sh
# installs them.
#
#   ROUNDS=5  BENCH_DIR=target/bench-pull  TREE=<dir>  scripts/bench-pull.sh
# Figures measured so far, and what the design rests on: docs/benchmarks.md.
set -euo pipefail

cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
source scripts/lib.sh
ROUNDS=${ROUNDS:-5}
BENCH_DIR=${BENCH_DIR:-$PWD/target/bench-pull}
# The tree bench-sif.sh builds serves here too.
if [[ -z ${TREE:-} && -d $PWD/target/bench-sif/minbase ]]; then
    TREE=$PWD/target/bench-sif/minbase
fi
TREE=${TREE:-$BENCH_DIR/minbase}
mkdir -p "$BENCH_DIR"

for tool in docker-registry skopeo umoci tar; do
    command -v "$tool" >/dev/null || {
        echo "bench-pull: $tool is missing (scripts/install-deps.sh installs it)" >&2
        exit 1
    }
done

if [[ ! -d $TREE ]]; then
    command -v mmdebstrap >/dev/null || {
        echo "bench-pull: mmdebstrap is missing; or set TREE=<rootfs dir>" >&2
        exit 1
    }
    mirror=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
    echo "bench-pull: building a Debian bookworm minbase tree in $TREE" >&2
    rm -rf "$TREE.tmp"
    mmdebstrap --variant=minbase --mode=unshare bookworm "$TREE.tmp" ${mirror:+"$mirror"} >&2
    mv "$TREE.tmp" "$TREE"
fi

find_cargo bench-pull
cargo build --release -q -p sifbox
sifbox=$(cargo_out_dir release "$PWD")/sifbox

work=$BENCH_DIR/run
rm -rf "$work"
mkdir -p "$work"

# --- the image: three layers in an OCI layout, pushed to a local registry --
layout=$work/layout
echo "bench-pull: making the image" >&2
umoci init --layout "$layout"
umoci new --image "$layout:img"
tar -C "$TREE" -cf "$work/l1.tar" .
mkdir -p "$work/l2/opt/extra" "$work/l3/opt/extra"
cp -a "$TREE/usr/bin" "$work/l2/opt/extra/bin"
cp -a "$TREE/usr/sbin" "$work/l3/opt/extra/sbin"
tar -C "$work/l2" -cf "$work/l2.tar" .
tar -C "$work/l3" -cf "$work/l3.tar" .
for l in l1 l2 l3; do
    umoci raw add-layer --image "$layout:img" "$work/$l.tar"
done
rm -rf "$work/l1.tar" "$work/l2.tar" "$work/l3.tar" "$work/l2" "$work/l3"
umoci config --image "$layout:img" --config.env PATH=/usr/local/bin:/usr/bin:/bin --config.cmd /bin/bash

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cat >"$work/registry.yml" <<EOF
version: 0.1
log:
  level: error
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: $work/registry
http:
  addr: 127.0.0.1:$port
EOF
docker-registry serve "$work/registry.yml" >"$work/registry.log" 2>&1 &
registry_pid=$!
trap 'kill "$registry_pid" 2>/dev/null || true' EXIT
for _ in $(seq 1 100); do
    curl -fs "http://127.0.0.1:$port/v2/" >/dev/null 2>&1 && break
    sleep 0.1
done
ref=127.0.0.1:$port/bench/minbase:1
skopeo copy --quiet --insecure-policy --dest-tls-verify=false "oci:$layout:img" "docker://$ref"

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.3f", b - a }'; }
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else printf "%.3f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

ours=()
tools=()
pull_ours() {
    rm -rf "$work/store"
    sync
    local t
    t=$(now)
    SIFBOX_CACHE=$work/store "$sifbox" pull -q "$ref" >/dev/null
    ours+=("$(elapsed "$t")")
}
pull_tools() {
    rm -rf "$work/oci" "$work/bundle"
    sync
    local t
    t=$(now)
    skopeo copy --quiet --insecure-policy --src-tls-verify=false "docker://$ref" "oci:$work/oci:img"
    umoci unpack --rootless --image "$work/oci:img" "$work/bundle" >/dev/null
    tools+=("$(elapsed "$t")")
}

for round in $(seq 1 "$ROUNDS"); do
    # Alternate who goes first, so neither always gets the warmer cache.
    if ((round % 2)); then pull_ours; pull_tools; else pull_tools; pull_ours; fi
    echo "round $round: sifbox pull ${ours[-1]}s   skopeo copy + umoci unpack ${tools[-1]}s"
done

# Both made the same tree.
diff -rq --no-dereference "$work/bundle/rootfs/opt/extra" \
    "$work/store/rootfs/$(ls "$work/store/rootfs")/opt/extra" >/dev/null ||
    echo "bench-pull: warning: the two trees differ under /opt/extra" >&2

m_o=$(printf '%s\n' "${ours[@]}" | median)
m_t=$(printf '%s\n' "${tools[@]}" | median)
size=$(du -sb "$work/bundle/rootfs" | cut -f1)
blobs=$(du -sb "$work/oci/blobs" | cut -f1)
rm -rf "$work/store" "$work/oci" "$work/bundle"
echo
echo "image: 3 layers, $blobs bytes of blobs, $size bytes unpacked; $(nproc) CPUs; $ROUNDS rounds, medians:"
awk -v a="$m_o" -v b="$m_t" 'BEGIN {
    printf "  sifbox pull %6.2fs   skopeo copy + umoci unpack %6.2fs   ratio %.2fx (goal <= 1.0)\n", a, b, a / b }'
