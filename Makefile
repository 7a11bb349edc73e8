# iotune: `make demo` and `make test` are the README's quick start.
# Both install what is missing first (scripts/setup.sh, idempotent; needs root).

.PHONY: setup demo test
setup:
	bash scripts/setup.sh

demo: setup
	.venv/bin/iotune demo

test: setup
	.venv/bin/python -m pytest -p no:cacheprovider tests
