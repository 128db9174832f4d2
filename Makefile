# make run: train the default job; make test: build and run every test.
# Both install the Debian packages they need first when any is missing.
BUILD ?= build
JOBS ?= $(shell nproc)
DEB_PACKAGES := cmake make gcc pkg-config lua5.4 liblua5.4-dev libopenblas-openmp-dev

.PHONY: run test build deps bench clean install

deps:
	@missing=""; for p in $(DEB_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  if [ "$$(id -u)" = 0 ]; then sudo=""; else sudo=sudo; fi; \
	  $$sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq $$missing; \
	fi

build: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release
	cmake --build $(BUILD) -j $(JOBS)

test: build
	cd $(BUILD) && OMP_NUM_THREADS=2 ctest --output-on-failure

# make install [PREFIX=/usr/local]: ckrun, libck, ck.h, ck.pc, ck.so and the stdlib
install: build
	cmake --install $(BUILD) $(if $(PREFIX),--prefix $(PREFIX))

run: build
	$(BUILD)/ckrun scripts/train_sdxl_lora.lua

bench: build
	bash bench/kernels.sh

clean:
	rm -rf $(BUILD)
