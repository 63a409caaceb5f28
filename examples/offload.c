/* offload.c -- the README's "Offload" program: a task made from one portable kernel, which runs
   on every device whose backend runs kernels, run five times by gpuarr_offload, and its model on
   the host. */
#include <stdio.h>
#include <tgmath.h> /* a file with kernels: float math as on the devices */
#include "gpuarr.h"

/* y = x as f64: one portable kernel, so the task runs on every device with no code per backend */
GPUARR_KERNEL(widen, (GPUARR_IN(float, x), GPUARR_OUT(double, y)), {
    int64_t i = gpuarr_index(0);
    y[i] = (double)x[i];
})

int main(void) {
    if (gpuarr_init(NULL) != GPUARR_OK) return 1;
    gpuarr_task_desc td = {0};
    td.kernel = &widen_gpuarr_kernel;              /* its name "widen" is the models' key; one input, one output */
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
