# shellcheck shell=bash
# Shared by the scripts in this directory: source it, don't run it.

# Puts cargo on PATH: the caller's, else the usual rustup location of this
# user or, under sudo, of the user who called sudo. $1 names the caller in
# the error message.
find_cargo() {
    command -v cargo >/dev/null 2>&1 && return 0
    local home
    for home in "${CARGO_HOME:-}" "$HOME/.cargo" \
        "${SUDO_USER:+$(getent passwd "$SUDO_USER" | cut -d: -f6)/.cargo}"; do
        if [[ -n $home && -x $home/bin/cargo ]]; then
            PATH="$home/bin:$PATH"
            if [[ -z ${RUSTUP_HOME:-} && ! -d $HOME/.rustup && -d ${home%/.cargo}/.rustup ]]; then
                export RUSTUP_HOME=${home%/.cargo}/.rustup
            fi
            return 0
        fi
    done
    echo "$1: error: cargo not found on PATH or in ~/.cargo/bin: install a Rust toolchain (1.91 or newer, e.g. with rustup)" >&2
    exit 1
}

# Prints the directory where cargo puts the binaries of profile $1 (release
# or debug) of the repository at $2: .cargo/config.toml names the host's own
# triple as the build target, so they go to target/<triple>/<profile>.
cargo_out_dir() {
    local host
    host=$(rustc -vV | sed -n 's/^host: //p')
    [[ -n $host ]] || {
        echo "cargo_out_dir: cannot read the host triple from 'rustc -vV'" >&2
        return 1
    }
    echo "${CARGO_TARGET_DIR:-$2/target}/$host/$1"
}
