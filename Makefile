# Two commands do all the set-up on a fresh machine:
#   make demo   run the example DAG against the local Azure ML emulator
#   make test   run the test suite (unit, integration, e2e); changes no tracked file. Two pytest-xdist
#               workers, a test file at a time (--dist loadfile): one runs the e2e matrix (one file, one
#               shared Airflow deployment), the other the rest beside it.
# and one more for maintainers:
#   make reliability   run the e2e fault matrix and rebuild docs/reliability.{md,json} from it
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo demo-clean test reliability lint install clean docs

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade "pip==26.3"
	$(PY) -m pip install --quiet -c constraints.txt -e ".[test]"
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
	$(PY) -m pytest -q -p no:cacheprovider -n 2 --dist loadfile

reliability: $(STAMP)
	bash scripts/ensure_postgres.sh
	AZUREML_RELIABILITY_DIR="$(CURDIR)/docs" $(PY) -m pytest -q -p no:cacheprovider tests/e2e

# The docs site (Sphinx, warnings are errors) into the git-ignored docs/_build/html; autodoc imports
# Airflow, whose home is kept inside docs/_build too. Open docs/_build/html/index.html afterwards.
docs: $(STAMP)
	$(PY) -m pip install --quiet -c constraints.txt -e ".[test,docs]"
	rm -rf docs/_build
	AIRFLOW_HOME="$(CURDIR)/docs/_build/airflow-home" $(PY) -m sphinx -W --keep-going -q -b html -d docs/_build/doctrees docs docs/_build/html
	@echo "docs: built docs/_build/html/index.html (serve it: $(PY) -m http.server -d docs/_build/html)"

lint: $(STAMP)
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) .demo
