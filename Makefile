# The two commands: `make studio` starts the whole Studio on the embedded default;
# `make test` installs everything and runs the whole suite.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat requirements.txt requirements-dev.txt | sha1sum | cut -c1-12)
TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/studio
TEST_REDIS_URL ?= redis://127.0.0.1:6379/11

.PHONY: install studio test lint services browser dstack bench bench-gpu bench-gpu-wheels

$(STAMP): requirements.txt requirements-dev.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -r requirements-dev.txt -c constraints.txt
	rm -f $(VENV)/.installed-*
	touch $@

install: $(STAMP)

# runstudio --check-only first: a Studio already running from var/ (or a taken STUDIO_ADDR) stops
# this one before it migrates or bootstraps anything.
studio: install
	mkdir -p var
	DEBUG=$${DEBUG:-1} $(PY) manage.py runstudio --check-only
	DEBUG=$${DEBUG:-1} $(PY) manage.py migrate --noinput
	DEBUG=$${DEBUG:-1} $(PY) manage.py bootstrapdemo
	DEBUG=$${DEBUG:-1} $(PY) manage.py runstudio

services:
	bash .ci/services.sh

# Debian's chromium for the Playwright tests (never `playwright install`: no downloads here).
browser:
	test -x /usr/bin/chromium || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null)

# The dstack server for the backend tests, in its own virtualenv (var/dstack-venv).
dstack:
	bash .ci/dstack.sh

test: install services browser dstack
	DEBUG=1 DATABASE_URL=$(TEST_DATABASE_URL) REDIS_URL=$(TEST_REDIS_URL) $(PY) -m pytest $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

# The CPU benchmarks (bench/*.py), each printing one JSON object, on their own database, Redis db
# and queue. The figures are recorded in bench/RESULTS.md.
BENCH_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/studio_bench
BENCH_REDIS_URL ?= redis://127.0.0.1:6379/14
bench: install services
	for b in dispatch ingest reads overhead; do \
	  DATABASE_URL=$(BENCH_DATABASE_URL) REDIS_URL=$(BENCH_REDIS_URL) CELERY_QUEUE=studio-bench $(PY) -m bench.$$b || exit 1; \
	done

# The GPU benchmark (bench/engine_gpu.py, under 8 minutes on an H200; tiny shapes on a CPU-only
# machine). On the device machine, where there is no .venv: `make bench-gpu PY=python3`.
bench-gpu:
	$(PY) -m bench.engine_gpu $(BENCH_GPU_ARGS)

# The trainer wheels the device machine's image lacks or holds at other versions (its python is 3.12),
# into var/gpu-wheels for the device tool's `carry`; bench/RESULTS.md "GPU (issue 8)" has the command.
GPU_WHEELS := transformers==5.24.0 trl==1.16.0 datasets==5.2.0 peft==0.21.2 tokenizers==0.23.3 dill==0.4.1 multiprocess==0.70.19 liger-kernel==0.8.5
bench-gpu-wheels:
	python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
	  -d var/gpu-wheels $(GPU_WHEELS)
