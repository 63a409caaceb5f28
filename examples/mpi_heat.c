/* mpi_heat.c -- 2-D heat diffusion over MPI ranks, each rank's rows on its own device.
 *
 * The NY x NX grid of f32 is cut into row blocks, one per rank (the first NY % ranks blocks one
 * row longer). A block lives on its rank's device with a halo row above and below; each step the
 * ranks swap edge rows with gpuarr_mpi_sendrecv, then apply the 5-point stencil to their rows:
 * one portable kernel (GPUARR_KERNEL), run where the block lives, whatever the device (a device
 * whose backend runs no portable kernels: the same kernel on host copies of the block). The
 * grid's edge keeps its values. Rank 0 gathers the field and compares it with a one-rank run of
 * the same code on the host, in the same process: bit for bit, since every device does the same
 * f32 operations in the same order (a kernel is never contracted into fma, on any device).
 *
 *   mpirun -np 4 ./mpi_heat [--nx N] [--ny N] [--steps N] [--device SPEC[,SPEC...]]
 *
 * --device: rank r takes the (r % count)-th SPEC (e.g. host,opencl:0,opencl:1); without it
 * gpuarr_mpi_device picks the node-local rank's GPU, else the host. Exit status 0 when the field
 * is identical to the one-rank run, 1 when not or on an error, 2 on bad arguments.
 * Build: mpicc -std=c11 -I.. mpi_heat.c -lm -lpthread -ldl */
#define _DEFAULT_SOURCE 1 /* before any C library header: the implementation needs POSIX calls */
#include <mpi.h>                /* <mpi.h>, then GPUARR_MPI, then gpuarr.h: the gpuarr_mpi_ calls */
#define GPUARR_MPI
#define GPUARR_IMPLEMENTATION   /* this one file is the whole program */
#include "gpuarr.h"
#include <tgmath.h> /* a file with kernels: float math as on the devices */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define K 0.1f /* diffusion number: stable for K <= 0.25 */

/* v = one step of u at the interior point (lo + index 1, 1 + index 0) of an nx-wide block. */
GPUARR_KERNEL(heat, (GPUARR_IN(float, u), GPUARR_OUT(float, v), GPUARR_SCALAR(int64_t, nx), GPUARR_SCALAR(int64_t, lo),
                     GPUARR_SCALAR(float, k)), {
    int64_t i = (lo + gpuarr_index(1)) * nx + 1 + gpuarr_index(0);
    float c = u[i], n = u[i - nx], s = u[i + nx], w = u[i - 1], e = u[i + 1];
    v[i] = c + k * ((n + s) + (w + e) - 4.0f * c);
})

/* The initial field, from integers: every rank computes the same floats. Values stay within
   [0.25, 1] (a stencil with K <= 0.25 averages), far from subnormals, which an OpenCL device
   may flush to zero where the host does not. */
static float initial(int64_t row, int64_t col, int64_t ny, int64_t nx) {
    if (row == 0) return 1.0f; /* a hot top edge */
    if (row == ny - 1 || col == 0 || col == nx - 1) return 0.25f;
    return 0.25f + (float)((row * 7 + col * 13) % 17) / 32.0f;
}

/* One rank's block: rows [first, first + rows) of the grid, stored with a halo row above and
   below in two (rows + 2) x nx arrays, u (now) and v (next). */
typedef struct block {
    gpuarr_device dev;
    int64_t nx, ny, first, rows, lo, hi; /* local rows [lo, hi) are updated: not the grid's edge */
    gpuarr_array u, v;
} block;

