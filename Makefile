# Two commands do all the set-up on a fresh machine:
#   make demo   run the example DAG against the local Azure ML emulator
#   make test   run the test suite (unit, integration, e2e)
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test lint install clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade "pip==26.3"
	$(PY) -m pip install --quiet -c constraints.txt -e ".[test]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) scripts/demo.py

test: $(STAMP)
	bash scripts/ensure_postgres.sh
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q -p no:cacheprovider

lint: $(STAMP)
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) .demo
