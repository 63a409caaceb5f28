/* cuda_aware_build.c -- builds the MPI layer's CUDA-aware branch where the MPI is not CUDA-aware
   (Debian's Open MPI: its mpi-ext.h says MPIX_CUDA_AWARE_SUPPORT 0). make mpi-tests compiles and
   links it with -DMPIX_CUDA_AWARE_SUPPORT=1 -DGPUARR__MPI_NO_EXT (mpi-ext.h left out), with
   MPIX_Query_cuda_support declared as Open MPI declares it (libmpi has it). Not run: with no
   CUDA-aware MPI and no GPU here, the direct path has nothing to talk to. */
#define _DEFAULT_SOURCE 1
#include <mpi.h>
int MPIX_Query_cuda_support(void);

#define GPUARR_MPI
#define GPUARR_IMPLEMENTATION
#include "gpuarr.h"

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    gpuarr_init(NULL);
    gpuarr_device d = gpuarr_host();
    int64_t n = 4;
    gpuarr_array a;
    if (gpuarr_zeros(d, GPUARR_F32, 1, &n, &a) == GPUARR_OK) {
        gpuarr_mpi_send(a, 0, -1, MPI_PROC_NULL, 0, MPI_COMM_WORLD);
        gpuarr_release(a);
    }
    gpuarr_shutdown();
    MPI_Finalize();
    return 0;
}
