/* offload.c -- the README's "Offload" program: a task with a host, an OpenCL and a CUDA
   implementation, run five times by gpuarr_offload, and its model on the host. */
#include <stdio.h>
#include "gpuarr.h"

/* out[0] = in[0] as f64, on whichever device runs it */
static gpuarr_result widen(const gpuarr_array *in, int n_in, gpuarr_array *out, int n_out, gpuarr_stream s, void *user) {
    (void)n_in, (void)n_out, (void)user;
    return gpuarr_convert_async(in[0], gpuarr_current_device(), GPUARR_F64, s, &out[0]);
}

int main(void) {
    if (gpuarr_init(NULL) != GPUARR_OK) return 1;
    gpuarr_task_desc td = {0};
    td.name = "widen";                             /* the models' key */
    td.n_in = td.n_out = 1;
    td.impl[GPUARR_BACKEND_HOST] = td.impl[GPUARR_BACKEND_OPENCL] = td.impl[GPUARR_BACKEND_CUDA] = widen;
    gpuarr_task task;
    gpuarr_array in, out;
    int64_t n = 1 << 20;
    gpuarr_offload_desc od = {0};                  /* every device, the models' choice */
    od.out_device = gpuarr_host();                 /* outputs back on the host */
    gpuarr_device on;
    if (gpuarr_task_create(&td, &task) != GPUARR_OK || gpuarr_zeros(gpuarr_host(), GPUARR_F32, 1, &n, &in) != GPUARR_OK) return 1;
    for (int i = 0; i < 5; i++) { /* the first run on each device is a warm-up */
        if (gpuarr_offload(task, &in, 1, &out, 1, &od, &on) != GPUARR_OK) {
            fprintf(stderr, "%s\n", gpuarr_last_error());
            return 1;
        }
        gpuarr_device_info info;
        if (gpuarr_device_get_info(on, &info) == GPUARR_OK) printf("run %d on %s\n", i, info.spec);
        gpuarr_release(out);
    }
    gpuarr_task_stats st;
    if (gpuarr_task_get_stats(task, gpuarr_host(), &st) == GPUARR_OK)
        printf("host: %llu calls, t = %.3g s + %.3g s * n\n", (unsigned long long)st.calls, st.model_a_s, st.model_b_s);
    gpuarr_release(in);
    gpuarr_task_destroy(task);
    gpuarr_shutdown();
    return 0;
}
