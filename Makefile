# llmgate: `make run` and `make test` set this machine up themselves (scripts/setup.sh).
PY := .venv/bin/python

.PHONY: setup setup-test run run-cluster test test-fast test-unit test-integration lint format typecheck check bench bench-smoke nginx-conf mutate clean

setup:
	@scripts/setup.sh

# One command, no shell: the runner's parent is make itself, which it watches for the
# signals make does not pass on (runner/make_parent.py).
run: setup
	@$(PY) -m runner

# Several gateway instances (each its own gunicorn) behind one nginx upstream block, sharing
# two Memcached nodes, all on loopback: what a scaled-out deployment does (docs/scaling.md).
INSTANCES ?= 3
run-cluster: setup
	@$(PY) -m runner --instances $(INSTANCES) --memcached-nodes 2

setup-test:
	@scripts/setup.sh test

# Every test: the fast ones as test-fast runs them, then the slow ones in one process (each
# takes more than 5 s, most of it load or timing of their own that they must not share).
# Run serially, the whole suite took 17.5 of CI's 25 minutes.
test: test-fast
	$(PY) -m pytest -m slow

# Everything but the tests marked slow (each takes more than 5 s): the unit tests and the
# quick integration tests, real processes still. These run in TEST_PROCS pytest processes
# (pytest-xdist), a test file at a time each, so a module's stacks stay in one process: 4
# on 2 cores, because the tests mostly wait (paced streams, timeouts, processes starting);
# the time measured last is in the README's Development section (docs/conventions.md).
TEST_PROCS ?= 4
test-fast: setup-test
	$(PY) -m pytest -m "not slow" -n $(TEST_PROCS) --dist loadfile

test-unit: setup
	$(PY) -m pytest tests/unit

test-integration: setup-test
	$(PY) -m pytest tests/integration

lint: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

format: setup
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

typecheck: setup
	$(PY) -m mypy app runner simulator llmgate_client llmgate_wire bench tests

check: lint typecheck test

# The benchmark report (docs/performance.md): bench/results/<date>/report.md, results.json
# and PNG plots; ~20 minutes on 2 cores. bench-smoke: the same code at tiny sizes in about a
# minute (CI): it fails when a section is missing or a number is not finite, never on speed.
bench: setup
	$(PY) -m pip install -q -r requirements-bench.txt
	$(PY) -m bench

bench-smoke: setup-test
	$(PY) -m pip install -q -r requirements-bench.txt
	$(PY) -m bench --smoke

nginx-conf: setup
	@$(PY) -m runner.nginx

# Mutation testing of the pure modules (not run by `make test` / CI): mutmut from
# requirements-mutate.txt, a fresh run each time (the modules' hashes taken at its start),
# then the score per module, written into docs/mutation.md's Result table with those hashes;
# fails when a survivor is not argued equivalent there. CI's unit tests fail when a module
# differs from the hash recorded (`scripts/mutation_score.py --check`).
# Config: [tool.mutmut] in pyproject.toml.
MUTATE_CHILDREN ?= 1
mutate: setup
	$(PY) -m pip install -q -r requirements-mutate.txt
	rm -rf mutants
	$(PY) scripts/mutation_score.py --snapshot
	$(PY) -m mutmut run --max-children $(MUTATE_CHILDREN)
	@echo
	@$(PY) scripts/mutation_score.py --write-doc

clean:
	rm -rf .run .pytest_cache .mypy_cache .ruff_cache mutants
