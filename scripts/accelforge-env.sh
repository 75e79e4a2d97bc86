#!/usr/bin/env bash
# Build .venv-af: a Python >= 3.12 virtualenv with AccelForge and this mambalaya, used by the
# AccelForge cross-check tests (tests/test_accelforge.py skip, saying why, when it is absent).
# Finds python3.13/python3.12 on PATH or in pyenv; prints a note and succeeds when none exists.
set -u
cd "$(dirname "$0")/.."
py=""
for cand in python3.13 python3.12; do
  if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import sys; assert sys.version_info >= (3, 12)' 2>/dev/null; then
    py=$(command -v "$cand"); break
  fi
done
if [ -z "$py" ] && command -v pyenv >/dev/null 2>&1; then
  for v in $(pyenv versions --bare 2>/dev/null | grep -E '^3\.(1[2-9])(\.|$)' | sort -rV); do
    if [ -x "$(pyenv root)/versions/$v/bin/python" ]; then py="$(pyenv root)/versions/$v/bin/python"; break; fi
  done
fi
if [ -z "$py" ]; then
  echo "accelforge-env: no Python >= 3.12 found; the AccelForge cross-check tests will be skipped"
  exit 0
fi
if [ ! -x .venv-af/bin/python ]; then
  "$py" -m venv .venv-af || { echo "accelforge-env: could not create .venv-af"; exit 0; }
fi
# AF_ENV_PART (scripts/test-env.sh): "deps" installs mambalaya's dependencies and AccelForge, read
# from pyproject.toml, without building this source tree (so it can run beside another install of
# it); "project" then installs mambalaya itself with --no-deps; unset, both in one pip run.
case "${AF_ENV_PART:-}" in
  deps)
    reqs=$(mktemp)
    "$py" - > "$reqs" <<'PY'
import tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
print("\n".join(project["dependencies"] + project["optional-dependencies"]["accelforge"]))
PY
    set -- install -q --no-compile -r "$reqs" ;;
  project) set -- install -q --no-compile --no-deps -e . ;;
  *) set -- install -q --no-compile -e '.[accelforge]' ;;
esac
.venv-af/bin/pip "$@" 2>&1 | grep -v 'is ignored: it is neither a file nor a directory'
installed=${PIPESTATUS[0]}
[ -z "${reqs:-}" ] || rm -f "$reqs"
if [ "$installed" -ne 0 ]; then
  echo "accelforge-env: installing accelforge failed; its cross-checks will be skipped"
elif [ "${AF_ENV_PART:-}" != project ]; then
  # AccelForge's first import compiles the modules it pulls in (sympy, numba, pandas: about 1,800;
  # 12 s): done here, beside .venv's install in scripts/test-env.sh, not in the test that runs it
  env -u PYTHONDONTWRITEBYTECODE .venv-af/bin/python -c "import accelforge" >/dev/null 2>&1 || true
fi
exit 0