#define TRY(call)                                                                            \
    do {                                                                                     \
        if ((call) != GPUARR_OK) {                                                           \
            fprintf(stderr, "mpi_heat: %s: %s\n", #call, gpuarr_last_error());               \
            return 1;                                                                        \
        }                                                                                    \
    } while (0)

static int block_init(block *b, gpuarr_device dev, int64_t ny, int64_t nx, int rank, int ranks) {
    memset(b, 0, sizeof *b);
    b->dev = dev, b->nx = nx, b->ny = ny;
    b->rows = ny / ranks + (rank < ny % ranks);
    b->first = rank * (ny / ranks) + (rank < ny % ranks ? rank : ny % ranks);
    b->lo = b->first == 0 ? 2 : 1;                        /* local row 1 is grid row first */
    b->hi = b->first + b->rows == ny ? b->rows : b->rows + 1;
    int64_t shape[2] = {b->rows + 2, nx};
    float *f = calloc((size_t)(shape[0] * nx), sizeof *f);
    if (!f) return 1;
    for (int64_t r = 0; r < shape[0]; r++) /* halo rows outside the grid stay 0, never read */
        for (int64_t c = 0; c < nx && b->first + r - 1 >= 0 && b->first + r - 1 < ny; c++)
            f[r * nx + c] = initial(b->first + r - 1, c, ny, nx);
    gpuarr_result res = gpuarr_from_host_as(dev, GPUARR_F32, f, 2, shape, &b->u); /* both keep the edge */
    if (res == GPUARR_OK) res = gpuarr_from_host_as(dev, GPUARR_F32, f, 2, shape, &b->v);
    free(f);
    TRY(res);
    return 0;
}

/* v = stencil(u) over the rows [lo, hi): the kernel where the block lives. gpuarr orders it after
   the halos just received and orders the next send after it. */
static int stencil(block *b) {
    gpuarr_launch l = {.ndim = 2, .global = {b->nx - 2, b->hi - b->lo}};
    gpuarr_result r = heat(&l, b->u, b->v, b->nx, b->lo, K);
    if (r != GPUARR_ERROR_UNSUPPORTED) {
        TRY(r);
        return 0;
    }
    /* a device that runs no portable kernels: the same kernel on host copies, v copied back */
    gpuarr_array hu = {0}, hv = {0};
    r = gpuarr_convert(b->u, gpuarr_host(), 0, &hu);
    if (r == GPUARR_OK) r = gpuarr_convert(b->v, gpuarr_host(), 0, &hv);
    if (r == GPUARR_OK) r = heat(&l, hu, hv, b->nx, b->lo, K);
    if (r == GPUARR_OK) r = gpuarr_copy(b->v, hv);
    if (r != GPUARR_OK) fprintf(stderr, "mpi_heat: staging through the host: %s\n", gpuarr_last_error());
    gpuarr_release(hu);
    gpuarr_release(hv);
    return r != GPUARR_OK;
}

/* One step: halos of u from the neighbours (MPI_PROC_NULL at the grid's edge: nothing moves),
   then v = stencil(u), then u and v swap. */
static int step(block *b, MPI_Comm comm) {
    int rank, ranks;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &ranks);
    int up = rank > 0 ? rank - 1 : MPI_PROC_NULL, down = rank < ranks - 1 ? rank + 1 : MPI_PROC_NULL;
    int64_t nx = b->nx, n = b->rows;
    /* my first row up, my lower halo from below; then my last row down, my upper halo from above */
    TRY(gpuarr_mpi_sendrecv(b->u, nx, nx, up, 0, b->u, (n + 1) * nx, nx, GPUARR_F32, down, 0, comm));
    TRY(gpuarr_mpi_sendrecv(b->u, n * nx, nx, down, 1, b->u, 0, nx, GPUARR_F32, up, 1, comm));
    if (b->hi > b->lo && stencil(b)) return 1;
    gpuarr_array t = b->u;
    b->u = b->v, b->v = t;
    return 0;
}

static void block_free(block *b) {
    gpuarr_release(b->u);
    gpuarr_release(b->v);
}

/* Runs `steps` steps of this rank's block of the grid over comm; *b holds the result. */
static int solve(block *b, gpuarr_device dev, int64_t ny, int64_t nx, int steps, MPI_Comm comm) {
    int rank, ranks;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &ranks);
    if (block_init(b, dev, ny, nx, rank, ranks)) return 1;
    for (int t = 0; t < steps; t++)
        if (step(b, comm)) return 1;
    return 0;
}

/* Rank 0 receives every block's rows into `field` (ny x nx on the host); the others send theirs. */
static int gather(const block *b, gpuarr_array field, MPI_Comm comm) {
    int rank, ranks;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &ranks);
    if (rank != 0) {
        TRY(gpuarr_mpi_send(b->u, b->nx, b->rows * b->nx, 0, 2, comm));
        return 0;
    }
    void *p;
    TRY(gpuarr_host_data(field, &p));
    TRY(gpuarr_read(b->u, b->nx, b->rows * b->nx, GPUARR_F32, p)); /* rank 0's rows come first */
    for (int r = 1; r < ranks; r++) {
        int64_t rows = b->ny / ranks + (r < b->ny % ranks), first = r * (b->ny / ranks) + (r < b->ny % ranks ? r : b->ny % ranks);
        TRY(gpuarr_mpi_recv(field, first * b->nx, rows * b->nx, GPUARR_F32, r, 2, comm));
    }
    return 0;
}

