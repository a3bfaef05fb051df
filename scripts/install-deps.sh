#!/usr/bin/env bash
# Installs what sifbox needs, in two sets. Idempotent and fast when everything
# is already there. Needs root: re-executes itself with sudo when it can.
#
# Usage: scripts/install-deps.sh [run|test]
#   run  (the default; scripts/demo.sh): the Debian packages that running
#        sifbox and the demo need. Creates no user.
#   test (scripts/test.sh, scripts/bench*.sh): those, the peers and tools the
#        test suite and the benchmarks drive, and the unprivileged test user
#        `sbtest` with subordinate id ranges in /etc/subuid and /etc/subgid.
#
# It leaves no service enabled or running: packages are installed with a
# policy-rc.d that forbids starting services (unless the machine has its own),
# and every systemd unit a package installed here enables is disabled
# afterwards. The tests start the daemons they need themselves and stop them
# by pid. Packages that were already installed are not touched.
set -euo pipefail

readonly TEST_USER=sbtest
readonly SET=${1:-run}
# What `sifbox run`, `sifbox eval` and the demo need.
readonly RUN_PACKAGES=(
    uidmap          # newuidmap/newgidmap for --userns full
    e2fsprogs       # mkfs.ext4, for disk-backed writable layers (--disk, eval as root)
    ca-certificates # TLS to registries for `sifbox pull`
    mmdebstrap      # the demo's Debian base image (scripts/bootstrap-base.sh)
    busybox-static  # the demo's (and the tests') root filesystem
    python3         # the demo checks the rewards of the example tasks
    procps          # ps, which the demo compares with the sandbox's
    util-linux      # unshare, nsenter, runuser
)
# What only the test suite and the benchmarks need, on top of RUN_PACKAGES.
readonly TEST_PACKAGES=(
    bubblewrap      # the peer of the benchmark
    crun            # a peer to compare against
    buildah         # the peer of scripts/bench-build.sh
    hyperfine       # ad-hoc timing next to scripts/bench.py
    iproute2        # ip, to look at network namespaces
    passwd          # useradd, for the test user
    shellcheck      # lint of the scripts in scripts/test.sh
    siftool         # SIF interop tests (Debian's reference implementation)
    squashfs-tools  # mksquashfs/unsquashfs interop tests and benchmark
    umoci           # OCI image layouts for import tests
    skopeo          # OCI archives for import tests
    docker-registry # a local OCI registry for the pull tests (started by the tests)
    apache2-utils   # htpasswd, for the registry behind basic auth
    groff-base      # groff, to check that `sifbox man` renders
)

case $SET in
run) PACKAGES=("${RUN_PACKAGES[@]}") ;;
test) PACKAGES=("${RUN_PACKAGES[@]}" "${TEST_PACKAGES[@]}") ;;
*)
    printf "install-deps: error: unknown set %q: use 'run' (what sifbox and the demo need) or 'test' (also the tests, the benchmarks and the user %s)\n" "$SET" "$TEST_USER" >&2
    exit 125
    ;;
esac
readonly PACKAGES

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
    [[ $SET == run ]] && return 0
    id -u "$TEST_USER" >/dev/null 2>&1 &&
        [[ -d $(getent passwd "$TEST_USER" | cut -d: -f6) ]] &&
        grep -qs "^${TEST_USER}:" /etc/subuid &&
        grep -qs "^${TEST_USER}:" /etc/subgid
}

