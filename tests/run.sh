#!/usr/bin/env bash
# README's test command: install the project and test dependencies (the right torch build, see
# scripts/install.sh), then run every test.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh requirements-dev.txt
CHROMIUM="${MEMTUNE_CHROMIUM:-/usr/bin/chromium}"
if [[ ! -x "$CHROMIUM" ]]; then
  cat >&2 <<HINT
memtune: no Chromium at $CHROMIUM, so the browser tests (tests/test_browser*.py) will be skipped.
  Debian/Ubuntu: sudo apt-get install chromium
  elsewhere:     python3 -m playwright install chromium
                 export MEMTUNE_CHROMIUM=\$(ls ~/.cache/ms-playwright/chromium-*/chrome-linux*/chrome | head -1)
HINT
fi
# One pytest-xdist worker per core, at most 4 (each holds the libraries and a demo model, ~1 GiB);
# MEMTUNE_TEST_WORKERS overrides, and 1 runs everything in this process.
CORES="$(python3 -c 'import os; print(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)')"
WORKERS="${MEMTUNE_TEST_WORKERS:-$(( CORES < 4 ? CORES : 4 ))}"
PARALLEL=()
if (( WORKERS > 1 )); then
  # groups and order: tests/conftest.py (XDIST_GROUPS, FIRST)
  PARALLEL=(-n "$WORKERS" --dist loadgroup --no-loadscope-reorder)
fi
START=$SECONDS
set +e
python3 -m pytest -q -p no:cacheprovider ${PARALLEL[@]+"${PARALLEL[@]}"} "$@"  # (bash 3.2: an empty array is unset)
CODE=$?
set -e
echo "memtune: test suite took $(( SECONDS - START )) s wall time with ${WORKERS} worker(s) on ${CORES} core(s)"
exit "$CODE"
