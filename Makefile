# The two commands: `make demo` and `make test`. Each installs missing Debian
# packages first (scripts/install-deps.sh).
JOBS ?= 2
BUILD ?= build
ASAN_BUILD ?= build-asan
RELEASE_BUILD ?= build-release
PYTHON ?= /usr/bin/python3

.PHONY: all deps build build-asan build-release test unit integration demo bench fuzz install wheel image clean

all: build

deps:
	@bash scripts/install-deps.sh

$(BUILD)/CMakeCache.txt: | deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo

$(ASAN_BUILD)/CMakeCache.txt: | deps
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DSL_SANITIZE=ON

build: deps $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j$(JOBS)

build-asan: deps $(ASAN_BUILD)/CMakeCache.txt
	cmake --build $(ASAN_BUILD) -j$(JOBS)

$(RELEASE_BUILD)/CMakeCache.txt: | deps
	cmake -S . -B $(RELEASE_BUILD) -DCMAKE_BUILD_TYPE=Release

# Compiled only: -O3 warns of things -O2 does not see (maybe-uninitialized),
# and -Werror makes them errors in a Release build.
build-release: deps $(RELEASE_BUILD)/CMakeCache.txt
	cmake --build $(RELEASE_BUILD) -j$(JOBS)

# The whole suite, twice: a normal build, then ASan + UBSan; and a Release
# build compiled, so that its warnings fail here rather than later.
test: build build-asan build-release
	bash scripts/run-tests.sh $(BUILD)
	bash scripts/run-tests.sh $(ASAN_BUILD)

demo: build
	bash scripts/demo.sh $(BUILD)

bench: build
	bash bench/run.sh $(BUILD)

# PREFIX=/usr/local (default) or any other; DESTDIR works as usual.
install: build
	cmake --install $(BUILD) $(if $(PREFIX),--prefix $(PREFIX))

# The Python package as a wheel with libsluice inside, in dist/ (pip install
# dist/sluice-*.whl; docs/python.md), from the Release build.
wheel: build-release
	bash scripts/build-wheel.sh $(RELEASE_BUILD) dist

# The OCI image sluice:<version> of this build, made with podman or buildah
# without a base image (docs/operations.md#the-image). IMAGE_TAG overrides it.
image: build
	@bash scripts/install-deps.sh
	bash scripts/make-image.sh $(BUILD) $(IMAGE_TAG)

fuzz: deps
	bash scripts/fuzz.sh

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(RELEASE_BUILD) build-fuzz var
