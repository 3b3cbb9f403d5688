.PHONY: test test-all demo setup lint bench bench-api

setup:
	scripts/setup.sh

test:
	scripts/test.sh

# Everything, the end-to-end tests marked slow included (real-vLLM syncs mid-episode, failing publish).
test-all:
	CRUCIBLE_TEST_SLOW=1 scripts/test.sh

demo:
	scripts/demo.sh

lint:
	.venv/bin/ruff check .
	.venv/bin/mypy core cli

bench:
	.venv/bin/python bench/sandbox.py
	.venv/bin/python bench/episodes.py
	.venv/bin/python bench/weight_sync.py --json

bench-api:
	.venv/bin/python bench/api.py
