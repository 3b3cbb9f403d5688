#!/usr/bin/env bash
# make demo: real RL on a tiny model, end to end, on this machine (see scripts/demo.py).
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/python scripts/demo.py "$@"
