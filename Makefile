# Two commands do everything on a fresh machine: `make demo` and `make test`.
VENV       ?= .venv
PYTHON     ?= python3
TORCH_SPEC ?= torch==2.13.0
PY         := $(VENV)/bin/python
STAMP      := $(VENV)/.wb-installed

.PHONY: install demo test lint bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first: any other spec than the local CPU wheel pulls gigabytes of CUDA packages
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[test]"
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(VENV)/bin/wb demo

test: install
	@command -v tmux >/dev/null 2>&1 || (command -v apt-get >/dev/null 2>&1 && \
		(apt-get install -y -qq tmux >/dev/null 2>&1 || (apt-get update -qq >/dev/null 2>&1 && \
		apt-get install -y -qq tmux >/dev/null 2>&1)) || echo "tmux not installed: the tmux end-to-end test will be skipped")
	$(VENV)/bin/pytest -q -p no:cacheprovider

lint: install
	$(VENV)/bin/ruff check workbench tests bench

bench: install
	$(PY) bench/bench_compare.py
	$(PY) bench/bench_dump.py
	$(PY) bench/bench_metrics.py
	$(PY) bench/bench_formats_open.py

clean:
	rm -rf $(VENV) wb_demo wb_out .pytest_cache
