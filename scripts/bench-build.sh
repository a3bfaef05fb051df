#!/usr/bin/env bash
# Benchmark `sifbox build` against Debian's buildah (`buildah build
# --isolation chroot --layers`, vfs storage) on the same Dockerfiles and the
# same Debian bookworm minbase base image, in one run, interleaved:
#
#   cold       every step runs (sifbox --no-cache; buildah --no-cache)
#   no-change  the same build again: every step from the cache
#
# Both tools have the base image in their own store before timing starts
# (sifbox: `image import`; buildah: a commit of the same tarball). Prints
# per-round times, medians and ratios (sifbox / buildah; below 1 means
# sifbox is faster). Runs as root (buildah's chroot isolation needs it).
# The apt case needs the network to the Debian mirror.
#
#   ROUNDS=3  BENCH_DIR=target/bench-build  scripts/bench-build.sh
# Figures measured so far, and what the design rests on: docs/benchmarks.md.
set -euo pipefail

cd "$(dirname "$0")/.."
REPO=$PWD
ROUNDS=${ROUNDS:-3}
BENCH_DIR=${BENCH_DIR:-$REPO/target/bench-build}
mkdir -p "$BENCH_DIR"

command -v buildah >/dev/null || { echo "bench-build: buildah is missing (apt-get install buildah)" >&2; exit 1; }
[[ $(id -u) -eq 0 ]] || { echo "bench-build: run as root (buildah --isolation chroot needs it)" >&2; exit 1; }

"$REPO/scripts/bootstrap-base.sh"
tar=${SIFBOX_BASE_TAR:-$REPO/target/bookworm-minbase.tar}

# shellcheck source=scripts/lib.sh
source "$REPO/scripts/lib.sh"
find_cargo bench-build
cargo build --release -q -p sifbox
SIFBOX=$(cargo_out_dir release "$REPO")/sifbox

export SIFBOX_CACHE=$BENCH_DIR/sifbox-cache
export SIFBOX_RUNTIME=$BENCH_DIR/runtime
BUILDAH=(buildah --storage-driver vfs --root "$BENCH_DIR/buildah/root" --runroot "$BENCH_DIR/buildah/runroot")
rm -rf "$SIFBOX_CACHE" "$SIFBOX_RUNTIME" "$BENCH_DIR/buildah"
mkdir -p "$SIFBOX_RUNTIME"

echo "bench-build: importing the base image into both stores" >&2
"$SIFBOX" image import "$tar" --name localhost/bench-base >/dev/null
"$SIFBOX" run localhost/bench-base true
ctr=$("${BUILDAH[@]}" from scratch)
"${BUILDAH[@]}" add "$ctr" "$tar" / >/dev/null
"${BUILDAH[@]}" commit -q "$ctr" localhost/bench-base >/dev/null
"${BUILDAH[@]}" rm "$ctr" >/dev/null

# The build contexts.
ctx=$BENCH_DIR/ctx
rm -rf "$ctx"
mkdir -p "$ctx/apt" "$ctx/files/src"
for i in $(seq 1 200); do echo "file $i" >"$ctx/files/src/f$i.txt"; done
cp -r "$ctx/files/src" "$ctx/apt/src"
cat >"$ctx/apt/Dockerfile" <<'EOF'
FROM localhost/bench-base
RUN apt-get update && apt-get install -y --no-install-recommends hello && rm -rf /var/lib/apt/lists/*
COPY src /app/src
RUN ls /app/src | wc -l > /app/count
WORKDIR /app
CMD ["hello"]
EOF
cat >"$ctx/files/Dockerfile" <<'EOF'
FROM localhost/bench-base
ENV APP=/app
WORKDIR /app
COPY src ./src
RUN mkdir -p out && for f in src/*.txt; do tr a-z A-Z < "$f" > "out/$(basename "$f")"; done
RUN useradd -m runner && chown -R runner out
RUN printf '#!/bin/sh\ncat /app/out/f1.txt\n' > /usr/local/bin/show && chmod 755 /usr/local/bin/show
USER runner
CMD ["show"]
EOF

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.3f", b - a }'; }
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else printf "%.3f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

declare -A T
record() { T[$1]+="$2 "; }

ours() { # CASE MODE
    local flags=() t
    [[ $2 == cold ]] && flags=(--no-cache)
    t=$(now)
    "$SIFBOX" build -q "${flags[@]}" -t "bench-$1" "$ctx/$1" >/dev/null
    record "sifbox-$1-$2" "$(elapsed "$t")"
}
theirs() { # CASE MODE
    local flags=() t
    [[ $2 == cold ]] && flags=(--no-cache)
    t=$(now)
    "${BUILDAH[@]}" build -q --isolation chroot --layers "${flags[@]}" -t "bench-$1" "$ctx/$1" >/dev/null 2>&1
    record "buildah-$1-$2" "$(elapsed "$t")"
}

for round in $(seq 1 "$ROUNDS"); do
    for c in files apt; do
        for mode in cold nochange; do
            # Alternate who goes first.
            if ((round % 2)); then ours "$c" "$mode"; theirs "$c" "$mode"; else theirs "$c" "$mode"; ours "$c" "$mode"; fi
        done
    done
    echo "bench-build: round $round done" >&2
done

printf '\n%-10s %-9s %12s %12s %8s   (medians of %s rounds, seconds)\n' case mode sifbox buildah ratio "$ROUNDS"
for c in files apt; do
    for mode in cold nochange; do
        o=$(tr ' ' '\n' <<<"${T[sifbox-$c-$mode]}" | grep . | median)
        b=$(tr ' ' '\n' <<<"${T[buildah-$c-$mode]}" | grep . | median)
        r=$(awk -v o="$o" -v b="$b" 'BEGIN { printf "%.2f", o / b }')
        printf '%-10s %-9s %12s %12s %7sx   sifbox: %s  buildah: %s\n' "$c" "$mode" "$o" "$b" "$r" "${T[sifbox-$c-$mode]}" "${T[buildah-$c-$mode]}"
    done
done
