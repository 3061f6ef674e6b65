# Two entry points for newcomers: `make test` and (later) `make repro`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup test lint bench repro results bench-regimes ui clean

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

# The whole pipeline on the embedded default (dvc.yaml): data, zoo, profile, collect, the learning
# stages, export and evaluate. A second run skips every stage in about a second.
# DVC runs stages with whatever `python` is first on PATH, so the venv goes first.
repro: $(STAMP)
	PATH="$(abspath $(VENV))/bin:$$PATH" HF_HUB_OFFLINE=1 $(VENV)/bin/dvc repro

bench-regimes: repro
	HF_HUB_OFFLINE=1 $(PY) benchmarks/bench_regimes.py

# Rewrites the README's results section from the outputs of the last `make repro`.
results: $(STAMP)
	$(PY) -m pipeline.readme

# MLflow UI on the local SQLite store, bound to 127.0.0.1 only.
ui: $(STAMP)
	$(PY) -m pipeline.tracking ui

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
