#!/usr/bin/env bash
# Builds every tree of builds.txt (the README's device calls use them; build_tree.sh, one after another: ~2 minutes
# each on two cores), then lists them. Start it first thing in a session that may get a device whose checkout has no
# trees yet (`.device/` is git-ignored; it survives only where the checkout does).
set -euo pipefail
set -f  # (the fields of builds.txt are split unquoted)
cd "$(git rev-parse --show-toplevel)"
while IFS='|' read -r name patches flags; do
  name=$(echo $name)
  case "$name" in '' | '#'*) continue ;; esac
  bash benchmarks/experiments/build_tree.sh "$name" "$(echo $patches)" "$(echo $flags)" < /dev/null
done < benchmarks/experiments/builds.txt
set +f
du -sh .device/trees/*
