.PHONY: test demo setup lint bench

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