/* The field against the one-rank run on the host: 0 when every bit agrees. */
static int compare(gpuarr_array field, int64_t ny, int64_t nx, int steps) {
    block ref;
    int bad = solve(&ref, gpuarr_host(), ny, nx, steps, MPI_COMM_SELF);
    void *pf, *pr;
    if (!bad) bad = gpuarr_host_data(field, &pf) != GPUARR_OK || gpuarr_host_data(ref.u, &pr) != GPUARR_OK;
    if (!bad) {
        const float *f = pf, *g = (const float *)pr + nx; /* past the reference's upper halo */
        double diff = 0;
        for (int64_t i = 0; i < ny * nx; i++) diff = fmax(diff, fabs((double)f[i] - (double)g[i]));
        bad = memcmp(f, g, (size_t)(ny * nx) * sizeof *f) != 0;
        printf("%lld x %lld grid, %d steps: max abs diff against one rank %g: %s\n", (long long)ny, (long long)nx,
               steps, diff, bad ? "DIFFERENT" : "identical");
    }
    block_free(&ref);
    return bad;
}

static int parse(int argc, char **argv, int64_t *ny, int64_t *nx, int *steps, const char **devices) {
    for (int i = 1; i < argc; i++) {
        char *end = NULL;
        long long v = 0;
        if (i + 1 < argc && strcmp(argv[i], "--device") == 0) *devices = argv[++i];
        else if (i + 1 < argc && strcmp(argv[i], "--nx") == 0) v = strtoll(argv[++i], &end, 10), *nx = v;
        else if (i + 1 < argc && strcmp(argv[i], "--ny") == 0) v = strtoll(argv[++i], &end, 10), *ny = v;
        else if (i + 1 < argc && strcmp(argv[i], "--steps") == 0) v = strtoll(argv[++i], &end, 10), *steps = (int)v;
        else return 1;
        if ((end && *end) || v < 0 || v > 1 << 20) return 1;
    }
    return *nx < 3 || *ny < 3;
}

/* --device's (rank % count)-th spec, else gpuarr_mpi_device's choice. */
static int pick_device(const char *devices, int rank, gpuarr_device *dev) {
    if (!devices) {
        TRY(gpuarr_mpi_device(MPI_COMM_WORLD, dev));
        return 0;
    }
    int count = 1;
    for (const char *c = devices; *c; c++) count += *c == ',';
    const char *s = devices;
    for (int i = 0; i < rank % count; i++) s = strchr(s, ',') + 1;
    char spec[64];
    snprintf(spec, sizeof spec, "%.*s", (int)strcspn(s, ","), s);
    TRY(gpuarr_device_find(spec, dev));
    return 0;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, ranks, status = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &ranks);
    int64_t ny = 50, nx = 64; /* 50 rows: uneven blocks on 3 or 4 ranks */
    int steps = 100;
    const char *devices = NULL;
    if (parse(argc, argv, &ny, &nx, &steps, &devices) || ny < ranks) {
        if (rank == 0)
            fprintf(stderr, "usage: mpirun -np N %s [--nx N] [--ny N] [--steps N] [--device SPEC[,SPEC...]]\n"
                            "  (nx, ny >= 3 and ny >= the number of ranks)\n", argv[0]);
        MPI_Finalize();
        return 2;
    }
    if (gpuarr_init(NULL) != GPUARR_OK) {
        fprintf(stderr, "mpi_heat: rank %d: %s\n", rank, gpuarr_last_error());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    gpuarr_device dev;
    gpuarr_device_info info;
    block b;
    if (pick_device(devices, rank, &dev) || gpuarr_device_get_info(dev, &info) != GPUARR_OK ||
        solve(&b, dev, ny, nx, steps, MPI_COMM_WORLD))
        MPI_Abort(MPI_COMM_WORLD, 1); /* the other ranks would wait for this one's halos */
    char where[128], *all = rank == 0 ? malloc(sizeof where * (size_t)ranks) : NULL; /* where each rank ran */
    snprintf(where, sizeof where, "rank %d: rows %lld..%lld on %s", rank, (long long)b.first,
             (long long)(b.first + b.rows - 1), info.spec);
    if (rank == 0 && !all) MPI_Abort(MPI_COMM_WORLD, 1);
    MPI_Gather(where, sizeof where, MPI_CHAR, all, sizeof where, MPI_CHAR, 0, MPI_COMM_WORLD);
    gpuarr_array field = {0};
    if (rank == 0) {
        for (int r = 0; r < ranks; r++) printf("%s\n", all + sizeof where * (size_t)r);
        free(all);
        if (gpuarr_empty(gpuarr_host(), GPUARR_F32, 2, (int64_t[]){ny, nx}, &field) != GPUARR_OK) MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (gather(&b, field, MPI_COMM_WORLD)) MPI_Abort(MPI_COMM_WORLD, 1);
    if (rank == 0) status = compare(field, ny, nx, steps);
    gpuarr_release(field);
    block_free(&b);
    gpuarr_shutdown();
    MPI_Bcast(&status, 1, MPI_INT, 0, MPI_COMM_WORLD); /* every rank exits with rank 0's verdict */
    MPI_Finalize();
    return status;
}
