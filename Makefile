# Two entry points for newcomers: `make test` and (later) `make repro`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup test lint bench clean

setup: $(STAMP)

# torch is pinned in pyproject and installed in the same pip command as everything else,
# so pip picks the local CPU wheel instead of resolving a CUDA build.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev]"
	$(PY) -c "import torch, transformers, hypothesis"
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m pytest -q

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

bench: $(STAMP)
	$(PY) benchmarks/bench_decoder.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
