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
exec python3 -m pytest -q -p no:cacheprovider "$@"
