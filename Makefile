# Understudy developer entry points. `make demo` and `make test` are all a new machine needs.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Every package mypy checks (bench/ and tests/ aside).
TYPED := policies scheduling gateway controller agent stateful parity sim understudy deploy model_repo

.PHONY: venv test test-fast lint demo plan-demo bench bench-live clean distclean

# Python writes each module's bytecode once, on its first import, even where the environment
# says not to (PYTHONDONTWRITEBYTECODE): otherwise every process compiles what it imports
# afresh (torch alone takes seconds), and a test run starts hundreds (agents, their runtimes,
# controllers, gateways, clients). pip installs without compiling (--no-compile): only the
# modules something imports are compiled, then read from __pycache__ by every later process.
unexport PYTHONDONTWRITEBYTECODE

# The virtual environment, (re)installed whenever pyproject.toml changes.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --no-compile -e '.[server,dev]'
	touch $(STAMP)

$(VENV) venv: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/mypy $(TYPED)

# The unit tier runs on two workers (pure code: no timings to disturb); the integration tier
# runs alone, one test at a time, as its failover timings need the machine's cores.
test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/mypy $(TYPED)
	$(BIN)/python -m pytest -m unit -n 2
	$(BIN)/python -m pytest -m integration --durations=15

# Lint, import contracts and the unit tier only (tests/unit, marked `unit` by tests/conftest.py).
test-fast: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -m unit -n 2

demo: $(STAMP)
	$(BIN)/understudy --log-level WARNING models build
	$(BIN)/understudy --log-level WARNING testbed demo

# The planning-only demo of a generated cluster (no processes started).
plan-demo: $(STAMP)
	$(BIN)/understudy --log-level WARNING demo

bench: $(STAMP)
	$(BIN)/python bench/ilp_scale.py
	$(BIN)/python bench/heuristic_scale.py

# Benchmarks on real processes (Triton, testbed): several minutes each.
bench-live: $(STAMP)
	$(BIN)/python bench/load_times.py
	$(BIN)/python bench/failover.py

# Build and tool caches; the virtual environment stays (see distclean).
clean:
	rm -rf build dist *.egg-info .pytest_cache .ruff_cache .mypy_cache .hypothesis
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
