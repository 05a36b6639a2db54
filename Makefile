# epochstream — the two README commands, plus benchmarks.
# Needs only python3 (3.11+) and, for Spark, Java 17 on PATH.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: demo test bench bench-quick install clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[spark,test]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/epochstream demo $(ARGS)

test: $(STAMP)
	$(PY) -m pytest -q $(PYTEST_ARGS)

bench: $(STAMP)
	$(PY) -m pip install --quiet -e ".[bench]"
	$(PY) -m benchmarks $(ARGS)

bench-quick: $(STAMP)
	$(PY) -m pip install --quiet -e ".[bench]"
	$(PY) -m benchmarks --quick $(ARGS)

clean:
	rm -rf $(VENV) .epochstream .pytest_cache .hypothesis
