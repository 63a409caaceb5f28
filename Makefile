# gpuarr -- the two commands are `make demo` and `make test`.
#
#   make demo     build and run examples/quickstart.c on the best device found
#   make test     install the Debian packages the tests need (tools/deps.sh: as root; otherwise it
#                 prints the apt-get line and stops), build everything, run the Criterion suite on
#                 every device class present (tests/matrix.txt), the compile tests (C11 gcc/clang,
#                 C++17, .cu, -O3, -flto, GPUARR_STATIC, the README's code, an installed copy used
#                 through pkg-config, CMake and libgpuarr), the DLPack tests against NumPy (a venv
#                 under build/ with NumPy from PyPI), bench-smoke, and under mpirun the MPI tests
#                 and examples, and the single header (single-header-check: the quickstart and
#                 every example needing no other library built against it alone, in an empty folder)
#   make check    the suite under ASan+UBSan, the threaded tests under TSan, valgrind on the
#                 examples, a slice of the fault matrix, the fuzz corpus replayed (fuzz-replay)
#                 and 2 minutes of the soak (soak-slice)
#   make run-matrix MATRIX_ONLY=REGEX  the lines of the device matrix whose "==" line matches
#   make faults   the fault matrix: every driver call of each scenario failed in turn, under
#                 ASan+UBSan (tests/faults; a slice of it runs in make check)
#   make lib      build/lib/: libgpuarr.a and libgpuarr.so.<version>, from gpuarr.c; only gpuarr_
#                 symbols exported
#   make install  gpuarr.h and the folders of HEADER_DIRS to $(PREFIX)/include/gpuarr, the
#                 libraries to LIBDIR, the pkg-config files, the CMake package gpuarr::gpuarr and
#                 the Python module gpuarr to PYTHONDIR; PREFIX defaults to /usr/local; honours
#                 DESTDIR. make uninstall removes them.
#   make single-header  build/single-header/gpuarr.h: gpuarr.h with its folders inlined, one
#                 self-contained file to drop into a project (tools/amalgamate.py)
#   make clean
#
# The long tails are in fragments beside what they serve, each listing its targets:
#   tests/fuzz/fuzz.mk    fuzz, fuzz-merge, fuzz-replay, soak
#   tests/mpi/mpi.mk      mpi-tests, mpi-examples
#   tools/bench/bench.mk  bench, bench-smoke, bench-plots, bench-leases, bench-compare, bench-offload,
#                         bench-offload-starpu, bench-mpi, bench-dlpack
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
# examples that need MPI are built with its flags (tests/mpi/mpi.mk)
MPI_EXAMPLES := mpi_heat
EXAMPLES  := $(filter-out $(MPI_EXAMPLES),$(basename $(notdir $(wildcard examples/*.c))))
TESTS     := $(basename $(notdir $(wildcard tests/test_*.c)))
THREADED_TESTS := test_threads test_streams test_pool test_dlpack test_telemetry test_trace test_leases test_transfer_model test_transfer_model_fit \
                  test_offload test_offload_kernels test_kernels
WHITEBOX_TESTS := test_registry test_internals test_opencl_limits test_telemetry_files test_lease_links test_transfer_model_fit \
                  test_offload_models
TOOLS     := gpuarr-info gpuarr-bench

# --- toolchains ---------------------------------------------------------------------------
CUDA_HOME ?= $(firstword $(wildcard /usr/local/cuda) $(patsubst %/bin/nvcc,%,$(shell command -v nvcc 2>/dev/null)))
NVCC      := $(firstword $(wildcard $(CUDA_HOME)/bin/nvcc) $(shell command -v nvcc 2>/dev/null))
CUDA_H    := $(firstword $(wildcard $(CUDA_HOME)/include/cuda.h))
NVML_H    ?= $(firstword $(wildcard $(CUDA_HOME)/include/nvml.h /usr/include/nvml.h))
MPICC     := $(shell command -v mpicc 2>/dev/null)
MPI_EXAMPLES_BUILD := $(MPICC)
# Open MPI's flags come from its wrapper (mpicc --showme); the compiler stays $(CC)
MPI_CFLAGS = $(shell mpicc --showme:compile 2>/dev/null)
MPI_LIBS = $(shell mpicc --showme:link 2>/dev/null)
MPIRUN_NP = mpirun --oversubscribe $(if $(filter 0,$(shell id -u)),--allow-run-as-root) -np

.PHONY: all demo test check install clean deps-test deps-check info compile-tests \
        run-tests run-matrix run-asan run-tsan run-valgrind kernels kernels-check cuda-kernels \
        compile-matrix install-check install-check-consumers readme-blocks faults faults-slice python-tests python-constants python-constants-check single-header single-header-check

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

# gpuarr-info is built with GPUARR_MPI and Open MPI's flags where mpicc is found (its --mpi;
# MPI_Init only then), without elsewhere; a stamp rebuilds it when that changes.
MPI_STAMP := $(BUILD)/rel/mpi-$(if $(MPICC),yes,no).stamp
$(MPI_STAMP):
	@mkdir -p $(@D) && rm -f $(BUILD)/rel/mpi-*.stamp && touch $@
$(BUILD)/rel/tools/gpuarr-info: tools/gpuarr-info.c $(HEADERS) $(MPI_STAMP)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_REL) $(if $(MPICC),-DGPUARR_MPI $(MPI_CFLAGS)) -I. $< -o $@ $(if $(MPICC),$(MPI_LIBS)) $(LIBS)

# The Debian packages of a set (tools/deps.sh lists them): installed when root; otherwise the
# script prints the exact apt-get line and the target stops.
deps-test:
	@tools/deps.sh test

deps-check:
	@tools/deps.sh check

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
LINK_test_opencl_adopt := -lOpenCL
LINK_test_native_order := -lOpenCL
TEST_INCLUDE_tsan := -isystem tests/tsan_shim
$(eval $(call flavour_rules,rel,$(CFLAGS_REL)))
$(eval $(call flavour_rules,asan,$(CFLAGS_ASAN)))
$(eval $(call flavour_rules,tsan,$(CFLAGS_TSAN)))
# the bounds test_kernel_math holds the math functions to (the manual's table)
$(foreach f,rel asan tsan,$(BUILD)/$(f)/tests/test_kernel_math): tests/kernel_math_bounds.h

# --- the suite ------------------------------------------------------------------------------
# One suite, run on each device class: the host, and OpenCL on PoCL (installed above, so its
# absence is a failure: GPUARR_TEST_REQUIRE=1). The OpenCL-specific tests use two PoCL devices.
TEST_DEVICES ?= host opencl:0
GENERIC_TESTS := $(filter-out test_opencl test_opencl_adopt test_cuda test_cuda_adopt test_failures test_local_rank test_setuid $(WHITEBOX_TESTS),$(TESTS))
# ... and again on opencl:0 handled as a discrete GPU (own memory, pinned staging): the paths a
# CUDA or discrete OpenCL device takes, on PoCL. The cast tables and the kernel math functions
# are the same there: not rerun.
DISCRETE_TESTS := $(filter-out test_casts test_kernel_math,$(GENERIC_TESTS))
export POCL_DEVICES ?= pthread pthread
export GPUARR_TEST_REQUIRE ?= 1

test: deps-test
	@$(MAKE) --no-print-directory all kernels-check python-constants-check compile-tests single-header-check run-tests python-tests bench-smoke

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

# The suite's device matrix: tests/matrix.txt says which test runs on which device under which
# environment, tests/run-matrix.sh runs it. `make run-matrix MATRIX_ONLY=REGEX` runs the lines
# whose "==" line matches, e.g. MATRIX_ONLY='^test_casts on (host|opencl:0)$$'.
MATRIX_ENV = TEST_BIN=$(BUILD)/rel/tests GPUARR_INFO=$(BUILD)/rel/tools/gpuarr-info TEST_DEVICES="$(TEST_DEVICES)" \
  GENERIC_TESTS="$(GENERIC_TESTS)" DISCRETE_TESTS="$(DISCRETE_TESTS)" WHITEBOX_TESTS="$(WHITEBOX_TESTS)" \
  FAULT_OPENCL=$(abspath $(FAULT_OPENCL)) SETUID_ENV="$(SETUID_ENV)" FAKE_ENV="$(if $(FAKE_CUDA),$(FAKE_ENV))" \
  FAKE_CUDA_WHY_NOT="no cuda.h (CUDA_HOME=$(CUDA_HOME))" PTXAS=$(wildcard $(CUDA_HOME)/bin/ptxas)
run-matrix: $(addprefix $(BUILD)/rel/tests/,$(TESTS)) $(FAKE_CUDA) $(FAKE_NVML) $(FAULT_OPENCL) $(SETUID_PROBE) $(BUILD)/rel/tools/gpuarr-info
	@$(MATRIX_ENV) tests/run-matrix.sh tests/matrix.txt

run-tests: run-matrix $(BUILD)/rel/plugin/plugin_driver $(BUILD)/rel/tools/gpuarr-info $(BUILD)/rel/examples/quickstart $(BUILD)/rel/examples/offload \
           $(BUILD)/rel/examples/blur $(FAKE_CUDA)
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
	@echo "== examples/blur on $(TEST_DEVICES), opencl:0 as a discrete device$(if $(FAKE_CUDA), and cuda:0 of the fake driver): the kernel's image equals plain C's"
	@for d in $(TEST_DEVICES); do $(BUILD)/rel/examples/blur $$d >/dev/null || { $(BUILD)/rel/examples/blur $$d; exit 1; }; done
	@GPUARR_OPENCL_UNIFIED=off $(BUILD)/rel/examples/blur opencl:0 >/dev/null || { GPUARR_OPENCL_UNIFIED=off $(BUILD)/rel/examples/blur opencl:0; exit 1; }
	$(if $(FAKE_CUDA),@$(FAKE_ENV) $(BUILD)/rel/examples/blur cuda:0 > $(BUILD)/logs/blur-cuda.log 2>&1 || { cat $(BUILD)/logs/blur-cuda.log; exit 1; })
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

# The Python module (python/gpuarr) and DLPack against real clients, in a virtual environment
# under build/ made by Debian's Python with packages from PyPI (made once; `make clean` removes
# it): NumPy >= 2.1 (tests/python/test_numpy.py: the library through raw ctypes;
# test_module.py: the module), JAX on the CPU (test_jax.py), pyopencl on the system's PoCL
# (test_pyopencl.py: pyopencl's context adopted by gpuarr), and examples/numpy_interop.py.
# The round trips go through opencl:0 (PoCL). Debian has no dlpack.h: the official one comes
# from the apache-tvm-ffi wheel (only its header is used), and tests/compile/dlpack_abi.c is
# built with it included before gpuarr.h.
PYTHON ?= $(firstword $(wildcard /usr/bin/python3) python3)
VENV   := $(BUILD)/venv
VENV_PACKAGES := 'numpy>=2.1' jax pyopencl
DLPACK_H_WHEEL := apache-tvm-ffi==0.1.15.post2
$(VENV)/packages-installed:
	@rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --disable-pip-version-check $(VENV_PACKAGES)
	$(VENV)/bin/pip install -q --disable-pip-version-check --no-deps '$(DLPACK_H_WHEEL)'
	@touch $@
PY_ENV = GPUARR_LIB=$(abspath $(BUILD))/lib/libgpuarr.so GPUARR_PY_DEVICE=opencl:0 PYTHONPATH=$(abspath python)
python-tests: $(VENV)/packages-installed $(BUILD)/lib/libgpuarr.so python-constants-check
	@inc=$$(ls -d $(VENV)/lib/python3*/site-packages/tvm_ffi/include | head -1); \
	  [ -f "$$inc/dlpack/dlpack.h" ] || { echo "python-tests: no dlpack/dlpack.h in $(DLPACK_H_WHEEL)"; exit 1; }; \
	  $(CC) -std=c11 $(WARN) -DGPUARR_TEST_REAL_DLPACK -I$$inc -I. tests/compile/dlpack_abi.c -o $(BUILD)/compile/dlpack-abi-official $(LIBS) && \
	  $(CXX) -std=c++17 $(WARN) -x c++ -DGPUARR_TEST_REAL_DLPACK -I$$inc -I. tests/compile/dlpack_abi.c -o $(BUILD)/compile/dlpack-abi-official-cxx $(LIBS) && \
	  $(BUILD)/compile/dlpack-abi-official && $(BUILD)/compile/dlpack-abi-official-cxx
	@echo "== tests/python/test_numpy.py: DLPack with NumPy $$($(VENV)/bin/python -c 'import numpy; print(numpy.__version__)') through raw ctypes"
	@$(PY_ENV) $(VENV)/bin/python tests/python/test_numpy.py
	@echo "== tests/python/test_module.py: the gpuarr module with NumPy"
	@$(PY_ENV) $(VENV)/bin/python tests/python/test_module.py
	@echo "== tests/python/test_jax.py: the gpuarr module with JAX on the CPU"
	@$(PY_ENV) $(VENV)/bin/python tests/python/test_jax.py
	@echo "== tests/python/test_pyopencl.py: pyopencl's context adopted by gpuarr"
	@$(PY_ENV) $(VENV)/bin/python tests/python/test_pyopencl.py
	@echo "== examples/numpy_interop.py on opencl:0"
	@$(PY_ENV) $(VENV)/bin/python examples/numpy_interop.py opencl:0
	@rm -rf $(BUILD)/readme-python && mkdir -p $(BUILD)/readme-python && \
	  awk '/^```python[ \t]*$$/ { n++; on = 1; next } /^```/ { on = 0 } on { print > ("$(BUILD)/readme-python/block-" n ".py") }' README.md
	@for f in $(BUILD)/readme-python/block-*.py; do echo "== README.md's Python block $$f"; \
	  $(PY_ENV) $(VENV)/bin/python $$f || exit 1; done

# The device kernels are compiled from kernels/gpuarr_kernels.h, embedded as text in
# generated/gpuarr_kernels_source.h: regenerate with `make kernels`; the test fails when stale.
kernels:
	tools/embed-kernels.sh > generated/gpuarr_kernels_source.h

# The Python module's dtype and result constants (generated/gpuarr_constants.py) are made from
# gpuarr.h's lists by tools/python-constants.c: `make python-constants` remakes them; the test
# fails when they are stale.
$(BUILD)/rel/tools/python-constants: tools/python-constants.c gpuarr.h
	@mkdir -p $(@D)
	$(CC) -std=c11 $(WARN) -I. $< -o $@
python-constants: $(BUILD)/rel/tools/python-constants
	$< > $(BUILD)/gpuarr_constants.py && mv $(BUILD)/gpuarr_constants.py generated/gpuarr_constants.py
python-constants-check: $(BUILD)/rel/tools/python-constants
	@$< | cmp -s - generated/gpuarr_constants.py || \
	  { echo "generated/gpuarr_constants.py is stale: run 'make python-constants'"; exit 1; }
	@echo "Python constants: generated/gpuarr_constants.py matches gpuarr.h's lists"

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
	@# the layout README.md describes: backends, layers and generated files where they should be
	@$(PYTHON) tools/check-layout.py
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
	@echo "== install check 4: the Python module, imported from the staged copy by $(PYTHON)"
	@cd $(INSTALL_CHECK) && PYTHONPATH=$(INSTALL_DEST)/usr/lib/python3/dist-packages GPUARR_LIB=$(INSTALL_DEST)/usr/lib/$(LIB_SONAME) \
	  $(PYTHON) -c 'import gpuarr, sys; assert gpuarr.__file__.startswith(sys.argv[1]), gpuarr.__file__; \
	    assert gpuarr._k.__file__.startswith(sys.argv[1]), gpuarr._k.__file__; \
	    a = gpuarr.zeros((2, 3), "f16").to(dtype=gpuarr.F32); assert (a.dtype, a.shape) == ("f32", (2, 3)); \
	    print("   import gpuarr from", gpuarr.__file__, "with", gpuarr._lib._name, "and its constants from", gpuarr._k.__file__)' \
	  $(INSTALL_DEST)
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
	$(call run_sanitized,asan,test_opencl_adopt,ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1,2,opencl:0)
	$(if $(FAKE_CUDA),$(call run_sanitized,asan,test_cuda_adopt,$(FAKE_ENV) ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1,2,cuda:0))
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

run-tsan: $(addprefix $(BUILD)/tsan/tests/,$(THREADED_TESTS) test_opencl_adopt) $(FAKE_CUDA) $(FAKE_NVML)
	$(call run_sanitized,tsan,$(THREADED_TESTS),GPUARR_STRESS_OPS=100000 TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$(CURDIR)/tools/tsan.supp",1,$(TEST_DEVICES))
	$(call run_sanitized,tsan,test_opencl_adopt,TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$(CURDIR)/tools/tsan.supp",1,opencl:0)
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

# --- the long tails, each in a fragment beside what it serves -----------------------------------
include tests/fuzz/fuzz.mk
include tests/mpi/mpi.mk
include tools/bench/bench.mk

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
# The Python module, where Debian's python3 imports from: /usr/lib/python3/dist-packages for
# PREFIX=/usr, $(PREFIX)/lib/python3.X/dist-packages otherwise (/usr/local's is on its path)
PYTHON_VERSION := $(shell $(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)
PYTHONDIR    ?= $(if $(filter /usr,$(PREFIX)),$(PREFIX)/lib/python3/dist-packages,$(PREFIX)/lib/python$(PYTHON_VERSION)/dist-packages)
PY_FILES     := $(PYTHONDIR)/gpuarr/__init__.py $(PYTHONDIR)/gpuarr/_constants.py
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
	install -d $(DESTDIR)$(PYTHONDIR)/gpuarr
	install -m 644 python/gpuarr/__init__.py $(DESTDIR)$(PYTHONDIR)/gpuarr/
	install -m 644 generated/gpuarr_constants.py $(DESTDIR)$(PYTHONDIR)/gpuarr/_constants.py

# What install put there, and the gpuarr directories it made once they are empty; nothing else.
uninstall:
	rm -f $(DESTDIR)$(HEADERDIR)/gpuarr.h $(addprefix $(DESTDIR)$(HEADERDIR)/,$(filter-out gpuarr.h,$(HEADERS)))
	rm -f $(addprefix $(DESTDIR)$(LIBDIR)/,$(LIB_FILES)) $(addprefix $(DESTDIR),$(PKG_FILES) $(PY_FILES))
	rm -rf $(DESTDIR)$(PYTHONDIR)/gpuarr/__pycache__
	@for d in $(addprefix $(DESTDIR)$(HEADERDIR)/,$(HEADER_DIRS)) $(DESTDIR)$(HEADERDIR) $(DESTDIR)$(CMAKEDIR) $(DESTDIR)$(PYTHONDIR)/gpuarr; do \
	  if [ -d $$d ] && [ -z "$$(ls -A $$d)" ]; then echo "rmdir $$d"; rmdir $$d; fi; done

clean:
	rm -rf $(BUILD)

# --- one file to drop in ----------------------------------------------------------------------
# `make single-header`: $(SINGLE_HEADER), gpuarr.h with every file it includes inlined where it
# is included (tools/amalgamate.py follows the #include lines; no list of files here).
# single-header-check (in make test): that file has no quoted #include of a repository file
# left, preprocesses to what gpuarr.h and its folders do, and builds, in a folder that holds it
# and copies of the sources only, the examples that need no other library (the implementation
# compiled once from a two-line impl.c, so each is also a second translation unit), the
# quickstart again as C++17, tests/compile's two units and, with nvcc, the .cu examples; the
# quickstart (C and C++) and the two units run.
SINGLE_HEADER := $(BUILD)/single-header/gpuarr.h
SINGLE_CHECK  := $(BUILD)/single-header-check
single-header:
	@python3 tools/amalgamate.py -o $(SINGLE_HEADER) gpuarr.h
	@echo "single header: $(SINGLE_HEADER), $$(wc -l < $(SINGLE_HEADER)) lines, $$(wc -c < $(SINGLE_HEADER)) bytes"
single-header-check: single-header
	@for n in $$(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' $(SINGLE_HEADER)); do \
	  f=$$(find . -path ./$(BUILD) -prune -o -type f -name "$${n##*/}" -print | head -1); [ -z "$$f" ] || \
	  { echo "single-header-check: $(SINGLE_HEADER) still has #include \"$$n\" ($$f): tools/amalgamate.py did not inline it"; exit 1; }; done
	@rm -rf $(SINGLE_CHECK) && mkdir -p $(SINGLE_CHECK)/src $(SINGLE_CHECK)/out
	@cp $(SINGLE_HEADER) $(addprefix examples/,$(addsuffix .c,$(EXAMPLES)) $(addsuffix .cu,$(CU_EXAMPLES))) \
	  tests/compile/two_units_a.c tests/compile/two_units_b.c $(SINGLE_CHECK)/src/
	@printf '#define GPUARR_IMPLEMENTATION\n#include "gpuarr.h"\n' > $(SINGLE_CHECK)/src/impl.c
	@for d in "" -DGPUARR_NO_CUDA -DGPUARR_NO_OPENCL; do \
	  $(CC) -std=c11 -E -P -DGPUARR_IMPLEMENTATION $$d -I. -x c gpuarr.h > $(SINGLE_CHECK)/out/folders.i && \
	  (cd $(SINGLE_CHECK)/src && $(CC) -std=c11 -E -P -DGPUARR_IMPLEMENTATION $$d -x c gpuarr.h) > $(SINGLE_CHECK)/out/single.i && \
	  cmp -s $(SINGLE_CHECK)/out/folders.i $(SINGLE_CHECK)/out/single.i || \
	  { echo "single-header-check: the implementation $${d:+with $$d }preprocesses differently from gpuarr.h's"; exit 1; }; done
	cd $(SINGLE_CHECK)/src && $(CC) -std=c11 $(WARN) -I. -c impl.c -o ../out/impl.o
	@cd $(SINGLE_CHECK)/src && for e in $(EXAMPLES); do \
	  echo "$(CC) -std=c11 $(WARN) -I. $$e.c ../out/impl.o -o ../out/$$e $(LIBS)"; \
	  $(CC) -std=c11 $(WARN) -I. $$e.c ../out/impl.o -o ../out/$$e $(LIBS) || exit 1; done
	cd $(SINGLE_CHECK)/src && $(CXX) -std=c++17 $(WARN) -I. -x c++ quickstart.c -x none ../out/impl.o -o ../out/quickstart-cxx $(LIBS)
	cd $(SINGLE_CHECK)/src && $(CC) -std=c11 $(WARN) -I. two_units_a.c two_units_b.c -o ../out/two-units $(LIBS)
	@cd $(SINGLE_CHECK)/src && for e in $(CU_EXAMPLES); do \
	  echo "$(NVCC) -std=c++17 -O2 -Werror all-warnings -I. $$e.cu ../out/impl.o -o ../out/$$e $(LIBS)"; \
	  $(NVCC) -std=c++17 -O2 -Werror all-warnings -I. $$e.cu ../out/impl.o -o ../out/$$e $(LIBS) || exit 1; done
	@cd $(SINGLE_CHECK)/out && ./quickstart > quickstart.log && ./quickstart-cxx > quickstart-cxx.log && ./two-units
	@echo "single-header-check passed: $(SINGLE_HEADER) alone in $(SINGLE_CHECK)/src built $(EXAMPLES) $(CU_EXAMPLES), the quickstart as C++17 and two units;" \
	  "the quickstart ran: $$(tail -1 $(SINGLE_CHECK)/out/quickstart.log)"
