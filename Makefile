# The two commands: `make demo` runs the main job, `make test` installs everything and runs the tests.
# `make test-fast` is the inner loop: the suite without the deployment shapes (RabbitMQ, Redis
# Cluster, Sentinel, Prometheus, Flower) and the chaos cases, and without the slow cases.
# `make eval` measures reranking on the shipped collection (nDCG, P@k, R@k, MRR, latency, depth).
# VENV names the environment: `make test VENV=~/venvs/rerankq` uses one that already has
# rerankq installed as it is, and makes it like .venv otherwise.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
# The CPU build of torch; a bare `torch` requirement would pull a multi-GB CUDA build.
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: install demo lint test test-fast eval bench clean

ifeq ($(origin VENV),file)
# The project's own .venv: made, and installed again whenever pyproject.toml changes.
READY := $(STAMP)
else
# The caller's environment: used as it is when it can import rerankq, pytest and pytest-xdist.
READY := $(if $(shell $(PY) -c 'import producer, worker, pytest, xdist' >/dev/null 2>&1 && echo yes),,$(STAMP))
endif
# The lint needs the dev extra's checkers too.
LINT_READY := $(if $(filter file,$(origin VENV)),$(STAMP),$(if $(shell $(PY) -c 'import ruff, mypy, importlinter' >/dev/null 2>&1 && echo yes),,$(STAMP)))

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet "$(TORCH_SPEC)"
	$(PIP) install --quiet -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

demo: $(READY)
	$(PY) -m rerankq demo

# Style (ruff), formatting (ruff format --check), types (mypy, strict on every shipped package) and the
# import contracts (lint-imports). Changes nothing: `ruff format` and `ruff check --fix` do.
lint: $(LINT_READY)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy
	$(VENV)/bin/lint-imports

# Test processes (pytest-xdist): two per CPU for the whole suite. Its tests wait more than they
# compute (worker start-ups, store retries, failovers): on this 2-core machine two processes took
# 18:15 in CI, three 10:13 (quiet, 1,130 tests) and four 18:05 (`CI=true bash .ci/run` on a clean
# clone, 1,190 tests; 2026-12-02), then 9:48 (the same, 1,218 tests; 2026-12-03, after the slowest
# cases were cut). The suite is CPU-bound on two cores. Every wait for an event has a
# generous deadline (tests/delivery_helpers.py PATIENCE), so the extra load does not make it
# flaky. With `--dist loadgroup`, tests/conftest.py's scheduler keeps a module whose tests share
# a costly module-scoped server or worker (ONE_PROCESS_MODULES) in one process, so it starts
# once. Each process starts its own private Redis and, at its first amqp case, its own RabbitMQ
# node; every test has its own namespace and queues.
TEST_PROCESSES ?= $(shell echo $$(( $$(nproc 2>/dev/null || echo 2) * 2 )))
# Every test process collects every module, and pytest caches each rewritten test module as
# bytecode: with PYTHONDONTWRITEBYTECODE set (as some shells and images set it) nothing is
# cached and each process rewrites them all again, 2.5 s more per process on every run.
PYTEST := env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest
test: $(READY)
	$(PYTEST) -q -n $(TEST_PROCESSES) --dist loadgroup tests

# The fast tier, in more processes than CPUs: without the deployment cases almost all of it
# waits on worker start-ups and Redis.
FAST_PROCESSES ?= 4
test-fast: $(READY)
	$(PYTEST) -q -n $(FAST_PROCESSES) --dist loadgroup -m "not deployment and not chaos and not slow" tests

eval: $(READY)
	$(PY) -m evaluation --plots eval-out --json eval-out/eval.json

bench: $(READY)
	$(PY) -m ops.bench.scoring --quick
	$(PY) -m ops.bench.queue --quick
	$(PY) -m ops.bench.scale --quick
	$(PY) -m ops.bench.submit --quick

# The caller's own VENV is theirs: clean removes only the environment this Makefile made.
clean:
	rm -rf $(if $(filter file,$(origin VENV)),$(VENV)) .pytest_cache .hypothesis .import_linter_cache .ruff_cache .mypy_cache
