# The two commands: `make demo` runs the main job, `make test` installs everything and runs the tests.
# `make eval` measures reranking on the shipped collection (nDCG, P@k, R@k, MRR, latency, depth).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
# The CPU build of torch; a bare `torch` requirement would pull a multi-GB CUDA build.
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: install demo test eval bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet "$(TORCH_SPEC)"
	$(PIP) install --quiet -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) -m worker.demo

test: $(STAMP)
	$(PY) -m pytest -q tests

eval: $(STAMP)
	$(PY) -m worker.evaluation --plots eval-out --json eval-out/eval.json

bench: $(STAMP)
	$(PY) ops/bench/scoring.py --quick
	$(PY) ops/bench/queue.py --quick
	$(PY) ops/bench/scale.py --quick

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
