#!/usr/bin/env bash
# Installs memtune's Python packages at the versions the suite passed with (requirements.lock and
# requirements-dev.lock, used as constraints), with the right torch build for this machine, then the given
# requirements file (default requirements.txt).
#   - An NVIDIA GPU (nvidia-smi answers): torch from PyPI, which is the CUDA build (~3 GB of downloads).
#   - No NVIDIA GPU on Linux: the CPU build of the locked torch first (~200 MB instead of ~3 GB of CUDA libraries),
#     unless that version is already installed.
#   - macOS / others: PyPI's torch is already the right one.
# scripts/lock.sh moves the locks to newer releases, deliberately, after the suite passed on them.
set -euo pipefail
cd "$(dirname "$0")/.."
REQS="${1:-requirements.txt}"
PIP=(python3 -m pip install -q --disable-pip-version-check)
TORCH="$(sed -n 's/^torch==//p' requirements.lock)"
if [[ "$(uname -s)" == "Linux" ]] && ! nvidia-smi >/dev/null 2>&1; then
  HAVE="$(python3 -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null || true)"
  if [[ "$HAVE" != "$TORCH" ]]; then
    echo "memtune: no NVIDIA GPU found: installing the CPU build of torch $TORCH (download.pytorch.org/whl/cpu)" >&2
    # where that index cannot be reached (a mirror of PyPI only), the same release from the configured index
    "${PIP[@]}" --retries 1 --timeout 20 "torch==$TORCH" --index-url https://download.pytorch.org/whl/cpu \
      || { echo "memtune: download.pytorch.org unreachable: torch $TORCH from the configured index instead" >&2
           "${PIP[@]}" "torch==$TORCH"; }
  fi
fi
"${PIP[@]}" -c requirements.lock -c requirements-dev.lock -r "$REQS"
# The k-quant GGUF export's quantizer (core/export/kquant.py): llama.cpp's library from node-llama-cpp's prebuilt CPU
# package for this system, at the version scripts/quantizer/package-lock.json pins, where Node.js is installed. Without
# it memtune still runs; the Export tab's k-quant formats say how to add it.
if command -v npm >/dev/null 2>&1; then
  Q=scripts/quantizer
  if [[ ! "$Q/node_modules/.package-lock.json" -nt "$Q/package-lock.json" ]]; then
    echo "memtune: installing llama.cpp's quantizer for 4-bit GGUF files (npm ci in $Q)" >&2
    (cd "$Q" && npm ci --no-audit --no-fund --loglevel=error) \
      || echo "memtune: the quantizer did not install; GGUF Q4_K_M/Q5_K_M/Q6_K stay unavailable (run: cd $Q && npm ci)" >&2
  fi
else
  echo "memtune: no npm found: GGUF Q4_K_M/Q5_K_M/Q6_K need Node.js 20+ (nodejs.org), then: cd scripts/quantizer && npm ci" >&2
fi
