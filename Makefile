# Reproducible compendium: `make all` builds everything at the default profile, `make test` tests.
PYTHON_BOOT ?= python3
VENV        ?= .venv
PY          := $(VENV)/bin/python
PROFILE     ?= quick
NB          ?= afl_benchmark
ARGS        ?=

.PHONY: all setup data notebooks html book run bench test clean

all: book

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON_BOOT) -m venv $(VENV)
	$(PY) -m pip install -e ".[book,test]"
	touch $@

data: setup
	PYTHON=$(PY) bash data/get_data.sh

notebooks: data
	$(PY) -m fedlib.runner all --profile $(PROFILE)

html: setup
	$(VENV)/bin/jupyter-book build . -W --keep-going
	@echo "Book built: $(CURDIR)/_build/html/index.html"

book: notebooks
	$(MAKE) html

run: data
	$(PY) -m fedlib.runner $(NB) --profile $(PROFILE) $(ARGS)

bench: setup
	$(PY) -m fedlib.bench.afl_aggregation --out book/benchmarks/afl_aggregation.txt
	$(PY) -m fedlib.bench.stsa_gram --out book/benchmarks/stsa_gram.txt
	$(PY) -m fedlib.bench.fedtsne_speed --out book/benchmarks/fedtsne_speed.txt
	$(PY) -m fedlib.bench.refed_scoring --out book/benchmarks/refed_scoring.txt

test: data
	$(PY) -m pytest -n 2 --dist loadfile tests

clean:
	rm -rf _build book/executed
