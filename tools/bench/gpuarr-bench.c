/* gpuarr-bench: measured performance, each figure next to its baseline from the same run.
 *
 *   gpuarr-bench [--mib N] [--cuda-mib N] [--reps N] [--host-only | --opencl-only | --pool-only |
 *                --cuda-only | --mutable-only | --batch-only] [--device SPEC]
 *                [--host-isa auto|baseline|avx2|both[,...]] [--csv FILE|- [--sweep-min SIZE] [--sweep-max SIZE]]
 *                [--trace-overhead] [--leases [--lease-jobs N]] [--calibrate]
 *
 * Every run starts with the machine: the CPU's name, vendor, family, model and stepping, the ISA
 * flags that matter (sse4_2 avx avx2 fma f16c bmi2 avx512*), a machine tag made of them for
 * file names ("zen3-avx2"), the compiler, the host cast kernels in use (what gpuarr chose, or
 * GPUARR_HOST_ISA), and every device with its name and version (PoCL's names its target, e.g.
 * pthread-haswell).
 *
 * The suites, one file each beside this one (their comments say what each measures and how):
 *   suite_host.h       the host section: casts against memcpy (--host-only, --host-isa)
 *   suite_pools.h      the pools against raw allocations (--pool-only)
 *   suite_mutable.h    arrays you write into (--mutable-only)
 *   suite_opencl.h     OpenCL transfers, casts, kernel builds, batches (--opencl-only, --batch-only)
 *   suite_cuda.h       CUDA transfers, casts, kernel loads, pools (--cuda-only, --cuda-mib)
 *   suite_sweep.h      rate against size for plots (--csv, --sweep-min, --sweep-max)
 *   suite_trace.h      what the trace costs (--trace-overhead)
 *   suite_leases.h     what leases cost (--leases, --lease-jobs)
 *   suite_calibrate.h  the transfer models' calibration (--calibrate)
 * bench_common.h holds what they share. One translation unit: the suites reach into the
 * implementation (its device table, its drivers' entry points), so it is compiled here, once. */
#define GPUARR_IMPLEMENTATION
#include "gpuarr.h"

#include "bench_common.h"
#include "suite_host.h"
#include "suite_trace.h"
#include "suite_leases.h"
#include "suite_pools.h"
#include "suite_opencl.h"
#include "suite_mutable.h"
#include "suite_cuda.h"
#include "suite_sweep.h"
#include "suite_calibrate.h"

/* "4096", "64K", "256M", "1G" (K, M, G: powers of 1024); 0 when it is not a size. */
static size_t parse_size(const char *s) {
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    int shift = *end == 'K' || *end == 'k' ? 10 : *end == 'M' || *end == 'm' ? 20 : *end == 'G' || *end == 'g' ? 30 : 0;
    if (shift) end++;
    if (end == s || *end || v > (SIZE_MAX >> shift)) return 0;
    return (size_t)v << shift;
}

/* --host-isa: a comma list of auto, baseline, avx2; "both" = baseline,avx2. */
static bool parse_isa_list(const char *text) {
    static char copy[128];
    snprintf(copy, sizeof copy, "%s", strcmp(text, "both") == 0 ? "baseline,avx2" : text);
    isa_count = 0;
    for (char *p = strtok(copy, ","); p; p = strtok(NULL, ",")) {
        if (strcmp(p, "auto") != 0 && strcmp(p, "baseline") != 0 && strcmp(p, "avx2") != 0) {
            fprintf(stderr, "gpuarr-bench: --host-isa: \"%s\" is not auto, baseline or avx2 (or both)\n", p);
            return false;
        }
        if (isa_count == MAX_ISAS) {
            fprintf(stderr, "gpuarr-bench: --host-isa: at most %d entries\n", MAX_ISAS);
            return false;
        }
        isa_list[isa_count++] = p;
    }
    if (isa_count == 0) fprintf(stderr, "gpuarr-bench: --host-isa: empty list\n");
    return isa_count > 0;
}

