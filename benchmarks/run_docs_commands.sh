#!/usr/bin/env bash
# Runs the commands of docs/operator-guide.md and README's main job as a new user would type them, on a GPU
# machine, and records each one's output and status. Exit status: the number of failed steps (0 = all worked).
#
#   bash benchmarks/run_docs_commands.sh [PHASE ...]        (default: every phase, in this order)
#
# Phases and rough times on one H200 with the default llama-3.2-1b shape (engine starts dominate):
#   setup       pip install the project (KOG_BUILD_EXT=0 unless set), ~20 s
#   doctor      kog doctor, kog doctor --json, ~10 s
#   checkpoint  CKPT=$(kog make-checkpoint), kog make-checkpoint --list, ~1 min the first time
#   bench       kog bench (README main job: stock then kog, one table), ~4 min
#   serve       vllm serve --backend kog | --kog-options | --worker-cls | --backend stock, a completion and
#               kog stats after each, ~5 min
#               (the last one is the rollback phase, also runnable alone: rollback, ~1 min)
#   offline     python3 docs/examples/offline_kog.py "$CKPT", ~1.5 min
#   latency     vllm bench latency with --worker-cls (and stock for comparison), ~4 min
#   http        two servers and kog bench --url A/B, ~4 min
#   patch       kog patch-vllm --check/--apply, serve and bench latency with --execution-backend kog, --revert, ~4 min
#   render      benchmarks/render_performance.py on this run's bench.json, seconds
# One device command may run 10 minutes, so split it, for example:
#   bash benchmarks/run_docs_commands.sh setup doctor checkpoint bench
#   bash benchmarks/run_docs_commands.sh setup checkpoint serve offline
#   bash benchmarks/run_docs_commands.sh setup checkpoint latency http render
#   bash benchmarks/run_docs_commands.sh setup checkpoint patch
# (a fresh machine needs `setup` and `checkpoint` again; both are quick when already done).
#
# On the device machine: run from the repository root with `.device` carried; this script sources
# .device/env.sh when it exists. Outputs (at most 8 files, for the device's $OUT):
#   $OUT/docs-commands.log  every command and its output      $OUT/summary.txt  one line per step
#   $OUT/bench.json, bench.png (kog bench)   $OUT/http.json (A/B)   $OUT/latency-kog.json, latency-stock.json
# Environment: OUT (default ./docs-commands-out), KOG_DOCS_SHAPE (default llama-3.2-1b), KOG_COMMIT.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="${OUT:-$ROOT/docs-commands-out}"
WORK="${KOG_DOCS_WORK:-/tmp/kog-docs}"
SHAPE="${KOG_DOCS_SHAPE:-llama-3.2-1b}"
mkdir -p "$OUT" "$WORK/bin"
LOG="$OUT/docs-commands.log"
SUMMARY="$OUT/summary.txt"
FAILED=0

if [ -f .device/env.sh ] && [ "${KOG_DOCS_NO_DEVICE_ENV:-0}" != 1 ]; then
  # shellcheck disable=SC1091
  source .device/env.sh >>"$LOG" 2>&1 || { echo "sourcing .device/env.sh failed" | tee -a "$SUMMARY"; exit 1; }
fi
export PYTHONUNBUFFERED=1

# `kog` and `vllm` as a user has them; where the console scripts are not on PATH (the device machine has no
# `vllm` executable), the same commands through their modules.
command -v kog >/dev/null 2>&1 || { printf '#!/bin/sh\nexec python3 -m kog_backend.tools.cli "$@"\n' >"$WORK/bin/kog"; chmod +x "$WORK/bin/kog"; }
command -v vllm >/dev/null 2>&1 || { printf '#!/bin/sh\nexec python3 -m vllm.entrypoints.cli.main "$@"\n' >"$WORK/bin/vllm"; chmod +x "$WORK/bin/vllm"; }
export PATH="$WORK/bin:$PATH"

note() { echo "$*" | tee -a "$LOG"; }

# step NAME TIMEOUT_S COMMAND: runs COMMAND (a docs command, as written) in bash, logs it, records the status.
step() {
  local name=$1 limit=$2 cmd=$3 start rc
  note ""
  note "=== [$name] \$ $cmd"
  start=$(date +%s)
  timeout --kill-after=30 "$limit" bash -c "$cmd" >>"$LOG" 2>&1
  rc=$?
  local took=$(( $(date +%s) - start ))
  if [ "$rc" -eq 0 ]; then
    echo "PASS  $name  (${took} s)  $cmd" | tee -a "$SUMMARY" "$LOG"
  else
    FAILED=$((FAILED + 1))
    echo "FAIL  $name  rc=$rc (${took} s)  $cmd" | tee -a "$SUMMARY" "$LOG"
  fi
  return "$rc"
}

