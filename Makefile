# Two commands a fresh machine needs: `make test` (and, with the translation
# work, `make demo`). Both create .venv and install the package on first use.

VENV ?= .venv
PYTHON := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

DEMO_RUN ?= runs/demo
DEMO_EXPORT ?= exports/demo

.PHONY: install demo test test-prerequisites test-fast test-backends bench clean web-packages

$(STAMP): setup.py device-requirements.txt
	test -x $(PYTHON) || python3 -m venv $(VENV)
	$(PYTHON) -m pip install --quiet --upgrade pip
	$(PYTHON) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

# A device's Python, as docs/on-device.md tells a device to install it: the package without its
# dependencies, then device-requirements.txt (LiteRT's runtime, the tokenizer libraries, NumPy): no
# TensorFlow, no Keras. tests/test_on_device.py runs builtin LiteRT exports there.
DEVICE_VENV ?= .venv-device
DEVICE_STAMP := $(DEVICE_VENV)/.installed-stamp

$(DEVICE_STAMP): setup.py device-requirements.txt
	test -x $(DEVICE_VENV)/bin/python || python3 -m venv $(DEVICE_VENV)
	$(DEVICE_VENV)/bin/python -m pip install --quiet --no-deps -e .
	$(DEVICE_VENV)/bin/python -m pip install --quiet -r device-requirements.txt
	touch $(DEVICE_STAMP)

install: $(STAMP)

# The main job: train English->German on the built-in corpus, report BLEU and
# sample translations, leave a run directory with TensorBoard logs, and export
# it as a SavedModel for TensorFlow Serving, translating through the export.
demo: $(STAMP)
	rm -rf $(DEMO_RUN) $(DEMO_EXPORT)
	$(VENV)/bin/keras-transformer train --dataset demo --out $(DEMO_RUN)
	$(VENV)/bin/keras-transformer translate $(DEMO_RUN) "The young cat sees a big dog in the park." "Today the children do not sleep."
	$(VENV)/bin/keras-transformer export $(DEMO_RUN) $(DEMO_EXPORT)
	$(VENV)/bin/keras-transformer translate --saved-model $(DEMO_EXPORT) "The young cat sees a big dog in the park." "Today the children do not sleep."

# Tests run in two processes (much of their time is tracing and start-up, not
# arithmetic), a file at a time, so that module fixtures are built once.
PYTEST_WORKERS ?= 2
PYTEST := $(PYTHON) -m pytest -n $(PYTEST_WORKERS) --dist loadfile

# The layer and model tests, which run again on Keras' other backends (the
# rest of the package is TensorFlow by nature). JAX compiles every op it runs
# eagerly: at XLA's lowest optimisation level the tests take half the time.
BACKEND_TESTS := tests/test_layers.py tests/test_attention.py tests/test_positional.py \
	tests/test_transformer.py tests/test_classifier.py
ON_JAX := KERAS_BACKEND=jax JAX_PLATFORMS=cpu \
	XLA_FLAGS="--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"

# What the tests need beyond .venv (headless Chromium for the browser tests),
# installed if missing, or one line naming the command to run, before any test
# starts: the one place that sets it up (.ci/run runs `make test`).
test-prerequisites:
	sh scripts/test-prerequisites.sh

# The npm packages `export --format web` puts into a page (LiteRT.js, Hugging Face's tokenizers port),
# installed once from the lockfile into a cache (keras_transformer/export/web): before any test runs.
web-packages: $(STAMP)
	TF_CPP_MIN_LOG_LEVEL=3 $(PYTHON) -m keras_transformer.export.web

# The whole suite, slow end-to-end tests included, then the layer and model
# tests on JAX (tests/test_backends.py compares the backends' outputs). The JAX
# part runs even when the TensorFlow part failed, so that one run reports both;
# make's exit status is non-zero if either failed.
test: test-prerequisites $(STAMP) $(DEVICE_STAMP) web-packages
	failed=""; \
	$(PYTEST) || failed="the TensorFlow part"; \
	$(ON_JAX) $(PYTEST) -m "not slow" $(BACKEND_TESTS) || failed="$${failed:+$$failed and }the JAX part"; \
	if [ -n "$$failed" ]; then echo "make test: $$failed failed" >&2; exit 1; fi

# Everything but the tests marked slow.
test-fast: test-prerequisites $(STAMP)
	$(PYTEST) -m "not slow"

# The speed benchmark (BENCHMARKS.md): installs the `bench` extra (keras-hub)
# and, unless BENCH_TORCH=0, the `bench-torch` extra (PyTorch) into .venv.
# Extra pip arguments for torch, e.g. TORCH_PIP_ARGS="--index-url
# https://download.pytorch.org/whl/cpu" for the CPU-only wheels.
BENCH_TORCH ?= 1
TORCH_PIP_ARGS ?=
BENCH_STAMP := $(VENV)/.bench-stamp-torch$(BENCH_TORCH)
BENCH_ARGS ?=

$(BENCH_STAMP): $(STAMP) setup.py
	$(PYTHON) -m pip install --quiet -e ".[bench]"
	if [ "$(BENCH_TORCH)" = 1 ]; then $(PYTHON) -m pip install --quiet -e ".[bench-torch]" $(TORCH_PIP_ARGS); fi
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(PYTHON) benchmarks/suite.py $(BENCH_ARGS)

# The layer and model tests on JAX and on PyTorch (the `bench-torch` extra;
# with PyTorch installed, tests/test_backends.py compares it too).
test-backends: $(BENCH_STAMP)
	$(ON_JAX) $(PYTEST) $(BACKEND_TESTS)
	KERAS_BACKEND=torch $(PYTEST) $(BACKEND_TESTS)
	$(PYTEST) tests/test_backends.py

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
