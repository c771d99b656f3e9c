# dtrain build. `make` builds build/dtrain and libdtrain (static + shared); `make test` builds
# and runs every test (plus an ASan+UBSan run of the unit tests); `make demo` trains the
# reference MLP on Fashion-MNIST. Optional backends: MPI=0|1 (default: on when mpicc exists).

BUILD   ?= build
CC      ?= cc
SAN     ?= 0
OPT     ?= -O3 -march=native -fno-math-errno
PKG_CFLAGS := $(shell pkg-config --cflags libcjson 2>/dev/null || echo -I/usr/include/cjson)

CFLAGS  := -std=c11 -D_GNU_SOURCE -Wall -Wextra -g -fPIC -pthread -fopenmp-simd -Iinclude -Isrc $(PKG_CFLAGS) $(OPT) $(EXTRA_CFLAGS)
LDLIBS  := -lopenblas -lcjson -lz -lmvec -lm -pthread -lrt
LDLIBS  += -lsodium -lgfshare

ifeq ($(SAN),1)
  CFLAGS  += -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
  LDFLAGS += -fsanitize=address,undefined
endif

# MPI: compiled in when mpicc is found (override with MPI=0).
MPICC := $(shell command -v mpicc 2>/dev/null)
MPI   ?= $(if $(MPICC),1,0)
ifeq ($(MPI),1)
  CFLAGS += -DDT_HAVE_MPI=1 $(shell mpicc --showme:compile 2>/dev/null)
  LDLIBS += $(shell mpicc --showme:link 2>/dev/null)
endif

ALL_C    := $(wildcard src/*/*.c src/*/*/*.c)
TEST_C   := $(filter %_test.c,$(ALL_C))
CLI_C    := $(filter src/cli/%,$(filter-out $(TEST_C),$(ALL_C)))
LIB_C    := $(filter-out $(TEST_C) $(CLI_C),$(ALL_C))
LIB_O    := $(LIB_C:%.c=$(BUILD)/obj/%.o)
CLI_O    := $(CLI_C:%.c=$(BUILD)/obj/%.o)
TEST_BIN := $(patsubst %.c,$(BUILD)/tests/%,$(notdir $(TEST_C)))

.PHONY: all lib test test-unit test-asan demo clean fixtures print-ldlibs fuzz fuzz-build fuzz-bins
all: $(BUILD)/dtrain $(BUILD)/libdtrain.a $(BUILD)/libdtrain.so $(TEST_BIN)
lib: $(BUILD)/libdtrain.a $(BUILD)/libdtrain.so

$(BUILD)/obj/%.o: %.c Makefile
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/libdtrain.a: $(LIB_O)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/libdtrain.so: $(LIB_O)
	$(CC) -shared $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/dtrain: $(CLI_O) $(BUILD)/libdtrain.a
	$(CC) $(LDFLAGS) -o $@ $(CLI_O) $(BUILD)/libdtrain.a $(LDLIBS)

# each src/<module>/<name>_test.c is one test program linked against the static library
define TEST_RULE
$(BUILD)/tests/$(notdir $(1:.c=)): $(BUILD)/obj/$(1:.c=.o) $(BUILD)/libdtrain.a
	@mkdir -p $(BUILD)/tests
	$(CC) $(LDFLAGS) -o $$@ $$< $(BUILD)/libdtrain.a $(LDLIBS)
endef
$(foreach t,$(TEST_C),$(eval $(call TEST_RULE,$(t))))

# The whole suite: unit tests, integration scripts (tests/*.sh), then the sanitizer subset.
test: all
	@tests/run-tests $(BUILD); a=$$?; \
	$(MAKE) --no-print-directory test-asan; b=$$?; \
	echo "===="; tests/run-tests --total $(BUILD) build-asan && [ $$a -eq 0 ] && [ $$b -eq 0 ]

test-unit: all
	tests/run-tests $(BUILD) unit

# ASan+UBSan build in its own tree (build-asan/): every unit test and integration script.
test-asan:
	$(MAKE) --no-print-directory BUILD=build-asan SAN=1 OPT=-O1 all
	DTRAIN_SANITIZED=1 tests/run-tests build-asan

demo: 
	@scripts/install-deps
	$(MAKE) --no-print-directory $(BUILD)/dtrain
	$(BUILD)/dtrain train --data fashion-mnist --model mlp --epochs 2 --batch 32 --optimizer adam --lr 0.001

# libFuzzer targets (fuzz/fuzz_*.c: model spec, safetensors/checkpoint restore, IDX and gzip, CSV)
# built with clang, ASan and UBSan in build-fuzz/; `make fuzz FUZZ_SECONDS=N` runs each for N
# seconds (default 60) from its committed seed corpus (fuzz/corpus/NAME), failing on a crash, a
# leak or an input slower than FUZZ_TIMEOUT seconds (a hang). `make test` runs them briefly
# (tests/fuzz.sh). New crashers are saved in build-fuzz/crash-*.
FUZZ_TARGETS := spec checkpoint idx csv
FUZZ_TARGETS += fl
FUZZ_SECONDS ?= 60
FUZZ_TIMEOUT ?= 10
FUZZ_BUILD := build-fuzz
fuzz: fuzz-build
	tests/fuzz-run $(FUZZ_BUILD) $(FUZZ_SECONDS) $(FUZZ_TIMEOUT) $(FUZZ_TARGETS)

fuzz-build:
	@$(MAKE) --no-print-directory BUILD=$(FUZZ_BUILD) CC=clang SAN=1 MPI=0 OPT="-O1 -gline-tables-only" \
	  EXTRA_CFLAGS=-fsanitize=fuzzer-no-link fuzz-bins

fuzz-bins: $(FUZZ_TARGETS:%=$(BUILD)/fuzz_%)

$(BUILD)/fuzz_%: fuzz/fuzz_%.c fuzz/fuzz_common.h $(BUILD)/libdtrain.a
	$(CC) $(CFLAGS) -I. -fsanitize=fuzzer -o $@ $< $(BUILD)/libdtrain.a $(LDFLAGS) $(LDLIBS)

# `make client`: the stand-alone federated-learning client for an edge box, without MPI (and, like
# the whole build, without oneDNN): build-client/dtrain-fl-client (the fl-client command alone).
.PHONY: client
client:
	@$(MAKE) --no-print-directory BUILD=build-client MPI=0 build-client/dtrain-fl-client

$(BUILD)/dtrain-fl-client: src/cli/cmd_fl.c src/cli/flags.c $(BUILD)/libdtrain.a
	$(CC) $(CFLAGS) -DDT_FL_CLIENT_MAIN $(LDFLAGS) -o $@ src/cli/cmd_fl.c src/cli/flags.c $(BUILD)/libdtrain.a $(LDLIBS)

# Regenerates the PyTorch reference fixtures (needs Debian's python3-torch; CI does not).
fixtures:
	/usr/bin/python3 tests/ref/gen_ref.py tests/ref
	/usr/bin/python3 tests/ref/gen_gpt_ref.py tests/ref

# The libraries a program linking build/libdtrain.a needs (MPI included when built with it).
print-ldlibs:
	@echo $(LDLIBS)

clean:
	rm -rf build build-asan build-fuzz
	rm -rf build-client

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
