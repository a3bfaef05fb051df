#!/usr/bin/env bash
# Makes the base image that the example tasks (examples/tasks) and the build
# and eval tests start FROM, without Docker Hub: a Debian bookworm minbase
# tree bootstrapped with mmdebstrap from the host's Debian mirror, kept as
# target/bookworm-minbase.tar (made once per machine, ~1 minute), and
# imported into the image store as `debian:bookworm` when a sifbox binary
# is given. Idempotent: an existing tarball and an existing import are kept.
#
# Usage: scripts/bootstrap-base.sh [SIFBOX-BINARY]
#        ($SIFBOX_CACHE selects the store; $SIFBOX_BASE_TAR the tarball)
#
# With $SIFBOX_COMPAT_TAR set (scripts/test.sh sets it), it also makes that
# tarball once: the same minbase with the real programs of the seccomp
# compatibility tests (crates/sifbox/tests/e2e/compat.rs: Python, Node,
# OpenSSL, curl, git, ssh-keygen, Go, Rust, a JDK, gcc, make, gdb, strace,
# SQLite; about 1.8 GB, 3 minutes). It is a test fixture only: nothing is
# imported from it here.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
readonly REPO
TAR=${SIFBOX_BASE_TAR:-$REPO/target/bookworm-minbase.tar}
readonly NAME=debian:bookworm
readonly COMPAT_PACKAGES=python3,python3-venv,python3-pip,nodejs,openssl,curl,git,openssh-client,golang-go,rustc,default-jdk-headless,gcc,make,libc6-dev,gdb,strace,sqlite3,ca-certificates

log() { printf 'bootstrap-base: %s\n' "$*" >&2; }
die() {
    log "error: $*"
    exit 1
}

# bootstrap TAR WHAT [MMDEBSTRAP-ARGS...]: makes TAR with mmdebstrap unless
# it exists (written beside it and renamed, so never half-made).
bootstrap() {
    local tar=$1 what=$2 mirror
    shift 2
    if [[ -s $tar ]]; then
        log "ok: $tar exists"
        return 0
    fi
    command -v mmdebstrap >/dev/null 2>&1 ||
        die "mmdebstrap is not installed: run scripts/install-deps.sh"
    mirror=$(awk '/^URIs:/ { print $2; exit }' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
    if [[ -z $mirror ]]; then
        mirror=$(awk '$1 == "deb" { print $2; exit }' /etc/apt/sources.list 2>/dev/null || true)
    fi
    mirror=${mirror:-http://deb.debian.org/debian}
    mkdir -p "$(dirname "$tar")"
    tmp="$tar.partial.$$"
    trap 'rm -f -- "$tmp"' EXIT
    log "bootstrapping Debian bookworm ($what) from $mirror into $tar"
    # root: chroot mode; other users: a user namespace (needs a subuid range).
    mmdebstrap --quiet --variant=minbase --mode=auto --format=tar "$@" bookworm "$tmp" "$mirror" ||
        die "mmdebstrap failed (is $mirror reachable?)"
    mv -- "$tmp" "$tar"
    trap - EXIT
    log "ok: made $tar"
}

bootstrap "$TAR" "minbase, about a minute"
if [[ -n ${SIFBOX_COMPAT_TAR:-} ]]; then
    bootstrap "$SIFBOX_COMPAT_TAR" "minbase and the compatibility tests' programs, about 3 minutes" \
        --include="$COMPAT_PACKAGES"
fi

if [[ -n ${1:-} ]]; then
    sifbox=$1
    [[ -x $sifbox ]] || die "$sifbox is not an executable sifbox binary"
    # The import is done once per store (by the tarball's fingerprint);
    # naming it again is instant.
    "$sifbox" image import "$TAR" --name "$NAME" >/dev/null ||
        die "importing $TAR as $NAME failed"
    log "ok: $NAME in the image store ${SIFBOX_CACHE:-(default)}"
fi
