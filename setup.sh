#!/usr/bin/env bash
# One-line set-up for a fresh machine with Python >= 3.10:
#   ./setup.sh demo   install stepscope (CPU torch first, so pip never pulls a CUDA build) and run the demo
#   ./setup.sh test   install the test dependencies and run the tests
set -euo pipefail
cd "$(dirname "$0")"
what="${1:-demo}"
shift || true
python=${PYTHON:-python3}
venv=${STEPSCOPE_VENV:-.venv}

if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check)
# torch first and pinned: a bare `torch` requirement would download a multi-GB CUDA build.
"$venv/bin/python" -c "import torch" 2>/dev/null || "${pip[@]}" "torch==2.13.0"

case "$what" in
  demo)
    "${pip[@]}" -e ".[all]"
    exec "$venv/bin/stepscope" demo "$@"
    ;;
  test)
    "${pip[@]}" -e ".[dev]"
    exec "$venv/bin/python" -m pytest -q "$@"
    ;;
  *)
    echo "usage: ./setup.sh demo|test" >&2
    exit 2
    ;;
esac
