# Two entry points do all set-up on a fresh machine: `make demo` and `make test`.
# Both are idempotent: the venv and the installs are reused when already present.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
# The CPU wheel; an unpinned torch pulls a multi-GB CUDA build.
TORCH_PIN := torch==2.13.0
STAMP  := $(VENV)/.installed
# nbval runs every tutorial in notebooks/ and compares its outputs with the stored ones, through
# the sanitizers (timings, addresses, paths) in notebooks/nbval_sanitize.cfg.
NBVAL  := --nbval --nbval-current-env --nbval-cell-timeout=600 \
          --nbval-sanitize-with notebooks/nbval_sanitize.cfg

.PHONY: demo test test-full notebooks install system-deps browser-deps apt-install clean

demo: install
	$(VENV)/bin/fexplore demo

# One pytest run: the suite (the real-browser test included) and every notebook, on every core
# (--dist loadfile: a notebook's cells, which share one kernel, stay on one worker).
test: install browser-deps
	$(PY) -m pytest -q -n auto --dist loadfile tests notebooks $(NBVAL)

# The same, with every case of the target and precision matrices (zoo models, Hugging Face
# architectures, generated kernels' cases) on all four variants (`make test` runs each on two:
# both targets, both precisions); several minutes more.
test-full: install browser-deps
	FEXPLORE_FULL_MATRIX=1 $(PY) -m pytest -q -n auto --dist loadfile tests notebooks $(NBVAL)

# Re-execute every tutorial in place, storing fresh outputs; run it after changing what a
# tutorial shows (a stage, a view), then `make test` checks that they are stable.
notebooks: install
	$(VENV)/bin/jupyter nbconvert --to notebook --execute --inplace \
	  --ExecutePreprocessor.timeout=600 notebooks/*.ipynb
	@# source locations are stored relative to the checkout: no machine's path in the repo
	sed -i 's|$(CURDIR)/fexplore/|fexplore/|g' notebooks/*.ipynb

install: $(STAMP) system-deps

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip setuptools wheel
	$(PIP) install $(TORCH_PIN)
	$(PIP) install -e '.[dev]'
	touch $(STAMP)

# Debian packages, installed when missing and we are root: graphviz's `dot` renders the graph
# views; chromium is the browser the real-browser test drives through Playwright (Playwright's
# own browser download needs a network we do not have, so the test uses this one).
system-deps:
	@$(MAKE) --no-print-directory apt-install CMD=dot PKG=graphviz \
	  WHY="graph views will fall back to text"

browser-deps:
	@$(MAKE) --no-print-directory apt-install CMD=chromium PKG=chromium \
	  WHY="the real-browser test will be skipped"

apt-install:
	@if ! command -v $(CMD) >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y $(PKG); \
	  else \
	    echo "note: $(PKG) ('$(CMD)') is missing and we are not root; $(WHY)"; \
	  fi; \
	fi

clean:
	rm -rf $(VENV) build *.egg-info test-artifacts fexplore-report