int main(int argc, char **argv) {
    size_t mib = 64;
    int reps = 11;
    const char *only = NULL;
    bool host = true, opencl = true, pools = true, cuda = true, mutable_arrays = true;
    size_t cuda_mib = 256, sweep_min = 4096, sweep_max = (size_t)256 << 20;
    const char *csv = NULL;
    bool reps_given = false, trace_overhead = false, leases = false;
    int lease_jobs = 256;
    saved_isa_env = getenv("GPUARR_HOST_ISA") ? strdup(getenv("GPUARR_HOST_ISA")) : NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--mib") == 0 && i + 1 < argc) mib = (size_t)strtoul(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) reps = atoi(argv[++i]), reps_given = true;
        else if (strcmp(argv[i], "--host-isa") == 0 && i + 1 < argc) {
            if (!parse_isa_list(argv[++i])) return 2;
        } else if (strcmp(argv[i], "--csv") == 0 && i + 1 < argc) csv = argv[++i];
        else if (strcmp(argv[i], "--sweep-min") == 0 && i + 1 < argc) sweep_min = parse_size(argv[++i]);
        else if (strcmp(argv[i], "--sweep-max") == 0 && i + 1 < argc) sweep_max = parse_size(argv[++i]);
        else if (strcmp(argv[i], "--device") == 0 && i + 1 < argc) only = argv[++i];
        else if (strcmp(argv[i], "--cuda-mib") == 0 && i + 1 < argc) cuda_mib = (size_t)strtoul(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--host-only") == 0) opencl = pools = cuda = mutable_arrays = false;
        else if (strcmp(argv[i], "--opencl-only") == 0) host = pools = cuda = mutable_arrays = false;
        else if (strcmp(argv[i], "--pool-only") == 0) host = opencl = cuda = mutable_arrays = false;
        else if (strcmp(argv[i], "--cuda-only") == 0) host = opencl = pools = mutable_arrays = false;
        else if (strcmp(argv[i], "--mutable-only") == 0) host = opencl = pools = cuda = false;
#ifndef GPUARR_NO_OPENCL
        else if (strcmp(argv[i], "--batch-only") == 0) { host = pools = cuda = mutable_arrays = false; batch_only = true; }
#endif
        else if (strcmp(argv[i], "--probe-build") == 0 && i + 1 < argc) return probe_build_time(argv[i + 1]);
        else if (strcmp(argv[i], "--trace-overhead") == 0) trace_overhead = true;
        else if (strcmp(argv[i], "--leases") == 0) leases = true;
        else if (strcmp(argv[i], "--lease-jobs") == 0 && i + 1 < argc) lease_jobs = atoi(argv[++i]);
        else if (strcmp(argv[i], "--lease-peer") == 0 && i + 4 < argc)
            return lease_peer(atoi(argv[i + 1]), atol(argv[i + 2]), atol(argv[i + 3]), strtod(argv[i + 4], NULL));
        else if (strcmp(argv[i], "--calibrate") == 0) return bench_calibrate();
        else {
            fprintf(stderr,
                    "usage: %s [--mib N] [--cuda-mib N] [--reps N (1..63)] [--host-only | --opencl-only | --pool-only | --cuda-only | "
                    "--mutable-only | --batch-only] [--device SPEC] [--host-isa auto|baseline|avx2|both[,...]] "
                    "[--csv FILE|- [--sweep-min SIZE] [--sweep-max SIZE]] [--trace-overhead] [--leases [--lease-jobs N]] [--calibrate]\n",
                    argv[0]);
            return 2;
        }
    }
    if (mib == 0 || reps < 1 || reps > 63 || lease_jobs < 1 || (leases && reps > 15)) {
        fprintf(stderr, "gpuarr-bench: --mib and --lease-jobs must be > 0, --reps 1..63 (1..15 with --leases)\n");
        return 2;
    }
    if (sweep_min < 64 || sweep_min % 8 || sweep_max < sweep_min) {
        fprintf(stderr, "gpuarr-bench: --sweep-min must be >= 64 and a multiple of 8, --sweep-max >= --sweep-min (sizes: 4096, 64K, 256M)\n");
        return 2;
    }
    if (gpuarr_init(NULL) != GPUARR_OK) die("gpuarr_init");
    cpu_desc cpu;
    read_cpu(&cpu);
    if (csv) {
        sweep(csv, &cpu, sweep_min, sweep_max, reps_given ? reps : 63, host, opencl, cuda, only);
        gpuarr_shutdown();
        free(saved_isa_env);
        return 0;
    }
    printf("## Run\n\n");
    print_machine(stdout, "- ", &cpu);
    printf("\n");
    if (trace_overhead) {
        bench_trace_overhead(reps_given ? reps : 21, only);
        gpuarr_shutdown();
        free(saved_isa_env);
        return 0;
    }
    if (leases) {
        bench_leases(argv[0], lease_jobs, reps_given ? reps : 3);
        gpuarr_shutdown();
        free(saved_isa_env);
        return 0;
    }
    printf("memcpy: glibc, one thread, %zu MiB, interleaved with the measured calls in every repetition; %d repetitions.\n\n", mib, reps);
    if (host) {
        bench_host_casts(mib, reps);
        bench_small_alloc();
    }
    if (pools) bench_pools(only);
    if (mutable_arrays) bench_mutable(mib, reps, only);
#ifndef GPUARR_NO_OPENCL
    if (opencl) bench_opencl(argv[0], mib, reps, only);
#else
    GPUARR__UNUSED(opencl);
#endif
#ifndef GPUARR_NO_CUDA
    if (cuda) bench_cuda(argv[0], cuda_mib, reps, only);
#else
    GPUARR__UNUSED(cuda);
    GPUARR__UNUSED(cuda_mib);
#endif
    GPUARR__UNUSED(only);
    gpuarr_shutdown();
    free(saved_isa_env);
    return 0;
}
