# Two entry points do all set-up on a fresh machine: `make demo` and `make test`.
# Both are idempotent: the venv and the installs are reused when already present.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
# The CPU wheel; an unpinned torch pulls a multi-GB CUDA build.
TORCH_PIN := torch==2.13.0
STAMP  := $(VENV)/.installed

.PHONY: demo test install system-deps clean

demo: install
	$(VENV)/bin/fexplore demo

test: install
	$(PY) -m pytest -q tests

install: $(STAMP) system-deps

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip setuptools wheel
	$(PIP) install $(TORCH_PIN)
	$(PIP) install -e '.[dev]'
	touch $(STAMP)

# graphviz's `dot` renders the graph views; install it when missing and we are root.
system-deps:
	@if ! command -v dot >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y graphviz; \
	  else \
	    echo "note: graphviz 'dot' is missing and we are not root; graph views will fall back to text"; \
	  fi; \
	fi

clean:
	rm -rf $(VENV) build *.egg-info
