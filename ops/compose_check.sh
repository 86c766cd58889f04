#!/usr/bin/env bash
# Builds the images docker-compose.yml names and runs the stack for real, profile by profile,
# under faults (ops/compose_check/__init__.py says what it checks). Not part of `make test`.
#
#   bash ops/compose_check.sh                      # default, amqp, cluster, sentinel, flower
#   bash ops/compose_check.sh default amqp         # some profiles only
#
# Needs a Docker engine (dockerd is started, and stopped at the end, when it is installed and
# not running, and this runs as root), Compose (`docker compose` v2, or `docker-compose` 1.29),
# and a Python with rerankq's [worker] extra installed: $PYTHON, else ./.venv/bin/python, else
# python3. The check runs this checkout's code (PYTHONPATH), as `python -m ops.compose_check`.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
python=${PYTHON:-}
if [ -z "$python" ]; then
    if [ -x "$root/.venv/bin/python" ]; then python=$root/.venv/bin/python; else python=python3; fi
fi
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
exec "$python" -m ops.compose_check "$@"
