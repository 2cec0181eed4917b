#!/usr/bin/env bash
# Copies into gpu-carry/ (ignored) the little the device-only build (-DSY_DEVICE_ONLY=ON,
# deploy/gpu-check.sh) takes from this machine, because the GPU machine's image has none of our
# Debian -dev packages and cannot download: PCRE2's header and its static 8-bit library (static,
# so the binaries need no libpcre2 at run time on another distribution). Nothing else: the GPU
# tests are plain programs (no Catch2, no nlohmann-json) and switchyard-bench has no CAF,
# ZeroMQ or msgpack. Together with deploy/gpu-model.sh split; docs/cuda-backend.md, "On a device".
#   gpu-carry/include/pcre2.h      (~47 KB)
#   gpu-carry/lib/libpcre2-8.a     (~0.8 MB, x86-64 ELF, PIE-compatible, needs only libc)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
header=/usr/include/pcre2.h
lib=$(ls /usr/lib/"$(uname -m)"-linux-gnu/libpcre2-8.a /usr/lib/libpcre2-8.a /usr/lib64/libpcre2-8.a 2>/dev/null | head -1 || true)
[ -s "$header" ] && [ -n "$lib" ] || {
  echo "gpu-carry: need $header and libpcre2-8.a (Debian: apt-get install libpcre2-dev)" >&2
  exit 1
}
mkdir -p gpu-carry/include gpu-carry/lib
cp "$header" gpu-carry/include/pcre2.h
cp "$lib" gpu-carry/lib/libpcre2-8.a
{
  echo "pcre2 $(dpkg-query -W -f='${Version}' libpcre2-dev 2>/dev/null || echo '?') from $lib, $(uname -m)"
} >gpu-carry/lib/MANIFEST
du -b gpu-carry/include/pcre2.h gpu-carry/lib/libpcre2-8.a gpu-carry/lib/MANIFEST
echo "gpu-carry: carry gpu-carry/include gpu-carry/lib (with the model halves: deploy/gpu-model.sh split)"
