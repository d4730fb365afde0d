#!/usr/bin/env bash
# One device call for an experiment tree (.device/trees/NAME, build_tree.sh) inside vLLM: the issue's benchmark
# (runbook call 5: LLM.generate, batch 1, 32-token prompt, 512 new tokens, random weights with the real shapes,
# stock and kog side by side) for SHAPES, then, if PYTEST_K is given, call 3's multi-token parity tests selected by
# it with the tree's kernel (KOG_TEST_IMPL=monokernel, KOG_TEST_SHAPE the first of SHAPES).
#   source .device/env.sh && [PYTEST_K="greedy_identical"] bash benchmarks/experiments/vllm_call.sh NAME "SHAPES"
# Carry: .device/env.sh, .device/vllm-0.26.0-h200.tar.xz, .device/vllm-0.26.0-h200-extra.tar.xz and
# .device/trees/NAME only (vLLM and every tree together exceed the carry limit). The tree's package is installed
# (editable, without building: its stripped .so is unpacked), so a later runbook call on the same machine
# reinstalls main's (run_on_device.sh's marker is removed). The bench records KOG_COMMIT (default "tree NAME": the
# device's checkout does not know which sources the tree holds).
set -u
name=$1
shapes=${2:-qwen3-1.7b}
OUT=${OUT:-/tmp/kog-exp}
mkdir -p "$OUT"
cd ".device/trees/$name" || exit 1
xz -dc kog_backend/_C.abi3.so.xz > kog_backend/_C.abi3.so
rm -f /tmp/.kog-installed
KOG_BUILD_EXT=0 python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/pip-$name.log" 2>&1 \
  || { tail -20 "$OUT/pip-$name.log"; exit 1; }
export PYTHONPATH=$PWD:${PYTHONPATH:-} KOG_TEST_CKPT_DIR=${KOG_TEST_CKPT_DIR:-/tmp/kog-test-ckpt} HF_HUB_OFFLINE=1
models=()
for s in ${shapes//,/ }; do models+=(--model "$s"); done
start=$SECONDS
python3 -m kog_backend.cli bench "${models[@]}" --kog-options '{"step_impl": "monokernel"}' \
  --out "$OUT/bench-$name" --no-chart --commit "${KOG_COMMIT:-tree $name}" > "$OUT/bench-$name.txt" 2>&1
echo "== bench $name: rc=$? $((SECONDS - start)) s"
left=$((560 - SECONDS))  # (the call's limit is 600 s)
if [ -n "${PYTEST_K:-}" ] && [ "$left" -gt 60 ]; then
  s=$SECONDS
  KOG_TEST_IMPL=monokernel KOG_TEST_SHAPE=${shapes%%,*} timeout "$left" python3 -m pytest -p no:cacheprovider \
    -q -x integration_tests/test_multi_token.py -k "$PYTEST_K" > "$OUT/multi-token-$name.txt" 2>&1
  echo "== multi-token $name (-k $PYTEST_K): rc=$? $((SECONDS - s)) s: $(tail -n 1 "$OUT/multi-token-$name.txt")"
elif [ -n "${PYTEST_K:-}" ]; then
  echo "== multi-token $name: not run, $left s left"
fi
tail -n 30 "$OUT/bench-$name.txt"
