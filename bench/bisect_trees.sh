#!/usr/bin/env bash
# Source trees of the given commits under .bisect/COMMIT (git-ignored through .git/info/exclude), for bench.product's
# bisect plans: each row runs `python -m core.train` from its own commit's code. core/ and bench/ only (the rows read a model folder and a data file, not assets/).
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.bisect/' .git/info/exclude 2>/dev/null || echo '/.bisect/' >> .git/info/exclude
for c in "$@"; do
  rm -rf ".bisect/$c" && mkdir -p ".bisect/$c"
  git archive "$c" -- core bench | tar -x -C ".bisect/$c"
done
du -sh .bisect
