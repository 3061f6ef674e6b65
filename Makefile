# Two entry points for newcomers: `make test` and (later) `make repro`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup setup-gpu test test-all test-gpu gpu-check lint bench bench-never-loses repro results bench-regimes \
	real-pair bench-real-pair ui clean

setup: $(STAMP)

# Every package is pinned by version and SHA-256 in requirements.lock (made from constraints.txt;
# tests/test_lock.py keeps the two in step), pip itself by version; torch is the local CPU wheel.
# The project goes in last with --no-deps and no build isolation, so nothing unhashed is fetched.
$(STAMP): pyproject.toml constraints.txt requirements.lock
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q pip==26.3
	$(PY) -m pip install -q --require-hashes -r requirements.lock
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	$(PY) -c "import torch, transformers, hypothesis, polars, ray"
	touch $(STAMP)

# A CUDA build of torch from PyPI (its plain Linux x86_64 wheel is the CUDA one) beside the same
# pins as `make setup`: constraints.txt with torch==X+cpu turned into torch===X, which only the
# plain wheel matches (==X would also match a +cpu wheel and keep it). torch's nvidia-* and triton
# come at the versions torch itself pins.
GPU_CONSTRAINTS := $(VENV)/constraints-gpu.txt

setup-gpu:
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	sed -E 's/^torch==([^+]+)\+cpu$$/torch===\1/' constraints.txt > $(GPU_CONSTRAINTS)
	grep -qE '^torch===' $(GPU_CONSTRAINTS) || { echo "constraints.txt: no torch==X+cpu line" >&2; exit 2; }
	$(PY) -m pip install -q -c $(GPU_CONSTRAINTS) -e ".[dev,ray]"
	$(PY) -c "import torch; assert torch.version.cuda, f'torch {torch.__version__} has no CUDA'; print('torch', torch.__version__, 'CUDA', torch.version.cuda, 'GPUs', torch.cuda.device_count())"
	touch $(STAMP)

# The developer loop: every test but the `slow` end-to-end runs and the opt-in `shared_data` ones.
test: $(STAMP)
	$(PY) -m pip check
	$(PY) -m ruff check .
	$(PY) -m pytest -q -m "not slow and not shared_data"

# Every test, the DVC end-to-end runs included (about 20 min on 2 cores); what CI runs.
test-all: $(STAMP)
	$(PY) -m pip check
	$(PY) -m ruff check .
	$(PY) -m pytest -q

# One-command device check (benchmarks/gpu_check.py): fp32/bf16 lossless of every policy, a timing
# table, a re-profile and the budget choice; writes gpu_check.{json,md} under $OUT or
# artifacts/gpu_check. DEVICE=cpu runs it at smoke sizes (a CI test runs that too).
DEVICE ?= cuda
gpu-check: $(STAMP)
	$(PY) -m benchmarks.gpu_check --device $(DEVICE) $(if $(filter cpu,$(DEVICE)),--smoke)

# The lossless and numerics checks on CUDA (fp32 and bf16); they skip where no GPU is present.
test-gpu: $(STAMP)
	$(PY) -m pytest -q -m gpu

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

bench: $(STAMP)
	$(PY) benchmarks/bench_decoder.py

# The whole pipeline on the embedded default (dvc.yaml): data, zoo, profile, collect, the learning
# stages, export and evaluate. A second run skips every stage in about a second.
# DVC runs stages with whatever `python` is first on PATH, so the venv goes first.
# One MLflow parent run per `make repro`: its id reaches every stage's process through
# TREEGRAFT_PIPELINE_RUN (tracking only, no output depends on it); `end` closes it (FAILED if dvc
# failed) or removes it when every stage was up to date.
# $(1): pipeline.tracking's options (an overlay), $(2): the dvc command run under the parent.
define pipeline_run
@run=$$($(PY) -m pipeline.tracking $(1) start) || exit 1; \
	echo "MLflow pipeline run $$run"; \
	PATH="$(abspath $(VENV))/bin:$$PATH" HF_HUB_OFFLINE=1 TREEGRAFT_PIPELINE_RUN=$$run $(VENV)/bin/dvc $(2); \
	rc=$$?; $(PY) -m pipeline.tracking $(1) end $$run $$rc; exit $$rc
endef

repro: $(STAMP)
	$(call pipeline_run,,repro)

# Per request, never meaningfully slower than AR: AR and the budget stage's policy decoded
# alternately per held-back prompt (fp32 and bf16), with the per-request switch-off.
bench-never-loses: repro
	HF_HUB_OFFLINE=1 $(PY) benchmarks/bench_never_loses.py --pair zoo-m --switch-off

bench-regimes: repro
	HF_HUB_OFFLINE=1 $(PY) benchmarks/bench_regimes.py

# The real Qwen2.5-Coder 1.5B/0.5B pair trains, deploys and evaluates its own scheduler (opt-in, not
# in CI): install the conversion extras, build the pair once (~1.4 GB of downloads, checked by
# SHA-256), run the whole pipeline with its overlay through DVC (profiles/real-pair.yaml: bf16, 5
# categories x 16 collect prompts, 6 x 3 held-back cells; about 30 min on 2 cores), then decode the
# held-back prompts per dataset against every baseline in wall clock (benchmarks/bench_deployed.py)
# and write docs/real-pair-results.md. `dvc exp run` keeps the experiment; `git checkout params.yaml
# dvc.lock && dvc checkout` brings the default's outputs back.
REAL := qwen2.5-coder-1.5b-0.5b
real-pair: $(STAMP)
	$(PY) -m pip install -q -c constraints.txt -e ".[dev,ray,real-pair]"
	HF_HUB_OFFLINE=1 $(PY) -m models.real_pair
	$(call pipeline_run,--profile real-pair,exp run -S overlay=real-pair)
	HF_HUB_OFFLINE=1 $(PY) benchmarks/bench_deployed.py --profile real-pair --pair $(REAL) \
		--out artifacts/bench/deployed_real
	$(PY) -m pipeline.real_pair_results

# After `make real-pair`: the pair's linear kernels (benchmarks/bench_linear.py) and, per prompt,
# AR against the deployed policy with the per-request switch-off (benchmarks/bench_never_loses.py,
# bf16; wall and CPU time, outputs checked): 2 held-back prompts of each of 6 datasets, 6 lockstep
# runs each; a prompt whose interval against the 0.97x floor is undecided is timed again, up to 24.
NEVER_LOSES_PROMPTS = --datasets alpaca gsm8k humaneval mt_bench sum pydoc --per-dataset 2 \
	--repeats 6 --most-repeats 24
bench-real-pair: $(STAMP)
	HF_HUB_OFFLINE=1 $(PY) benchmarks/bench_linear.py
	HF_HUB_OFFLINE=1 $(PY) benchmarks/bench_never_loses.py --profile real-pair --switch-off \
		$(NEVER_LOSES_PROMPTS) --pair $(REAL) --dtypes bfloat16 --out artifacts/bench/never_loses_real_bf16
	$(PY) -m pipeline.real_pair_results

# Writes docs/results.md, the README's headline table and a row of docs/ledger.csv from the newest
# finished `make repro`, naming the commit whose code it ran (its MLflow parent run records it);
# refuses in one line, writing nothing, where this checkout's code or params differ from that run's.
results: $(STAMP)
	$(PY) -m pipeline.readme

# MLflow UI on the local SQLite store, bound to 127.0.0.1 only. Prints a link to the experiment and
# one to the newest pipeline run of each overlay side by side (after e.g. `make repro` and
# `dvc exp run -S overlay=smoke`).
ui: $(STAMP)
	$(PY) -m pipeline.tracking ui

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
