#!/usr/bin/env bash
# The project's test command (the README's, what .ci/run and .github/workflows/ci.yml run):
# install the test extras, lint, run the tests marked `mds` in an environment of their own,
# then the main suite.
#
# Versions: pip resolves with tools/ci-constraints.txt (-c), the versions the suite is run
# against (torch's CPU build, the tested Ray release); the extras themselves pin nothing.
#
# mosaicml-streaming (the mds converter's dependency) caps numpy below 2.2 and imports
# torchvision, whose PyPI build does not load beside the CPU torch: installing it here would
# hold the whole project back. So the main run deselects `mds` (pyproject's addopts), and a
# second venv gets torch and '.[mds,test-core]'; tools/mds-test-env/README.md says why its
# torchvision is a placeholder. That venv (about 1.9 GB) lives outside the source tree and is
# kept between runs: ATLAS_FAST_MDS_VENV, default
# ${XDG_CACHE_HOME:-$HOME/.cache}/atlas-fast/mds-venv. Both runs must pass.
#
# Env: PYTHON (default python) the interpreter whose environment gets '.[test]';
#      ATLAS_FAST_MDS_VENV the MDS venv (made if absent);
#      ATLAS_FAST_REQUIRE_NGINX=1 a missing nginx fails its tests (set here as root or in CI).
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python}
constraints=$PWD/tools/ci-constraints.txt
started=$(date +%s)

"$python" -m pip install -c "$constraints" -e '.[test]'
# tests/remote serve files with nginx, a system package. It is installed only where that is
# allowed without asking: as root (.ci/run in a container) or in CI with password-less sudo
# (GitHub's runners). There its tests must run: ATLAS_FAST_REQUIRE_NGINX=1 turns their skip
# into a failure. Elsewhere (a contributor without root) nothing is installed and those tests
# skip, saying how to install nginx.
have_nginx() { command -v nginx >/dev/null || [ -x /usr/sbin/nginx ]; }
can_install=0 as_root=""
if [ "$(id -u)" = 0 ]; then
    can_install=1
elif [ -n "${CI:-}" ] && command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    can_install=1 as_root="sudo -n"
fi
if [ "$can_install" = 1 ] && command -v apt-get >/dev/null; then
    if ! have_nginx; then
        $as_root apt-get update -q
        $as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q nginx
    fi
    export ATLAS_FAST_REQUIRE_NGINX=1
elif ! have_nginx; then
    echo "tools/test.sh: nginx is missing, and is installed here only as root or in CI:" \
        "the tests that serve files over HTTP will skip (Debian/Ubuntu:" \
        "sudo apt-get install nginx; macOS: brew install nginx)" >&2
fi
ruff check .
ruff format --check .
cython-lint src/

venv=${ATLAS_FAST_MDS_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/atlas-fast/mds-venv}
mds_started=$(date +%s)
if [ ! -x "$venv/bin/python" ]; then
    mkdir -p "$(dirname "$venv")"
    "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install -q -c "$constraints" torch -e '.[mds,test-core]'
PYTHONPATH="$PWD/tools/mds-test-env${PYTHONPATH:+:$PYTHONPATH}" \
    "$venv/bin/python" -m pytest -p no:cacheprovider -m mds tests/convert/test_convert_mds.py
echo "mds tests in $venv: $(($(date +%s) - mds_started)) s, set-up included"

# The main suite last, so that its summary closes the run (with the total time). The build
# above compiled the core (a C compiler is required): it must be the default backend.
if [ "${ATLAS_FAST_NO_EXTENSIONS:-}" = 1 ]; then expect=python; else expect=cython; fi
export ATLAS_FAST_EXPECT_BACKEND=${ATLAS_FAST_EXPECT_BACKEND:-$expect}
status=0
"$python" -m pytest || status=$?
echo "tools/test.sh: $(($(date +%s) - started)) s in all"
exit "$status"
