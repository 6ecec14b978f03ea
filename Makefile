# Two commands do everything on a fresh machine:
#   make demo   - install into .venv, then run the built-in scaling study on this machine's cores
#   make test   - install into .venv, then run the whole test suite
PY ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: demo test install clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/parascale demo

test: $(STAMP)
	$(VENV)/bin/python -m pytest -q $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) build src/*.egg-info
