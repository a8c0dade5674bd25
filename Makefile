# Two commands do everything on a fresh machine: `make demo` and `make test`.
VENV       ?= .venv
PYTHON     ?= python3
TORCH_SPEC ?= torch==2.13.0
PY         := $(VENV)/bin/python
STAMP      := $(VENV)/.wb-installed

.PHONY: install demo test lint bench clean proto

$(STAMP): pyproject.toml
	@echo "make: setting up $(VENV) once (a few minutes; later runs skip this)"
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "make: [1/3] upgrading pip in $(VENV)"
	$(PY) -m pip install -q --upgrade pip
	# torch first: any other spec than the local CPU wheel pulls gigabytes of CUDA packages
	@echo "make: [2/3] installing $(TORCH_SPEC) (CPU build, about 200 MB)"
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	@echo "make: [3/3] installing wb and its dependencies (textual, duckdb, pandas, typer, transformers, pytest, ...)"
	$(PY) -m pip install -q -e ".[test]"
	touch $(STAMP)

MSIT_STAMP := $(VENV)/.wb-msit

install: $(STAMP)
	@$(PY) -c "from workbench.compare.judging.kernel_code import kernel_code; kernel_code().build()" \
	  || echo "make: the metric kernels did not compile now: a compare compiles the ones it needs on first use"

# msit (the peer we replace) for the compatibility tests only, never a runtime dependency. msit pins numpy<2,
# so it is installed without its deps and with numpy held where it is; if it fails those tests skip, saying why.
$(MSIT_STAMP): $(STAMP)
	-@$(PY) -m pip freeze | grep -iE '^(numpy|pandas|torch)==' > $(VENV)/wb-constraints.txt; \
	PIP_CONSTRAINT=$(CURDIR)/$(VENV)/wb-constraints.txt timeout 900 $(PY) -m pip install -q --no-deps "msit==8.2.0" \
	  && PIP_CONSTRAINT=$(CURDIR)/$(VENV)/wb-constraints.txt PATH=$(CURDIR)/$(VENV)/bin:$$PATH \
	     timeout 900 $(VENV)/bin/msit install llm < /dev/null > $(VENV)/wb-msit-install.log 2>&1 \
	  || echo "msit could not be installed: its compatibility tests will be skipped (see $(VENV)/wb-msit-install.log)"
	@touch $(MSIT_STAMP)

# msprobe (mindstudio-probe), likewise for the compatibility tests only; numpy/pandas/torch held where they are.
MSPROBE_STAMP := $(VENV)/.wb-msprobe
$(MSPROBE_STAMP): $(STAMP)
	-@$(PY) -m pip freeze | grep -iE '^(numpy|pandas|torch)==' > $(VENV)/wb-constraints.txt; \
	PIP_CONSTRAINT=$(CURDIR)/$(VENV)/wb-constraints.txt timeout 900 $(PY) -m pip install -q "mindstudio-probe==26.2.0" \
	  > $(VENV)/wb-msprobe-install.log 2>&1 \
	  || echo "msprobe could not be installed: its compatibility tests will be skipped (see $(VENV)/wb-msprobe-install.log)"
	@touch $(MSPROBE_STAMP)

# Ray (the `ray` extra, for `wb compare --ray` and its tests); numpy/pandas/torch held where they are. If it
# fails, the Ray tests skip, saying why.
RAY_STAMP := $(VENV)/.wb-ray
$(RAY_STAMP): $(STAMP)
	-@$(PY) -m pip freeze | grep -iE '^(numpy|pandas|torch)==' > $(VENV)/wb-constraints.txt; \
	PIP_CONSTRAINT=$(CURDIR)/$(VENV)/wb-constraints.txt timeout 900 $(PY) -m pip install -q -e ".[test,ray]" \
	  > $(VENV)/wb-ray-install.log 2>&1 \
	  || echo "ray could not be installed: the Ray tests will be skipped (see $(VENV)/wb-ray-install.log)"
	@touch $(RAY_STAMP)

demo: install
	$(VENV)/bin/wb demo

test: install $(MSIT_STAMP) $(MSPROBE_STAMP) $(RAY_STAMP)
	@command -v tmux >/dev/null 2>&1 || (command -v apt-get >/dev/null 2>&1 && \
		(apt-get install -y -qq tmux >/dev/null 2>&1 || (apt-get update -qq >/dev/null 2>&1 && \
		apt-get install -y -qq tmux >/dev/null 2>&1)) || echo "tmux not installed: the tmux end-to-end test will be skipped")
	$(VENV)/bin/pytest -q -p no:cacheprovider

# ruff, the format check, mypy (settings in pyproject.toml), the import contracts (lint-imports, [tool.importlinter])
# and the run-time import checks (docs/architecture.md)
lint: install
	$(VENV)/bin/ruff check workbench tests bench
	$(VENV)/bin/ruff format --check workbench tests bench
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	$(VENV)/bin/pytest -q -p no:cacheprovider tests/unit/test_architecture.py

bench: install
	$(PY) bench/bench_compare.py
	$(PY) bench/bench_dump.py
	$(PY) bench/bench_metrics.py
	$(PY) bench/bench_formats_open.py
	$(PY) bench/bench_app.py
	$(PY) bench/bench_torchair.py --quick

# the GE protobuf schema (workbench/formats/proto/*.proto) compiled into the descriptor set read at import time;
# protoc from grpcio-tools in a throwaway venv (the package is not a dependency of wb)
proto:
	test -x /tmp/wb-protoc/bin/python || ($(PYTHON) -m venv /tmp/wb-protoc && /tmp/wb-protoc/bin/pip install -q grpcio-tools)
	cd workbench/formats/proto && /tmp/wb-protoc/bin/python -m grpc_tools.protoc -I. --descriptor_set_out=ge_schema.desc \
	  ge_dump.proto ge_ir.proto

clean:
	rm -rf $(VENV) wb_demo wb_out .pytest_cache
