# tools/bench/bench.mk -- the benchmarks: gpuarr-bench and the programs beside it (included by the Makefile).
# None is part of make test but bench-smoke; each prints a table, bench/results/ keeps them.
#   make bench    gpuarr-bench: the host, pool, mutable-array, OpenCL and CUDA tables (bench/results/)
#   make bench-smoke  gpuarr-bench --host-isa, --csv and --calibrate, checked (in make test)
#   make bench-plots  the size sweep (gpuarr-bench --csv) and its PNGs in bench/results/plots/
#                 (needs gnuplot-nox: tools/deps.sh installs it as root, else prints the apt-get line)
#   make bench-leases  gpuarr-bench --leases on PoCL's two pthread devices: lease latency, across
#                 processes, 8 workers with 1, 2, 4 and unlimited slots
#   make bench-compare  gpuarr against Boost.Compute and raw OpenCL on opencl:0 (needs libboost-dev)
#   make bench-offload  the offload planner's regret against the per-call oracle, always-host,
#                 always-device and the 1 MiB rule on the host and PoCL as a discrete device, and
#                 gpuarr_map on one and two PoCL devices and the host (bench/results/offload.md)
#   make bench-offload-starpu  the same workload under StarPU's dmda scheduler (needs libstarpu-dev)
#   make bench-mpi  send/recv bandwidth between 2 MPI ranks, gpuarr arrays against MPI_Send
#   make bench-dlpack  DLPack hand-over to and from NumPy against numpy.copy
.PHONY: bench bench-smoke bench-plots

