/*
 * bench-mpi.c -- one-way send/recv bandwidth between two MPI ranks on one machine:
 * gpuarr_mpi_send/recv of f32 arrays on the host, on opencl:0 (PoCL, unified memory) and on
 * opencl:0 handled as a discrete device (GPUARR_OPENCL_UNIFIED=off: pinned staging), against
 * plain MPI_Send/MPI_Recv of malloc'ed host buffers and of buffers allocated as gpuarr's host
 * pool allocates (2 MiB aligned, MADV_HUGEPAGE), in one run (make bench-mpi):
 *
 *   mpirun -np 2 build/rel/tools/bench-mpi [--reps N] [--max-mib M]
 *
 * Each point: rank 0 sends `iters` messages of the size, rank 1 receives them and answers with
 * one byte; the time from the first send to the answer, divided by iters, is one sample; the
 * median of --reps samples (default 7; one per round, each round every mode and size in turn)
 * is printed, as GB/s (1e9 bytes/s). Both ranks use the same
 * kind of device (each process has its own PoCL). GPUARR_MPI_CHUNK is the default (4 MiB) unless
 * set. The answer's latency is in every sample (at most about 1/iters of it).
 */
#define _DEFAULT_SOURCE 1
#include <mpi.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define GPUARR_MPI
#define GPUARR_IMPLEMENTATION
#include "gpuarr.h"

enum { MODES = 5, MPI_MODES = 2, MAX_REPS = 64 };
static const char *mode_names[MODES] = {"MPI_Send (malloc)", "MPI_Send (huge pages)", "gpuarr host",
                                        "gpuarr opencl:0 unified", "gpuarr opencl:0 discrete"};
static int rank;

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void must(gpuarr_result r, const char *what) {
    if (r == GPUARR_OK) return;
    fprintf(stderr, "rank %d: %s: %s\n", rank, what, gpuarr_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
}

/* One sample: seconds per message of `bytes`. */
static double sample(int mode, gpuarr_array a, void *buf, size_t bytes, int iters) {
    char ack = 0;
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int i = 0; i < iters; i++) {
        if (mode < MPI_MODES) {
            if (rank == 0) MPI_Send(buf, (int)bytes, MPI_BYTE, 1, 5, MPI_COMM_WORLD);
            else MPI_Recv(buf, (int)bytes, MPI_BYTE, 0, 5, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else if (rank == 0) {
            must(gpuarr_mpi_send(a, 0, -1, 1, 5, MPI_COMM_WORLD), "gpuarr_mpi_send");
        } else {
            must(gpuarr_mpi_recv(a, 0, -1, 0, 0, 5, MPI_COMM_WORLD), "gpuarr_mpi_recv");
        }
    }
    if (rank == 1) MPI_Send(&ack, 1, MPI_BYTE, 0, 6, MPI_COMM_WORLD);
    else MPI_Recv(&ack, 1, MPI_BYTE, 1, 6, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    return (MPI_Wtime() - t0) / iters;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int reps = 7, max_mib = 64;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) reps = atoi(argv[++i]);
        else if (strcmp(argv[i], "--max-mib") == 0 && i + 1 < argc) max_mib = atoi(argv[++i]);
    }
    if (size != 2 || reps < 1 || reps > MAX_REPS || max_mib < 1) {
        if (rank == 0) fprintf(stderr, "usage: mpirun -np 2 bench-mpi [--reps 1..%d] [--max-mib M]\n", MAX_REPS);
        MPI_Finalize();
        return 2;
    }
    size_t sizes[16];
    int nsizes = 0;
    for (size_t s = 4096; s <= (size_t)max_mib << 20 && nsizes < 16; s *= 4) sizes[nsizes++] = s;
    /* rounds outside, modes inside: a burst of load from elsewhere on the machine falls on every
       mode alike rather than on one column (gpuarr is started anew for each mode and round) */
    static double t[MODES][16][MAX_REPS];
    for (int rep = 0; rep < reps; rep++)
        for (int mode = 0; mode < MODES; mode++) {
            if (mode >= MPI_MODES) {
                if (mode == 4) setenv("GPUARR_OPENCL_UNIFIED", "off", 1);
                must(gpuarr_init(NULL), "gpuarr_init");
            }
            gpuarr_device dev = gpuarr_host();
            if (mode >= 3) must(gpuarr_device_find("opencl:0", &dev), "gpuarr_device_find(opencl:0)");
            for (int k = 0; k < nsizes; k++) {
                size_t bytes = sizes[k];
                int iters = (int)(((size_t)64 << 20) / bytes);
                iters = iters < 4 ? 4 : iters > 200 ? 200 : iters;
                void *buf = NULL;
                gpuarr_array a = {0};
                if (mode == 0) {
                    buf = malloc(bytes);
                    memset(buf, 1, bytes);
                } else if (mode == 1) { /* as gpuarr's host pool allocates: 2 MiB aligned, huge pages asked */
                    size_t huge = (size_t)2 << 20, rounded = (bytes + huge - 1) / huge * huge;
                    buf = aligned_alloc(huge, rounded);
                    madvise(buf, rounded, MADV_HUGEPAGE);
                    memset(buf, 1, bytes);
                } else {
                    int64_t n = (int64_t)(bytes / 4);
                    must(gpuarr_zeros(dev, GPUARR_F32, 1, &n, &a), "gpuarr_zeros");
                }
                sample(mode, a, buf, bytes, 2); /* warm-up: pools, kernels, MPI's paths */
                t[mode][k][rep] = sample(mode, a, buf, bytes, iters);
                free(buf);
                if (a.id) gpuarr_release(a);
            }
            if (mode >= MPI_MODES) gpuarr_shutdown();
            if (mode == 4) unsetenv("GPUARR_OPENCL_UNIFIED");
        }
    double gbs[MODES][16];
    for (int mode = 0; mode < MODES; mode++)
        for (int k = 0; k < nsizes; k++) {
            qsort(t[mode][k], (size_t)reps, sizeof(double), cmp_double);
            gbs[mode][k] = (double)sizes[k] / t[mode][k][reps / 2] / 1e9;
        }
    if (rank == 0) {
        printf("| size |");
        for (int m = 0; m < MODES; m++) printf(" %s GB/s |", mode_names[m]);
        printf("\n|---:|");
        for (int m = 0; m < MODES; m++) printf("---:|");
        printf("\n");
        for (int k = 0; k < nsizes; k++) {
            if (sizes[k] >= (1u << 20)) printf("| %zu MiB |", sizes[k] >> 20);
            else printf("| %zu KiB |", sizes[k] >> 10);
            for (int m = 0; m < MODES; m++) printf(" %.2f |", gbs[m][k]);
            printf("\n");
        }
        printf("(median of %d samples; one-way, rank 0 -> rank 1, f32 arrays, GPUARR_MPI_CHUNK %s)\n", reps,
               getenv("GPUARR_MPI_CHUNK") ? getenv("GPUARR_MPI_CHUNK") : "default 4 MiB");
    }
    MPI_Finalize();
    return 0;
}
