# tests/mpi/mpi.mk -- the MPI tests and examples under mpirun (included by the Makefile).
#   make mpi-tests  tests/mpi/test_mpi under mpirun -np 4 (host and PoCL ranks; part of make test,
#                 mpi-tests-asan of make check), plus compile checks of the MPI part
#   make mpi-examples  examples/mpi_heat on 1 to 4 ranks and gpuarr-info --mpi (part of make test)

# --- the MPI examples ---------------------------------------------------------------------------
# The MPI examples (examples/mpi_heat.c: its own implementation unit, a portable kernel) need
# mpicc. mpi-examples runs them under mpirun, each rank on the host, one of PoCL's two devices or
# the fake driver's GPUs, and gpuarr-info --mpi (built with MPI where mpicc is: see the Makefile).
$(BUILD)/rel/examples/mpi_heat: examples/mpi_heat.c $(HEADERS)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_REL) $(MPI_CFLAGS) -I. $< -o $@ $(MPI_LIBS) $(LIBS)

# Each run: rank r on the (r mod count)-th device of the --device list, the field bit for bit
# equal to the one-rank run on the host, and every rank on the device it should be on.
# $(1) ranks, $(2) --device list (empty: gpuarr_mpi_device's choice, expected $(5)),
# $(3) environment, $(4) more arguments
define mpi_heat_run
	@echo "== mpirun -np $(1) examples/mpi_heat $(if $(2),--device $(2),(gpuarr_mpi_device's choice)) $(4)$(if $(3), ($(firstword $(3)) ...))"
	@$(3) timeout 300 $(MPIRUN_NP) $(1) $(BUILD)/rel/examples/mpi_heat $(if $(2),--device $(2)) $(4) > $(BUILD)/logs/mpi-heat.log 2>&1 && \
	  grep -q ": identical$$" $(BUILD)/logs/mpi-heat.log && \
	  awk -v specs="$(or $(2),$(5))" -v n=$(1) 'BEGIN { k = split(specs, s, ",") } /^rank [0-9]+: rows / { seen++; if ($$NF != s[$$2 % k + 1]) bad = 1 } \
	    END { exit bad || seen != n }' $(BUILD)/logs/mpi-heat.log || { cat $(BUILD)/logs/mpi-heat.log; exit 1; }
endef
comma := ,

.PHONY: mpi-examples
mpi-examples: $(if $(MPI_EXAMPLES_BUILD),$(BUILD)/rel/examples/mpi_heat) $(BUILD)/rel/tools/gpuarr-info $(FAKE_CUDA)
ifeq ($(MPI_EXAMPLES_BUILD),)
	@echo "== mpi-examples skipped: no mpicc (Debian: $$(tools/deps.sh --list mpi); make test installs them)"
