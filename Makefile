# Two commands for a newcomer: `make demo` and `make test`. Both build .venv from nothing.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-dev

.PHONY: demo test test-deps lint docs docs-serve unit integration e2e bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[local]'
	touch $@

PLUGINS := plugins/hafo-check-openai plugins/hafo-check-training

$(STAMP): pyproject.toml $(addsuffix /pyproject.toml,$(PLUGINS)) | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[dev]'
	$(BIN)/python -m pip install -q --no-build-isolation $(addprefix -e ,$(PLUGINS))
	touch $(VENV)/.installed $@

demo: $(VENV)/.installed
	$(BIN)/hafo demo

lint: $(STAMP)
	$(BIN)/ruff check hafo tests benchmarks examples plugins scripts docs/hooks
	$(BIN)/mypy hafo $(addsuffix /src,$(PLUGINS))
	$(BIN)/lint-imports

# The documentation site (mkdocs.yml): docs/ plus the reference generated from the code
# (docs/hooks/reference.py); --strict: a broken link or anchor, a missing page or an
# undocumented field fails the build. Into site/; `make docs-serve` serves it with live reload.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

docs-serve: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve

unit: $(STAMP)
	$(BIN)/pytest -q -n 2 tests/unit $(addsuffix /tests,$(PLUGINS))

integration: $(STAMP)
	$(BIN)/pytest -q tests/integration

# Debian packages the end-to-end tests use (chromium for the dashboard, openssl for
# certificates, systemd-analyze for the units, haproxy, systemd-nspawn and debootstrap for the
# machine tests); installs only what is missing.
test-deps:
	bash scripts/install-test-deps.sh

e2e: $(STAMP) test-deps
	$(BIN)/pytest -q tests/e2e

# The suite in lanes (scripts/test_lanes.py, tests/README.md): the unit tests on two workers,
# the integration tests that time nothing on several, the timing tests one at a time, and the
# machines and end-to-end tools beside them. Stopped (SIGTERM, Ctrl-C), it tears down what
# it started.
test: $(STAMP) test-deps
	$(MAKE) lint
	$(MAKE) docs
	$(BIN)/python scripts/test_lanes.py

bench: $(STAMP)
	$(BIN)/python benchmarks/failover.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache site
