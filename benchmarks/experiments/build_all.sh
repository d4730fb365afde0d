#!/usr/bin/env bash
# Builds every tree the README's device calls use (build_tree.sh, one after another: ~2 minutes each on two
# cores), then lists them. Start it first thing in a session that may get a device whose checkout has no trees yet
# (`.device/` is git-ignored; it survives only where the checkout does).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
b=benchmarks/experiments/build_tree.sh
bash $b main "" ""
bash $b pt "pass-template.patch" ""
bash $b pt-o "pass-template.patch tagged-stages.patch" "-DKOG_EXP_TAGGED_O"
bash $b pt-ogu "pass-template.patch tagged-stages.patch" "-DKOG_EXP_TAGGED_O -DKOG_EXP_TAGGED_GU"
bash $b pt-ogud "pass-template.patch tagged-stages.patch" "-DKOG_EXP_TAGGED_O -DKOG_EXP_TAGGED_GU -DKOG_EXP_TAGGED_DOWN"
bash $b fm "pass-template.patch fused-mlp.patch" "-DKOG_EXP_FUSED_MLP"
bash $b fmo "pass-template.patch fused-mlp.patch" "-DKOG_EXP_FUSED_MLP -DKOG_EXP_FUSED_O"
bash $b fmoc "pass-template.patch fused-mlp.patch" "-DKOG_EXP_FUSED_MLP -DKOG_EXP_FUSED_O -DKOG_EXP_FUSED_COMBINE"
bash $b mma "mma-gemv.patch" ""
bash $b nomath "" "-DKOG_BENCH_NO_MATH"
bash $b stream "stream-tokens.patch" ""
bash $b p1024 "icache-probe.patch" "-DKOG_BENCH_ICACHE_PROBE=1024"
bash $b p1024loop "icache-probe.patch" "-DKOG_BENCH_ICACHE_PROBE=1024 -DKOG_BENCH_ICACHE_LOOP"
du -sh .device/trees/*