else
	@mkdir -p $(BUILD)/logs
	$(call mpi_heat_run,1,opencl:0)
	$(call mpi_heat_run,2,host$(comma)opencl:0)
	$(call mpi_heat_run,3,host$(comma)opencl:0$(comma)opencl:1)
	$(call mpi_heat_run,4,host$(comma)opencl:0$(comma)opencl:1)
	$(call mpi_heat_run,4,opencl:1$(comma)opencl:0,GPUARR_OPENCL_UNIFIED=off,--nx 37 --ny 23 --steps 40)
	$(if $(FAKE_CUDA),$(call mpi_heat_run,3,cuda:0$(comma)opencl:0$(comma)cuda:1,$(FAKE_ENV),--steps 30))
	$(call mpi_heat_run,4,,,--nx 16 --ny 9,opencl:0$(comma)opencl:1)
	@echo "== examples/mpi_heat refuses a grid with fewer rows than ranks (exit status 2), and a device that is not there (1, naming it)"
	@timeout 60 $(MPIRUN_NP) 4 $(BUILD)/rel/examples/mpi_heat --ny 3 >/dev/null 2>&1; [ $$? = 2 ]
	@timeout 60 $(MPIRUN_NP) 2 $(BUILD)/rel/examples/mpi_heat --device host,opencl:7 > $(BUILD)/logs/mpi-heat-bad.log 2>&1; \
	  [ $$? = 1 ] && grep -q 'spec "opencl:7": no such device' $(BUILD)/logs/mpi-heat-bad.log || { cat $(BUILD)/logs/mpi-heat-bad.log; exit 1; }
	@echo "== mpirun -np 4 gpuarr-info --mpi: a row per rank, gpuarr_mpi_device's pick local rank mod 2 of PoCL's two devices"
	@timeout 120 $(MPIRUN_NP) 4 $(BUILD)/rel/tools/gpuarr-info --mpi > $(BUILD)/logs/info-mpi.txt 2>&1 && \
	  [ $$(grep -cE "^[0-9]+ " $(BUILD)/logs/info-mpi.txt) = 4 ] && \
	  for r in 0 1 2 3; do grep -qE "^$$r +[^ ]+ +$$r OMPI_COMM_WORLD_LOCAL_RANK=$$r +opencl:$$((r % 2)) +host,opencl:0,opencl:1$$" $(BUILD)/logs/info-mpi.txt || exit 1; done || \
	  { cat $(BUILD)/logs/info-mpi.txt; exit 1; }
	@timeout 120 $(MPIRUN_NP) 4 $(BUILD)/rel/tools/gpuarr-info --mpi --json > $(BUILD)/logs/info-mpi.json && \
	  $(PYTHON) -c 'import json, sys; r = json.load(open(sys.argv[1]))["ranks"]; assert [x["rank"] for x in r] == [0, 1, 2, 3], r; assert all(x["error"] is None and x["device"] == "opencl:%d" % (x["local_rank"] % 2) for x in r), r' $(BUILD)/logs/info-mpi.json
	@echo "== gpuarr-info --mpi where gpuarr_init fails on every rank: each row says why, exit status 1"
	@GPUARR_LOG=bogus timeout 120 $(MPIRUN_NP) 2 $(BUILD)/rel/tools/gpuarr-info --mpi > $(BUILD)/logs/info-mpi-bad.txt 2>&1; [ $$? = 1 ] && \
	  [ $$(grep -cE '^[01] .*gpuarr_init: GPUARR_LOG="bogus"' $(BUILD)/logs/info-mpi-bad.txt) = 2 ] || { cat $(BUILD)/logs/info-mpi-bad.txt; exit 1; }
endif
	@echo "== gpuarr-info --mpi without MPI in the build: says so, exit status 2"
	@$(MAKE) --no-print-directory $(BUILD)/rel/tools/gpuarr-info-nompi >/dev/null
	@$(BUILD)/rel/tools/gpuarr-info-nompi --mpi 2>&1 | grep -q "built without MPI" && { $(BUILD)/rel/tools/gpuarr-info-nompi --mpi 2>/dev/null; [ $$? = 2 ]; }
$(BUILD)/rel/tools/gpuarr-info-nompi: tools/gpuarr-info.c $(HEADERS)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_REL) -I. $< -o $@ $(LIBS)

# --- the MPI tests (the manual's MPI section) ---------------------------------------------------
# tests/mpi/test_mpi.c runs under mpirun, 4 ranks on 2 CPUs (--oversubscribe; --allow-run-as-root
# when root), each on its own device (host, opencl:0, opencl:1, opencl:0 discrete; then host,
# cuda:0, opencl:0, cuda:1 on the fake CUDA driver where it is built), each job
# bounded by MPI_TEST_TIMEOUT seconds; every rank must print its "0 failed" status line.
MPI_RANKS ?= 4
MPIRUN = mpirun -np $(MPI_RANKS) --oversubscribe $(if $(filter 0,$(shell id -u)),--allow-run-as-root)
MPI_TEST_TIMEOUT ?= 300
.PHONY: mpi-tests mpi-tests-asan
$(BUILD)/rel/tests/mpi/test_mpi: tests/mpi/test_mpi.c $(HEADERS)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_REL) $(MPI_CFLAGS) -I. $< -o $@ $(MPI_LIBS) $(LIBS)
$(BUILD)/asan/tests/mpi/test_mpi: tests/mpi/test_mpi.c $(HEADERS)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_ASAN) $(MPI_CFLAGS) -I. $< -o $@ $(MPI_LIBS) $(LIBS)
# $(1) flavour, $(2) environment, $(3) the ranks' devices (TEST_MPI_DEVICES), $(4) the log's name
define run_mpi_test
	@echo "== $(1): tests/mpi/test_mpi under $(MPIRUN) (ranks on $(3))"
	@$(2) TEST_MPI_DEVICES="$(3)" timeout $(MPI_TEST_TIMEOUT) $(MPIRUN) $(BUILD)/$(1)/tests/mpi/test_mpi >$(BUILD)/logs/$(4).log 2>&1 || \
	  { cat $(BUILD)/logs/$(4).log; echo "mpi-tests ($(1)): failed or timed out ($(MPI_TEST_TIMEOUT) s)"; exit 1; }
	@grep "checks, \|ended in" $(BUILD)/logs/$(4).log
	@test "$$(grep -c 'checks, 0 failed' $(BUILD)/logs/$(4).log)" = $(MPI_RANKS) || \
	  { cat $(BUILD)/logs/$(4).log; echo "mpi-tests ($(1)): not every rank reported success"; exit 1; }
	@if grep -qE $(SANITIZER_REPORT) $(BUILD)/logs/$(4).log; then cat $(BUILD)/logs/$(4).log; echo "$(1): sanitizer report in test_mpi"; exit 1; fi
