# Reproducible compendium: `make all` builds everything at the default profile, `make test` tests.
PYTHON_BOOT ?= python3
VENV        ?= .venv
PY          := $(VENV)/bin/python
PROFILE     ?= quick
NB          ?= afl_benchmark
ARGS        ?=
# chapters executed side by side by `make notebooks`: 2 on the 2-core default machine; one at a time
# at the paper profile (each chapter sizes itself to the whole GPU)
JOBS        ?= $(if $(filter paper,$(PROFILE)),1,2)

FLOWER      ?= afl num-clients=3

.PHONY: all setup data browser notebooks html html-student book run bench bench-paper records flower-deploy flower-simulate test clean

all: book

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON_BOOT) -m venv $(VENV)
	$(PY) -m pip install -e ".[book,test,flower]"
	touch $@

data: setup
	PYTHON=$(PY) bash data/get_data.sh

notebooks: data
	$(PY) -m fedlib.runner all --profile $(PROFILE) --jobs $(JOBS)

html: setup
	$(VENV)/bin/jupyter-book build . -W --keep-going
	@echo "Book built: $(CURDIR)/_build/html/index.html"

# the same book without the solutions of the exercises (sphinx-exercise hide_solutions), for students
html-student: setup
	$(PY) -m fedlib.runner.student . --out _build/student/html

book: notebooks
	$(MAKE) html

run: data
	$(PY) -m fedlib.runner $(NB) --profile $(PROFILE) $(ARGS)

bench: setup
	$(PY) -m fedlib.afl.bench --out book/benchmarks/afl_aggregation.txt
	$(PY) -m fedlib.bench.federated_batched --out book/benchmarks/federated_batched.txt
	$(PY) -m fedlib.stsa.bench --out book/benchmarks/stsa_gram.txt
	$(PY) -m fedlib.fedtsne.bench_speed --out book/benchmarks/fedtsne_speed.txt
	$(PY) -m fedlib.fedtsne.bench_scale --out book/benchmarks/fedtsne_scale.txt
	$(PY) -m fedlib.refed.bench --out book/benchmarks/refed_scoring.txt
	$(PY) -m fedlib.bench.extraction --out book/benchmarks/extraction.txt
	$(PY) -m fedlib.bench.flower --out book/benchmarks/flower.txt
	$(PY) -m fedlib.bench.book_time --out book/benchmarks/book_time.txt
	$(PY) -m fedlib.bench.book_time --alone fedtsne_benchmark stsa_benchmark refed_benchmark afl_benchmark

bench-paper: setup   # on a machine with a CUDA GPU: the paper profile's units there against its CPU
	$(PY) -m fedlib.bench.paper_device --device cuda --out book/benchmarks/paper_device.txt

# the recorded runs: comparisons at a converged budget, written to book/records/ (hours on a 2-core CPU)
records: data
	$(PY) -m fedlib.records afl_converged --profile quick workers=1 --split
	$(PY) -m fedlib.records refed_resolved --profile quick
	$(PY) -m fedlib.records refed_pim --profile quick
	$(PY) -m fedlib.records stsa_converged --profile quick

# a SuperLink and N SuperNodes on 127.0.0.1, the run, everything stopped: make flower-deploy FLOWER="stsa num-clients=5"
flower-deploy: data
	$(PY) -m fedlib.flower deploy $(FLOWER)

flower-simulate: data
	$(PY) -m fedlib.flower simulate $(FLOWER)

# headless Chromium for the browser tests of the built book (tests/book/test_book.py): Debian's chromium and
# chromium-driver, installed with apt-get when missing (needs root, as in CI); nothing if present
browser:
	@if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then \
	    echo "browser: chromium and chromedriver found"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "browser: installing the Debian packages chromium chromium-driver (apt-get, as root)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	        chromium chromium-driver fonts-liberation fonts-dejavu-core; \
	else \
	    echo "browser: chromium and chromedriver are missing and this is not root. Install them with" >&2; \
	    echo "    sudo apt-get update && sudo apt-get install -y chromium chromium-driver" >&2; \
	    echo "(the browser tests of tests/book/test_book.py need them; FEDLIB_CHROMIUM / FEDLIB_CHROMEDRIVER name other paths)" >&2; \
	    exit 1; \
	fi

test: data browser
	$(PY) -m pytest -n 2 --dist loadfile tests

clean:
	rm -rf _build book/executed
