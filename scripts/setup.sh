#!/usr/bin/env bash
# Sets up a development environment in ./.venv (or $KOG_VENV): vLLM 0.26.0 with its torch 2.11.0 (CUDA 13.0
# build), kog_backend in editable mode with its test extras, and the CUDA extensions kog_backend/_C (and the
# test-only kog_backend/_C_test, unless KOG_BUILD_TEST_EXT=0) built in place with nvcc for sm_90a. Needs
# Python >= 3.10 and nvcc 13.x (CUDA_HOME, default /usr/local/cuda); no GPU needed.
# Safe to re-run: installed packages are kept and the extension build is incremental.
#
# Environment:
#   KOG_VENV=path        virtual environment to create or reuse (default: <repo>/.venv)
#   KOG_PYTHON=python3   interpreter that creates the venv
#   KOG_BUILD_EXT=0      skip the extension build (Python-only install)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${KOG_VENV:-$ROOT/.venv}"
PYTHON="${KOG_PYTHON:-python3}"
export CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"

step() { printf '\n== setup: %s (%s)\n' "$*" "$(date +%T)"; }

# A fresh install takes ~8 GiB in the venv (torch's CUDA 13 libraries ~4.5, vLLM and its kernels ~3) plus pip's
# download cache; a full disk otherwise surfaces mid-install as pip's "[Errno 28] No space left on device".
if [ ! -x "$VENV/bin/python" ]; then
  mkdir -p "$(dirname "$VENV")"
  free_kib=$(df -Pk "$(dirname "$VENV")" | awk 'NR==2 {print $4}')
  if [ "${free_kib:-0}" -lt $((12 * 1024 * 1024)) ]; then
    echo "setup: warning: $((free_kib / 1024 / 1024)) GiB free under $(dirname "$VENV"); a fresh install needs ~12 GiB" \
         "(8 in the venv, the rest pip's cache; PIP_NO_CACHE_DIR=1 saves the cache)" >&2
  fi
  step "creating $VENV with $("$PYTHON" --version 2>&1)"
  "$PYTHON" -m venv "$VENV"
fi
PY="$VENV/bin/python"

# The build backend needs torch importable (setup.py uses torch.utils.cpp_extension) and setuptools >= 77
# (SPDX license string); they are installed into the venv first and the project is then built without
# isolation, so the extension compiles against exactly the torch that vLLM runs with.
step "build requirements"
"$PY" -m pip install --progress-bar off "setuptools>=77" wheel "torch==2.11.0"

step "kog_backend (editable) with vllm==0.26.0 and test extras"
KOG_BUILD_EXT=0 "$PY" -m pip install --progress-bar off --no-build-isolation -e "$ROOT[test]"

if [ "${KOG_BUILD_EXT:-1}" != "0" ]; then
  if [ ! -x "$CUDA_HOME/bin/nvcc" ]; then
    echo "setup: nvcc not found at $CUDA_HOME/bin/nvcc (set CUDA_HOME, or KOG_BUILD_EXT=0 to skip the extension)" >&2
    exit 1
  fi
  step "CUDA extensions kog_backend/_C and _C_test for sm_${KOG_CUDA_ARCH:-90a} ($("$CUDA_HOME/bin/nvcc" --version | tail -1))"
  (cd "$ROOT" && "$PY" setup.py build_ext --inplace)
  ls -l "$ROOT"/kog_backend/_C*.so
fi
step "done; run the tests with: $VENV/bin/python -m pytest tests -q"
