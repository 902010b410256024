# Two commands do all the set-up on a fresh machine:
#   make demo   run the example DAG against the local Azure ML emulator
#   make test   run the test suite (unit, integration, e2e); changes no tracked file. Five pytest-xdist
#               workers, a test file at a time (--dist loadfile) in collection order (--no-loadscope-reorder:
#               xdist would otherwise start the files with the most tests first, and the e2e files last):
#               the e2e matrix is four files, one a worker at the start, each on an Airflow deployment of
#               its own, while the fifth starts on the integration tests; then all take the rest. The
#               same CPU on 2 cores took 13 min 42 s on four workers and 11 min 49 s on five: the fifth
#               fills the cores while the e2e workers wait for their deployments (docs/benchmarks.md).
# and more for maintainers:
#   make test-distributed  the Celery deployment's backfill and rolling-restart rows, and the partitioned-asset
#               chain under the real scheduler (.ci/run runs them too)
#   make reliability   run the e2e fault matrix and rebuild docs/reliability.{md,json} from it
#   make bench-backfill  benchmarks/backfill.py: backfills of 10, 30 and 60 intervals on the Celery deployment
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
TEST_WORKERS ?= 5
VERSION_TEST_WORKERS ?= 2  # 3.1/3.2: at 4, 3.2 lost two timing-held tests (cost estimate, demo) on 2 cores
# the distributed rows: the backfill file on one worker, the deadline and partitioned-asset files on the other
DISTRIBUTED_TEST_WORKERS ?= 2
STAMP  := $(VENV)/.installed

.PHONY: demo demo-clean test test-distributed bench-backfill reliability lint install clean docs test-airflow-3.1 test-airflow-3.2 test-versions

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade "pip==26.3"
	$(PY) -m pip install --quiet -c constraints.txt -e ".[test,azure-storage,distributed]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) scripts/demo.py

demo-clean: $(STAMP)
	$(PY) scripts/demo.py --fresh

test: $(STAMP)
	bash scripts/ensure_postgres.sh
	bash scripts/ensure_kubectl.sh
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=20 \
	  -m "not distributed"

# The distributed deployment (CeleryExecutor on Redis, two Celery workers, two triggerers): backfills under
# evictions, each reprocess behaviour, rolling restarts. And the partitioned-asset chain, which needs the scheduler
# to create runs (tests/e2e/test_partitioned_assets.py, its own LocalExecutor deployment: 2.5 min), and the savings
# view in headless Chromium on that deployment's runs (Debian's chromium, docs/ui.md). And the deadline rows
# (tests/e2e/test_deadline.py, a LocalExecutor deployment of their own: about 6 min). About 20 min of rows,
# mostly waiting: on two workers, about 11 min (the backfill file on one, the other two files on the other).
# .ci/run runs it beside the Airflow 3.1/3.2 runs, so that `make test` stays within its 12 min
# (docs/backfills.md, docs/assets.md).
test-distributed: $(STAMP)
	bash scripts/ensure_postgres.sh
	bash scripts/ensure_redis.sh
	bash scripts/ensure_chromium.sh
	$(PY) -m pytest -q -p no:cacheprovider -n $(DISTRIBUTED_TEST_WORKERS) --dist loadfile --durations=5 -m distributed tests/e2e

# Backfills of 10, 30 and 60 daily intervals (4 partitions each) on the Celery deployment under node evictions and
# whole-cluster preemptions at a fixed rate: wall time, intervals per hour, the ratio to the cluster-bound ideal,
# Airflow's overhead per job, Azure's peak queue (docs/benchmarks.md, "Backfills"). Its 60-interval backfill is
# the long variant of test-distributed's backfill row: it checks every row scored once, jobs = partitions +
# resubmissions and 0 duplicates, and exits 1 if not. About 45 min on 2 cores; not in `make test` or .ci/run.
# BENCH_ARGS passes options (e.g. BENCH_ARGS="--intervals 10,30 --plot docs/benchmarks_backfill.png", or --quick).
bench-backfill: $(STAMP)
	bash scripts/ensure_postgres.sh
	bash scripts/ensure_redis.sh
	$(PY) benchmarks/backfill.py $(BENCH_ARGS)

reliability: $(STAMP)
	bash scripts/ensure_postgres.sh
	bash scripts/ensure_redis.sh
	AZUREML_RELIABILITY_DIR="$(CURDIR)/docs" $(PY) -m pytest -q -p no:cacheprovider tests/e2e

# The docs site (Sphinx, warnings are errors) into the git-ignored docs/_build/html; autodoc imports
# Airflow, whose home is kept inside docs/_build too. Open docs/_build/html/index.html afterwards.
# First scripts/check_doc_links.py: every relative link and #anchor of README.md and docs/**/*.md
# must resolve (MyST's -W build checks the docs pages' own, not README.md's); external links are
# listed, not fetched.
docs: $(STAMP)
	$(PY) -m pip install --quiet -c constraints.txt -e ".[test,docs]"
	$(PY) scripts/check_doc_links.py
	rm -rf docs/_build
	AIRFLOW_HOME="$(CURDIR)/docs/_build/airflow-home" $(PY) -m sphinx -W --keep-going -q -b html -d docs/_build/doctrees docs docs/_build/html
	@echo "docs: built docs/_build/html/index.html (serve it: $(PY) -m http.server -d docs/_build/html)"

# Airflow 3.1 and 3.2 (docs/airflow_versions.md): unit and integration tests, each in its own git-ignored
# venv built from its pins (constraints/airflow-<v>.txt); `make test` is Airflow 3.3 (constraints.txt).
.venv-airflow-%/.installed: pyproject.toml constraints/airflow-%.txt
	$(PYTHON) -m venv .venv-airflow-$*
	.venv-airflow-$*/bin/python -m pip install --quiet --upgrade "pip==26.3"
	.venv-airflow-$*/bin/python -m pip install --quiet -c constraints/airflow-$*.txt -e ".[test]"
	touch $@

AIRFLOW_VERSION_TESTS = $(PY_ALT) -m pytest -q -p no:cacheprovider -n $(VERSION_TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=10 -m "not same_on_every_airflow" tests/unit tests/integration

test-airflow-3.1: PY_ALT := .venv-airflow-3.1/bin/python
test-airflow-3.1: .venv-airflow-3.1/.installed
	$(AIRFLOW_VERSION_TESTS)

test-airflow-3.2: PY_ALT := .venv-airflow-3.2/bin/python
test-airflow-3.2: .venv-airflow-3.2/.installed
	$(AIRFLOW_VERSION_TESTS)

test-versions: test-airflow-3.1 test-airflow-3.2

lint: $(STAMP)
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) .demo
