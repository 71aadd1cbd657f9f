# `make demo` and `make test` do all set-up on a fresh machine. Where a CUDA torch is already importable by
# python3, the virtual environment sees it (system site packages) instead of installing the CPU build.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
DEMO_MODEL ?= models/demo-qwen3moe-small.gguf
DEMO_PROMPT ?= The three laws of thermodynamics are

.PHONY: demo test clean

$(VENV)/.created:
	@if $(PYTHON) -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then \
		echo "using the CUDA torch already installed"; $(PYTHON) -m venv --system-site-packages $(VENV); \
	else \
		$(PYTHON) -m venv $(VENV) && $(PY) -m pip install -q --upgrade pip && $(PY) -m pip install -q torch==2.13.0; \
	fi
	touch $@

$(VENV)/.installed: $(VENV)/.created pyproject.toml
	$(PY) -m pip install -q -e .
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(PY) -m pip install -q -e '.[test]'
	touch $@

$(DEMO_MODEL): | $(VENV)/.installed
	$(VENV)/bin/strata make-model --arch qwen3moe --preset small --quant Q4_K -o $@

demo: $(VENV)/.installed $(DEMO_MODEL)
	$(VENV)/bin/strata run $(DEMO_MODEL) -p "$(DEMO_PROMPT)" -n 48 --seed 0

test: $(VENV)/.installed-test
	$(PY) -m pytest tests

clean:
	rm -rf $(VENV) models
