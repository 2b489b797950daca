#!/usr/bin/env bash
# Build (once) a free-threaded CPython from Debian's source package and a venv with Zephon in it.
#
# Usage:  bash scripts/freethreaded.sh            # build if missing, print the venv's python path
#         ZEPHON_FT_HOME=/some/dir bash scripts/freethreaded.sh
#
# Everything lives outside the checkout, in $ZEPHON_FT_HOME (default ~/.cache/zephon-ft):
#   src/         the Debian source package (python3.14 if the mirror has it, else python3.13)
#   python3.Nt/  the interpreter, built with ./configure --disable-gil (6-10 min on 2 cores)
#   venv/        pip 26.x, numpy<=2.4.x and pyarrow<=24.x (cp313t wheels; newer ones compile), pillow, pytest,
#                hypothesis, zstandard (builds from source, ~40 s), pyyaml, tqdm, psutil, torch 2.12
#                (ZEPHON_FT_TORCH=0 skips it: several GB of CUDA wheels the core does not need),
#                and Zephon itself with --no-deps (tokenizers/simplejpeg have no cp313t wheels:
#                Zephon falls back to a byte-level tokenizer and PIL).
# A second run with everything in place only prints the path. Needs the build deps of CPython
# (gcc, make, libssl-dev, zlib1g-dev, liblzma-dev, libbz2-dev, libsqlite3-dev, libffi-dev).
set -euo pipefail

HOME_DIR="${ZEPHON_FT_HOME:-$HOME/.cache/zephon-ft}"
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MIRROR="${ZEPHON_FT_MIRROR:-http://deb.debian.org/debian}"
SUITE="${ZEPHON_FT_SUITE:-trixie}"
JOBS="${ZEPHON_FT_JOBS:-$(nproc)}"
mkdir -p "$HOME_DIR"
log() { echo "[freethreaded] $*" >&2; }

# --- 1. the source package, through a private apt configuration (the system's sources are untouched)
fetch_source() {
    local apt="$HOME_DIR/apt"
    mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial"
    echo "deb-src $MIRROR $SUITE main" > "$apt/sources.list"
    local opts=(-o "Dir::Etc::SourceList=$apt/sources.list" -o "Dir::Etc::SourceParts=/dev/null"
                -o "Dir::State::Lists=$apt/lists" -o "Dir::Cache=$apt/cache" -o "APT::Get::Only-Source=true")
    apt-get "${opts[@]}" update >&2
    mkdir -p "$HOME_DIR/src"
    for pkg in python3.14 python3.13; do
        if (cd "$HOME_DIR/src" && apt-get "${opts[@]}" source --download-only "$pkg" >&2); then
            echo "$pkg"; return 0
        fi
        log "$pkg: source package not available from $MIRROR $SUITE; trying the next one"
    done
    log "no python3.14 or python3.13 source package found in $MIRROR $SUITE"; return 1
}

existing=""
for v in 3.14 3.13; do
    if [ -x "$HOME_DIR/python${v}t/bin/python${v}t" ]; then existing="$v"; break; fi
done

if [ -z "$existing" ]; then
    build="$(ls -d "$HOME_DIR"/build-3.1* 2>/dev/null | head -1 || true)"
    if [ -n "$build" ] && [ -f "$build/config.status" ] && grep -q -- "--disable-gil" "$build/config.status"; then
        ver="${build##*build-}"
        log "resuming the configured build in $build"
        cd "$build"
    else
        pkg="$(fetch_source)"
        ver="${pkg#python}"
        orig="$(ls "$HOME_DIR/src/${pkg}_"*.orig.tar.* | head -1)"
        build="$HOME_DIR/build-$ver"
        rm -rf "$build"; mkdir -p "$build"
        log "unpacking $orig"
        tar -xf "$orig" -C "$build" --strip-components=1
        cd "$build"
        log "configure --disable-gil (prefix $HOME_DIR/python${ver}t)"
        ./configure --disable-gil --prefix="$HOME_DIR/python${ver}t" --with-ensurepip=install \
            >"$HOME_DIR/configure.log" 2>&1
    fi
    log "make -j$JOBS (log: $HOME_DIR/make.log)"
    make -j"$JOBS" >"$HOME_DIR/make.log" 2>&1
    make install >"$HOME_DIR/install.log" 2>&1
    existing="$ver"
fi

PY="$HOME_DIR/python${existing}t/bin/python${existing}t"
"$PY" -c "import sys, ssl, zlib, lzma, bz2, sqlite3, ctypes; assert not sys._is_gil_enabled(), 'GIL is on'"

VENV="$HOME_DIR/venv"
if [ ! -f "$VENV/.zephon-ready" ]; then
    [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
    VP="$VENV/bin/python"
    "$VP" -m pip install -q --upgrade 'pip>=26' >&2
    "$VP" -m pip install -q --prefer-binary 'numpy<=2.4.99' pillow 'pyarrow<=24.99' pytest hypothesis \
        zstandard pyyaml tqdm psutil >&2
    "$VP" -m pip install -q --no-deps -e "$REPO" >&2
    # torch: a cp313t wheel with its CUDA libraries (a few GB from PyPI); Zephon's core does not need it.
    if [ "${ZEPHON_FT_TORCH:-1}" = 1 ]; then
        "$VP" -m pip install -q 'torch==2.12.*' >&2 || log "warning: torch 2.12 did not install (the core runs without it)"
    fi
    touch "$VENV/.zephon-ready"
fi
VP="$VENV/bin/python"
"$VP" -c "import sys, zephon, zephon.ops.vision, zephon.engine, numpy, PIL.Image; assert not sys._is_gil_enabled(), 'GIL re-enabled by an import'" \
    || log "warning: importing zephon re-enabled the GIL (or failed); see above"
echo "$VP"
