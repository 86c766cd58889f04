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

.PHONY: install demo test test-fast eval bench clean

ifeq ($(origin VENV),file)
# The project's own .venv: made, and installed again whenever pyproject.toml changes.
READY := $(STAMP)
else
# The caller's environment: used as it is when it can import rerankq and pytest.
READY := $(if $(shell $(PY) -c 'import producer, worker, pytest' >/dev/null 2>&1 && echo yes),,$(STAMP))
endif

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet "$(TORCH_SPEC)"
	$(PIP) install --quiet -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

demo: $(READY)
	$(PY) -m worker.cli demo

test: $(READY)
	$(PY) -m pytest -q tests

test-fast: $(READY)
	$(PY) -m pytest -q -m "not deployment and not chaos and not slow" tests

eval: $(READY)
	$(PY) -m worker.evaluation --plots eval-out --json eval-out/eval.json

bench: $(READY)
	$(PY) -m ops.bench.scoring --quick
	$(PY) -m ops.bench.queue --quick
	$(PY) -m ops.bench.scale --quick
	$(PY) -m ops.bench.submit --quick

# The caller's own VENV is theirs: clean removes only the environment this Makefile made.
clean:
	rm -rf $(if $(filter file,$(origin VENV)),$(VENV)) .pytest_cache .hypothesis .import_linter_cache
