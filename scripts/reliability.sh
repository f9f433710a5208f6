#!/usr/bin/env bash
# The load test and then the fault test, with the project's virtualenv; arguments go to both
# (in practice: --quick for a short run). Exit status 1 if either reported a failed check.
# Figures and commands: docs/reliability.md.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
python=${DPSS_PYTHON:-$root/.venv/bin/python}
cd "$root"
status=0
"$python" -m scripts.load_test "$@" || status=1
"$python" -m scripts.fault_test "$@" || status=1
exit "$status"
