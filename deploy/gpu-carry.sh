#!/usr/bin/env bash
# Copies into gpu-carry/ (ignored) the little the device-only build (-DSY_DEVICE_ONLY=ON,
# deploy/gpu-check.sh) takes from this machine, because the GPU machine's image has none of our
# Debian -dev packages and cannot download: PCRE2's header and its static 8-bit library (static,
# so the binaries need no libpcre2 at run time on another distribution), and the nlohmann-json
# headers (header-only: bench-engine's --json report). Nothing else: the GPU tests are plain
# programs (no Catch2) and switchyard-bench has no CAF, ZeroMQ or msgpack. Together with
# deploy/gpu-model.sh split; docs/cuda-backend.md, "On a device".
#   gpu-carry/include/pcre2.h      (~47 KB)
#   gpu-carry/include/nlohmann/    (~1 MB of headers)
#   gpu-carry/lib/libpcre2-8.a     (~0.8 MB, x86-64 ELF, PIE-compatible, needs only libc)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
header=/usr/include/pcre2.h
lib=$(ls /usr/lib/"$(uname -m)"-linux-gnu/libpcre2-8.a /usr/lib/libpcre2-8.a /usr/lib64/libpcre2-8.a 2>/dev/null | head -1 || true)
json_dir=/usr/include/nlohmann
[ -s "$header" ] && [ -n "$lib" ] && [ -s "$json_dir/json.hpp" ] || {
  echo "gpu-carry: need $header, libpcre2-8.a and $json_dir (Debian: apt-get install libpcre2-dev nlohmann-json3-dev)" >&2
  exit 1
}
mkdir -p gpu-carry/include gpu-carry/lib
cp "$header" gpu-carry/include/pcre2.h
rm -rf gpu-carry/include/nlohmann
cp -r "$json_dir" gpu-carry/include/nlohmann
cp "$lib" gpu-carry/lib/libpcre2-8.a
{
  echo "pcre2 $(dpkg-query -W -f='${Version}' libpcre2-dev 2>/dev/null || echo '?') from $lib, $(uname -m)"
} >gpu-carry/lib/MANIFEST
du -sb gpu-carry/include/pcre2.h gpu-carry/include/nlohmann gpu-carry/lib/libpcre2-8.a gpu-carry/lib/MANIFEST
echo "gpu-carry: carry gpu-carry/include gpu-carry/lib (with the model halves: deploy/gpu-model.sh split)"
