#!/usr/bin/env bash
# A second virtual environment for the torchvision model source: PyPI's torchvision does not
# import beside the torch 2.13 CPU wheel, but torch 2.14.1 + torchvision 0.29.1 lie on this
# machine's disk (about 5.5 GB installed, ~2 minutes). Prints the interpreter path on success.
set -euo pipefail
cd "$(dirname "$0")/.."
V=.venv-tv
if [ ! -x "$V/bin/python" ] || ! "$V/bin/python" -c "import torchvision" 2>/dev/null; then
  python3 -m venv "$V"
  "$V/bin/python" -m pip install -q -U pip >/dev/null
  "$V/bin/python" -m pip install -q torch==2.14.1 torchvision==0.29.1 >&2
  "$V/bin/python" -m pip install -q -e ".[test]" >&2
fi
"$V/bin/python" -c "import torchvision" >&2
echo "$PWD/$V/bin/python"
