#!/usr/bin/env bash
# The project's test command (the README's, and what .ci/run runs): install the test extras,
# lint, run the tests marked `mds` in an environment of their own, then the main suite.
#
# mosaicml-streaming (the mds converter's dependency) caps numpy below 2.2 and imports
# torchvision, whose PyPI build does not load beside the local CPU torch: installing it here
# would hold the whole project back. So the main run deselects `mds` (pyproject's addopts),
# and a second venv (ATLAS_FAST_MDS_VENV, default .ci-venvs/mds, kept between runs) gets
# torch==2.13.0 and '.[mds,test-core]'; tools/mds-test-env/README.md says why its torchvision
# is a placeholder. Both runs must pass.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python}

"$python" -m pip install -e '.[test]'
# tests/remote serve files with nginx (the Debian package) on 127.0.0.1.
if ! command -v nginx >/dev/null && [ ! -x /usr/sbin/nginx ] && command -v apt-get >/dev/null; then
    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q nginx
fi
ruff check .
ruff format --check .
cython-lint src/

venv=${ATLAS_FAST_MDS_VENV:-.ci-venvs/mds}
started=$(date +%s)
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
"$venv/bin/python" -m pip install -q torch==2.13.0 -e '.[mds,test-core]'
PYTHONPATH="$PWD/tools/mds-test-env${PYTHONPATH:+:$PYTHONPATH}" \
    "$venv/bin/python" -m pytest -p no:cacheprovider -m mds tests/convert/test_convert_mds.py
echo "mds tests in $venv: $(( $(date +%s) - started )) s, set-up included"

# The main suite last, so that its summary is the run's closing line.
"$python" -m pytest
