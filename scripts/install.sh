#!/usr/bin/env bash
# Installs memtune's Python packages with the right torch build for this machine, then the given requirements
# file (default requirements.txt).
#   - An NVIDIA GPU (nvidia-smi answers): torch from PyPI, which is the CUDA build (~3 GB of downloads).
#   - No NVIDIA GPU on Linux: the CPU build of torch first (~200 MB instead of ~3 GB of CUDA libraries), unless
#     a torch is already installed; pip then keeps it.
#   - macOS / others: PyPI's torch is already the right one.
set -euo pipefail
cd "$(dirname "$0")/.."
REQS="${1:-requirements.txt}"
PIP=(python3 -m pip install -q --disable-pip-version-check)
if [[ "$(uname -s)" == "Linux" ]] && ! nvidia-smi >/dev/null 2>&1; then
  if ! python3 -c "import torch" >/dev/null 2>&1; then
    echo "memtune: no NVIDIA GPU found: installing the CPU build of torch (download.pytorch.org/whl/cpu)" >&2
    "${PIP[@]}" torch --index-url https://download.pytorch.org/whl/cpu
  fi
fi
"${PIP[@]}" -r "$REQS"
