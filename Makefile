# Two commands a fresh machine needs: `make test` (and, with the translation
# work, `make demo`). Both create .venv and install the package on first use.

VENV ?= .venv
PYTHON := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
export TF_CPP_MIN_LOG_LEVEL ?= 2

.PHONY: install test test-fast clean

$(STAMP): setup.py
	test -x $(PYTHON) || python3 -m venv $(VENV)
	$(PYTHON) -m pip install --quiet --upgrade pip
	$(PYTHON) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

# The whole suite, slow end-to-end tests included.
test: $(STAMP)
	$(PYTHON) -m pytest

# Everything but the tests marked slow.
test-fast: $(STAMP)
	$(PYTHON) -m pytest -m "not slow"

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