ckpt() {
  # CKPT=$(kog make-checkpoint) as in the guide; idempotent.
  CKPT=$(kog make-checkpoint --shape "$SHAPE" 2>>"$LOG") || return 1
  export CKPT
}

SERVER_PID=""
start_server() {  # start_server NAME PORT ARGS...: `vllm serve "$CKPT" ARGS` in the background, waits for /health
  local name=$1 port=$2; shift 2
  local logf="$WORK/${name//[^A-Za-z0-9._-]/_}.server.log"  # (names like "A/B stock server")
  note ""
  note "=== [$name] \$ vllm serve \"\$CKPT\" $*   (background, port $port)"
  vllm serve "$CKPT" --port "$port" "$@" >>"$logf" 2>&1 &
  SERVER_PID=$!
  local deadline=$(( $(date +%s) + 420 ))
  while [ "$(date +%s)" -lt "$deadline" ]; do
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then
      tail -40 "$logf" >>"$LOG"
      echo "FAIL  $name  server exited  vllm serve \"\$CKPT\" $*" | tee -a "$SUMMARY" "$LOG"
      FAILED=$((FAILED + 1)); SERVER_PID=""; return 1
    fi
    if python3 -c "import urllib.request,sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:$port/health', timeout=2).status != 200)" 2>/dev/null; then
      echo "PASS  $name  server up  vllm serve \"\$CKPT\" $*" | tee -a "$SUMMARY" "$LOG"
      return 0
    fi
    sleep 2
  done
  tail -40 "$logf" >>"$LOG"
  echo "FAIL  $name  not healthy after 420 s" | tee -a "$SUMMARY" "$LOG"
  FAILED=$((FAILED + 1)); stop_server; return 1
}

