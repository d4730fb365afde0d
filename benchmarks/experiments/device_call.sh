#!/usr/bin/env bash
# One device call for experiment builds made by build_tree.sh (.device/trees/NAME): the A/B of BUILDS on Qwen3-1.7B
# and Llama-3.2-1B at the contexts in $CTX (default 32,128,512; benchmarks/ab_kernel_builds.sh: forward, then
# reverse; $BENCH_EXTRA: more bench_monokernel.py arguments, default --tokens 32, set it empty for one-token steps
# only: a token of a 32-token launch, the mode vLLM runs, costs 30-60 us more than a one-token launch,
# benchmarks/NOTES.md, twenty-first session), then the kernel tests (integration_tests/test_monokernel_gpu.py)
# inside each tree of TESTS. Trees built before bench_monokernel.py had --tokens fail with an argument error.
#   source .device/env.sh && bash benchmarks/experiments/device_call.sh "BUILDS" "TESTS"
# Carry: .device/env.sh, .device/vllm-0.26.0-h200-extra.tar.xz (pytest), .device/trees (about 3 MiB per tree).
set -u
builds=$1
tests=${2:-}
OUT=${OUT:-/tmp/kog-exp}
mkdir -p "$OUT"
start=$SECONDS
OUT=$OUT/ab bash benchmarks/ab_kernel_builds.sh \
  "--no-variants --reps 20 --shapes qwen3-1.7b,llama-3.2-1b --ctx ${CTX:-32,128,512} ${BENCH_EXTRA---tokens 32}" $builds \
  > "$OUT/ab.txt" 2>&1
echo "== A/B: $((SECONDS - start)) s" | tee -a "$OUT/ab.txt"
for t in $tests; do
  s=$SECONDS
  (cd ".device/trees/$t" && xz -dc kog_backend/_C.abi3.so.xz > kog_backend/_C.abi3.so \
    && PYTHONPATH=$PWD:${PYTHONPATH:-} timeout 240 python3 -m pytest -q -x integration_tests/test_monokernel_gpu.py) \
    > "$OUT/tests-$t.txt" 2>&1
  echo "== tests $t: rc=$? $((SECONDS - s)) s: $(tail -n 1 "$OUT/tests-$t.txt")"
done
cat "$OUT/ab.txt"
# The run tool returns at most 8 files and the last 12,000 characters of output: the per-run files go into one
# archive, and the rows (build, shape, variant, ctx, us) are printed once more, compactly, last.
tar -cJf "$OUT/details.tar.xz" -C "$OUT" ab $(cd "$OUT" && ls tests-*.txt 2>/dev/null) && rm -rf "$OUT/ab" "$OUT"/tests-*.txt
echo "== rows (pass-build, shape, variant, ctx, us)"
awk '/^== [0-9]+ /{b=$2"-"$3; next} /^(qwen3|llama)/{printf "%-12s %s %s %s\n", b, substr($0,1,14), substr($0,15,22), substr($0,37,16)}' \
  "$OUT/ab.txt"
