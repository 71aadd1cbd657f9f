# `make demo` and `make test` do all set-up on a fresh machine. Where a CUDA torch is already importable by
# python3, the virtual environment sees it (system site packages) instead of installing the CPU build.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
DEMO_PROMPT ?= The Python interpreter

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

# No model named: the small trained model shipped in strata/data/default-model (the synthetic one, with a notice,
# where that file is absent). DEMO_MODEL=path/to/model.gguf runs another.
demo: $(VENV)/.installed
	$(VENV)/bin/strata run $(DEMO_MODEL) -p "$(DEMO_PROMPT)" -n 48 --seed 0

test: $(VENV)/.installed-test
	$(PY) -m pytest tests

clean:
	rm -rf $(VENV) models
