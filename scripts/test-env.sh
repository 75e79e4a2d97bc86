#!/usr/bin/env bash
# Everything the test suite needs, built side by side: `.venv` with the test extras, and `.venv-af`
# (scripts/accelforge-env.sh: a Python >= 3.12 environment with AccelForge for the cross-check
# tests). pip works on one core, so the AccelForge environment's dependencies are installed while
# `.venv` is, and mambalaya itself into it afterwards (--no-deps): the two never build this source
# tree at the same time. Fails if `.venv` cannot be built; `.venv-af` is best effort, as in
# accelforge-env.sh (its tests are skipped, saying why, without it).
set -euo pipefail
cd "$(dirname "$0")/.."
AF_ENV_PART=deps bash scripts/accelforge-env.sh &
af=$!
status=0
python3 -m venv .venv && .venv/bin/pip install -q --no-compile -e '.[test]' || status=$?
wait "$af" || true
[ "$status" -eq 0 ] || exit "$status"
AF_ENV_PART=project bash scripts/accelforge-env.sh
