# epochstream — the two README commands, plus benchmarks.
# Needs only python3 (3.11+) and, for Spark, Java 17 on PATH.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: demo demo-cluster test test-heavy bench bench-quick bench-all install clean api typecheck

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[spark,test,metrics,otel]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/epochstream demo $(ARGS)

# The demo on a Spark standalone cluster on this machine (a master and two workers, each its own
# JVM) with a PostgreSQL catalog (a throwaway server, PostgreSQL 15 from Debian), all stopped at the end, on failure
# and Ctrl-C too. ARGS as for demo: --days N, --pace S (and --workers N, --keep-logs).
demo-cluster: $(STAMP)
	$(PY) -m epochstream._demo.cluster demo $(ARGS)

# the dashboard's test drives a real headless browser: Debian's chromium and chromium-driver
BROWSER := /usr/bin/chromedriver
$(BROWSER):
	@if [ "$$(id -u)" = 0 ]; then \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get install -y -q chromium chromium-driver >/dev/null 2>&1 || \
	  { apt-get update -q >/dev/null && apt-get install -y -q chromium chromium-driver >/dev/null; }; \
	else echo "make test needs Debian's chromium and chromium-driver (the dashboard's browser" \
	  "test): sudo apt-get install chromium chromium-driver" >&2; exit 1; fi

# the suite without the tests marked heavy (~12 minutes on 2 cores); `make test-heavy` runs those
# (~3 minutes: Spark drivers killed and restarted, a standalone cluster); CI (.ci/run) runs both
test: $(STAMP) $(BROWSER)
	$(PY) -m pytest -q -m "not heavy" $(PYTEST_ARGS)

test-heavy: $(STAMP)
	$(PY) -m pytest -q -m heavy $(PYTEST_ARGS)

bench: $(STAMP)
	$(PY) -m pip install --quiet -e ".[bench]"
	$(PY) -m benchmarks $(ARGS)

bench-quick: $(STAMP)
	$(PY) -m pip install --quiet -e ".[bench]"
	$(PY) -m benchmarks --quick $(ARGS)

# the core suite plus the feature cases (history, groups, pushdown, catalog, spark_source,
# security): about 40 minutes in full
bench-all: $(STAMP)
	$(PY) -m pip install --quiet -e ".[bench]"
	$(PY) -m benchmarks --all $(ARGS)

# API reference from the docstrings (pdoc) into docs/api/: about 0.9 MB of HTML, no source
# listings, no search index. Open docs/api/index.html.
API_MODULES := epochstream epochstream.catalog epochstream.transport epochstream.protocol \
	epochstream.order epochstream.frontier epochstream.wire epochstream.errors \
	epochstream.spark epochstream.testing epochstream.cli epochstream.filters epochstream.history
api: $(STAMP)
	$(PY) -m pip install --quiet "pdoc>=14"
	rm -rf docs/api
	$(PY) -m pdoc --docformat restructuredtext --no-show-source --no-search \
		-o docs/api $(API_MODULES)

# mypy --strict on a typed user program and on the CLI/demo (epochstream's own modules are read
# for their signatures only); the test suite runs the same check.
typecheck: $(STAMP)
	MYPYPATH=. $(PY) -m mypy --strict --follow-imports=silent tests/typed_usage.py epochstream/_cli epochstream/_demo \
		epochstream/cli.py epochstream/demo.py epochstream/__main__.py

clean:
	rm -rf $(VENV) .epochstream .pytest_cache .hypothesis
