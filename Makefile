# iotune: `make demo` and `make test` are the README's quick start.
# Both install what is missing first (scripts/setup.sh, idempotent; needs root).

.PHONY: setup demo test test-quick
setup:
	bash scripts/setup.sh

demo: setup
	.venv/bin/iotune demo

# the whole suite, as CI runs it (.ci/run); the 15 slowest tests are listed at the end
test: setup
	.venv/bin/python -m pytest -p no:cacheprovider --durations=15 tests

# the quick tier: the pure tests, for the edit-test loop (under a minute; no root
# needed once the venv exists, which only a missing venv makes setup build)
test-quick: .venv/bin/python
	.venv/bin/python -m pytest -p no:cacheprovider -m "not slow" tests

.venv/bin/python:
	bash scripts/setup.sh
