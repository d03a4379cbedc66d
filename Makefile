# The two commands: `make demo` (the console on embedded defaults, simulated fleet)
# and `make test` (the whole suite against real PostgreSQL, Redis and Chromium).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: demo test lint clean

# The server and the agent (the demo runs a simulated fleet of real agents).
$(VENV)/.installed: requirements.txt agent/requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt -r agent/requirements.txt
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed requirements-test.txt
	$(PY) -m pip install --quiet -r requirements-test.txt
	touch $@

demo: $(VENV)/.installed
	PY=$(PY) scripts/demo.sh

test: $(VENV)/.installed-test
	PY=$(PY) scripts/test.sh $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) var staticfiles test-artifacts
