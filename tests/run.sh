#!/usr/bin/env bash
# README's test command: install the project and test dependencies (the right torch build, see
# scripts/install.sh), then run every test (the full suite), and print its wall time and CPU seconds per category.
# `bash tests/run.sh --fast`: the fast tier alone (tests/tiers.py), for a developer's every change: no installing,
# no process, browser or training run (a fast test that starts one fails).
set -euo pipefail
cd "$(dirname "$0")/.."
TIER=(-m "not slow")  # tests marked slow (minutes each: inductor's compile cache): `bash tests/run.sh -m slow`
if [[ "${1:-}" == "--fast" ]]; then
  shift
  TIER=(-m fast)
else
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
  # llama.cpp for the GGUF round trip (tests/test_llama.py): node-llama-cpp's prebuilt CPU binaries, pinned in
  # tests/llama/package-lock.json; npm never downloads or compiles llama.cpp itself, and --omit=optional skips the other
  # platforms' builds (CUDA, Vulkan: 650 MB). Reinstalled when the lock changes.
  if command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1; then
    if ! cmp -s tests/llama/package-lock.json tests/llama/node_modules/.memtune-lock 2>/dev/null; then
      (cd tests/llama && NODE_LLAMA_CPP_SKIP_DOWNLOAD=true npm ci --omit=optional --no-audit --no-fund --loglevel=error \
        && cp package-lock.json node_modules/.memtune-lock) \
        || echo "memtune: npm ci in tests/llama failed; the llama.cpp tests will say so" >&2
    fi
  else
    cat >&2 <<HINT
memtune: no node/npm, so the llama.cpp round-trip tests (tests/test_llama.py) will be skipped.
  Debian/Ubuntu: sudo apt-get install nodejs npm     (node 18 or newer; then run this script again)
HINT
  fi
  # Go for the Ollama Modelfile tests (tests/test_modelfile.py): Ollama's own parser and template code, tests/go.
  if ! command -v go >/dev/null 2>&1; then
    cat >&2 <<HINT
memtune: no Go, so the Ollama Modelfile tests (tests/test_modelfile.py) will be skipped.
  Debian/Ubuntu: sudo apt-get install golang-go     (Go 1.19 or newer)
HINT
  fi
fi
# One pytest-xdist worker per core, at most 4 (each holds the libraries and a demo model, ~1 GiB);
# MEMTUNE_TEST_WORKERS overrides, and 1 runs everything in this process.
CORES="$(python3 -c 'import os; print(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)')"
WORKERS="${MEMTUNE_TEST_WORKERS:-$(( CORES < 4 ? CORES : 4 ))}"
PARALLEL=()
if (( WORKERS > 1 )); then
  # groups and order: tests/conftest.py (XDIST_GROUPS, BROWSER_GROUPS, FIRST)
  PARALLEL=(-n "$WORKERS" --dist loadgroup --no-loadscope-reorder)
fi
START=$SECONDS
# Each test's category and CPU seconds (tests/tiers.py): the totals land here, and tests/tiers.txt is rewritten
# from what the tests did (which ones start a process or train).
export MEMTUNE_TEST_SUMMARY="$(mktemp "${TMPDIR:-/tmp}/memtune-cpu.XXXXXX")" MEMTUNE_TEST_RECORD=1
set +e
python3 -m pytest -q -p no:cacheprovider "${TIER[@]}" ${PARALLEL[@]+"${PARALLEL[@]}"} "$@"  # (bash 3.2: an empty array is unset)
CODE=$?
set -e
echo "memtune: test suite took $(( SECONDS - START )) s wall time with ${WORKERS} worker(s) on ${CORES} core(s)"
cat "$MEMTUNE_TEST_SUMMARY"
rm -f "$MEMTUNE_TEST_SUMMARY"
exit "$CODE"
