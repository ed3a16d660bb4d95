#!/usr/bin/env bash
# One-line set-up for a fresh machine with Python >= 3.10:
#   ./setup.sh demo   install stepscope with its dashboard and run the demo (no torch needed)
#   ./setup.sh test   install torch (CPU, pinned, first) and the test dependencies, run the tests
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
compile_package() {
  # An editable install leaves stepscope's own modules uncompiled, and where
  # PYTHONDONTWRITEBYTECODE is set (container images often set it) no process ever writes their
  # bytecode: each one that imports the analyses compiled them again, ~0.35 s of CPU (the suite
  # starts hundreds: CLI runs, ingest workers, collector children, the dashboard's server).
  "$venv/bin/python" -m compileall -q stepscope >/dev/null
}
install_torch() {
  # torch first and pinned: a bare `torch` requirement would download a multi-GB CUDA build.
  "$venv/bin/python" -c "import torch" 2>/dev/null || "${pip[@]}" "torch==2.13.0"
}

case "$what" in
  demo)
    "${pip[@]}" -e ".[dashboard]"
    compile_package
    exec "$venv/bin/stepscope" demo "$@"
    ;;
  test)
    install_torch
    "${pip[@]}" -e ".[dev]"
    compile_package
    # Every test on all cores (pytest-xdist, one worker per core, a file's tests in one worker
    # except the sweeps that tests/conftest.py's SPREAD names). No test needs the machine to
    # itself: those that record fresh timings and judge them (the gate's runs, the watch's slow
    # steps) are built to hold on a loaded machine, which is what a shared CI runner is.
    exec "$venv/bin/python" -m pytest -q -n auto --dist loadfile "$@"
    ;;
  *)
    echo "usage: ./setup.sh demo|test" >&2
    exit 2
    ;;
esac
