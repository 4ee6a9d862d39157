#!/bin/sh
# Builds static/kernels.wasm from kernels.c (the artifact is committed).
#
# Deterministic: no debug info, no symbol names and no producers section (it
# would name the compiler build), so a rebuild with the same clang gives the
# same bytes. Needs clang and wasm-ld with the wasm32 target (Debian: clang, lld).
# `build.sh --check` builds into a temporary file and fails when the committed
# kernels.wasm differs (CI).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
committed="$here/../static/kernels.wasm"
out=$committed
if [ "${1:-}" = "--check" ]; then
  out=$(mktemp -d)/kernels.wasm
fi
CC=${CC:-clang}
mkdir -p "$(dirname "$out")"
"$CC" --target=wasm32 -O3 -msimd128 -nostdlib -ffreestanding -fno-builtin-memset \
  -g0 -ffile-prefix-map="$here"=. \
  -Wall -Wextra -Werror \
  -Wl,--no-entry -Wl,--strip-all -Wl,-z,stack-size=65536 \
  -o "$out.tmp" "$here/kernels.c"
chmod 644 "$out.tmp"
mv "$out.tmp" "$out"
if [ "$out" != "$committed" ]; then
  if cmp -s "$out" "$committed"; then
    echo "client/web/static/kernels.wasm matches wasm/kernels.c"
    rm -f "$out"
    exit 0
  fi
  echo "client/web/static/kernels.wasm differs from a fresh build of wasm/kernels.c: run \`make web\` and commit" >&2
  rm -f "$out"
  exit 1
fi
echo "wrote $out ($(wc -c <"$out") bytes)"
