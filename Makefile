# The two commands: `make demo` and `make test`. Each installs missing Debian
# packages first (scripts/install-deps.sh).
JOBS ?= 2
BUILD ?= build
ASAN_BUILD ?= build-asan
PYTHON ?= /usr/bin/python3

.PHONY: all deps build build-asan test unit integration demo bench fuzz install clean

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

# The whole suite, twice: a normal build, then ASan + UBSan.
test: build build-asan
	bash scripts/run-tests.sh $(BUILD)
	bash scripts/run-tests.sh $(ASAN_BUILD)

demo: build
	bash scripts/demo.sh $(BUILD)

bench: build
	bash bench/run.sh $(BUILD)

# PREFIX=/usr/local (default) or any other; DESTDIR works as usual.
install: build
	cmake --install $(BUILD) $(if $(PREFIX),--prefix $(PREFIX))

fuzz: deps
	bash scripts/fuzz.sh

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) build-fuzz var
