#!/usr/bin/env bash
# make install's installers timed on fresh venvs: pip as before (its cache empty in this environment), uv from an
# empty cache, uv from its cache. Run from the repository root: bash docs/make-test-2026-12-06c-avx2/install_timing.sh
# (removes ~/.cache/uv, uses /tmp/install-timing; needs the network to PyPI).
set -euo pipefail
req="$PWD/requirements.txt"
uv_pin="$(grep -m1 '^uv==' "$req" | cut -d' ' -f1)"
work=/tmp/install-timing
rm -rf "$work" && mkdir -p "$work" && cd "$work"
t() { local start=$SECONDS; "$@" >/dev/null 2>&1; echo "$((SECONDS - start)) s: $*"; }
python3 -m venv tools && tools/bin/python -m pip install --quiet "$uv_pin" >/dev/null 2>&1
python3 -m venv pip-venv
t pip-venv/bin/python -m pip install --quiet -r "$req"
rm -rf ~/.cache/uv
python3 -m venv uv-cold
t tools/bin/uv pip install --quiet --compile-bytecode --python uv-cold/bin/python -r "$req"
python3 -m venv uv-warm
t tools/bin/uv pip install --quiet --compile-bytecode --python uv-warm/bin/python -r "$req"
for venv in pip-venv uv-cold uv-warm; do "$venv/bin/python" -m pip freeze 2>/dev/null | grep -v '^uv==' | sha256sum | cut -c1-16; done
echo "(the same three digests: the same packages and versions)"
