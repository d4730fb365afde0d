#!/usr/bin/env bash
# Kernel builds A/B in one device call (the only comparison that holds: machines differ by a few percent). Builds
# whose executed code is the same still differ by up to ~9 us on Qwen3-1.7B through code generation alone (shifted
# and rescheduled builds of one source, docs/tuning.md), and builds that add never-run code have run up to 27-39 us
# slower, so a small build-against-build difference is not yet a design result;
# runtime variants of one build (bench_monokernel.py --set) are free of it.
#   bash benchmarks/ab_kernel_builds.sh "BENCH ARGS" NAME [NAME ...]
# Each NAME is an extension build at .device/variants/NAME.so.xz of this tree's sources (make one here with
# KOG_NVCC_FLAGS=... python setup.py build_ext --inplace, strip, xz), or, for a build of other sources (another
# branch: its argument table may differ, and the host refuses a mismatched extension), a tree at
# .device/trees/NAME/ (git archive BRANCH | tar -x -C ...) holding its build as kog_backend/_C.abi3.so.xz.
# The builds are timed in the order given, then again in reverse (drift shows as a difference between the two
# rounds), with benchmarks/bench_monokernel.py and BENCH ARGS (e.g. "--no-variants --reps 20 --ctx 32"); the
# tables are printed last. The default build is restored after.
set -u
OUT=${OUT:-/tmp/kog-ab}; mkdir -p "$OUT"
export PYTHONPATH=$PWD:${PYTHONPATH:-}
args=$1; shift
so=kog_backend/_C.abi3.so
[ -f "$so" ] && cp "$so" "$OUT/default.so"
names=("$@")
order=("${names[@]}"); for ((i=${#names[@]}-1; i>=0; i--)); do order+=("${names[i]}"); done
n=0
for v in "${order[@]}"; do
  n=$((n + 1))
  s=$SECONDS
  if [ -d ".device/trees/$v" ]; then
    ( cd ".device/trees/$v" && xz -dc kog_backend/_C.abi3.so.xz > kog_backend/_C.abi3.so \
      && PYTHONPATH=$PWD timeout 300 python3 benchmarks/bench_monokernel.py $args ) > "$OUT/$n-$v.txt" 2>&1
  else
    xz -dc ".device/variants/$v.so.xz" > "$so" || exit 1
    timeout 300 python3 benchmarks/bench_monokernel.py $args > "$OUT/$n-$v.txt" 2>&1
  fi
  echo "$n $v: rc=$? $((SECONDS - s)) s"
done
[ -f "$OUT/default.so" ] && cp "$OUT/default.so" "$so"
n=0
for v in "${order[@]}"; do
  n=$((n + 1))
  echo "== $n $v"; sed -n '/^copy bandwidth/,$p' "$OUT/$n-$v.txt"
done
