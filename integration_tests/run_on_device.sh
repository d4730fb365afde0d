#!/usr/bin/env bash
# Runs GPU integration tests on the H200 device, from the repo root, with .device carried:
#   source .device/env.sh && bash integration_tests/run_on_device.sh [pytest args...]
# Installs the project without building (the extension .so, if any, is carried), writes logs under $OUT and
# prints pytest's summary last.
set -uo pipefail
OUT="${OUT:-/tmp/kog-out}"
mkdir -p "$OUT"
export KOG_TEST_CKPT_DIR="${KOG_TEST_CKPT_DIR:-/tmp/kog-test-ckpt}" HF_HUB_OFFLINE=1
if ! python3 -c "import kog_backend.engine.plugin" 2>/dev/null || [ ! -f /tmp/.kog-installed ]; then
  KOG_BUILD_EXT=0 python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/pip.log" 2>&1 \
    || { tail -20 "$OUT/pip.log"; exit 1; }
  touch /tmp/.kog-installed
fi
python3 -m pytest -p no:cacheprovider -rA -s "$@" 2>&1 | tee -a "$OUT/itests.log" | grep -E "^\[|PASSED|FAILED|ERROR|SKIPPED|passed|failed|Error|assert " | tail -60
exit "${PIPESTATUS[0]}"
