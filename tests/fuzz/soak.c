/*
 * soak.c -- the api interpreter (fuzz_api.c) on random inputs from 8 threads at once, under
 * ASan+UBSan, with allocation faults (the inputs inject them): `make soak` runs it for
 * SOAK_MINUTES (default 30), `make check` for 2. Usage: soak MINUTES [SEED [THREADS]] (1..8).
 * A failing sequence is written to build/logs/soak-crash-input, a hanging one (a watchdog: 90 s
 * past the deadline) to build/logs/soak-crash-input.hang-<thread>; replay with FUZZ_API_SOAK=1
 * build/fuzz-replay/fuzz_api <file> (FUZZ_API_TRACE=1 prints each call).
 *
 * Each thread keeps its own handle table (fz_run's), and fz_soak leaves out the process-wide ops
 * (init/shutdown, set_limit) and the per-input pool checks; those run here at the end, once every
 * thread has joined: every pool back to 0 allocated bytes and, after a trim, 0 reserved.
 */
#define FUZZ_API_NO_ENTRY 1
#include "fuzz_api.c"

#include <time.h>

#define SOAK_THREADS 8

static double soak_deadline;
static uint64_t soak_seed;
static unsigned long long soak_inputs[SOAK_THREADS];

static double soak_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t soak_next(uint64_t *s) { /* splitmix64 */
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint8_t soak_input[SOAK_THREADS][1024]; /* what each thread runs now (for the watchdog) */
static size_t soak_size[SOAK_THREADS];
static int soak_done[SOAK_THREADS];

static void *soak_thread(void *arg) {
    int t = (int)(intptr_t)arg;
    fz_thread = 1 + t; /* its own MPI communicator and tags */
    uint64_t state = soak_seed * 1000003u + (uint64_t)t;
    uint8_t *input = soak_input[t];
    while (soak_now() < soak_deadline) {
        size_t n = 16 + soak_next(&state) % (sizeof soak_input[t] - 16);
        soak_size[t] = n;
        for (size_t i = 0; i < n; i += 8) {
            uint64_t v = soak_next(&state);
            memcpy(input + i, &v, n - i < 8 ? n - i : 8);
        }
        /* fewer forged handles and hostile shapes than uniform bytes give: more work done */
        for (size_t i = 0; i < n; i++)
            if (input[i] >= 0xe0 && (soak_next(&state) & 3)) input[i] &= 0x7f;
        fz_run(input, n);
        soak_inputs[t]++;
    }
    __atomic_store_n(&soak_done[t], 1, __ATOMIC_SEQ_CST);
    return NULL;
}

int main(int argc, char **argv) {
    double minutes = argc > 1 ? atof(argv[1]) : 30;
    soak_seed = argc > 2 ? (uint64_t)strtoull(argv[2], NULL, 0) : (uint64_t)time(NULL);
    int threads = argc > 3 ? atoi(argv[3]) : SOAK_THREADS;
    if (threads < 1 || threads > SOAK_THREADS) threads = SOAK_THREADS;
    printf("soak: %d threads, %.1f min, seed %llu\n", threads, minutes, (unsigned long long)soak_seed);
    fflush(stdout);
    fz_soak = 1;
    pthread_once(&fz_once, fz_start);
    soak_deadline = soak_now() + minutes * 60;
    pthread_t th[SOAK_THREADS];
    for (int t = 0; t < threads; t++)
        if (pthread_create(&th[t], NULL, soak_thread, (void *)(intptr_t)t) != 0) fz_die("pthread_create");
    /* watchdog: a thread still in one sequence 90 s after the deadline is a hang (the slowest seen
       take 15 s, building kernels) */
    for (;;) {
        int done = 0;
        for (int t = 0; t < threads; t++) done += __atomic_load_n(&soak_done[t], __ATOMIC_SEQ_CST);
        if (done == threads) break;
        if (soak_now() > soak_deadline + 90) {
            const char *keep = getenv("FUZZ_API_CRASH_INPUT");
            for (int t = 0; t < threads; t++) {
                if (soak_done[t]) continue;
                fprintf(stderr, "soak: thread %d hangs in a sequence of %zu bytes\n", t, soak_size[t]);
                if (keep) {
                    char path[4096];
                    snprintf(path, sizeof path, "%s.hang-%d", keep, t);
                    FILE *f = fopen(path, "wb");
                    if (f) {
                        fwrite(soak_input[t], 1, soak_size[t], f);
                        fclose(f);
                        fprintf(stderr, "soak: its input is in %s\n", path);
                    }
                }
            }
            fz_die("the soak hangs (seed %llu)", (unsigned long long)soak_seed);
        }
        struct timespec ts = {1, 0};
        nanosleep(&ts, NULL);
    }
    for (int t = 0; t < threads; t++) pthread_join(th[t], NULL);
    unsigned long long total = 0;
    for (int t = 0; t < SOAK_THREADS; t++) total += soak_inputs[t];
    /* the checks the threads left out, now that nothing else runs */
    fz z;
    memset(&z, 0, sizeof z);
    fz_find_devices(&z);
    fz_soak = 0;
    fz_cleanup(&z);
    gpuarr_shutdown();
    printf("soak: %llu sequences from %d threads (%llu gpuarr_mpi calls, %llu succeeded), seed %llu: no crash, every pool back to 0\n", total,
           threads, fz_mpi_calls[0], fz_mpi_calls[1], (unsigned long long)soak_seed);
    return 0;
}
