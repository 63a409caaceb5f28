# tests/fuzz/fuzz.mk -- the fuzzers and the soak (included by the Makefile).
#   make fuzz     the libFuzzer targets of tests/fuzz (api, parse, dlpack; clang), FUZZ_SECONDS each
#                 (default 60); new inputs go to build/fuzz/corpus/, `make fuzz-merge` minimizes
#                 them into tests/fuzz/corpus/ (-merge=1)
#   make fuzz-replay  the committed corpus through gcc ASan+UBSan builds (tests/fuzz/standalone.c;
#                 in make check)
#   make soak     the api interpreter's random sequences from 8 threads under ASan with faults
#                 for SOAK_MINUTES (default 30); make check runs 2 minutes of it (soak-slice; its
#                 seed is printed, a failing input kept in build/logs/soak-crash-input)
.PHONY: fuzz fuzz-build fuzz-merge fuzz-replay soak soak-slice

# --- fuzzing -------------------------------------------------------------------------------
# tests/fuzz: fuzz_api.c (an op-code interpreter over every public call, on the host, PoCL's two
# devices and the fake CUDA driver's two, with allocation faults) and fuzz_parse.c (the
# configuration parsers, white-box) and fuzz_dlpack.c (malformed tensors given to the DLPack
# imports). The clang builds
# are libFuzzer's; the gcc builds (ASan+UBSan, tests/fuzz/standalone.c as main) replay the
# committed corpus, and tests/fuzz/soak.c runs the api interpreter from 8 threads.
FUZZ_TARGETS := api parse dlpack
FUZZ_SECONDS ?= 60
SOAK_MINUTES ?= 30
# api: an input is at most 96 ops of a few bytes each; len_control=0 lets it reach them at once
FUZZ_FLAGS_api := -max_len=1024 -len_control=0
FUZZ_FLAGS_parse := -max_len=602
FUZZ_FLAGS_dlpack := -max_len=64
FUZZ_CFLAGS := -std=c11 -O1 -g $(WARN) -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all
FUZZ_DEFS = -DFUZZ_FAKE_CUDA='"$(abspath $(BUILD))/fake-cuda/libcuda.so.1"' -DFUZZ_FAKE_NVML='"$(abspath $(BUILD))/fake-nvml/libnvidia-ml.so.1"' -DFUZZ_CACHE_DIR='"$(abspath $(BUILD))/fuzz/cache"'
FUZZ_ENV := ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 LSAN_OPTIONS=suppressions=$(CURDIR)/tests/fuzz/lsan.supp \
            UBSAN_OPTIONS=print_stacktrace=1
# Where Open MPI is installed (make test installs it) the api target and the soak include the MPI
# part (GPUARR_MPI): the harness starts a one-rank MPI job itself (tests/fuzz/fuzz_api.c, op_mpi).
FUZZ_MPI_IMPL = $(if $(MPICC),-DGPUARR_MPI $(MPI_CFLAGS) -include mpi.h)
FUZZ_MPI_DEFS = $(if $(MPICC),-DFUZZ_MPI $(MPI_CFLAGS))
FUZZ_MPI_LIBS = $(if $(MPICC),$(MPI_LIBS))
$(BUILD)/fuzz/gpuarr.o: gpuarr.c $(HEADERS)
	@mkdir -p $(@D)
	$(CLANG) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link $(FUZZ_MPI_IMPL) -I. -c $< -o $@
$(BUILD)/fuzz/fuzz_api: tests/fuzz/fuzz_api.c $(BUILD)/fuzz/gpuarr.o $(FAKE_CUDA) $(FAKE_NVML)
	$(CLANG) $(FUZZ_CFLAGS) -fsanitize=fuzzer $(FUZZ_DEFS) $(FUZZ_MPI_DEFS) -I. $< $(BUILD)/fuzz/gpuarr.o -o $@ $(FUZZ_MPI_LIBS) $(LIBS)
$(BUILD)/fuzz/fuzz_parse: tests/fuzz/fuzz_parse.c $(HEADERS)
	@mkdir -p $(@D)
	$(CLANG) $(FUZZ_CFLAGS) -fsanitize=fuzzer -I. $< -o $@ $(LIBS)
$(BUILD)/fuzz/fuzz_dlpack: tests/fuzz/fuzz_dlpack.c $(BUILD)/fuzz/gpuarr.o
	$(CLANG) $(FUZZ_CFLAGS) -fsanitize=fuzzer -I. $< $(BUILD)/fuzz/gpuarr.o -o $@ $(FUZZ_MPI_LIBS) $(LIBS)
