# Every target sets itself up: a fresh clone needs nothing but Python 3.11+ and a C compiler.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test run lint bench clean

# The compiled router modules: their .py (and .pxd) sources; an extension older than its source
# would shadow it, so every target that runs code builds them first.
COMPILED_SOURCES := $(wildcard router/*/*.pyx router/*/*.pxd) \
  $(wildcard $(patsubst %.pxd,%.py,$(wildcard router/*/*.pxd)))
BUILT := $(VENV)/.compiled

$(STAMP): pyproject.toml setup.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $(VENV)/.built-by-install
	touch $(STAMP)

# A changed .pxd rebuilds every module: the modules that cimport it embed its layouts. Right
# after an install nothing is built again: the editable install has just run build_ext in
# place (Cython took the install's own copy of its headers as newer than the C it made, and
# compiled every module a second time).
$(BUILT): $(STAMP) $(COMPILED_SOURCES)
	if [ -e $(VENV)/.built-by-install ]; then rm $(VENV)/.built-by-install; else \
	  $(BIN)/python setup.py -q build_ext --inplace \
	    $(if $(wildcard $(BUILT)),$(if $(filter %.pxd,$?),--force)); fi
	touch $(BUILT)

# The tests spend most of their time waiting on the real processes they start, so they run in
# TEST_WORKERS processes at once (pytest-xdist, each with its own PostgreSQL server; a file's
# tests in one worker, which makes its module fixtures once, and in the order tests/conftest.py
# gives: llama-server's tests last, while it builds), with the perf gates measured on a
# simulated clock; then the gates timed on the real clock run alone on the machine, as their
# ratios need (bench/conftest.py marks them machine_alone).
TEST_WORKERS ?= 2

# nginx, the peer the router's per-core gate is measured against (bench/test_nginx_gate.py):
# the one on the PATH, else Debian's package unpacked beside the venv's programs (not
# installed: nothing is started, no system file is touched). Where neither can be had, the
# other tests still run and that gate fails, saying so; the next `make` tries again.
NGINX := $(VENV)/.nginx

$(NGINX): $(STAMP)
	if command -v nginx >/dev/null || [ -x $(BIN)/nginx ]; then touch $(NGINX); else \
	  rm -rf $(VENV)/nginx-package && mkdir -p $(VENV)/nginx-package && cd $(VENV)/nginx-package \
	  && { apt-get download -q nginx 2>/dev/null || { apt-get update -q && apt-get download -q nginx; }; } \
	  && dpkg -x nginx_*.deb unpacked && cp unpacked/usr/sbin/nginx ../bin/nginx \
	  && touch ../.nginx \
	  || echo "nginx could not be fetched: bench/test_nginx_gate.py will fail" >&2; \
	fi

## test: install, build the extension, lint, run every test and perf gate
test: $(BUILT) $(NGINX)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile \
	  --no-loadscope-reorder --durations=25 -m "not machine_alone" tests bench; tests=$$?; \
	  $(BIN)/python -m pytest -q -p no:cacheprovider --durations=25 -m machine_alone bench; \
	  gates=$$?; \
	  for status in $$tests $$gates; do \
	    if [ $$status -eq 5 ]; then echo "no tests were collected" >&2; exit 1; fi; \
	  done; \
	  if [ $$tests -ne 0 ]; then exit $$tests; fi; exit $$gates

## run: install, then start a whole fleet on this machine (gpuctl up)
run: $(BUILT)
	$(BIN)/gpuctl up

lint: $(STAMP)
	$(BIN)/ruff check .

bench: $(BUILT)
	$(BIN)/python -m pytest -q bench --benchmark-columns=min,mean,ops -s

clean:
	rm -rf $(VENV) build *.egg-info router/*.c router/*.so router/*.html
