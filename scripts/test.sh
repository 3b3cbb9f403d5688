#!/usr/bin/env bash
# `make test`: set the machine up, then run the whole suite against real services.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# The machine's Postgres when it answers on 127.0.0.1:5432; else the tests start an embedded one.
if [ -z "${CRUCIBLE_TEST_DATABASE_URL:-}" ] && (exec 3<>/dev/tcp/127.0.0.1/5432) 2>/dev/null; then
  export CRUCIBLE_TEST_DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres
fi
export CRUCIBLE_TEST_REDIS_URL=${CRUCIBLE_TEST_REDIS_URL:-redis://127.0.0.1:6379/15}
make lint  # ruff, mypy over every package, shellcheck over the in-sandbox bash programs
set +e
# xdist workers: CRUCIBLE_TEST_WORKERS (default 2; 0: one process). `loadgroup`: the tests of one xdist group
# (every test using a vLLM server; the tests that sweep the machine's containers) run on one worker, in order.
# Two workers on these 2-core machines: one process leaves the cores idle while a test waits on Docker,
# vLLM or a child process (fresh clones, one machine: 1,735 s of pytest in one process, 1,503 s and 1,480 s on two;
# docs/getting-started.md has the latest runs).
# The default run leaves out tests marked slow (minutes each: real-vLLM syncs mid-episode and during a
# failing publish), those marked fleet (tests/fleet: hosts in network namespaces, `make test-fleet`) and
# compose (tests/compose: compose.yaml brought up with docker-compose, `make test-compose`) and harbor (the
# `harbor` package in its Debian 13 image reading and writing task folders, `make test-harbor`);
# `make test-all` (CRUCIBLE_TEST_SLOW=1) runs them too.
parallel=(--durations=25)
if [ "${CRUCIBLE_TEST_WORKERS:-2}" != 0 ]; then parallel+=(-n "${CRUCIBLE_TEST_WORKERS:-2}" --dist loadgroup); fi
if [ -n "${CRUCIBLE_TEST_SLOW:-}" ]; then
  .venv/bin/pytest "${parallel[@]}" "$@"
else
  .venv/bin/pytest "${parallel[@]}" -m "not slow and not fleet and not compose and not harbor" "$@"
fi
status=$?
set -e
# pytest exits 5 when it collected no tests: that is a failure, never a pass.
if [ "$status" = 5 ]; then echo "pytest collected no tests" >&2; exit 1; fi
exit "$status"
