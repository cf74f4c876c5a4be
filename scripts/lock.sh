#!/usr/bin/env bash
# Moves the version locks to the newest releases requirements*.txt allow, deliberately: installs them into a new
# virtual environment, writes requirements.lock and requirements-dev.lock from it, runs README's test command there,
# and keeps the new locks only if the whole suite passes (otherwise the old ones are put back and it exits 1).
#   bash scripts/lock.sh            # then review `git diff requirements*.lock` and commit
# torch: the newest CPU build from download.pytorch.org where it can be reached (PyPI's CUDA build on an NVIDIA
# machine); where neither answers, the version the lock already holds. MEMTUNE_LOCK_VENV names the venv's folder.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${MEMTUNE_LOCK_VENV:-$(mktemp -d)/venv}"
python3 -m venv "$VENV"
PY="$VENV/bin/python"
PIP=("$PY" -m pip install -q --disable-pip-version-check)
touch requirements.lock requirements-dev.lock  # the first lock starts from none
OLD_TORCH="$(sed -n 's/^torch==//p' requirements.lock)"
echo "memtune: newest releases into $VENV" >&2
if nvidia-smi >/dev/null 2>&1 || [[ "$(uname -s)" != "Linux" ]]; then
  "${PIP[@]}" --upgrade torch
elif ! "${PIP[@]}" --upgrade torch --index-url https://download.pytorch.org/whl/cpu 2>/dev/null; then
  # never PyPI's torch here: on Linux that is the CUDA build (~3 GB), which is not what a machine without a GPU runs
  KEEP="${OLD_TORCH:-$(python3 -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null || true)}"
  if [[ -z "$KEEP" ]]; then
    echo "memtune: the CPU index cannot be reached and no torch version is known: install torch first" >&2
    exit 1
  fi
  echo "memtune: the CPU index cannot be reached: torch stays at $KEEP (the CPU build this machine can install)" >&2
  "${PIP[@]}" "torch==$KEEP"
fi
# the torch just chosen stays: --upgrade below would otherwise move it (to PyPI's CUDA build on Linux)
echo "torch==$("$PY" -c 'import torch; print(torch.__version__.split("+")[0])')" > "$VENV/torch.txt"
"${PIP[@]}" --upgrade -c "$VENV/torch.txt" -r requirements.txt
cp requirements.lock requirements.lock.old
cp requirements-dev.lock requirements-dev.lock.old
restore() { mv requirements.lock.old requirements.lock; mv requirements-dev.lock.old requirements-dev.lock; }
"$PY" scripts/lockfile.py freeze requirements.lock
"${PIP[@]}" --upgrade -c requirements.lock -r requirements-dev.txt
"$PY" scripts/lockfile.py freeze requirements-dev.lock --minus requirements.lock
git --no-pager diff --stat -- requirements.lock requirements-dev.lock || true
echo "memtune: running the suite on the new versions" >&2
if PATH="$VENV/bin:$PATH" bash tests/run.sh "$@"; then
  rm -f requirements.lock.old requirements-dev.lock.old
  echo "memtune: the suite passed: the new locks stay (review and commit requirements*.lock)" >&2
else
  restore
  echo "memtune: the suite failed on the new versions: the old locks are back" >&2
  exit 1
fi
