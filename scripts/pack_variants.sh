#!/usr/bin/env bash
# Builds kernel variants for a kernel-only device call: this checkout's kog_backend/_C.abi3.so as `main`, and each
# BRANCH given (or NAME=BRANCH) built in a temporary worktree, each stripped of host debug sections and xz'd into
# .device/variants/NAME.so.xz (~5 MB each), the form benchmarks/ab_kernel_builds.sh reads. The kernel tests and
# bench_monokernel.py import no vLLM, so such a call carries `[".device/variants"]` alone
# (integration_tests/README.md, item 0).
# A branch whose host side differs from this checkout's (another argument table) travels as a tree instead:
# `tree:NAME=BRANCH` puts the branch's tracked files (benchmarks/results left out) with its `_C` and `_C_test`
# builds, stripped and xz'd, under .device/trees/NAME/ (~9 MB), the form ab_kernel_builds.sh's tree mode reads; on
# the device, `cd .device/trees/NAME && for f in kog_backend/*.so.xz; do xz -dc $f > ${f%.xz}; done` and
# PYTHONPATH=$PWD (the call then carries [".device/variants", ".device/trees"]).
# Builds run one after another (~3 min each on 2 cores; `_C` only, a tree's `_C_test` too).
#   bash scripts/pack_variants.sh shift=attn-row-shift pipe=attn-pipelined abort-fast tree:fp8half=fp8-half
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT_DIR="$ROOT/.device/variants"
export CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
[ -x "$ROOT/.venv/bin/python" ] || { echo "pack_variants: no .venv (run scripts/setup.sh)" >&2; exit 1; }
mkdir -p "$OUT_DIR"

pack() {  # NAME SO
  local tmp
  tmp="$(mktemp -d)"
  cp "$2" "$tmp/_C.abi3.so"
  strip --strip-debug "$tmp/_C.abi3.so"
  xz -9 -T0 -c "$tmp/_C.abi3.so" > "$OUT_DIR/$1.so.xz"
  rm -rf "$tmp"
  echo "packed $1 ($(( $(stat -c %s "$OUT_DIR/$1.so.xz") / 1048576 )) MiB)"
}

[ -f "$ROOT/kog_backend/_C.abi3.so" ] \
  || { echo "pack_variants: no kog_backend/_C.abi3.so (run scripts/setup.sh)" >&2; exit 1; }
pack main "$ROOT/kog_backend/_C.abi3.so"
# The test-only launchers (the SM-holding kernel of test_fault_gpu.py, the sampling tests), this checkout's: on the
# device, `xz -dc .device/variants/_C_test.so.xz > kog_backend/_C_test.abi3.so`.
[ -f "$ROOT/kog_backend/_C_test.abi3.so" ] && pack _C_test "$ROOT/kog_backend/_C_test.abi3.so"
for arg in "$@"; do
  tree=0
  case "$arg" in tree:*) tree=1 arg="${arg#tree:}" ;; esac
  name="${arg%%=*}" branch="${arg#*=}"
  [ "$name" = "$arg" ] && name="$branch"
  wt="$(mktemp -d)/$name"
  git -C "$ROOT" worktree add -q --detach "$wt" "$branch"
  ln -s "$ROOT/.venv" "$wt/.venv"
  (cd "$wt" && KOG_BUILD_TEST_EXT=$tree .venv/bin/python setup.py build_ext --inplace > build.log 2>&1) \
    || { tail -20 "$wt/build.log"; git -C "$ROOT" worktree remove --force "$wt"; exit 1; }
  if [ "$tree" = 1 ]; then
    dst="$ROOT/.device/trees/$name"
    rm -rf "$dst" && mkdir -p "$dst"
    git -C "$ROOT" archive "$branch" | tar -x -C "$dst"
    rm -rf "$dst/benchmarks/results"
    for so in _C _C_test; do
      cp "$wt/kog_backend/$so.abi3.so" "$dst/kog_backend/$so.abi3.so"
      strip --strip-debug "$dst/kog_backend/$so.abi3.so"
      xz -9 -T0 "$dst/kog_backend/$so.abi3.so"
    done
    echo "packed tree $name ($(( $(du -sb "$dst" | cut -f1) / 1048576 )) MiB)"
  else
    pack "$name" "$wt/kog_backend/_C.abi3.so"
  fi
  git -C "$ROOT" worktree remove --force "$wt"
done
echo "carry [\".device/variants\", \".device/trees\"]: $(( $(du -scb "$OUT_DIR" "$ROOT/.device/trees" 2>/dev/null | tail -1 | cut -f1) / 1048576 )) MiB of 64"
