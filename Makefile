.PHONY: test demo setup lint bench bench-api

setup:
	scripts/setup.sh

test:
	scripts/test.sh

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
