# Two commands do everything, each with its own set-up, on a fresh Debian machine:
#   make demo   generate a small image dataset, pack it, train a CNN fed by stoker
#   make test   C++ tests (GoogleTest via CTest) and Python tests (pytest)
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
CMAKE := $(VENV)/bin/cmake
STAMPS := build/.stamps
CPP_BUILD := build/cpp
JOBS ?= 2

APT_PACKAGES := g++ pkg-config libjpeg62-turbo-dev libturbojpeg0-dev libspng-dev libgtest-dev \
                nlohmann-json3-dev libjpeg-turbo-progs
PY_PACKAGES := torch==2.13.0 nanobind scikit-build-core cmake ninja numpy tqdm pillow pytest \
               webdataset ruff

.PHONY: setup install test test-cpp test-python demo bench clean

$(STAMPS)/system:
	@missing=$$(for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing system packages: $$missing"; \
	  SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	fi
	@mkdir -p $(STAMPS) && touch $@

$(STAMPS)/python: $(STAMPS)/system Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(PY_PACKAGES)
	@touch $@

setup: $(STAMPS)/python

# Builds the wheel with scikit-build-core (incrementally, in build/wheel) and installs it.
install: setup
	$(PY) -m pip install -q --no-build-isolation --no-deps .

test-cpp: setup
	$(CMAKE) -S . -B $(CPP_BUILD) -G Ninja -DCMAKE_MAKE_PROGRAM=$(abspath $(VENV))/bin/ninja \
	  -DSTOKER_BUILD_TESTS=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo > /dev/null
	$(CMAKE) --build $(CPP_BUILD) -j $(JOBS)
	cd $(CPP_BUILD) && $(abspath $(VENV))/bin/ctest --output-on-failure -j $(JOBS)

test-python: install
	$(VENV)/bin/ruff check python tests benchmarks examples
	$(PY) -m pytest -q tests/python

test: test-cpp test-python

demo: install
	$(PY) examples/demo.py

bench: install
	$(PY) benchmarks/run.py

clean:
	rm -rf build
