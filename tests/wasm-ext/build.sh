#!/usr/bin/env bash
# The wheels tests/eryx_envs.rs uploads to test WebAssembly extension modules, built
# from ext.c with Debian's clang and wasm-ld (`make test-wasm-ext` installs them):
#   isobox_wasmext-1.0-cp314-cp314-wasi_0_0_0_wasm32.whl
#       isobox_wasmext.cpython-314-wasm32-wasi.so   (a top-level extension module)
#       wasmpkg/__init__.py, wasmpkg/_speed.abi3.so (one inside a package)
#   oldabi-1.0-cp313-cp313-wasi_0_0_0_wasm32.whl    (built for CPython 3.13: refused)
#   noinit-1.0-cp314-cp314-wasi_0_0_0_wasm32.whl    (a shared library without
#                                                    PyInit_noinit: no Python module)
#   broken-1.0-cp314-cp314-wasi_0_0_0_wasm32.whl    (WebAssembly cut short)
#   ownmem-1.0-cp314-cp314-wasi_0_0_0_wasm32.whl    (a library with a memory of its
#                                                    own, beyond a run's memory cap)
#   clash-1.0-cp314-cp314-wasi_0_0_0_wasm32.whl     (exports PyLong_FromLong with
#                                                    another signature than CPython's)
#   platlib-1.0-cp314-cp314-wasi_0_0_0_wasm32.whl   (an extension module under the
#                                                    wheel's .data/platlib)
#   many256-1.0-…, many257-1.0-…                    (256 and 257 extension modules:
#                                                    at and over the bound)
# Usage: build.sh OUT_DIR
set -euo pipefail
out="${1:?usage: build.sh OUT_DIR}"
here="$(cd "$(dirname "$0")" && pwd)"
cc="${WASM_CC:-clang-19}"
ld="${WASM_LD:-wasm-ld-19}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# A shared library as wasi-sdk makes one (position-independent, the `dylink.0`
# section, CPython's symbols left to the dynamic linker), without libc: the module
# calls only CPython.
lib() { # MODULE OUTPUT [SOURCE]
    "$cc" --target=wasm32-wasi -fPIC -O2 -nostdlib -Wall -Werror -DMODULE="$1" \
        -c "${3:-$here/ext.c}" -o "$tmp/$1.o"
    "$ld" --experimental-pic -shared --unresolved-symbols=import-dynamic \
        -o "$2" "$tmp/$1.o"
}

mkdir -p "$tmp/w1/wasmpkg" "$tmp/w2" "$tmp/w3" "$tmp/w4" "$tmp/w5" "$tmp/w6"
lib isobox_wasmext "$tmp/w1/isobox_wasmext.cpython-314-wasm32-wasi.so"
lib _speed "$tmp/w1/wasmpkg/_speed.abi3.so"
printf 'from ._speed import add, fnv1a, compiled_for\n' > "$tmp/w1/wasmpkg/__init__.py"
lib oldabi "$tmp/w2/oldabi.cpython-313-wasm32-wasi.so"
printf '__attribute__((visibility("default"))) int answer(void) { return 42; }\n' > "$tmp/noinit.c"
lib noinit "$tmp/w3/noinit.cpython-314-wasm32-wasi.so" "$tmp/noinit.c"
# WebAssembly whose first section is cut short.
printf '\0asm\1\0\0\0\1\377\377' > "$tmp/w4/broken.cpython-314-wasm32-wasi.so"
# A module with an empty dylink.0 section and a memory section: one memory of a page.
printf '\0asm\1\0\0\0\0\11\10dylink.0\5\3\1\0\1' > "$tmp/w5/ownmem.cpython-314-wasm32-wasi.so"
printf '__attribute__((visibility("default"))) int PyLong_FromLong(void) { return 1; }\n' > "$tmp/clash.c"
lib clash "$tmp/w6/clash.cpython-314-wasm32-wasi.so" "$tmp/clash.c"
mkdir -p "$tmp/w7/platlib-1.0.data/platlib" "$tmp/w8" "$tmp/w9"
lib platmod "$tmp/w7/platlib-1.0.data/platlib/platmod.cpython-314-wasm32-wasi.so"
for i in $(seq -w 0 255); do
    cp "$tmp/w3/noinit.cpython-314-wasm32-wasi.so" "$tmp/w8/m$i.cpython-314-wasm32-wasi.so"
done
cp "$tmp"/w8/*.so "$tmp/w9/"
cp "$tmp/w3/noinit.cpython-314-wasm32-wasi.so" "$tmp/w9/m256.cpython-314-wasm32-wasi.so"

# A wheel: the files, then NAME-1.0.dist-info with METADATA, WHEEL and RECORD.
wheel() { # DIR NAME TAG
    python3 - "$1" "$2" "$3" "$out" <<'PY'
import base64, hashlib, os, sys, zipfile
src, name, tag, out = sys.argv[1:]
info = f"{name}-1.0.dist-info"
files = {}
for root, _, names in os.walk(src):
    for n in sorted(names):
        p = os.path.join(root, n)
        files[os.path.relpath(p, src)] = open(p, "rb").read()
files[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n".encode()
files[f"{info}/WHEEL"] = f"Wheel-Version: 1.0\nGenerator: isobox tests\nRoot-Is-Purelib: false\nTag: {tag}\n".encode()
record = ""
for p, b in sorted(files.items()):
    h = base64.urlsafe_b64encode(hashlib.sha256(b).digest()).rstrip(b"=").decode()
    record += f"{p},sha256={h},{len(b)}\n"
files[f"{info}/RECORD"] = (record + f"{info}/RECORD,,\n").encode()
with zipfile.ZipFile(os.path.join(out, f"{name}-1.0-{tag}.whl"), "w", zipfile.ZIP_DEFLATED) as z:
    for p, b in sorted(files.items()):
        zi = zipfile.ZipInfo(p, (2026, 1, 1, 0, 0, 0))
        zi.external_attr = 0o644 << 16
        z.writestr(zi, b, zipfile.ZIP_DEFLATED)
PY
}
mkdir -p "$out"
wheel "$tmp/w1" isobox_wasmext cp314-cp314-wasi_0_0_0_wasm32
wheel "$tmp/w2" oldabi cp313-cp313-wasi_0_0_0_wasm32
wheel "$tmp/w3" noinit cp314-cp314-wasi_0_0_0_wasm32
wheel "$tmp/w4" broken cp314-cp314-wasi_0_0_0_wasm32
wheel "$tmp/w5" ownmem cp314-cp314-wasi_0_0_0_wasm32
wheel "$tmp/w6" clash cp314-cp314-wasi_0_0_0_wasm32
wheel "$tmp/w7" platlib cp314-cp314-wasi_0_0_0_wasm32
wheel "$tmp/w8" many256 cp314-cp314-wasi_0_0_0_wasm32
wheel "$tmp/w9" many257 cp314-cp314-wasi_0_0_0_wasm32
