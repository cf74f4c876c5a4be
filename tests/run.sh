#!/usr/bin/env bash
# README's test command: install the project and test dependencies, then run every test.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q --disable-pip-version-check -r requirements-dev.txt
exec python3 -m pytest -q -p no:cacheprovider "$@"