# gpuarr-bench: one translation unit, the implementation and the suites (tools/bench/gpuarr-bench.c)
BENCH_SOURCES := tools/bench/gpuarr-bench.c $(wildcard tools/bench/*.h)
$(BUILD)/rel/tools/gpuarr-bench: $(BENCH_SOURCES) $(HEADERS)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_REL) -I. $< -o $@ $(LIBS)

bench: $(BUILD)/rel/tools/gpuarr-bench
	$(BUILD)/rel/tools/gpuarr-bench

# gpuarr-bench with the trace's hooks compiled out (GPUARR_NO_TRACE): the baseline of
# `gpuarr-bench --trace-overhead` (bench/results/trace-overhead.md)
$(BUILD)/rel/tools/gpuarr-bench-notrace: $(BENCH_SOURCES) $(HEADERS)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_REL) -DGPUARR_NO_TRACE -I. $< -o $@ $(LIBS)

# make bench-plots: gpuarr-bench --csv, rate against size from 4 KiB to 256 MiB for every path and
# its baselines (host casts with both kernel sets; transfers and casts on the first OpenCL and the
# first CUDA device, where there is one), into
# bench/results/plots/<machine tag>.csv, drawn by tools/bench/bench-plots.sh (gnuplot) as PNGs beside it.
# Not part of make test; make test runs bench-smoke: a 4-16 KiB sweep, its CSV checked.
BENCH_SWEEP_FLAGS ?= --host-isa baseline,avx2
bench-plots:
	@tools/deps.sh plots
	@$(MAKE) --no-print-directory $(BUILD)/rel/tools/gpuarr-bench
	@mkdir -p bench/results/plots
	$(BUILD)/rel/tools/gpuarr-bench --csv $(BUILD)/bench-sweep.csv $(BENCH_SWEEP_FLAGS)
	@tag=$$(sed -n 's/^# machine tag: //p' $(BUILD)/bench-sweep.csv) && cp $(BUILD)/bench-sweep.csv bench/results/plots/$$tag.csv && \
	  tools/bench/bench-plots.sh bench/results/plots/$$tag.csv bench/results/plots

# `make bench-leases`: what leases cost (gpuarr-bench --leases; bench/results/leases.md), on two
# PoCL pthread devices. Not part of make test: it takes about 15 s, most of it waiting for its
# child processes and restarting the library.
.PHONY: bench-leases
bench-leases: $(BUILD)/rel/tools/gpuarr-bench
	POCL_DEVICES="pthread pthread" $(BUILD)/rel/tools/gpuarr-bench --leases

bench-smoke: $(BUILD)/rel/tools/gpuarr-bench $(BUILD)/rel/tools/gpuarr-info $(FAKE_CUDA)
	@echo "== gpuarr-bench --host-isa and --csv (tools/bench/bench-smoke.sh$(if $(FAKE_CUDA),; CUDA rows on the fake driver))"
	@tools/bench/bench-smoke.sh $(BUILD)/rel/tools/gpuarr-bench $(BUILD)/logs $(abspath $(FAKE_CUDA))

# `make bench-offload`: tools/bench/bench-offload.c (needs the OpenCL ICD loader, -lOpenCL, and PoCL);
# each run starts from a fresh cache folder of its own, so nothing learned earlier counts.
.PHONY: bench-offload
$(BUILD)/rel/tools/bench-offload: tools/bench/bench-offload.c $(BUILD)/rel/gpuarr.o
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
# OpenCL worker on PoCL; tools/bench/bench-offload-starpu.c): a calibration run (STARPU_CALIBRATE=1,
# 4 passes) then a measured run on those models, in a STARPU_HOME of its own. Needs libstarpu-dev,
# installed as root, else its apt-get line is printed and the target stops (as make test).
STARPU_ENV := STARPU_HOME=$(abspath $(BUILD))/starpu-home STARPU_SCHED=dmda STARPU_NCPU=1 STARPU_NOPENCL=1 STARPU_OPENCL_ON_CPUS=1 STARPU_NCUDA=0
.PHONY: bench-offload-starpu
$(BUILD)/rel/tools/bench-offload-starpu: tools/bench/bench-offload-starpu.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_REL) $$(pkg-config --cflags starpu-1.3) $< -o $@ $$(pkg-config --libs starpu-1.3) -lOpenCL
bench-offload-starpu:
	@tools/deps.sh starpu
	@$(MAKE) --no-print-directory $(BUILD)/rel/tools/bench-offload-starpu
	@rm -rf $(BUILD)/starpu-home && mkdir -p $(BUILD)/starpu-home $(BUILD)/bench-offload
	$(STARPU_ENV) STARPU_CALIBRATE=1 $(BUILD)/rel/tools/bench-offload-starpu --calibrate 4 | tee $(BUILD)/bench-offload/starpu-calibration.txt
	$(STARPU_ENV) $(BUILD)/rel/tools/bench-offload-starpu --calibrate 0 | tee $(BUILD)/bench-offload/starpu-measured.txt

# `make bench-compare`: tools/bench/compare-boost-compute.cpp, gpuarr against Boost.Compute (header-only,
# in libboost-dev) and raw OpenCL on opencl:0, in one process; not part of make test. A missing
# package is installed as root, else its apt-get line is printed and the target stops (as make test).
.PHONY: bench-compare
$(BUILD)/rel/tools/compare-boost-compute: tools/bench/compare-boost-compute.cpp $(BUILD)/rel/gpuarr.o
	@mkdir -p $(@D)
	$(CXX) -std=c++17 -O2 -g -Wall -Wextra -Werror -I. $< $(BUILD)/rel/gpuarr.o -o $@ -lOpenCL $(LIBS)
bench-compare:
	@tools/deps.sh compare
	@$(MAKE) --no-print-directory $(BUILD)/rel/tools/compare-boost-compute
	$(BUILD)/rel/tools/compare-boost-compute

# `make bench-mpi`: tools/bench/bench-mpi.c, one-way bandwidth between 2 ranks, 4 KiB..64 MiB, gpuarr
# arrays on the host and opencl:0 (unified, discrete) against MPI_Send of malloc'ed buffers, in
# one run (bench/results/mpi.md). Not part of make test.
$(BUILD)/rel/tools/bench-mpi: tools/bench/bench-mpi.c $(HEADERS)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_REL) $(MPI_CFLAGS) -I. $< -o $@ $(MPI_LIBS) $(LIBS)
bench-mpi: $(BUILD)/rel/tools/bench-mpi
	$(subst -np $(MPI_RANKS),-np 2,$(MPIRUN)) $(BUILD)/rel/tools/bench-mpi $(BENCH_MPI_FLAGS)

# `make bench-dlpack`: the DLPack hand-over through ctypes against numpy.copy of the same bytes
# (tools/bench/bench-dlpack.py; bench/results/dlpack.md). Not part of make test.
.PHONY: bench-dlpack
bench-dlpack: $(VENV)/packages-installed $(BUILD)/lib/libgpuarr.so
	GPUARR_LIB=$(abspath $(BUILD))/lib/libgpuarr.so $(VENV)/bin/python tools/bench/bench-dlpack.py

# `make bench-kernels`: portable kernels against raw OpenCL launches, a hand-written threaded loop,
# a plain C loop and numpy.sum; a new process's first launch from the cache (bench/results/kernels.md).
# Needs the OpenCL ICD loader (-lOpenCL, for the raw baseline) and PoCL; the CUDA rows run where
# GPUARR_CUDA_LIBRARY names a driver (the fake one: make bench-kernels FAKE=1).
.PHONY: bench-kernels
$(BUILD)/rel/tools/bench-kernels: tools/bench/bench-kernels.c $(BUILD)/rel/gpuarr.o
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_REL) -I. $< $(BUILD)/rel/gpuarr.o -o $@ -lOpenCL $(LIBS)
bench-kernels: $(BUILD)/rel/tools/bench-kernels $(if $(FAKE),$(FAKE_CUDA))
	POCL_DEVICES="$(POCL_DEVICES)" BENCH_PYTHON=$(firstword $(wildcard $(VENV)/bin/python) python3) $(if $(FAKE),$(FAKE_ENV)) $(BUILD)/rel/tools/bench-kernels
