#!/usr/bin/env bash
# Packs the built extensions for a device call. A call carries 64 MiB at most (tracked files included) and vLLM's
# bundle in .device/ takes ~54 of them, so kog_backend/_C.abi3.so (~14 MB) and _C_test.abi3.so (~4 MB) travel as one
# xz archive of copies without host debug sections (~5 MB; the device code and its line info stay):
# .device/kog-ext.tar.xz. On the device, `tar xJf .device/kog-ext.tar.xz` puts them back in kog_backend/.
# Prints what carry [".device"] then weighs against the limit.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
[ -d "$ROOT/.device" ] || { echo "pack_extension: no .device/ (run ../shared/device/stage first)" >&2; exit 1; }
[ -f "$ROOT/kog_backend/_C.abi3.so" ] || { echo "pack_extension: no kog_backend/_C.abi3.so (run scripts/setup.sh)" >&2; exit 1; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/kog_backend"
for so in _C.abi3.so _C_test.abi3.so; do
  if [ -f "$ROOT/kog_backend/$so" ]; then
    cp "$ROOT/kog_backend/$so" "$tmp/kog_backend/$so"
    strip --strip-debug "$tmp/kog_backend/$so"
  fi
done
tar -cf - -C "$tmp" kog_backend | xz -9 -T0 > "$ROOT/.device/kog-ext.tar.xz"
tracked=$(git -C "$ROOT" ls-files -z | (cd "$ROOT" && xargs -0 du -cb) | tail -1 | cut -f1)
device=$(du -sb "$ROOT/.device" | cut -f1)
echo "packed $(ls "$tmp/kog_backend" | tr '\n' ' ')into .device/kog-ext.tar.xz ($(( $(stat -c %s "$ROOT/.device/kog-ext.tar.xz") / 1048576 )) MiB);" \
     "carry [\".device\"] weighs $(( (tracked + device) / 1048576 )) MiB of 64 with the tracked files"
