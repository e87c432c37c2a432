# Everything a fresh machine needs: each target creates .venv and installs the project into it.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STORE ?= var/store

.PHONY: run test lint bench crashtest clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

## run: the embedded demo: a store under ./var/store, events in, read back by queue and by key
run: $(VENV)/.installed
	$(PY) examples/quickstart.py --store $(STORE)

## test: lint, then every test
test: $(VENV)/.installed lint
	$(PY) -m pytest -q

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .

## bench: benchmarks side by side with their peers (writes benchmarks/results/)
bench: $(VENV)/.installed
	$(PY) benchmarks/bench_store.py

clean:
	rm -rf $(VENV) var .pytest_cache .ruff_cache .hypothesis
