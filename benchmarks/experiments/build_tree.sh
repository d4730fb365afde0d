#!/usr/bin/env bash
# Builds an experiment for the device: this checkout's committed sources (HEAD) with the given patches of
# benchmarks/experiments/ applied in order, compiled with KOG_NVCC_FLAGS, packed as .device/trees/NAME/ (sources +
# kog_backend/_C.abi3.so.xz: the layout benchmarks/ab_kernel_builds.sh times and the kernel tests run in).
#   bash benchmarks/experiments/build_tree.sh NAME "PATCH ..." "NVCC FLAGS"
# e.g. build_tree.sh pt-o "pass-template.patch tagged-stages.patch" "-DKOG_EXP_TAGGED_O" (build_all.sh makes every
# tree the README's device calls use). About 2 minutes on two cores; prints ptxas's spill lines per kernel (a build
# that spills is not the design it was meant to measure).
set -euo pipefail
name=$1
patches=${2:-}
flags=${3:-}
root=$(git rev-parse --show-toplevel)
cd "$root"
py=${KOG_PYTHON:-$root/.venv/bin/python}
work=$(mktemp -d "/tmp/kog-tree-$name-XXXX")
git archive HEAD | tar -x -C "$work"
for p in $patches; do
  (cd "$work" && git apply "$root/benchmarks/experiments/$p")
done
if ! (cd "$work" && CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} KOG_NVCC_FLAGS="$flags" KOG_PTXAS_VERBOSE=1 \
      "$py" setup.py build_ext --inplace > build.log 2>&1); then
  tail -40 "$work/build.log"
  exit 1
fi
echo "== $name: ptxas spill lines (count, line)"
grep -E "spill stores" "$work/build.log" | sort | uniq -c
strip "$work/kog_backend/_C.abi3.so"
dest=.device/trees/$name
rm -rf "$dest"
mkdir -p "$dest"
(cd "$work" && tar -c --exclude='*.so' --exclude='__pycache__' kog_backend benchmarks/*.py benchmarks/*.sh \
  integration_tests pyproject.toml setup.py) | tar -x -C "$dest"
xz -T2 -c "$work/kog_backend/_C.abi3.so" > "$dest/kog_backend/_C.abi3.so.xz"
rm -rf "$work"
echo "== $name: $(du -sh "$dest" | cut -f1) in $dest"
