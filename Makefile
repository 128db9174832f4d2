# make run: train the default job; make test: build and run every test.
# Both install the Debian packages they need first when any is missing.
BUILD ?= build
JOBS ?= $(shell nproc)
DEB_PACKAGES := cmake make gcc pkg-config lua5.4 liblua5.4-dev libopenblas-openmp-dev libjansson-dev libicu-dev zlib1g-dev libpng-dev libjpeg62-turbo-dev libwebp-dev libsentencepiece-dev libtomlplusplus-dev libopenmpi-dev openmpi-bin iproute2 coinor-libcbc-dev

.PHONY: run test build deps bench clean install fuzz test-asan

deps:
	$(call need_debs,$(DEB_PACKAGES))

build: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release
	cmake --build $(BUILD) -j $(JOBS)

# two tests at a time (those that time themselves run alone: CMakeLists.txt, RUN_SERIAL)
TEST_JOBS ?= 2
test: build
	cd $(BUILD) && OMP_NUM_THREADS=2 ctest -j $(TEST_JOBS) --output-on-failure

# make install [PREFIX=/usr/local]: ckrun, libck, ck.h, ck.pc, ck.so and the stdlib
install: build
	cmake --install $(BUILD) $(if $(PREFIX),--prefix $(PREFIX))

run: build
	$(BUILD)/ckrun scripts/train_sdxl_lora.lua

bench: build
	bash bench/kernels.sh

clean:
	rm -rf $(BUILD)

# Installs the Debian packages named in $(1) that are missing.
define need_debs
	@missing=""; for p in $(1); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  if [ "$$(id -u)" = 0 ]; then sudo=""; else sudo=sudo; fi; \
	  $$sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq $$missing; \
	fi
endef

# make fuzz [FUZZ_SECONDS=60]: the libFuzzer harnesses (tests/fuzz) built with
# clang in $(FUZZ_BUILD), each run for FUZZ_SECONDS on its corpus; fails on
# any crash, leak, undefined behaviour or hang (tests/fuzz/run.sh).
FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 60
FUZZ_DEB_PACKAGES := clang libclang-rt-dev libomp-dev

fuzz: deps
	$(call need_debs,$(FUZZ_DEB_PACKAGES))
	@mkdir -p $(FUZZ_BUILD) && echo '*' > $(FUZZ_BUILD)/.gitignore
	CC=clang CXX=clang++ cmake -S . -B $(FUZZ_BUILD) -DCMAKE_BUILD_TYPE=Release -DCK_CUDA=OFF -DCK_FUZZ=ON
	cmake --build $(FUZZ_BUILD) -j $(JOBS) --target fuzz_harnesses
	bash tests/fuzz/run.sh $(FUZZ_BUILD) $(FUZZ_SECONDS)

# make test-asan [ASAN_EXCLUDE=REGEX]: every test once more with the whole
# runtime built under AddressSanitizer and UndefinedBehaviorSanitizer in
# $(ASAN_BUILD) (OpenBLAS and Lua are the system's, uninstrumented); any
# error, leak (tests/lsan.supp) or undefined behaviour fails its test.
# sh_test_install is left out: it builds a plain host against the
# instrumented libck.so, where ASan cannot come first in the link order and
# Lua's longjmp leaves stale stack poison (false reports); the same host runs
# instrumented as host_embed_asan. ASAN_EXCLUDE leaves out more (ctest -E).
ASAN_BUILD ?= build-asan
ASAN_CFLAGS := -O1 -g -fno-omit-frame-pointer -march=native -fsanitize=address,undefined -fno-sanitize-recover=all
ASAN_LDFLAGS := -fsanitize=address,undefined
ASAN_EXCLUDE ?=
ASAN_SKIP := ^sh_test_install$$$(if $(ASAN_EXCLUDE),|$(ASAN_EXCLUDE))

test-asan: deps
	@mkdir -p $(ASAN_BUILD) && echo '*' > $(ASAN_BUILD)/.gitignore
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Asan -DCK_CUDA=OFF -DCMAKE_C_FLAGS="$(ASAN_CFLAGS)" \
	  -DCMAKE_CXX_FLAGS="$(ASAN_CFLAGS)" -DCMAKE_EXE_LINKER_FLAGS="$(ASAN_LDFLAGS)" \
	  -DCMAKE_SHARED_LINKER_FLAGS="$(ASAN_LDFLAGS)" -DCMAKE_MODULE_LINKER_FLAGS="$(ASAN_LDFLAGS)"
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	cd $(ASAN_BUILD) && OMP_NUM_THREADS=2 \
	  ASAN_OPTIONS=detect_leaks=1:verify_asan_link_order=0 \
	  LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan.supp:print_suppressions=0 \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  ctest -j $(TEST_JOBS) --output-on-failure -E '$(ASAN_SKIP)'