if [[ $(id -u) -ne 0 ]]; then
    if ((${#missing[@]} == 0)) && user_ready; then
        log "ok: all ${#PACKAGES[@]} packages of the set '$SET' present$([[ $SET == test ]] && echo ", user $TEST_USER ready") (nothing to do, so no root needed)"
        exit 0
    fi
    if command -v sudo >/dev/null 2>&1; then
        log "not root: re-running with sudo"
        exec sudo -- bash "$0" "$@"
    fi
    die "must run as root (it installs packages$([[ $SET == test ]] && echo " and creates the user '$TEST_USER'")), and sudo is not installed: run it as root"
fi

# --- packages -----------------------------------------------------------------
# enabled_units: the links that enable systemd units, one a line. Debian's
# maintainer scripts make them (deb-systemd-helper) whether or not systemd
# runs, so the links are what "enabled" means here.
enabled_units() {
    find /etc/systemd/system -mindepth 2 -maxdepth 2 -type l -path '*.wants/*' 2>/dev/null | LC_ALL=C sort
}

# no_new_services BEFORE: removes the links enabled since BEFORE (a file of
# enabled_units), which disables those units: deb-systemd-helper's state is
# kept, so a later upgrade of the package keeps them disabled, as after
# `systemctl disable`. Stops each such unit where systemd runs it.
no_new_services() {
    local link unit
    while read -r link; do
        unit=${link##*/}
        log "disabling $unit (enabled by the packages just installed; the tests start what they need themselves)"
        rm -f "$link"
        if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet "$unit" 2>/dev/null; then
            log "stopping $unit"
            systemctl stop "$unit" 2>/dev/null || log "warning: could not stop $unit"
        fi
    done < <(LC_ALL=C comm -13 "$1" <(enabled_units))
}

if ((${#missing[@]} == 0)); then
    log "packages: all ${#PACKAGES[@]} of the set '$SET' present"
else
    log "packages: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    # invoke-rc.d and deb-systemd-invoke ask policy-rc.d whether to start a
    # service; 101 says no. A machine's own policy-rc.d is left as it is.
    policy=/usr/sbin/policy-rc.d
    ours=false
    before=$(mktemp)
    enabled_units >"$before"
    if [[ ! -e $policy ]]; then
        # Gone however this script ends (an error, ^C), not only below.
        trap 'rm -f "$policy" "$before"' EXIT
        printf '#!/bin/sh\n# scripts/install-deps.sh: no service starts while it installs\nexit 101\n' >"$policy"
        chmod 0755 "$policy"
        ours=true
    fi
    rc=0
    { apt-get update -qq && apt-get install -y -qq --no-install-recommends \
        -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold \
        "${missing[@]}" </dev/null; } || rc=$?
    [[ $ours == false ]] || rm -f "$policy"
    ((rc == 0)) || die "apt-get install ${missing[*]} failed"
    no_new_services "$before"
    rm -f "$before"
fi

# --- loop devices, for disk-backed writable layers ---------------------------
if [[ ! -e /dev/loop-control ]]; then
    modprobe loop 2>/dev/null ||
        log "warning: no /dev/loop-control and \`modprobe loop\` failed: writable layers will be tmpfs only"
fi

# --- the unprivileged test user (set `test` only) -----------------------------
add_test_user() {
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
}
[[ $SET == run ]] || add_test_user

# --- host settings that sifbox needs (reported, not changed) -----------------
if [[ -r /proc/sys/kernel/unprivileged_userns_clone ]] &&
    [[ $(cat /proc/sys/kernel/unprivileged_userns_clone) == 0 ]]; then
    log "warning: kernel.unprivileged_userns_clone is 0: unprivileged sandboxes will fail (sysctl -w kernel.unprivileged_userns_clone=1)"
fi
if [[ -r /proc/sys/user/max_user_namespaces ]] &&
    [[ $(cat /proc/sys/user/max_user_namespaces) == 0 ]]; then
    log "warning: user.max_user_namespaces is 0: sandboxes will fail (sysctl -w user.max_user_namespaces=15000)"
fi

if [[ $SET == run ]]; then
    log "ok: the ${#PACKAGES[@]} packages of the set 'run' present"
    exit 0
fi
log "ok: packages present, user $TEST_USER ($(id -u "$TEST_USER")) with ranges $(grep "^${TEST_USER}:" /etc/subuid | head -n1 | cut -d: -f2-) (subuid), $(grep "^${TEST_USER}:" /etc/subgid | head -n1 | cut -d: -f2-) (subgid)"
