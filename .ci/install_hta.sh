#!/usr/bin/env bash
# Install HolisticTraceAnalysis (HTA) 0.5.0 into its own venv, <repo>/.hta-venv, for the HTA
# cross-check tests (tests/hta_runner.py finds it there) and benchmarks/bench_ingest.py.
# Why a venv of its own: HTA pulls jupyterlab and pins its own pandas; it must never enter
# stepscope's environment. Idempotent: a venv that already has HTA 0.5.0 is left as it is.
# Exits non-zero when the install fails; the HTA tests then skip (no interpreter found).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.hta-venv
python=${PYTHON:-python3}
version=0.5.0
start=$(date +%s)

has_hta() {
  "$venv/bin/python" - "$version" 2>/dev/null <<'PY'
import sys
from importlib.metadata import version
import hta.trace_analysis  # noqa: F401  (the import the cross-checks need)
sys.exit(version("holistictraceanalysis") != sys.argv[1])
PY
}

if has_hta; then
  echo "HTA $version already installed in $venv"
  exit 0
fi
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "holistictraceanalysis==$version"
has_hta
echo "HTA $version installed in $venv in $(( $(date +%s) - start )) s"
