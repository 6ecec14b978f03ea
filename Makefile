# Two commands do everything on a fresh machine:
#   make demo   - install into .venv, then run the built-in scaling study on this machine's cores
#   make test   - install into .venv, then run the whole test suite
#   make test-fast - the tests that start no process (not marked slow), for every edit
PY ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast install clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/parascale demo

# two tests at a time: most of a process-starting test is waiting (for a start-up, a timeout, a
# killed process), and each uses at most 4 processes, so two fit 2 cores without timing out
test: $(STAMP)
	$(VENV)/bin/python -m pytest -q -n 2 $(PYTEST_ARGS)

test-fast: $(STAMP)
	$(VENV)/bin/python -m pytest -q -m "not slow" $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) build src/*.egg-info