$(BUILD)/fuzz-replay/gpuarr.o: gpuarr.c $(HEADERS)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_ASAN) $(FUZZ_MPI_IMPL) -I. -c $< -o $@
$(BUILD)/fuzz-replay/fuzz_dlpack: tests/fuzz/fuzz_dlpack.c tests/fuzz/standalone.c $(BUILD)/asan/gpuarr.o
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_ASAN) -I. tests/fuzz/fuzz_dlpack.c tests/fuzz/standalone.c $(BUILD)/asan/gpuarr.o -o $@ $(LIBS)
$(BUILD)/fuzz-replay/fuzz_api: tests/fuzz/fuzz_api.c tests/fuzz/standalone.c $(BUILD)/fuzz-replay/gpuarr.o $(FAKE_CUDA) $(FAKE_NVML)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_ASAN) $(FUZZ_DEFS) $(FUZZ_MPI_DEFS) -I. tests/fuzz/fuzz_api.c tests/fuzz/standalone.c $(BUILD)/fuzz-replay/gpuarr.o -o $@ $(FUZZ_MPI_LIBS) $(LIBS)
$(BUILD)/fuzz-replay/fuzz_parse: tests/fuzz/fuzz_parse.c tests/fuzz/standalone.c $(HEADERS)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_ASAN) -I. tests/fuzz/fuzz_parse.c tests/fuzz/standalone.c -o $@ $(LIBS)
$(BUILD)/fuzz-replay/soak: tests/fuzz/soak.c tests/fuzz/fuzz_api.c $(BUILD)/fuzz-replay/gpuarr.o $(FAKE_CUDA) $(FAKE_NVML)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_ASAN) $(FUZZ_DEFS) $(FUZZ_MPI_DEFS) -I. tests/fuzz/soak.c $(BUILD)/fuzz-replay/gpuarr.o -o $@ $(FUZZ_MPI_LIBS) $(LIBS)

fuzz-build: $(addprefix $(BUILD)/fuzz/fuzz_,$(FUZZ_TARGETS))

fuzz: fuzz-build
	@set -e; for t in $(FUZZ_TARGETS); do \
	  mkdir -p $(BUILD)/fuzz/corpus/$$t $(BUILD)/fuzz/artifacts; \
	  echo "== fuzz: $$t for $(FUZZ_SECONDS) s"; \
	  $(FUZZ_ENV) nice -n 10 $(BUILD)/fuzz/fuzz_$$t -max_total_time=$(FUZZ_SECONDS) $(FUZZ_FLAGS_$$t) -timeout=120 \
	    -rss_limit_mb=6144 -print_final_stats=1 -artifact_prefix=$(BUILD)/fuzz/artifacts/$$t- \
	    $(BUILD)/fuzz/corpus/$$t tests/fuzz/corpus/$$t; \
	done

# what the fuzzer found that adds coverage, minimized into the committed corpus
fuzz-merge: fuzz-build
	@set -e; for t in $(FUZZ_TARGETS); do \
	  $(FUZZ_ENV) $(BUILD)/fuzz/fuzz_$$t -merge=1 $(FUZZ_FLAGS_$$t) tests/fuzz/corpus/$$t $(BUILD)/fuzz/corpus/$$t; \
	done

fuzz-replay: $(addprefix $(BUILD)/fuzz-replay/fuzz_,$(FUZZ_TARGETS))
	@mkdir -p $(BUILD)/logs
	@set -e; for t in $(FUZZ_TARGETS); do \
	  log=$(BUILD)/logs/fuzz-replay-$$t.log; \
	  echo "== fuzz-replay: tests/fuzz/corpus/$$t ($$(ls tests/fuzz/corpus/$$t | wc -l) inputs, gcc ASan+UBSan)"; \
	  $(FUZZ_ENV) $(BUILD)/fuzz-replay/fuzz_$$t tests/fuzz/corpus/$$t >$$log 2>&1 || { cat $$log; exit 1; }; \
	  if grep -qE $(SANITIZER_REPORT) $$log; then cat $$log; echo "fuzz-replay: sanitizer report in $$t"; exit 1; fi; \
	  tail -1 $$log; \
	done

soak: $(BUILD)/fuzz-replay/soak
	@mkdir -p $(BUILD)/logs
	@echo "== soak: the api interpreter from 8 threads for $(SOAK_MINUTES) min (ASan+UBSan, faults)"
	@$(FUZZ_ENV) FUZZ_API_CRASH_INPUT=$(BUILD)/logs/soak-crash-input nice -n 10 $(BUILD)/fuzz-replay/soak $(SOAK_MINUTES) >$(BUILD)/logs/soak.log 2>&1 || { tail -80 $(BUILD)/logs/soak.log; exit 1; }
	@if grep -qE $(SANITIZER_REPORT) $(BUILD)/logs/soak.log; then cat $(BUILD)/logs/soak.log; echo "soak: sanitizer report"; exit 1; fi
	@grep '^soak: .* sequences' $(BUILD)/logs/soak.log

# the soak's slice in make check
soak-slice:
	@$(MAKE) --no-print-directory soak SOAK_MINUTES=2
