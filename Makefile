# gpuarr -- the two commands are `make demo` and `make test`.
#
#   make demo     build and run examples/quickstart.c on the best device found
#   make test     install the Debian packages the tests need (as root; otherwise print the
#                 apt-get line and stop), build everything, run the Criterion suite on every
#                 device class present, and the compile tests (C11 gcc/clang, C++17, .cu, the
#                 implementation at -O3 and with -flto, GPUARR_STATIC, the README's code, an
#                 installed copy used through pkg-config, CMake and libgpuarr, then uninstalled),
#                 the DLPack tests against NumPy through ctypes (a venv under build/ with NumPy
#                 from PyPI), bench-smoke (gpuarr-bench --host-isa and --csv, checked), and under
#                 mpirun the MPI tests (mpi-tests), examples/mpi_heat and gpuarr-info --mpi
#                 (mpi-examples)
#   make check    the suite under ASan+UBSan, the threaded tests under TSan, valgrind on the
#                 examples, a slice of the fault matrix, the fuzz corpus replayed (fuzz-replay)
#                 and 2 minutes of the soak (soak-slice; its seed is printed, a failing input
#                 kept in build/logs/soak-crash-input)
#   make faults   the fault matrix: every driver call of each scenario failed in turn, under
#                 ASan+UBSan (tests/faults; a slice of it runs in make check)
#   make fuzz     the libFuzzer targets of tests/fuzz (api, parse, dlpack; clang), FUZZ_SECONDS each
#                 (default 60); new inputs go to build/fuzz/corpus/, `make fuzz-merge` minimizes
#                 them into tests/fuzz/corpus/ (-merge=1)
#   make fuzz-replay  the committed corpus through gcc ASan+UBSan builds (tests/fuzz/standalone.c)
#   make soak     the api interpreter's random sequences from 8 threads under ASan with faults
#                 for SOAK_MINUTES (default 30)
#   make bench    tools/gpuarr-bench; prints a table (see bench/results/)
#   make bench-dlpack  DLPack hand-over to and from NumPy against numpy.copy (not in make test)
#   make bench-leases  gpuarr-bench --leases on PoCL's two pthread devices: lease latency, across
#                 processes, 8 workers with 1, 2, 4 and unlimited slots (not in make test)
#   make bench-plots  the size sweep (gpuarr-bench --csv) and its PNGs in bench/results/plots/
#                 (needs gnuplot-nox: installed as root, else the apt-get line; not in make test)
#   make bench-compare  gpuarr against Boost.Compute and raw OpenCL on opencl:0
#                 (needs libboost-dev, installed the same way; not in make test)
#   make bench-offload  issue 18's offload benchmark (tools/bench-offload.c): the planner's regret
#                 against the per-call oracle, always-host, always-device and the 1 MiB rule on the
#                 host and PoCL as a discrete device, and gpuarr_map on one and two PoCL devices
#                 and the host; raw output in build/bench-offload/ (bench/results/offload.md;
#                 not in make test)
#   make bench-offload-starpu  the same workload under StarPU's dmda scheduler (needs
#                 libstarpu-dev, installed the same way; not in make test)
#   make mpi-tests  tests/mpi/test_mpi under mpirun -np 4 (host and PoCL ranks; part of make test,
#                 mpi-tests-asan of make check), plus compile checks of the MPI part
#   make bench-mpi  send/recv bandwidth between 2 MPI ranks, gpuarr arrays against MPI_Send
#                 (tools/bench-mpi.c; bench/results/mpi.md; not in make test)
#   make lib      build/lib/: libgpuarr.a and libgpuarr.so.<version> (soname libgpuarr.so.<major>,
#                 links of both names and libgpuarr.so), from gpuarr.c; only gpuarr_ symbols exported
#   make install  gpuarr.h and its folders (backends/ layers/ kernels/ generated/) to
#                 $(PREFIX)/include/gpuarr (programs include
#                 <gpuarr/gpuarr.h>, or <gpuarr.h> with pkg-config's flags), the libraries to
#                 LIBDIR (default $(PREFIX)/lib), gpuarr.pc (header-only) and gpuarr-lib.pc (the
#                 library) to $(PREFIX)/share/pkgconfig, the CMake package gpuarr::gpuarr to
#                 $(PREFIX)/share/cmake/gpuarr; PREFIX defaults to /usr/local; honours DESTDIR
#   make uninstall  removes what make install put there (same PREFIX, LIBDIR and DESTDIR)
#   make clean
#
# CUDA and OpenCL are detected for the compile tests and later backends: CUDA_HOME (or
# /usr/local/cuda, or nvcc on PATH) and CL/cl.h. Nothing needs configuring.

CC        ?= cc
CXX       ?= c++
CLANG     ?= clang
PREFIX    ?= /usr/local
BUILD     := build
LIBS      := -lm -lpthread -ldl
WARN      := -Wall -Wextra -Wpedantic -Wconversion -Werror
CFLAGS_REL  := -std=c11 -O2 -g $(WARN)
CFLAGS_ASAN := -std=c11 -O1 -g $(WARN) -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
CFLAGS_TSAN := -std=c11 -O1 -g $(WARN) -fsanitize=thread
TEST_CFLAGS = -I. -Itests

