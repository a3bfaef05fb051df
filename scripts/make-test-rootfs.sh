#!/usr/bin/env bash
# Build the busybox root filesystem that sifbox's end-to-end tests run in.
#
# Usage: scripts/make-test-rootfs.sh [DEST]
#   DEST defaults to <repo>/target/test-rootfs; a relative DEST given here is
#   taken relative to the current directory.
#
# It builds crates/sifbox-probe as a fully static binary, then assembles a fresh
# tree (built beside DEST and renamed over it, so DEST is never half-made) with:
# a static /bin/busybox and its applet links, /usr/bin/sifbox-probe,
# /etc/passwd and /etc/group (root, user 1000, nobody 65534), /etc/hostname,
# /usr/bin/not-executable-test (mode 0644, for exit-code-126 tests) and the
# marker file /etc/sifbox-test-rootfs. Everything is world-readable so an
# unprivileged user can use the tree as an overlay lower layer.
#
# Needs: cargo, rustc, and busybox-static (Debian/Ubuntu package) for
# /bin/busybox (SIFBOX_BUSYBOX=PATH picks another static busybox). Prints DEST
# on success.
set -euo pipefail

die() {
    echo "make-test-rootfs: $*" >&2
    exit 1
}

if [[ $# -gt 1 || ${1:-} == -h || ${1:-} == --help ]]; then
    echo "usage: $0 [DEST]   (default: <repo>/target/test-rootfs)" >&2
    [[ $# -gt 1 ]] && exit 2
    exit 0
fi

script_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$script_dir/.." && pwd)
dest=${1:-$repo/target/test-rootfs}
# A DEST given on the command line is relative to the current directory.
[[ $dest == /* ]] || dest="$PWD/$dest"
dest=${dest%/}
[[ -n $dest && $dest != / ]] || die "refusing to use '/' as DEST"

MARKER="sifbox-test-rootfs v1"

# is_static FILE: succeed when FILE is a static executable, fail when it is
# dynamic; when no tool can tell, warn and succeed.
is_static() {
    local f=$1 out
    if command -v readelf >/dev/null 2>&1; then
        # A static-pie still has a .dynamic section but no interpreter and
        # no NEEDED libraries.
        out=$(readelf -lW -d "$f" 2>/dev/null) || return 1
        if grep -q 'INTERP' <<<"$out" || grep -q '(NEEDED)' <<<"$out"; then
            return 1
        fi
        return 0
    fi
    if command -v ldd >/dev/null 2>&1; then
        out=$(ldd "$f" 2>&1 || true)
        if grep -qE 'not a dynamic executable|statically linked' <<<"$out"; then
            return 0
        fi
        return 1
    fi
    echo "make-test-rootfs: warning: neither readelf nor ldd found; not checking that $f is static" >&2
    return 0
}

# --- 1. the probe, fully static ---------------------------------------------
command -v cargo >/dev/null 2>&1 || die "cargo not found"
host=$(rustc -vV | sed -n 's/^host: //p')
[[ -n $host ]] || die "cannot find the host triple from 'rustc -vV'"
probe_target="$repo/target/probe"
(
    cd "$repo"
    CARGO_TARGET_DIR="$probe_target" RUSTFLAGS="-C target-feature=+crt-static" \
        cargo build --release -p sifbox-probe --target "$host"
)
probe="$probe_target/$host/release/sifbox-probe"
[[ -x $probe ]] || die "probe binary not found at $probe"
is_static "$probe" || die "$probe is not statically linked"

# --- 2. busybox --------------------------------------------------------------
busybox=${SIFBOX_BUSYBOX:-/bin/busybox}
[[ -x $busybox ]] || die "$busybox not found: install the busybox-static package (apt-get install busybox-static)"
is_static "$busybox" ||
    die "$busybox is dynamically linked: install the busybox-static package (it replaces busybox)"
applets=$("$busybox" --list) || die "'$busybox --list' failed"
[[ -n $applets ]] || die "'$busybox --list' printed no applets"

# --- 3. assemble the tree beside DEST ----------------------------------------
mkdir -p "$(dirname "$dest")"
tmp="$dest.tmp.$$"
old="$dest.old.$$"
cleanup() {
    rm -rf -- "$tmp" "$old"
}
trap cleanup EXIT
rm -rf -- "$tmp"
mkdir -- "$tmp"

for d in bin sbin usr/bin usr/sbin etc root tmp proc sys dev home home/user var/tmp; do
    mkdir -p -- "$tmp/$d"
done

cp -- "$busybox" "$tmp/bin/busybox"
while IFS= read -r applet; do
    [[ -n $applet && $applet != */* ]] || continue
    [[ -e $tmp/bin/$applet || -L $tmp/bin/$applet ]] && continue
    ln -s busybox "$tmp/bin/$applet"
done <<<"$applets"
# These must exist whatever this busybox's applet list says.
[[ -L $tmp/bin/sh ]] || ln -sf busybox "$tmp/bin/sh"
ln -sf ../../bin/busybox "$tmp/usr/bin/env"

cp -- "$probe" "$tmp/usr/bin/sifbox-probe"

cat >"$tmp/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/bin/sh
user:x:1000:1000:user:/home/user:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
EOF
cat >"$tmp/etc/group" <<'EOF'
root:x:0:
user:x:1000:
nogroup:x:65534:
EOF
echo sifbox-test >"$tmp/etc/hostname"
echo "$MARKER" >"$tmp/etc/sifbox-test-rootfs"

cat >"$tmp/usr/bin/not-executable-test" <<'EOF'
#!/bin/sh
# Deliberately mode 0644: running it must fail with exit code 126.
echo "this should never run"
EOF

# --- 4. permissions ----------------------------------------------------------
# Directories 0755, files 0644, executables 0755 (symlinks are left alone).
find "$tmp" -type d -exec chmod 0755 {} +
find "$tmp" -type f -exec chmod 0644 {} +
chmod 0755 "$tmp/bin/busybox" "$tmp/usr/bin/sifbox-probe"
chmod 0644 "$tmp/usr/bin/not-executable-test"
# /tmp and /var/tmp are sticky and world-writable as on any system; in a
# sandbox they live on the sandbox's upper layer or a tmpfs anyway.
chmod 1777 "$tmp/tmp" "$tmp/var/tmp"

# --- 5. swap into place ------------------------------------------------------
if [[ -e $dest || -L $dest ]]; then
    mv -- "$dest" "$old"
fi
mv -- "$tmp" "$dest"
rm -rf -- "$old"
trap - EXIT

echo "$dest"
