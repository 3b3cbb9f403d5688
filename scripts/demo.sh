#!/usr/bin/env bash
# make demo: real RL on a tiny model, end to end, on this machine (see recipes/demo.py). Like `make
# test`, it first sets the machine up (scripts/setup.sh: .venv, Docker, Redis; a no-op when ready), so
# it works from a fresh clone.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/python -m recipes.demo "$@"
