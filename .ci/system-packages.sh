#!/usr/bin/env sh
# The system packages `make test` needs, installed with apt-get when missing:
# Debian's chromium (browser tests, driven by Playwright through
# executable_path: nothing downloads a browser), clang and lld (the SIMD
# kernels' wasm build, checked against the committed kernels.wasm), node and
# npm (the bundle and `node --test`). Called by the Makefile; safe to rerun.
set -eu
need=""
for pkg in chromium clang lld; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need="$need $pkg"
done
command -v node >/dev/null 2>&1 || need="$need nodejs"
command -v npm >/dev/null 2>&1 || need="$need npm"
[ -z "$need" ] && exit 0
if ! command -v apt-get >/dev/null 2>&1; then
    echo "make test needs:$need (no apt-get here: install them with your package manager)" >&2
    exit 1
fi
sudo=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        sudo="sudo"
    else
        echo "make test needs:$need; run as root or install them: apt-get install$need" >&2
        exit 1
    fi
fi
echo "installing system packages:$need" >&2
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq $need