# the header and the folders it includes from (see the layout in README.md)
HEADER_DIRS := backends layers kernels generated
HEADERS   := gpuarr.h $(wildcard $(addsuffix /*.h,$(HEADER_DIRS)))
# examples that need MPI are built with its flags, below (mpi-examples)
MPI_EXAMPLES := mpi_heat
EXAMPLES  := $(filter-out $(MPI_EXAMPLES),$(basename $(notdir $(wildcard examples/*.c))))
TESTS     := $(basename $(notdir $(wildcard tests/test_*.c)))
THREADED_TESTS := test_threads test_streams test_pool test_dlpack test_telemetry test_trace test_leases test_transfer_model test_transfer_model_fit \
                  test_offload
WHITEBOX_TESTS := test_registry test_internals test_opencl_limits test_telemetry_files test_lease_links test_transfer_model_fit \
                  test_offload_models
TOOLS     := gpuarr-info gpuarr-bench

# --- toolchains ---------------------------------------------------------------------------
CUDA_HOME ?= $(firstword $(wildcard /usr/local/cuda) $(patsubst %/bin/nvcc,%,$(shell command -v nvcc 2>/dev/null)))
NVCC      := $(firstword $(wildcard $(CUDA_HOME)/bin/nvcc) $(shell command -v nvcc 2>/dev/null))
HAVE_CL_H := $(wildcard /usr/include/CL/cl.h)
CUDA_H    := $(firstword $(wildcard $(CUDA_HOME)/include/cuda.h))
NVML_H    ?= $(firstword $(wildcard $(CUDA_HOME)/include/nvml.h /usr/include/nvml.h))
MPICC     := $(shell command -v mpicc 2>/dev/null)
MPI_EXAMPLES_BUILD := $(and $(MPICC),$(HAVE_CL_H))

# --- Debian packages ------------------------------------------------------------------------
MPI_PACKAGES   := libopenmpi-dev openmpi-bin
TEST_PACKAGES  := gcc g++ clang make libcriterion-dev \
                  pocl-opencl-icd ocl-icd-libopencl1 ocl-icd-opencl-dev opencl-headers \
                  python3 python3-venv cmake pkgconf $(MPI_PACKAGES)
CHECK_PACKAGES := $(TEST_PACKAGES) valgrind

.PHONY: all demo test check bench install clean deps-test deps-check info compile-tests \
        run-tests run-asan run-tsan run-valgrind kernels kernels-check cuda-kernels \
        compile-matrix install-check install-check-consumers readme-blocks faults faults-slice fuzz fuzz-build fuzz-merge fuzz-replay soak soak-slice \
        bench-plots bench-smoke python-tests

CU_EXAMPLES := $(if $(NVCC),$(basename $(notdir $(wildcard examples/*.cu))))

all: $(addprefix $(BUILD)/rel/examples/,$(EXAMPLES) $(CU_EXAMPLES) $(if $(MPI_EXAMPLES_BUILD),$(MPI_EXAMPLES))) \
     $(addprefix $(BUILD)/rel/tools/,$(TOOLS))

# .cu examples link the implementation compiled once as C (gpuarr.o), so a kernel edit
# recompiles only the .cu file
$(BUILD)/rel/examples/%: examples/%.cu $(BUILD)/rel/gpuarr.o
	@mkdir -p $(@D)
	$(NVCC) -std=c++17 -O2 -Werror all-warnings -I. $< $(BUILD)/rel/gpuarr.o -o $@ $(LIBS)

demo: $(BUILD)/rel/examples/quickstart
	@$(BUILD)/rel/examples/quickstart

info: $(BUILD)/rel/tools/gpuarr-info
	@$(BUILD)/rel/tools/gpuarr-info

# Installs the packages when root; otherwise names the exact command and stops.
define ensure_packages
	@missing=""; \
	if command -v dpkg-query >/dev/null 2>&1; then \
	  for p in $(1); do \
	    dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; \
	  done; \
	else echo "gpuarr: not a Debian system; assuming these are installed: $(1)"; fi; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "gpuarr: installing$$missing"; \
	    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing || exit 1; \
	  else \
	    echo "gpuarr: missing Debian packages. Run:"; \
	    echo "  sudo apt-get install -y$$missing"; \
	    exit 1; \
	  fi; \
	fi
endef

deps-test:
	$(call ensure_packages,$(TEST_PACKAGES))

deps-check:
	$(call ensure_packages,$(CHECK_PACKAGES))

# --- builds, one directory per flavour --------------------------------------------------------
# $(1) = flavour (rel, asan, tsan), $(2) = its CFLAGS
define flavour_rules
$(BUILD)/$(1)/gpuarr.o: gpuarr.c $(HEADERS)
	@mkdir -p $$(@D)
	$(CC) $(2) -I. -c $$< -o $$@
$(BUILD)/$(1)/examples/%: examples/%.c $(BUILD)/$(1)/gpuarr.o
	@mkdir -p $$(@D)
	$(CC) $(2) -I. $$< $(BUILD)/$(1)/gpuarr.o -o $$@ $(LIBS)
$(BUILD)/$(1)/tools/%: tools/%.c $(HEADERS)
	@mkdir -p $$(@D)
	$(CC) $(2) -I. $$< -o $$@ $(LIBS)
$(BUILD)/$(1)/tests/%: tests/%.c tests/test_common.h $(BUILD)/$(1)/gpuarr.o
	@mkdir -p $$(@D)
	$(CC) $(2) -Wno-conversion $(TEST_CFLAGS) $(TEST_INCLUDE_$(1)) $$< $(BUILD)/$(1)/gpuarr.o -o $$@ $(TEST_LIB_$(1)) $$(LINK_$$*) $(LIBS)
# white-box tests compile the implementation themselves
$(addprefix $(BUILD)/$(1)/tests/,$(WHITEBOX_TESTS)): $(BUILD)/$(1)/tests/%: tests/%.c tests/test_common.h $(HEADERS)
	@mkdir -p $$(@D)
	$(CC) $(2) -Wno-conversion $(TEST_CFLAGS) $(TEST_INCLUDE_$(1)) $$< -o $$@ $(TEST_LIB_$(1)) $(LIBS)
# tests/plugin: the implementation inside a dlopen'ed plugin, unloaded before a thread exits
$(BUILD)/$(1)/plugin/libgpuarr-plugin.so: gpuarr.c $(HEADERS)
	@mkdir -p $$(@D)
	$(CC) $(2) -fPIC -shared -I. $$< -o $$@ $(LIBS)
$(BUILD)/$(1)/plugin/plugin_driver: tests/plugin/plugin_driver.c gpuarr.h $(BUILD)/$(1)/plugin/libgpuarr-plugin.so
	@mkdir -p $$(@D)
	$(CC) $(2) -I. $$< -o $$@ $(LIBS)
endef
# Criterion cannot start under TSan (Snaipe/Criterion#274: its arena collides with TSan's shadow
# memory), so the TSan build uses tests/tsan_shim, a small stand-in with the same API that also
# runs each test in a forked child.
TEST_LIB_rel := -lcriterion
TEST_LIB_asan := -lcriterion
# tests that call OpenCL themselves (interop) link the loader; the library never does
LINK_test_opencl := -lOpenCL
LINK_test_native_order := -lOpenCL
TEST_INCLUDE_tsan := -isystem tests/tsan_shim
$(eval $(call flavour_rules,rel,$(CFLAGS_REL)))
$(eval $(call flavour_rules,asan,$(CFLAGS_ASAN)))
$(eval $(call flavour_rules,tsan,$(CFLAGS_TSAN)))

# --- the suite ------------------------------------------------------------------------------
# One suite, run on each device class: the host, and OpenCL on PoCL (installed above, so its
# absence is a failure: GPUARR_TEST_REQUIRE=1). The OpenCL-specific tests use two PoCL devices.
TEST_DEVICES ?= host opencl:0
GENERIC_TESTS := $(filter-out test_opencl test_cuda test_failures test_local_rank test_setuid $(WHITEBOX_TESTS),$(TESTS))
# ... and again on opencl:0 handled as a discrete GPU (own memory, pinned staging): the paths a
# CUDA or discrete OpenCL device takes, on PoCL. The cast tables are the same there: not rerun.
DISCRETE_TESTS := $(filter-out test_casts,$(GENERIC_TESTS))
export POCL_DEVICES ?= pthread pthread
export GPUARR_TEST_REQUIRE ?= 1

test: deps-test
	@$(MAKE) --no-print-directory all kernels-check compile-tests run-tests python-tests bench-smoke

# tests/fake_cuda: a CUDA driver that runs on the CPU and keeps the driver's contract strictly
# (deferred stream work, pinned copies at run time, context checks, PTX/cubin checks), so the
# CUDA backend's paths run in CI without a GPU. Built against cuda.h, where the toolkit is.
FAKE_CUDA := $(if $(CUDA_H),$(BUILD)/fake-cuda/libcuda.so.1)
$(BUILD)/fake-cuda/libcuda.so.1: tests/fake_cuda/fake_cuda.c tests/faults/fault_spec.h $(HEADERS)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_REL) -fPIC -shared -fvisibility=hidden -I. -I$(CUDA_HOME)/include -Wl,-soname,libcuda.so.1 $< -o $@ -lpthread -lm
# tests/fake_nvml: an NVML for the fake driver's devices (in reversed order, matched by UUID), for
# telemetry; the -old build lacks NVML's newer entry points. Needs no NVIDIA header.
FAKE_NVML := $(if $(FAKE_CUDA),$(BUILD)/fake-nvml/libnvidia-ml.so.1 $(BUILD)/fake-nvml-old/libnvidia-ml.so.1)
$(BUILD)/fake-nvml/libnvidia-ml.so.1: tests/fake_nvml/fake_nvml.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_REL) -fPIC -shared -fvisibility=hidden -Wl,-soname,libnvidia-ml.so.1 $< -o $@
$(BUILD)/fake-nvml-old/libnvidia-ml.so.1: tests/fake_nvml/fake_nvml.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_REL) -DFAKE_NVML_OLD -fPIC -shared -fvisibility=hidden -Wl,-soname,libnvidia-ml.so.1 $< -o $@
# tests/setuid: a program that starts gpuarr, which test_setuid installs setuid root in a folder
# of its own, and the library it is handed as GPUARR_OPENCL_LIBRARY
SETUID_PROBE := $(BUILD)/rel/setuid/setuid_probe $(BUILD)/rel/setuid/evil_library.so
$(BUILD)/rel/setuid/setuid_probe: tests/setuid/setuid_probe.c $(BUILD)/rel/gpuarr.o
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_REL) -I. $< $(BUILD)/rel/gpuarr.o -o $@ $(LIBS)
$(BUILD)/rel/setuid/evil_library.so: tests/setuid/evil_library.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_REL) -fPIC -shared $< -o $@
SETUID_ENV := GPUARR_TEST_SETUID_PROBE=$(abspath $(BUILD))/rel/setuid/setuid_probe \
  GPUARR_TEST_EVIL_LIBRARY=$(abspath $(BUILD))/rel/setuid/evil_library.so
# tests/fault_opencl (made below): an OpenCL library that fails chosen calls; test_opencl uses it too
FAULT_OPENCL := $(BUILD)/fault-opencl/libfault_opencl.so
FAKE_ENV := GPUARR_CUDA_LIBRARY=$(abspath $(BUILD))/fake-cuda/libcuda.so.1 GPUARR_CACHE_DIR=$(abspath $(BUILD))/fake-cuda/cache \
  GPUARR_NVML_LIBRARY=$(abspath $(BUILD))/fake-nvml/libnvidia-ml.so.1 GPUARR_TEST_FAKE_NVML_OLD=$(abspath $(BUILD))/fake-nvml-old/libnvidia-ml.so.1

run-tests: $(addprefix $(BUILD)/rel/tests/,$(TESTS)) $(FAKE_CUDA) $(FAKE_NVML) $(FAULT_OPENCL) $(SETUID_PROBE) $(BUILD)/rel/plugin/plugin_driver $(BUILD)/rel/tools/gpuarr-info \
           $(BUILD)/rel/examples/quickstart $(BUILD)/rel/examples/offload
	@set -e; for dev in $(TEST_DEVICES); do \
	  for t in $(GENERIC_TESTS); do \
	    echo "== $$t on $$dev"; \
	    GPUARR_TEST_DEVICE=$$dev $(BUILD)/rel/tests/$$t --jobs 2; \
	  done; \
	done
	@set -e; for t in $(DISCRETE_TESTS); do \
	  echo "== $$t on opencl:0 handled as a discrete device (GPUARR_OPENCL_UNIFIED=off: staged copies)"; \
	  GPUARR_OPENCL_UNIFIED=off GPUARR_TEST_DEVICE=opencl:0 $(BUILD)/rel/tests/$$t --jobs 2; \
	done
	@set -e; for t in $(WHITEBOX_TESTS); do echo "== $$t (white-box)"; $(BUILD)/rel/tests/$$t --jobs 2; done
	@echo "== test_opencl (POCL_DEVICES=\"$$POCL_DEVICES\")"
	@GPUARR_TEST_FAULT_OPENCL=$(abspath $(FAULT_OPENCL)) $(BUILD)/rel/tests/test_opencl --jobs 2
	@echo "== test_trace on opencl:0 whose markers report a wrong end (as NVIDIA's OpenCL did): host times instead"
	@GPUARR_OPENCL_LIBRARY=$(abspath $(FAULT_OPENCL)) FAULT_OPENCL_PROFILING=marker-end-far GPUARR_TEST_DEVICE=opencl:0 \
	  $(BUILD)/rel/tests/test_trace --filter 'trace/events_nest*' --jobs 2
	@echo "== test_local_rank: \"local\" over PoCL's two devices, 4 processes on 1 slot each (then with the fake driver's GPUs too)"
	@$(BUILD)/rel/tests/test_local_rank --jobs 2
	@$(if $(FAKE_CUDA),$(FAKE_ENV) $(BUILD)/rel/tests/test_local_rank --jobs 2)
	@echo "== test_setuid: a setuid-root copy of tests/setuid/setuid_probe run as nobody ignores GPUARR_TRACE and GPUARR_OPENCL_LIBRARY (skips, saying why, when not root)"
	@$(SETUID_ENV) $(BUILD)/rel/tests/test_setuid --jobs 1
	@echo "== test_cuda (its GPU tests skip, saying why, where there is no GPU)"
	@$(BUILD)/rel/tests/test_cuda --jobs 2
	@set -e; if $(BUILD)/rel/tools/gpuarr-info | grep -q "^cuda:0 "; then \
	  for t in $(GENERIC_TESTS); do echo "== $$t on cuda:0"; GPUARR_TEST_DEVICE=cuda:0 $(BUILD)/rel/tests/$$t --jobs 2; done; \
	else echo "== the suite on cuda:0 skipped: $$($(BUILD)/rel/tools/gpuarr-info --find cuda:0)"; fi
	@set -e; if [ -n "$(FAKE_CUDA)" ]; then \
	  for t in $(GENERIC_TESTS); do echo "== $$t on cuda:0 of the fake driver (tests/fake_cuda)"; \
	    $(FAKE_ENV) GPUARR_TEST_DEVICE=cuda:0 $(BUILD)/rel/tests/$$t --jobs 2; done; \
	  echo "== test_internals on the fake driver (the backend procs on cuda:0)"; \
	  $(FAKE_ENV) $(BUILD)/rel/tests/test_internals --jobs 2; \
	  echo "== test_telemetry_files on the fake driver and fake NVML (an OpenCL device linked to cuda:1)"; \
	  $(FAKE_ENV) $(BUILD)/rel/tests/test_telemetry_files --jobs 2; \
	  echo "== test_lease_links on the fake driver (leases across a GPU's CUDA and OpenCL views)"; \
	  $(FAKE_ENV) $(BUILD)/rel/tests/test_lease_links --jobs 2; \
	  echo "== test_cuda on the fake driver: two GPUs with peer access, then without"; \
	  $(FAKE_ENV) $(BUILD)/rel/tests/test_cuda --jobs 2; \
	  $(FAKE_ENV) FAKE_CUDA_PEER=0 $(BUILD)/rel/tests/test_cuda --jobs 2; \
	  echo "== test_roundtrip on the fake driver, its PTX refused as too new: kernels from NVRTC"; \
	  $(FAKE_ENV) FAKE_CUDA_PTX_MAX_ISA=6.0 GPUARR_TEST_DEVICE=cuda:0 $(BUILD)/rel/tests/test_roundtrip --jobs 2; \
	else echo "== the fake CUDA driver skipped: no cuda.h (CUDA_HOME=$(CUDA_HOME))"; fi
	@echo "== test_failures: sticky errors on the fake driver's two GPUs (its tests skip, saying why, without it), a lost device on PoCL's two (tests/fault_opencl)"
	@$(if $(FAKE_CUDA),$(FAKE_ENV)) GPUARR_TEST_FAULT_OPENCL=$(abspath $(FAULT_OPENCL)) $(BUILD)/rel/tests/test_failures --jobs 2
	@echo "== the library in a dlopen'ed plugin, unloaded before its worker thread exits"
	@$(if $(FAKE_CUDA),$(FAKE_ENV)) $(BUILD)/rel/plugin/plugin_driver $(BUILD)/rel/plugin/libgpuarr-plugin.so
	@echo "== gpuarr-info lists the OpenCL devices"
	@$(BUILD)/rel/tools/gpuarr-info | grep -q "^opencl:1 " || { $(BUILD)/rel/tools/gpuarr-info; exit 1; }
	@echo "== gpuarr-info --models prints the transfer models and a task model gpuarr_offload kept (the README's program, a cache folder of its own)"
	@rm -rf $(BUILD)/logs/models && mkdir -p $(BUILD)/logs && GPUARR_CACHE_DIR=$(abspath $(BUILD))/logs/models $(BUILD)/rel/examples/offload >/dev/null && \
	  GPUARR_CACHE_DIR=$(abspath $(BUILD))/logs/models $(BUILD)/rel/tools/gpuarr-info --models > $(BUILD)/logs/models.txt && \
	  grep -q "^task widen on host: t = " $(BUILD)/logs/models.txt && \
	  { ! $(BUILD)/rel/tools/gpuarr-info | grep -q "^opencl:0 " || grep -q "^host -> opencl:0 .*latency" $(BUILD)/logs/models.txt; } || \
	  { GPUARR_CACHE_DIR=$(abspath $(BUILD))/logs/models $(BUILD)/rel/tools/gpuarr-info --models; exit 1; }
	@echo "== gpuarr-info --find local: local rank 3 on PoCL's two devices is opencl:1"
	@test "$$(OMPI_COMM_WORLD_LOCAL_RANK=3 GPUARR_DEVICES=host,opencl $(BUILD)/rel/tools/gpuarr-info --find local)" = opencl:1
	@echo "== gpuarr-info --leases lists every slot (GPUARR_SLOTS=host=2, a folder of its own)"
	@rm -rf $(BUILD)/logs/leases && GPUARR_LEASE_DIR=$(abspath $(BUILD))/logs/leases GPUARR_SLOTS=host=2 $(BUILD)/rel/tools/gpuarr-info --leases | grep -q "^host slot 1: free$$"
	@echo "== gpuarr-info --watch 0.1 --count 2 --json: a JSON line per device per tick (tools/check-watch-json.py)"
	@$(PYTHON) tools/check-watch-json.py $(BUILD)/rel/tools/gpuarr-info
	@$(if $(FAKE_CUDA),echo "== the same on the fake driver with the fake NVML" && $(FAKE_ENV) $(PYTHON) tools/check-watch-json.py $(BUILD)/rel/tools/gpuarr-info)
	@$(MAKE) --no-print-directory mpi-examples
	@echo "== GPUARR_TRACE on examples/quickstart: tests/python/check_trace.py validates the file"
	@mkdir -p $(BUILD)/logs && GPUARR_TRACE=$(abspath $(BUILD))/logs/quickstart-trace.json $(BUILD)/rel/examples/quickstart >/dev/null
	@$(PYTHON) tests/python/check_trace.py $(BUILD)/logs/quickstart-trace.json --expect alloc --expect free
	@$(MAKE) --no-print-directory mpi-tests
	@echo "make test: all suites passed on: $(TEST_DEVICES), opencl:0 as a discrete device, two PoCL devices, the fake CUDA driver, CUDA where present, and 4 MPI ranks"

# --- MPI examples and gpuarr-info --mpi (issue 19) ---------------------------------------------
# gpuarr-info is built with GPUARR_MPI and Open MPI's flags (MPI_CFLAGS, MPI_LIBS below) where
# mpicc is found (its --mpi; MPI_Init only then), without elsewhere; a stamp rebuilds it when that
# changes. The MPI examples (examples/mpi_heat.c: its own implementation unit, an OpenCL kernel)
# need mpicc and CL/cl.h. mpi-examples runs them under mpirun, each rank on the host or one of
# PoCL's two devices.
MPIRUN_NP = mpirun --oversubscribe $(if $(filter 0,$(shell id -u)),--allow-run-as-root) -np
MPI_STAMP := $(BUILD)/rel/mpi-$(if $(MPICC),yes,no).stamp
$(MPI_STAMP):
	@mkdir -p $(@D) && rm -f $(BUILD)/rel/mpi-*.stamp && touch $@
$(BUILD)/rel/tools/gpuarr-info: tools/gpuarr-info.c $(HEADERS) $(MPI_STAMP)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_REL) $(if $(MPICC),-DGPUARR_MPI $(MPI_CFLAGS)) -I. $< -o $@ $(if $(MPICC),$(MPI_LIBS)) $(LIBS)
# -ffp-contract=off: the host stencil rounds as the OpenCL kernel does (no fused multiply-add)
$(BUILD)/rel/examples/mpi_heat: examples/mpi_heat.c $(HEADERS)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_REL) -ffp-contract=off $(MPI_CFLAGS) -I. $< -o $@ $(MPI_LIBS) -lOpenCL $(LIBS)

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
	@echo "== mpi-examples skipped: $(if $(MPICC),no CL/cl.h,no mpicc) (Debian: $(MPI_PACKAGES) ocl-icd-opencl-dev; make test installs them)"
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

# DLPack against NumPy (tests/python/test_numpy.py, examples/numpy_interop.py): libgpuarr.so
# loaded with ctypes by Debian's Python, in a virtual environment under build/ with NumPy >= 2.1
# from PyPI (made once; `make clean` removes it). The round trips go through opencl:0 (PoCL).
# Debian has no dlpack.h: the official one comes from the apache-tvm-ffi wheel (only its header
# is used), and tests/compile/dlpack_abi.c is built with it included before gpuarr.h.
PYTHON ?= $(firstword $(wildcard /usr/bin/python3) python3)
VENV   := $(BUILD)/venv
DLPACK_H_WHEEL := apache-tvm-ffi==0.1.15.post2
$(VENV)/numpy-installed:
	@rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --disable-pip-version-check 'numpy>=2.1'
	$(VENV)/bin/pip install -q --disable-pip-version-check --no-deps '$(DLPACK_H_WHEEL)'
	@touch $@
python-tests: $(VENV)/numpy-installed $(BUILD)/lib/libgpuarr.so
	@inc=$$(ls -d $(VENV)/lib/python3*/site-packages/tvm_ffi/include | head -1); \
	  [ -f "$$inc/dlpack/dlpack.h" ] || { echo "python-tests: no dlpack/dlpack.h in $(DLPACK_H_WHEEL)"; exit 1; }; \
	  $(CC) -std=c11 $(WARN) -DGPUARR_TEST_REAL_DLPACK -I$$inc -I. tests/compile/dlpack_abi.c -o $(BUILD)/compile/dlpack-abi-official $(LIBS) && \
	  $(CXX) -std=c++17 $(WARN) -x c++ -DGPUARR_TEST_REAL_DLPACK -I$$inc -I. tests/compile/dlpack_abi.c -o $(BUILD)/compile/dlpack-abi-official-cxx $(LIBS) && \
	  $(BUILD)/compile/dlpack-abi-official && $(BUILD)/compile/dlpack-abi-official-cxx
	@echo "== tests/python/test_numpy.py: DLPack with NumPy $$($(VENV)/bin/python -c 'import numpy; print(numpy.__version__)') through ctypes"
	@GPUARR_LIB=$(abspath $(BUILD))/lib/libgpuarr.so GPUARR_PY_DEVICE=opencl:0 $(VENV)/bin/python tests/python/test_numpy.py
	@echo "== examples/numpy_interop.py on opencl:0"
	@$(VENV)/bin/python examples/numpy_interop.py $(abspath $(BUILD))/lib/libgpuarr.so opencl:0

# `make bench-dlpack`: the DLPack hand-over through ctypes against numpy.copy of the same bytes
# (tools/bench-dlpack.py; bench/results/dlpack.md). Not part of make test.
.PHONY: bench-dlpack
bench-dlpack: $(VENV)/numpy-installed $(BUILD)/lib/libgpuarr.so
	GPUARR_LIB=$(abspath $(BUILD))/lib/libgpuarr.so $(VENV)/bin/python tools/bench-dlpack.py

# The device kernels are compiled from kernels/gpuarr_kernels.h, embedded as text in
# generated/gpuarr_kernels_source.h: regenerate with `make kernels`; the test fails when stale.
kernels:
	tools/embed-kernels.sh > generated/gpuarr_kernels_source.h

# The CUDA kernels also come as committed PTX (generated/gpuarr_cuda_ptx.h, made by NVRTC from the
# same text): `make cuda-kernels` remakes it; the test fails when it is stale, and where the
# toolkit is, ptxas verifies every module and NVRTC compiles every pair for the newest GPUs.
kernels-check: $(BUILD)/rel/tools/cuda-ptx
	@tools/embed-kernels.sh | cmp -s - generated/gpuarr_kernels_source.h || \
	  { echo "generated/gpuarr_kernels_source.h is stale: run 'make kernels'"; exit 1; }
	@rm -rf $(BUILD)/cuda-ptx && mkdir -p $(BUILD)/cuda-ptx && $(BUILD)/rel/tools/cuda-ptx --check $(BUILD)/cuda-ptx
ifneq ($(NVCC),)
	@for f in $(BUILD)/cuda-ptx/*.ptx; do $(CUDA_HOME)/bin/ptxas -arch=sm_75 $$f -o /dev/null || { echo "ptxas refused $$f"; exit 1; }; done
	@$(BUILD)/rel/tools/cuda-ptx --nvrtc sm_90
	@echo "CUDA kernels: the committed PTX is current and ptxas accepts all of it (ISA 7.0, sm_75)"
else
	@echo "CUDA kernels: the committed PTX is current (ptxas and NVRTC checks skipped: no CUDA toolkit)"
endif

cuda-kernels: $(BUILD)/rel/tools/cuda-ptx
	$(BUILD)/rel/tools/cuda-ptx > $(BUILD)/gpuarr_cuda_ptx.h && mv $(BUILD)/gpuarr_cuda_ptx.h generated/gpuarr_cuda_ptx.h

# The header as users compile it: C11 with gcc and clang, C++17, a .cu file, two translation
# units, the implementation after a plain include, the all-or-none allocator rule, and the
# implementation's POSIX calls whatever came before it (an #error where they would be hidden).
# Then the optimizer matrix, the README's code blocks and an installed copy (below).
POSIX_CALLS_USED = nm -u $(1) | grep -q clock_gettime && nm -u $(1) | grep -q madvise && ! nm -u $(1) | grep -q timespec_get || \
  { echo "compile test: $(1) should call clock_gettime and madvise, not timespec_get:"; nm -u $(1) | grep -E 'clock_gettime|madvise|timespec_get'; exit 1; }
compile-tests: compile-matrix readme-blocks install-check
	@mkdir -p $(BUILD)/compile
	@if $(CC) -std=c11 -I. -c tests/compile/libc_first.c -o $(BUILD)/compile/never.o 2>$(BUILD)/compile/libc-first.err; then \
	  echo "compile test: the implementation after <stdio.h> in strict ISO mode should stop with an #error"; exit 1; fi
	@grep -q "define _DEFAULT_SOURCE" $(BUILD)/compile/libc-first.err || { cat $(BUILD)/compile/libc-first.err; exit 1; }
	$(CC) -std=c11 $(WARN) -D_DEFAULT_SOURCE -I. tests/compile/libc_first.c -o $(BUILD)/compile/libc-first $(LIBS)
	$(CC) -std=c11 $(WARN) -I. tests/compile/compile_c.c -o $(BUILD)/compile/c11-gcc $(LIBS)
	$(CLANG) -std=c11 $(WARN) -I. tests/compile/compile_c.c -o $(BUILD)/compile/c11-clang $(LIBS)
	$(CXX) -std=c++17 $(WARN) -I. tests/compile/compile_cpp.cc -o $(BUILD)/compile/cxx17 $(LIBS)
	$(CC) -std=c11 $(WARN) -I. tests/compile/two_units_a.c tests/compile/two_units_b.c -o $(BUILD)/compile/two-units $(LIBS)
	$(CC) -std=c11 $(WARN) -I. tests/compile/custom_malloc.c -o $(BUILD)/compile/custom-malloc $(LIBS)
	@if $(CC) -std=c11 -I. -c tests/compile/malloc_without_free.c -o $(BUILD)/compile/never.o 2>/dev/null; then \
	  echo "compile test: GPUARR_MALLOC without GPUARR_FREE should not compile"; exit 1; fi
	@if $(CC) -std=c11 -ffast-math -I. -c tests/compile/compile_c.c -o $(BUILD)/compile/never.o 2>/dev/null; then \
	  echo "compile test: the implementation should refuse -ffast-math"; exit 1; fi
	$(CC) -std=c11 $(WARN) -I. tests/compile/opencl_decls.c -o $(BUILD)/compile/opencl-decls $(LIBS)
	$(CC) -std=c11 $(WARN) -DGPUARR_NO_RUNTIME_LINKING -DGPUARR_NO_CUDA -I. tests/compile/compile_c.c -o $(BUILD)/compile/linked-opencl -lOpenCL $(LIBS)
	$(CC) -std=c11 $(WARN) -DGPUARR_NO_OPENCL -I. tests/compile/compile_c.c -o $(BUILD)/compile/no-opencl $(LIBS)
	$(CC) -std=c11 $(WARN) -DGPUARR_NO_CUDA -DGPUARR_NO_OPENCL -I. tests/compile/compile_c.c -o $(BUILD)/compile/host-only $(LIBS)
	$(CC) -std=c11 $(WARN) -I. tests/compile/dlpack_abi.c -o $(BUILD)/compile/dlpack-abi $(LIBS)
	@# the official header, where the machine has it (Debian does not package it)
	@if echo '#include <dlpack/dlpack.h>' | $(CC) -E -x c - >/dev/null 2>&1; then \
	  $(CC) -std=c11 $(WARN) -DGPUARR_TEST_REAL_DLPACK -I. tests/compile/dlpack_abi.c -o $(BUILD)/compile/dlpack-abi-real $(LIBS) && \
	  $(BUILD)/compile/dlpack-abi-real; else echo "compile test: <dlpack/dlpack.h> not found: DLPack ABI checked by offsets only"; fi
	@for p in c11-gcc c11-clang cxx17 two-units custom-malloc opencl-decls linked-opencl no-opencl host-only dlpack-abi; do $(BUILD)/compile/$$p || exit 1; done
	@# each backend header is read once by the implementation
	@for h in host cuda opencl; do n=$$($(CC) -std=c11 -E -DGPUARR_IMPLEMENTATION -I. -x c gpuarr.h | grep -c "^# 1 \"\(\./\)\?backends/gpuarr_$$h.h\""); \
	  [ "$$n" = 1 ] || { echo "compile test: the implementation reads backends/gpuarr_$$h.h $$n times (once is right)"; exit 1; }; done
	@# adding a backend takes what the top of gpuarr.h says: a toy one, with those lines added to a copy
	@mkdir -p $(BUILD)/compile/toy
	@sed -e 's/^\(#define GPUARR_BACKEND_LIST(X) .*\)$$/\1 X(TOY, "toy")/' \
	  -e 's/^GPUARR_API gpuarr_result gpuarr_cuda_wrap_stream(.*;$$/&\nGPUARR_API gpuarr_result gpuarr_toy_answer(gpuarr_device d, int *out); \/* 42 on a toy device *\//' \
	  -e 's/^#define GPUARR__INTEROP_HOST(X)$$/&\n#define GPUARR__INTEROP_TOY(X) X(TOY, toy_answer, (gpuarr_device d, int *out), (d, out))/' \
	  -e 's|^#include "backends/gpuarr_host.h"$$|&\n#ifndef GPUARR_NO_TOY\n#include "backends/gpuarr_toy.h"\n#else\n#define GPUARR__BACKEND_FILL_TOY NULL\n#endif|' \
	  gpuarr.h > $(BUILD)/compile/toy/gpuarr.h
	@[ $$(diff gpuarr.h $(BUILD)/compile/toy/gpuarr.h | grep -c '^>') = 8 ] || { echo "compile test: the toy backend's lines did not all go into the copy of gpuarr.h"; exit 1; }
	$(CC) -std=c11 $(WARN) -I$(BUILD)/compile/toy -I. -Itests/compile/toy tests/compile/toy_backend.c -o $(BUILD)/compile/toy-backend $(LIBS)
	$(CC) -std=c11 $(WARN) -DGPUARR_NO_TOY -I$(BUILD)/compile/toy -I. -Itests/compile/toy tests/compile/toy_backend.c -o $(BUILD)/compile/toy-backend-left-out $(LIBS)
	@$(BUILD)/compile/toy-backend && $(BUILD)/compile/toy-backend-left-out
	@for p in c11-gcc c11-clang libc-first two-units; do $(call POSIX_CALLS_USED,$(BUILD)/compile/$$p); done
ifneq ($(NVCC),)
	$(NVCC) -std=c++17 -Werror all-warnings -I. tests/compile/compile_cu.cu -o $(BUILD)/compile/cu $(LIBS)
	@$(BUILD)/compile/cu
	$(CC) -std=c11 $(WARN) -I. -I$(CUDA_HOME)/include -c tests/compile/cuda_decls.c -o $(BUILD)/compile/cuda-decls.o
	$(CLANG) -std=c11 $(WARN) -I. -I$(CUDA_HOME)/include -c tests/compile/cuda_decls.c -o $(BUILD)/compile/cuda-decls-clang.o
	@# linked, not run: the toolkit's stub stands in for the driver at link time only
	$(CC) -std=c11 $(WARN) -DGPUARR_NO_RUNTIME_LINKING -DGPUARR_NO_OPENCL -I. -I$(CUDA_HOME)/include tests/compile/compile_c.c \
	  -o $(BUILD)/compile/linked-cuda -L$(CUDA_HOME)/lib64/stubs -lcuda $(LIBS)
	@echo "compile tests: CUDA declarations match <cuda.h> and <nvrtc.h>; -lcuda links"
else
	@echo "compile test: .cu and CUDA declarations skipped: nvcc not found (set CUDA_HOME)"
endif
	@# NVML's header is in neither Debian nor the toolkit's default install: NVML_H=path/to/nvml.h
ifneq ($(NVML_H),)
	$(CC) -std=c11 $(WARN) -I. -isystem $(dir $(NVML_H)) -c tests/compile/nvml_decls.c -o $(BUILD)/compile/nvml-decls.o
	$(CLANG) -std=c11 $(WARN) -I. -isystem $(dir $(NVML_H)) -c tests/compile/nvml_decls.c -o $(BUILD)/compile/nvml-decls-clang.o
	@echo "compile tests: NVML declarations match $(NVML_H)"
else
	@echo "compile test: NVML declarations not checked: no nvml.h (NVML_H=path/to/nvml.h to check them)"
endif
	@echo "compile tests passed"

# The implementation under the optimizer and modes users build it with: warnings such as
# -Wmaybe-uninitialized come from the optimizer, so each level finds its own. -O0 is covered by
# compile-tests above and gcc -O2 by the build (CFLAGS_REL); here gcc -O3, clang -O2 and -O3,
# g++ -O3, gcc -O3 -flto linked and run, and GPUARR_STATIC. One target per variant, compile only
# where that suffices: `make -j2 compile-matrix` runs them side by side.
MATRIX_WARN := $(WARN) -Wredundant-decls
MATRIX := gcc-O3.o clang-O2.o clang-O3.o gxx-O3.o lto static-api
compile-matrix: $(addprefix $(BUILD)/matrix/,$(MATRIX))
	@echo "compile matrix: gcc -O3, clang -O2/-O3, g++ -O3, gcc -O3 -flto, GPUARR_STATIC: no warnings"
$(BUILD)/matrix/gcc-O3.o: gpuarr.c $(HEADERS)
	@mkdir -p $(@D)
	$(CC) -std=c11 -O3 $(MATRIX_WARN) -I. -c $< -o $@
$(BUILD)/matrix/clang-%.o: gpuarr.c $(HEADERS)
	@mkdir -p $(@D)
	$(CLANG) -std=c11 -$* $(MATRIX_WARN) -I. -c $< -o $@
$(BUILD)/matrix/gxx-O3.o: gpuarr.c $(HEADERS)
	@mkdir -p $(@D)
	$(CXX) -std=c++17 -O3 $(MATRIX_WARN) -I. -x c++ -c $< -o $@
$(BUILD)/matrix/lto: gpuarr.c tests/compile/lto_main.c $(HEADERS)
	@mkdir -p $(@D)
	$(CC) -std=c11 -O3 -flto=auto $(MATRIX_WARN) -I. gpuarr.c tests/compile/lto_main.c -o $@ $(LIBS)
	$@
$(BUILD)/matrix/static-api: tests/compile/static_api.c $(HEADERS)
	@mkdir -p $(@D)
	$(CC) -std=c11 $(MATRIX_WARN) -I. $< -o $@ $(LIBS)
	@if nm $@ | grep -q ' T gpuarr_'; then echo "compile test: GPUARR_STATIC left public functions global:"; nm $@ | grep ' T gpuarr_' | head -3; exit 1; fi
	$@

# Every ```c block of README.md compiles (programs also link and run): tools/readme-blocks.sh
# says how a block is taken.
# Blocks with <mpi.h> link the implementation built with GPUARR_MPI and run on 2 ranks.
readme-blocks: $(BUILD)/rel/gpuarr.o $(if $(MPICC),$(BUILD)/rel/gpuarr-mpi.o)
	@CC="$(CC)" LIBS="$(LIBS)" $(if $(MPICC),MPI_CFLAGS="$(MPI_CFLAGS)" MPI_LIBS="$(MPI_LIBS)" MPI_IMPL=$(BUILD)/rel/gpuarr-mpi.o MPIRUN="$(MPIRUN_NP)") \
	  tools/readme-blocks.sh README.md $(BUILD)/readme $(BUILD)/rel/gpuarr.o
$(BUILD)/rel/gpuarr-mpi.o: gpuarr.c $(HEADERS)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_REL) -DGPUARR_MPI $(MPI_CFLAGS) -include mpi.h -I. -c $< -o $@

# `make install` into a scratch DESTDIR (PREFIX=/usr), and programs built against that alone: one
# with only its include directory, then tests/install/check.sh (pkg-config, CMake, libgpuarr
# shared and static); then `make uninstall` must leave no file or link there.
INSTALL_CHECK := $(BUILD)/install-check
INSTALL_DEST  := $(abspath $(INSTALL_CHECK))/destdir
INSTALL_VARS  := DESTDIR=$(INSTALL_DEST) PREFIX=/usr LIBDIR=/usr/lib
install-check:
	@rm -rf $(INSTALL_CHECK)
	@# the version is typed once (GPUARR_VERSION_STRING); the manual's first line must agree
	@grep -q '^ \* Version $(VERSION)\. ' gpuarr.h || { echo "install check: the top of gpuarr.h does not say 'Version $(VERSION).'"; exit 1; }
	@$(MAKE) --no-print-directory install $(INSTALL_VARS) >/dev/null
	$(CC) -std=c11 $(WARN) -I$(INSTALL_DEST)/usr/include tests/compile/installed.c -o $(INSTALL_CHECK)/installed $(LIBS)
	@$(INSTALL_CHECK)/installed
	@$(MAKE) --no-print-directory install-check-consumers $(INSTALL_VARS)
	@$(MAKE) --no-print-directory uninstall $(INSTALL_VARS) >/dev/null
	@left=$$(find $(INSTALL_DEST) -type f -o -type l -o -name '*gpuarr*'); [ -z "$$left" ] || \
	  { echo "install check: make uninstall left:"; echo "$$left"; exit 1; }
	@echo "install check: make uninstall removed every file and link make install made, and its gpuarr directories"
install-check-consumers:
	@CC="$(CC)" CFLAGS="-std=c11 $(WARN)" LIBS="$(LIBS)" DESTDIR=$(DESTDIR) PREFIX=$(PREFIX) VERSION=$(VERSION) \
	  LIBDIR=$(LIBDIR) PKGCONFIGDIR=$(PKGCONFIGDIR) LIBPKGCONFIGDIR=$(LIBPKGCONFIGDIR) CMAKEDIR=$(CMAKEDIR) LIB_OBJ=$(LIB_BUILD)/gpuarr.o \
	  LIB_A=$(LIB_A) LIB_REAL=$(LIB_REAL) LIB_SONAME=$(LIB_SONAME) LIB_SO=$(LIB_SO) \
	  tests/install/check.sh $(INSTALL_CHECK)

# --- the fault matrix (tests/faults): a failure at every driver call --------------------------
# tests/fault_opencl: an OpenCL library that forwards to the real loader and fails the Nth call
# (FAULT_OPENCL_FAIL); the fake CUDA driver does the same (FAKE_CUDA_FAIL). The matrix runs under
# ASan+UBSan, a fresh process per N. `make faults` walks every N of every scenario; `make
# faults-slice` (in `make check`) every 7th N.
$(FAULT_OPENCL): tests/fault_opencl/fault_opencl.c tests/faults/fault_spec.h
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_REL) -fPIC -shared -fvisibility=hidden $< -o $@ -ldl -lpthread
$(BUILD)/asan/faults/fault_matrix: tests/faults/fault_matrix.c $(BUILD)/asan/gpuarr.o
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_ASAN) -I. $< $(BUILD)/asan/gpuarr.o -o $@ $(LIBS)
FAULT_ENV := GPUARR_CUDA_LIBRARY=$(abspath $(BUILD))/fake-cuda/libcuda.so.1 GPUARR_OPENCL_LIBRARY=$(abspath $(FAULT_OPENCL)) \
  GPUARR_CACHE_DIR=$(abspath $(BUILD))/faults/cache ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1
FAULT_MATRIX_DEPS := $(FAKE_CUDA) $(FAULT_OPENCL) $(BUILD)/asan/faults/fault_matrix

faults: $(FAULT_MATRIX_DEPS)
	@$(if $(FAKE_CUDA),,echo "make faults: needs the fake CUDA driver (cuda.h; CUDA_HOME=$(CUDA_HOME))"; exit 1)
	$(FAULT_ENV) $(BUILD)/asan/faults/fault_matrix

faults-slice: $(FAULT_MATRIX_DEPS)
	@$(if $(FAKE_CUDA),,echo "make faults-slice: needs the fake CUDA driver (cuda.h; CUDA_HOME=$(CUDA_HOME))"; exit 1)
	$(FAULT_ENV) $(BUILD)/asan/faults/fault_matrix -e 7

# --- sanitizers -----------------------------------------------------------------------------
check: deps-check
	@$(MAKE) --no-print-directory run-asan run-tsan run-valgrind faults-slice fuzz-replay soak-slice
	@echo "make check: ASan+UBSan, TSan and valgrind are clean; the fault-matrix slice, the fuzz corpus replay and the soak slice pass"

# Criterion reports a test whose worker leaks as passing (LeakSanitizer runs after the result is
# sent), so any sanitizer report in the output fails the run. One exception, checked: PoCL leaks
# inside its compiler (libpocl, libLLVM) the first time it builds a kernel variant its cache lacks
# (tools/valgrind.supp names the same two leaks). A run whose only reports are leaks, with PoCL in
# them, is run once more, PoCL's cache now warm; a leak of gpuarr's is there again and fails.
# $(1) flavour, $(2) tests, $(3) environment, $(4) parallel jobs, $(5) devices
SANITIZER_REPORT := 'ERROR: (Leak|Address)Sanitizer|runtime error|WARNING: ThreadSanitizer'
OTHER_REPORT := 'ERROR: AddressSanitizer|runtime error|WARNING: ThreadSanitizer'
define run_sanitized
	@mkdir -p $(BUILD)/logs
	@set -e; for dev in $(5); do for t in $(2); do \
	  log=$(BUILD)/logs/$(1)-$$t-$$dev.log; \
	  echo "== $(1): $$t on $$dev"; \
	  $(3) GPUARR_TEST_DEVICE=$$dev $(BUILD)/$(1)/tests/$$t --jobs $(4) >$$log 2>&1 || { cat $$log; exit 1; }; \
	  if grep -qE $(SANITIZER_REPORT) $$log && ! grep -qE $(OTHER_REPORT) $$log && grep -qE 'libpocl|libLLVM' $$log; then \
	    mv $$log $$log.first; echo "   a leak report (PoCL's first build of a kernel variant?): run again, PoCL's cache warm"; \
	    $(3) GPUARR_TEST_DEVICE=$$dev $(BUILD)/$(1)/tests/$$t --jobs $(4) >$$log 2>&1 || { cat $$log; exit 1; }; \
	  fi; \
	  if grep -qE $(SANITIZER_REPORT) $$log; then cat $$log; echo "$(1): sanitizer report in $$t"; exit 1; fi; \
	  grep Synthesis $$log; \
	done; done
endef

run-asan: $(addprefix $(BUILD)/asan/tests/,$(TESTS)) $(FAKE_CUDA) $(FAKE_NVML) $(FAULT_OPENCL) $(BUILD)/asan/plugin/plugin_driver
	$(call run_sanitized,asan,$(GENERIC_TESTS),ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1,2,$(TEST_DEVICES))
	$(call run_sanitized,asan,$(WHITEBOX_TESTS),ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1,2,host)
	$(call run_sanitized,asan,test_opencl,GPUARR_TEST_FAULT_OPENCL=$(abspath $(FAULT_OPENCL)) ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1,2,opencl:0)
	$(call run_sanitized,asan,test_cuda,ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1,2,host)
	$(call run_sanitized,asan,test_local_rank,$(if $(FAKE_CUDA),$(FAKE_ENV)) ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1,2,host)
	$(call run_sanitized,asan,$(DISCRETE_TESTS),GPUARR_OPENCL_UNIFIED=off ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1,2,opencl:0)
	$(if $(FAKE_CUDA),$(call run_sanitized,asan,$(GENERIC_TESTS) test_cuda,$(FAKE_ENV) ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1,2,cuda:0))
	$(call run_sanitized,asan,test_failures,$(if $(FAKE_CUDA),$(FAKE_ENV)) GPUARR_TEST_FAULT_OPENCL=$(abspath $(FAULT_OPENCL)) ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1,2,cuda:0)
	@# use_sigaltstack=0: ASan's own thread teardown cannot unmap its signal stack once an
	@# instrumented library has been dlclose'd (an ASan CHECK failure, not a report about gpuarr)
	@echo "== asan: the library in a dlopen'ed plugin, unloaded before its worker thread exits"
	@$(if $(FAKE_CUDA),$(FAKE_ENV)) ASAN_OPTIONS=detect_leaks=1:use_sigaltstack=0 UBSAN_OPTIONS=print_stacktrace=1 \
	  $(BUILD)/asan/plugin/plugin_driver $(BUILD)/asan/plugin/libgpuarr-plugin.so >$(BUILD)/logs/asan-plugin.log 2>&1 || { cat $(BUILD)/logs/asan-plugin.log; exit 1; }
	@if grep -qE $(SANITIZER_REPORT) $(BUILD)/logs/asan-plugin.log; then cat $(BUILD)/logs/asan-plugin.log; echo "asan: sanitizer report in the plugin test"; exit 1; fi
	@$(MAKE) --no-print-directory mpi-tests-asan

run-tsan: $(addprefix $(BUILD)/tsan/tests/,$(THREADED_TESTS)) $(FAKE_CUDA) $(FAKE_NVML)
	$(call run_sanitized,tsan,$(THREADED_TESTS),GPUARR_STRESS_OPS=100000 TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$(CURDIR)/tools/tsan.supp",1,$(TEST_DEVICES))
	$(if $(FAKE_CUDA),$(call run_sanitized,tsan,$(THREADED_TESTS),$(FAKE_ENV) TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$(CURDIR)/tools/tsan.supp",1,cuda:0))

# Definite leaks only: an indirect leak hangs off a definite one, which is reported (or, for the
# few of PoCL's own in tools/valgrind.supp, suppressed together with what hangs off them).
# examples/mpi_heat: each of 2 ranks (host, opencl:0) under valgrind, with tools/valgrind-openmpi.supp
# for Open MPI's own reports (stacks through MPI_Init, MPI_Finalize and PMIx's thread).
run-valgrind: $(addprefix $(BUILD)/rel/examples/,$(EXAMPLES) $(if $(MPI_EXAMPLES_BUILD),$(MPI_EXAMPLES))) $(BUILD)/rel/tools/gpuarr-info
	@set -e; for e in $(EXAMPLES); do \
	  echo "== valgrind: examples/$$e"; \
	  valgrind -q --error-exitcode=1 --leak-check=full --errors-for-leak-kinds=definite --show-possibly-lost=no --suppressions=tools/valgrind.supp \
	    $(BUILD)/rel/examples/$$e >/dev/null; done
ifneq ($(MPI_EXAMPLES_BUILD),)
	@echo "== valgrind: examples/mpi_heat, mpirun -np 2, a rank on the host and one on opencl:0"
	@timeout 600 $(MPIRUN_NP) 2 valgrind -q --error-exitcode=1 --num-callers=40 --leak-check=full --errors-for-leak-kinds=definite \
	  --show-possibly-lost=no --suppressions=tools/valgrind.supp --suppressions=tools/valgrind-openmpi.supp \
	  $(BUILD)/rel/examples/mpi_heat --device host,opencl:0 --steps 10 >/dev/null
endif
	@echo "== valgrind: tools/gpuarr-info"
	@valgrind -q --error-exitcode=1 --leak-check=full --errors-for-leak-kinds=definite --show-possibly-lost=no --suppressions=tools/valgrind.supp \
	  $(BUILD)/rel/tools/gpuarr-info >/dev/null

# --- fuzzing (issue 13) ---------------------------------------------------------------------
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

# --- MPI (issue 19; the manual's MPI section) ------------------------------------------------
# tests/mpi/test_mpi.c runs under mpirun, 4 ranks on 2 CPUs (--oversubscribe; --allow-run-as-root
# when root), each on its own device (host, opencl:0, opencl:1, opencl:0 discrete; then host,
# cuda:0, opencl:0, cuda:1 on the fake CUDA driver where it is built), each job
# bounded by MPI_TEST_TIMEOUT seconds; every rank must print its "0 failed" status line. The flags
# come from Open MPI's wrapper (mpicc --showme), the compiler stays $(CC).
MPI_CFLAGS = $(shell mpicc --showme:compile 2>/dev/null)
MPI_LIBS = $(shell mpicc --showme:link 2>/dev/null)
MPI_RANKS ?= 4
MPIRUN = mpirun -np $(MPI_RANKS) --oversubscribe $(if $(filter 0,$(shell id -u)),--allow-run-as-root)
MPI_TEST_TIMEOUT ?= 300
.PHONY: mpi-tests mpi-tests-asan bench-mpi
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

# `make bench-mpi`: tools/bench-mpi.c, one-way bandwidth between 2 ranks, 4 KiB..64 MiB, gpuarr
# arrays on the host and opencl:0 (unified, discrete) against MPI_Send of malloc'ed buffers, in
# one run (bench/results/mpi.md). Not part of make test.
$(BUILD)/rel/tools/bench-mpi: tools/bench-mpi.c $(HEADERS)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_REL) $(MPI_CFLAGS) -I. $< -o $@ $(MPI_LIBS) $(LIBS)
bench-mpi: $(BUILD)/rel/tools/bench-mpi
	$(subst -np $(MPI_RANKS),-np 2,$(MPIRUN)) $(BUILD)/rel/tools/bench-mpi $(BENCH_MPI_FLAGS)

# --- benchmarks -----------------------------------------------------------------------------
bench: $(BUILD)/rel/tools/gpuarr-bench
	$(BUILD)/rel/tools/gpuarr-bench

# gpuarr-bench with the trace's hooks compiled out (GPUARR_NO_TRACE): the baseline of
# `gpuarr-bench --trace-overhead` (bench/results/trace-overhead.md)
$(BUILD)/rel/tools/gpuarr-bench-notrace: tools/gpuarr-bench.c $(HEADERS)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_REL) -DGPUARR_NO_TRACE -I. $< -o $@ $(LIBS)

# make bench-plots: gpuarr-bench --csv, rate against size from 4 KiB to 256 MiB for every path and
# its baselines (host casts with both kernel sets; transfers and casts on the first OpenCL and the
# first CUDA device, where there is one), into
# bench/results/plots/<machine tag>.csv, drawn by tools/bench-plots.sh (gnuplot) as PNGs beside it.
# Not part of make test; make test runs bench-smoke: a 4-16 KiB sweep, its CSV checked.
PLOT_PACKAGES := gnuplot-nox
BENCH_SWEEP_FLAGS ?= --host-isa baseline,avx2
bench-plots:
	$(call ensure_packages,$(PLOT_PACKAGES))
	@$(MAKE) --no-print-directory $(BUILD)/rel/tools/gpuarr-bench
	@mkdir -p bench/results/plots
	$(BUILD)/rel/tools/gpuarr-bench --csv $(BUILD)/bench-sweep.csv $(BENCH_SWEEP_FLAGS)
	@tag=$$(sed -n 's/^# machine tag: //p' $(BUILD)/bench-sweep.csv) && cp $(BUILD)/bench-sweep.csv bench/results/plots/$$tag.csv && \
	  tools/bench-plots.sh bench/results/plots/$$tag.csv bench/results/plots

# `make bench-leases`: what leases cost (gpuarr-bench --leases; bench/results/leases.md), on two
# PoCL pthread devices. Not part of make test: it takes about 15 s, most of it waiting for its
# child processes and restarting the library.
.PHONY: bench-leases
bench-leases: $(BUILD)/rel/tools/gpuarr-bench
	POCL_DEVICES="pthread pthread" $(BUILD)/rel/tools/gpuarr-bench --leases

bench-smoke: $(BUILD)/rel/tools/gpuarr-bench $(BUILD)/rel/tools/gpuarr-info $(FAKE_CUDA)
	@echo "== gpuarr-bench --host-isa and --csv (tools/bench-smoke.sh$(if $(FAKE_CUDA),; CUDA rows on the fake driver))"
	@tools/bench-smoke.sh $(BUILD)/rel/tools/gpuarr-bench $(BUILD)/logs $(abspath $(FAKE_CUDA))

# `make bench-offload`: tools/bench-offload.c (needs the OpenCL ICD loader, -lOpenCL, and PoCL);
# each run starts from a fresh cache folder of its own, so nothing learned earlier counts.
.PHONY: bench-offload
$(BUILD)/rel/tools/bench-offload: tools/bench-offload.c $(BUILD)/rel/gpuarr.o
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_REL) -I. $< $(BUILD)/rel/gpuarr.o -o $@ -lOpenCL $(LIBS)
bench-offload: $(BUILD)/rel/tools/bench-offload
	@mkdir -p $(BUILD)/bench-offload
	@rm -f $(BUILD)/bench-offload/failed
	($(BUILD)/rel/tools/bench-offload --reps 3 || touch $(BUILD)/bench-offload/failed) | tee $(BUILD)/bench-offload/regret.txt
	@test ! -e $(BUILD)/bench-offload/failed || { echo "bench-offload failed (see above)"; exit 1; }
	@(for task in "" --matmul; do \
	  $(BUILD)/rel/tools/bench-offload --map opencl:0 $$task || exit 1; \
	  POCL_DEVICES="pthread pthread" $(BUILD)/rel/tools/bench-offload --map opencl:0,opencl:1 $$task || exit 1; \
	  POCL_DEVICES="pthread pthread" $(BUILD)/rel/tools/bench-offload --map host,opencl:0,opencl:1 $$task || exit 1; \
	done || touch $(BUILD)/bench-offload/failed) | tee $(BUILD)/bench-offload/map.txt
	@test ! -e $(BUILD)/bench-offload/failed || { echo "bench-offload --map failed: an output differs from the host's (see above)"; exit 1; }

# `make bench-offload-starpu`: the same workload under StarPU's dmda scheduler (one CPU worker, one
# OpenCL worker on PoCL; tools/bench-offload-starpu.c): a calibration run (STARPU_CALIBRATE=1,
# 4 passes) then a measured run on those models, in a STARPU_HOME of its own. Needs libstarpu-dev,
# installed as root, else its apt-get line is printed and the target stops (as make test).
STARPU_PACKAGES := libstarpu-dev
STARPU_ENV := STARPU_HOME=$(abspath $(BUILD))/starpu-home STARPU_SCHED=dmda STARPU_NCPU=1 STARPU_NOPENCL=1 STARPU_OPENCL_ON_CPUS=1 STARPU_NCUDA=0
.PHONY: bench-offload-starpu
$(BUILD)/rel/tools/bench-offload-starpu: tools/bench-offload-starpu.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_REL) $$(pkg-config --cflags starpu-1.3) $< -o $@ $$(pkg-config --libs starpu-1.3) -lOpenCL
bench-offload-starpu:
	$(call ensure_packages,$(STARPU_PACKAGES))
	@$(MAKE) --no-print-directory $(BUILD)/rel/tools/bench-offload-starpu
	@rm -rf $(BUILD)/starpu-home && mkdir -p $(BUILD)/starpu-home $(BUILD)/bench-offload
	$(STARPU_ENV) STARPU_CALIBRATE=1 $(BUILD)/rel/tools/bench-offload-starpu --calibrate 4 | tee $(BUILD)/bench-offload/starpu-calibration.txt
	$(STARPU_ENV) $(BUILD)/rel/tools/bench-offload-starpu --calibrate 0 | tee $(BUILD)/bench-offload/starpu-measured.txt

# `make bench-compare`: tools/compare-boost-compute.cpp, gpuarr against Boost.Compute (header-only,
# in libboost-dev) and raw OpenCL on opencl:0, in one process; not part of make test. A missing
# package is installed as root, else its apt-get line is printed and the target stops (as make test).
BENCH_COMPARE_PACKAGES := libboost-dev
.PHONY: bench-compare
$(BUILD)/rel/tools/compare-boost-compute: tools/compare-boost-compute.cpp $(BUILD)/rel/gpuarr.o
	@mkdir -p $(@D)
	$(CXX) -std=c++17 -O2 -g -Wall -Wextra -Werror -I. $< $(BUILD)/rel/gpuarr.o -o $@ -lOpenCL $(LIBS)
bench-compare:
	$(call ensure_packages,$(BENCH_COMPARE_PACKAGES))
	@$(MAKE) --no-print-directory $(BUILD)/rel/tools/compare-boost-compute
	$(BUILD)/rel/tools/compare-boost-compute

# --- the library and the install ---------------------------------------------------------
# Every name and place `make lib`, `make install` and `make uninstall` use, in one place. The
# version is read from gpuarr.h (GPUARR_VERSION_STRING); the soname carries its major number.
VERSION      := $(shell sed -n 's/^.define GPUARR_VERSION_STRING "\([0-9.]*\)"$$/\1/p' gpuarr.h)
SOVERSION    := $(firstword $(subst ., ,$(VERSION)))
LIBDIR       ?= $(PREFIX)/lib
HEADERDIR    := $(PREFIX)/include/gpuarr
PKGCONFIGDIR := $(PREFIX)/share/pkgconfig
LIBPKGCONFIGDIR := $(LIBDIR)/pkgconfig
CMAKEDIR     := $(PREFIX)/share/cmake/gpuarr
LIB_BUILD    := $(BUILD)/lib
LIB_A        := libgpuarr.a
LIB_SO       := libgpuarr.so
LIB_SONAME   := $(LIB_SO).$(SOVERSION)
LIB_REAL     := $(LIB_SO).$(VERSION)
LIB_CFLAGS   := -std=c11 -O2 -fPIC $(WARN)
LIB_FILES    := $(LIB_A) $(LIB_REAL) $(LIB_SONAME) $(LIB_SO)
# gpuarr.pc (header-only) is architecture-independent: share/; gpuarr-lib.pc names LIBDIR: lib/
PKG_FILES    := $(PKGCONFIGDIR)/gpuarr.pc $(LIBPKGCONFIGDIR)/gpuarr-lib.pc \
                $(CMAKEDIR)/gpuarrConfig.cmake $(CMAKEDIR)/gpuarrConfigVersion.cmake
# a template of tools/pkg/ filled in for this PREFIX and LIBDIR
PKG_FILL      = sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@LIBDIR@|$(LIBDIR)|g' -e 's|@VERSION@|$(VERSION)|g'

# `make lib`: gpuarr.c as a static and a shared library. The shared one exports the gpuarr_
# functions and nothing else (tools/pkg/libgpuarr.map), and has no undefined symbol the link
# did not resolve (-z defs).
.PHONY: lib uninstall
lib: $(addprefix $(LIB_BUILD)/,$(LIB_FILES))
$(LIB_BUILD)/gpuarr.o: gpuarr.c $(HEADERS)
	@$(if $(SOVERSION),,echo "no GPUARR_VERSION_STRING found in gpuarr.h"; exit 1)
	@mkdir -p $(@D)
	$(CC) $(LIB_CFLAGS) -I. -c $< -o $@
$(LIB_BUILD)/$(LIB_A): $(LIB_BUILD)/gpuarr.o
	rm -f $@ && $(AR) rcs $@ $<
$(LIB_BUILD)/$(LIB_REAL): $(LIB_BUILD)/gpuarr.o tools/pkg/libgpuarr.map
	$(CC) -shared -Wl,-soname,$(LIB_SONAME) -Wl,--version-script=tools/pkg/libgpuarr.map -Wl,-z,defs $< -o $@ $(LIBS)
$(LIB_BUILD)/$(LIB_SONAME): $(LIB_BUILD)/$(LIB_REAL)
	ln -sfn $(LIB_REAL) $@
$(LIB_BUILD)/$(LIB_SO): $(LIB_BUILD)/$(LIB_SONAME)
	ln -sfn $(LIB_SONAME) $@

# The headers go under include/gpuarr/, not include/: "backends/" and "layers/" are too common
# names to put at the top. The header finds its folders next to itself, wherever that is. Then the libraries,
# the pkg-config files (gpuarr: header-only; gpuarr-lib: libgpuarr) and the CMake package.
install: lib
	install -d $(addprefix $(DESTDIR)$(HEADERDIR)/,$(HEADER_DIRS)) $(DESTDIR)$(LIBDIR) $(DESTDIR)$(PKGCONFIGDIR) $(DESTDIR)$(LIBPKGCONFIGDIR) $(DESTDIR)$(CMAKEDIR) $(LIB_BUILD)/pkg
	install -m 644 gpuarr.h $(DESTDIR)$(HEADERDIR)/
	@set -e; for d in $(HEADER_DIRS); do echo "install -m 644 $$d/*.h $(DESTDIR)$(HEADERDIR)/$$d/"; install -m 644 $$d/*.h $(DESTDIR)$(HEADERDIR)/$$d/; done
	install -m 644 $(LIB_BUILD)/$(LIB_A) $(DESTDIR)$(LIBDIR)/
	install -m 755 $(LIB_BUILD)/$(LIB_REAL) $(DESTDIR)$(LIBDIR)/
	ln -sfn $(LIB_REAL) $(DESTDIR)$(LIBDIR)/$(LIB_SONAME)
	ln -sfn $(LIB_SONAME) $(DESTDIR)$(LIBDIR)/$(LIB_SO)
	@set -e; for f in $(PKG_FILES); do n=$$(basename $$f); \
	  $(PKG_FILL) tools/pkg/$$n.in > $(LIB_BUILD)/pkg/$$n; \
	  echo "install -m 644 $(LIB_BUILD)/pkg/$$n $(DESTDIR)$$f"; install -m 644 $(LIB_BUILD)/pkg/$$n $(DESTDIR)$$f; done

# What install put there, and the gpuarr directories it made once they are empty; nothing else.
uninstall:
	rm -f $(DESTDIR)$(HEADERDIR)/gpuarr.h $(addprefix $(DESTDIR)$(HEADERDIR)/,$(filter-out gpuarr.h,$(HEADERS)))
	rm -f $(addprefix $(DESTDIR)$(LIBDIR)/,$(LIB_FILES)) $(addprefix $(DESTDIR),$(PKG_FILES))
	@for d in $(addprefix $(DESTDIR)$(HEADERDIR)/,$(HEADER_DIRS)) $(DESTDIR)$(HEADERDIR) $(DESTDIR)$(CMAKEDIR); do \
	  if [ -d $$d ] && [ -z "$$(ls -A $$d)" ]; then echo "rmdir $$d"; rmdir $$d; fi; done

clean:
	rm -rf $(BUILD)
