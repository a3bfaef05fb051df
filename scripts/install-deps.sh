#!/usr/bin/env bash
# Installs the system packages and the unprivileged test user that the demo,
# the test suite and the benchmark need. Idempotent and fast when everything
# is already there. Needs root: re-executes itself with sudo when it can.
#
# Usage: scripts/install-deps.sh
set -euo pipefail

readonly TEST_USER=sbtest
readonly PACKAGES=(
    busybox-static # the test and demo root filesystem
    bubblewrap     # the peer of the benchmark
    uidmap         # newuidmap/newgidmap for --userns full
    hyperfine      # ad-hoc timing next to scripts/bench.py
    python3        # scripts/bench.py, parsing cargo's JSON in scripts/test.sh
    iproute2       # ip, to look at network namespaces
    crun           # a peer to compare against
    procps         # ps, pkill -0 checks in tests
    util-linux     # runuser, unshare, nsenter
    passwd         # useradd
    ca-certificates
    shellcheck # lint of the scripts in scripts/test.sh
    siftool        # SIF interop tests (Debian's reference implementation)
    squashfs-tools # mksquashfs/unsquashfs interop tests and benchmark
    umoci          # OCI image layouts for import tests
    skopeo         # OCI archives for import tests
    mmdebstrap     # Debian base trees for benchmarks and base images
    docker-registry # a local OCI registry for the pull tests and benchmark
    apache2-utils  # htpasswd, for the registry behind basic auth
    e2fsprogs      # mkfs.ext4, for disk-backed writable layers (--disk, eval as root)
    groff-base     # groff, to check that `sifbox man` renders
    buildah        # the peer of scripts/bench-build.sh
)

log() { printf 'install-deps: %s\n' "$*" >&2; }
die() {
    log "error: $*"
    exit 1
}

if ! command -v dpkg-query >/dev/null 2>&1 || ! command -v apt-get >/dev/null 2>&1; then
    die "dpkg-query/apt-get not found: this script supports Debian and its derivatives (tested on Debian 12)"
fi

# --- what is missing (any user can tell) --------------------------------------
missing=()
for pkg in "${PACKAGES[@]}"; do
    status=$(dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null || true)
    [[ $status == installed ]] || missing+=("$pkg")
done

user_ready() {
    id -u "$TEST_USER" >/dev/null 2>&1 &&
        [[ -d $(getent passwd "$TEST_USER" | cut -d: -f6) ]] &&
        grep -qs "^${TEST_USER}:" /etc/subuid &&
        grep -qs "^${TEST_USER}:" /etc/subgid
}

if [[ $(id -u) -ne 0 ]]; then
    if ((${#missing[@]} == 0)) && user_ready; then
        log "ok: all ${#PACKAGES[@]} packages present, user $TEST_USER ready (nothing to do, so no root needed)"
        exit 0
    fi
    if command -v sudo >/dev/null 2>&1; then
        log "not root: re-running with sudo"
        exec sudo -- bash "$0" "$@"
    fi
    die "must run as root (it installs packages and creates the user '$TEST_USER'), and sudo is not installed: run it as root"
fi

# --- packages -----------------------------------------------------------------
if ((${#missing[@]} == 0)); then
    log "packages: all ${#PACKAGES[@]} present"
else
    log "packages: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq || die "apt-get update failed"
    apt-get install -y -qq --no-install-recommends \
        -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold \
        "${missing[@]}" </dev/null || die "apt-get install ${missing[*]} failed"
fi

# --- loop devices, for disk-backed writable layers ---------------------------
if [[ ! -e /dev/loop-control ]]; then
    modprobe loop 2>/dev/null ||
        log "warning: no /dev/loop-control and \`modprobe loop\` failed: writable layers will be tmpfs only"
fi

# --- the unprivileged test user ----------------------------------------------
if ! id -u "$TEST_USER" >/dev/null 2>&1; then
    log "creating user $TEST_USER"
    useradd -m -s /bin/bash "$TEST_USER" || die "useradd $TEST_USER failed"
fi
home=$(getent passwd "$TEST_USER" | cut -d: -f6)
[[ -d $home ]] || {
    log "creating home $home"
    install -d -m 0755 -o "$TEST_USER" -g "$TEST_USER" "$home"
}

# Prints the first id not used by any range in the FILEs, at least 100000
# and rounded up to a multiple of 65536, so that a new range overlaps no
# other (and the uid and gid ranges of the user start at the same id).
next_free_id() {
    awk -F: 'BEGIN { end = 100000 }
             NF >= 3 && $2 ~ /^[0-9]+$/ && $3 ~ /^[0-9]+$/ { e = $2 + $3; if (e > end) end = e }
             END { printf "%d\n", int((end + 65535) / 65536) * 65536 }' "$@"
}

# useradd normally adds a subordinate range; make sure there is one.
for file in /etc/subuid /etc/subgid; do
    [[ -e $file ]] || install -m 0644 /dev/null "$file"
done
for file in /etc/subuid /etc/subgid; do
    if ! grep -q "^${TEST_USER}:" "$file"; then
        start=$(next_free_id /etc/subuid /etc/subgid)
        log "adding ${TEST_USER}:${start}:65536 to $file"
        printf '%s:%s:65536\n' "$TEST_USER" "$start" >>"$file"
    fi
done

# --- host settings that sifbox needs (reported, not changed) -----------------
if [[ -r /proc/sys/kernel/unprivileged_userns_clone ]] &&
    [[ $(cat /proc/sys/kernel/unprivileged_userns_clone) == 0 ]]; then
    log "warning: kernel.unprivileged_userns_clone is 0: unprivileged sandboxes will fail (sysctl -w kernel.unprivileged_userns_clone=1)"
fi
if [[ -r /proc/sys/user/max_user_namespaces ]] &&
    [[ $(cat /proc/sys/user/max_user_namespaces) == 0 ]]; then
    log "warning: user.max_user_namespaces is 0: sandboxes will fail (sysctl -w user.max_user_namespaces=15000)"
fi

log "ok: packages present, user $TEST_USER ($(id -u "$TEST_USER")) with ranges $(grep "^${TEST_USER}:" /etc/subuid | head -n1 | cut -d: -f2-) (subuid), $(grep "^${TEST_USER}:" /etc/subgid | head -n1 | cut -d: -f2-) (subgid)"