endef
MPI_TEST_DEVICES := host,opencl:0,opencl:1,opencl:0/discrete
# with the fake CUDA driver (tests/fake_cuda), where cuda.h is: CUDA ranks, staged through pinned memory
MPI_TEST_DEVICES_FAKE := host,cuda:0,opencl:0,cuda:1
# tests/mpi/cuda_aware_build.c: the CUDA-aware branch compiled and linked (not run) against this
# MPI, which is not CUDA-aware; and GPUARR_MPI without <mpi.h> must stop at the header's #error.
$(BUILD)/rel/tests/mpi/cuda_aware_build: tests/mpi/cuda_aware_build.c $(HEADERS)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_REL) -DMPIX_CUDA_AWARE_SUPPORT=1 -DGPUARR__MPI_NO_EXT $(MPI_CFLAGS) -I. $< -o $@ $(MPI_LIBS) $(LIBS)
mpi-tests: $(BUILD)/rel/tests/mpi/test_mpi $(BUILD)/rel/tests/mpi/cuda_aware_build $(FAKE_CUDA)
	@mkdir -p $(BUILD)/logs
	@echo "== GPUARR_MPI defined without <mpi.h>: the header's #error"
	@printf '#define GPUARR_MPI\n#include "gpuarr.h"\n' | { ! $(CC) -std=c11 -fsyntax-only -I. -x c - 2>$(BUILD)/logs/mpi-no-header.log; } && \
	  grep -q 'include <mpi.h> before gpuarr.h' $(BUILD)/logs/mpi-no-header.log
	@echo "== the MPI part compiles warning-free with clang (C11) and g++ (C++17, Open MPI's C++ bindings off)"
	@printf '#include <mpi.h>\n#define GPUARR_MPI\n#define GPUARR_IMPLEMENTATION\n#include "gpuarr.h"\n' > $(BUILD)/logs/mpi-impl.c
	@$(CLANG) -std=c11 $(WARN) $(MPI_CFLAGS) -I. -fsyntax-only $(BUILD)/logs/mpi-impl.c
	@$(CXX) -std=c++17 $(WARN) -DOMPI_SKIP_MPICXX $(MPI_CFLAGS) -I. -fsyntax-only -x c++ $(BUILD)/logs/mpi-impl.c
	$(call run_mpi_test,rel,,$(MPI_TEST_DEVICES),rel-mpi)
	$(if $(FAKE_CUDA),$(call run_mpi_test,rel,$(FAKE_ENV),$(MPI_TEST_DEVICES_FAKE),rel-mpi-fake-cuda))
# Under ASan: Open MPI's own leaks from MPI_Init are suppressed (tools/lsan-openmpi.supp, which
# needs full stacks and Open MPI's components kept loaded), gpuarr's are reported; the test of a
# transfer longer than its time limit gets 5 s (its transfer takes 8-16 s there).
MPI_ASAN_ENV := TEST_MPI_SLOW_TIMEOUT_MS=5000 OMPI_MCA_mca_base_component_disable_dlclose=1 ASAN_OPTIONS=detect_leaks=1:fast_unwind_on_malloc=0 \
  LSAN_OPTIONS=suppressions=$(CURDIR)/tools/lsan-openmpi.supp UBSAN_OPTIONS=print_stacktrace=1
mpi-tests-asan: $(BUILD)/asan/tests/mpi/test_mpi
	@mkdir -p $(BUILD)/logs
	$(call run_mpi_test,asan,$(MPI_ASAN_ENV),$(MPI_TEST_DEVICES),asan-mpi)
