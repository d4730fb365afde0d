#!/usr/bin/env bash
# Batched traffic, stock server against `--backend kog` server on the same card in one call: 2, 4, 8 and 32
# concurrent streaming requests x 512 new tokens, aggregate and per-request tok/s (kog_backend/tools/bench/
# concurrency.py). Servers run one at a time (the same GPU memory for each), CUDA graphs on (vLLM's defaults).
#   bash benchmarks/concurrency_ab.sh MODEL on    # stock vs kog (kog runs single-request steps; batches are stock)
#   bash benchmarks/concurrency_ab.sh MODEL off   # the same with --dtype float16, which kog refuses at start:
#                                                 # stock fp16 vs kog fp16 (kog turned off, stock scheduling)
# Bar (issue 37): kog >= 0.97 x stock at every concurrency, in both modes. Results under $OUT (default
# /tmp/kog-concurrency), the comparison table printed last.
set -u
model=$1; mode=${2:-on}
OUT=${OUT:-/tmp/kog-concurrency}; mkdir -p "$OUT"
export PYTHONPATH=$PWD:${PYTHONPATH:-}
extra=(--gpu-memory-utilization 0.85 --max-model-len 4096 --seed 0)
[ "$mode" = off ] && extra+=(--dtype float16)
port=8731
run_one() {  # label, server args...
  local label=$1; shift
  python3 -m vllm.entrypoints.cli.main serve "$model" --host 127.0.0.1 --port $port "$@" "${extra[@]}" \
    > "$OUT/server-$label.log" 2>&1 &
  local pid=$!
  python3 -m kog_backend.tools.bench.concurrency --url http://127.0.0.1:$port --label "$label" --wait-ready 300 \
    --concurrency 2 4 8 32 --new-tokens 512 --json "$OUT/$label.json"
  local rc=$?
  grep -E "Asynchronous scheduling|kog will not run|kog: (disabled|single-request)" "$OUT/server-$label.log" | head -5
  kill "$pid"; wait "$pid" 2>/dev/null
  return $rc
}
run_one "stock-$mode" --backend stock
run_one "kog-$mode" --backend kog
python3 -m kog_backend.tools.bench.concurrency --compare "$OUT/stock-$mode.json" "$OUT/kog-$mode.json"