stop_server() {
  [ -n "$SERVER_PID" ] || return 0
  kill "$SERVER_PID" 2>/dev/null
  for _ in $(seq 60); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 1; done
  kill -9 "$SERVER_PID" 2>/dev/null
  wait "$SERVER_PID" 2>/dev/null
  grep -E "kog:|ERROR|Traceback" "$WORK"/*.server.log 2>/dev/null | tail -20 >>"$LOG"
  SERVER_PID=""
}
trap stop_server EXIT

# The completion request of the operator guide, then `kog stats`; for kog servers a check that steps ran on
# the kog path, and with `multi` that they generated several tokens each (checks, not docs commands).
exercise() {
  local name=$1 port=$2 expect_kog=$3
  step "$name: completion" 120 "curl -sf http://127.0.0.1:$port/v1/completions -H 'Content-Type: application/json' -d '{\"model\": \"$CKPT\", \"prompt\": \"Hello, my name is\", \"max_tokens\": 32}'"
  if [ "$expect_kog" = 0 ]; then  # a stock server runs no kog worker: kog stats finds no counters (exit status 1)
    step "$name: kog stats (no kog worker)" 30 "kog stats | tee /dev/stderr | grep -q 'no kog counters'"
  else
    step "$name: kog stats" 30 "kog stats"
    check_kog_steps "$name"
  fi
  if [ "$expect_kog" = multi ]; then
    check_multi "$name"
  fi
}

# Steps ran on the kog path (kog stats of the current KOG_STATE_DIR).
check_kog_steps() {
  step "$1: check kog steps > 0" 30 "kog stats --json | python3 -c 'import json,sys; d=json.load(sys.stdin); assert d and max(s[\"kog_steps\"] for s in d.values()) > 0, d'"
}

# The kog path generated several tokens per step (K > 1 took effect): kog tokens > kog steps.
check_multi() {
  step "$1: check kog tokens > kog steps (K > 1)" 30 "kog stats --json | python3 -c 'import json,sys; d=json.load(sys.stdin); assert d and max(s[\"kog_tokens\"] - s[\"kog_steps\"] for s in d.values()) > 0, d'"
}

phase_setup() {
  step setup 600 "KOG_BUILD_EXT=\${KOG_BUILD_EXT:-0} python3 -m pip install -q --no-deps --no-build-isolation -e ."
}

phase_doctor() {
  step "kog doctor" 120 "kog doctor"
  step "kog doctor --json" 120 "kog doctor --json --skip-p2p"
}

phase_checkpoint() {
  step "make-checkpoint --list" 60 "kog make-checkpoint --list"
  step "make-checkpoint" 900 "kog make-checkpoint --shape $SHAPE"
  ckpt
}

phase_bench() {
  ckpt || return
  step "kog bench (README main job)" 900 "kog bench --model $SHAPE --out $WORK/bench"
  cp -f "$WORK/bench/bench.json" "$WORK/bench/bench.png" "$OUT/" 2>/dev/null
}

phase_serve() {
  ckpt || return
  export KOG_STATE_DIR="$WORK/state-serve-kog"
  start_server "serve --backend kog" 8000 --backend kog && exercise "serve --backend kog" 8000 multi
  stop_server
  export KOG_STATE_DIR="$WORK/state-serve-kog-options"
  start_server "serve --kog-options" 8000 --backend kog --kog-options '{"tokens_per_step": 8}' && exercise "serve --kog-options" 8000 multi
  stop_server
  export KOG_STATE_DIR="$WORK/state-serve-worker-cls"
  start_server "serve --worker-cls" 8000 --worker-cls kog_backend.engine.worker.KogWorker --additional-config '{"kog": {"tokens_per_step": 8}}' \
    --scheduler-cls kog_backend.engine.scheduler.KogScheduler --no-async-scheduling \
    && exercise "serve --worker-cls" 8000 multi
  stop_server
  phase_rollback
}

phase_rollback() {
  ckpt || return
  export KOG_STATE_DIR="$WORK/state-serve-stock"
  start_server "serve --backend stock" 8000 --backend stock && exercise "serve --backend stock" 8000 0
  stop_server
  unset KOG_STATE_DIR
}

phase_offline() {
  ckpt || return
  step "offline example" 600 "python3 docs/examples/offline_kog.py \"\$CKPT\""
}

phase_latency() {
  ckpt || return
  export KOG_STATE_DIR="$WORK/state-latency"
  rm -rf "$KOG_STATE_DIR"
  step "vllm bench latency (kog)" 600 "vllm bench latency --model \"\$CKPT\" --batch-size 1 --input-len 32 --output-len 512 --num-iters-warmup 2 --num-iters 5 --worker-cls kog_backend.engine.worker.KogWorker --additional-config '{\"kog\": {}}' --scheduler-cls kog_backend.engine.scheduler.KogScheduler --no-async-scheduling --output-json $OUT/latency-kog.json"
  check_kog_steps "vllm bench latency (kog)"
  check_multi "vllm bench latency (kog)"
  unset KOG_STATE_DIR
  step "vllm bench latency (stock)" 600 "vllm bench latency --model \"\$CKPT\" --batch-size 1 --input-len 32 --output-len 512 --num-iters-warmup 2 --num-iters 5 --output-json $OUT/latency-stock.json"
}

phase_http() {
  ckpt || return
  local pid_a
  export KOG_STATE_DIR="$WORK/state-http"
  start_server "A/B stock server" 8000 --backend stock --gpu-memory-utilization 0.4 || return
  pid_a=$SERVER_PID
  if start_server "A/B kog server" 8001 --backend kog --gpu-memory-utilization 0.4; then
    step "kog bench --url A/B" 300 "kog bench --url http://127.0.0.1:8000 --url http://127.0.0.1:8001 --label stock --label kog --requests 5 --wait-ready 600 --out $WORK/http"
    cp -f "$WORK/http/http.json" "$OUT/" 2>/dev/null
    stop_server
  fi
  SERVER_PID=$pid_a
  stop_server
  unset KOG_STATE_DIR
}

phase_patch() {
  ckpt || return
  step "kog patch-vllm --check" 60 "kog patch-vllm --check"
  step "kog patch-vllm --apply" 120 "kog patch-vllm --apply" || return
  export KOG_STATE_DIR="$WORK/state-patch"
  start_server "serve --execution-backend kog" 8000 --execution-backend kog --additional-config '{"kog": {"tokens_per_step": 8}}' \
    --scheduler-cls kog_backend.engine.scheduler.KogScheduler --no-async-scheduling \
    && exercise "serve --execution-backend kog" 8000 multi
  stop_server
  rm -rf "$KOG_STATE_DIR"
  step "vllm bench latency --execution-backend kog" 600 "vllm bench latency --model \"\$CKPT\" --batch-size 1 --input-len 32 --output-len 512 --num-iters-warmup 2 --num-iters 5 --execution-backend kog"
  check_kog_steps "vllm bench latency --execution-backend kog"
  unset KOG_STATE_DIR
  step "kog patch-vllm --revert" 120 "kog patch-vllm --revert"
}

phase_render() {
  if [ -f "$WORK/bench/bench.json" ]; then
    step "render performance page" 60 "python3 benchmarks/render_performance.py $WORK/bench/bench.json --out $WORK/performance.md && cat $WORK/performance.md"
  else
    note "render: no bench.json from the bench phase on this machine; skipped"
  fi
}

PHASES=("$@")
[ ${#PHASES[@]} -gt 0 ] || PHASES=(setup doctor checkpoint bench serve offline latency http patch render)
note "run_docs_commands: phases ${PHASES[*]}; shape $SHAPE; $(date -u +%FT%TZ); $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"
for p in "${PHASES[@]}"; do
  if ! declare -F "phase_$p" >/dev/null; then
    echo "unknown phase $p" | tee -a "$SUMMARY"; FAILED=$((FAILED + 1)); continue
  fi
  "phase_$p"
done
note ""
note "=== summary ($FAILED failed)"
cat "$SUMMARY" >>"$LOG"
cat "$SUMMARY"
exit "$FAILED"
