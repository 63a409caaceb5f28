/* The library inside a plugin: a .so that contains the implementation is loaded with dlopen,
   used from a worker thread (init, from_host, convert, shutdown), then unloaded with dlclose
   while the thread is still alive; the thread then exits. Nothing of the unloaded code may run
   at that exit (a thread-specific-data destructor left behind would crash the process).
   Usage: plugin_driver path/to/plugin.so; exits 0 when all went well. */
#define _POSIX_C_SOURCE 200809L
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include "gpuarr.h"

typedef struct plugin_api {
    gpuarr_result (*init)(const gpuarr_desc *);
    void (*shutdown)(void);
    gpuarr_result (*device_find)(const char *, gpuarr_device *);
    gpuarr_device (*host)(void);
    gpuarr_result (*from_host_as)(gpuarr_device, gpuarr_dtype, const void *, int, const int64_t *, gpuarr_array *);
    gpuarr_result (*convert)(gpuarr_array, gpuarr_device, gpuarr_dtype, gpuarr_array *);
    gpuarr_result (*to_host_as)(gpuarr_array, gpuarr_dtype, void *, size_t);
    gpuarr_result (*release)(gpuarr_array);
    const char *(*last_error)(void);
} plugin_api;

static plugin_api api;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
static int stage; /* 1: the worker is done with the library; 2: the plugin is unloaded */
static int worker_failed;

static void *sym(void *so, const char *name) {
    void *p = dlsym(so, name);
    if (!p) {
        fprintf(stderr, "plugin_driver: %s not found: %s\n", name, dlerror());
        exit(1);
    }
    return p;
}

/* Converts to `spec` (f32 -> i32 on the device), back to the host, and checks the values. */
static int round_trip(const char *spec) {
    gpuarr_device d;
    if (api.device_find(spec, &d) != GPUARR_OK) return 0; /* not present: nothing to check */
    float in[64];
    int32_t back[64];
    for (int i = 0; i < 64; i++) in[i] = (float)i + 0.5f;
    int64_t shape[1] = {64};
    gpuarr_array h, dev;
    if (api.from_host_as(api.host(), GPUARR_F32, in, 1, shape, &h) != GPUARR_OK ||
        api.convert(h, d, GPUARR_I32, &dev) != GPUARR_OK || api.to_host_as(dev, GPUARR_I32, back, 64) != GPUARR_OK) {
        fprintf(stderr, "plugin_driver: %s: %s\n", spec, api.last_error());
        return 1;
    }
    api.release(dev);
    api.release(h);
    for (int i = 0; i < 64; i++)
        if (back[i] != i) return fprintf(stderr, "plugin_driver: %s: element %d is %d\n", spec, i, back[i]), 1;
    printf("plugin_driver: f32 -> i32 on %s and back from a worker thread\n", spec);
    return 0;
}

static void set_stage(int s) {
    pthread_mutex_lock(&lock);
    stage = s;
    pthread_cond_broadcast(&cond);
    pthread_mutex_unlock(&lock);
}

static void *worker(void *unused) {
    (void)unused;
    if (api.init(NULL) != GPUARR_OK) {
        fprintf(stderr, "plugin_driver: gpuarr_init: %s\n", api.last_error());
        worker_failed = 1;
    } else {
        worker_failed = round_trip("host") | round_trip("opencl:0") | round_trip("cuda:0");
        api.shutdown();
    }
    set_stage(1);
    pthread_mutex_lock(&lock); /* stay alive until the plugin is gone, then exit */
    while (stage != 2) pthread_cond_wait(&cond, &lock);
    pthread_mutex_unlock(&lock);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 2) return fprintf(stderr, "usage: plugin_driver plugin.so\n"), 2;
    void *so = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!so) return fprintf(stderr, "plugin_driver: %s\n", dlerror()), 1;
    *(void **)&api.init = sym(so, "gpuarr_init");
    *(void **)&api.shutdown = sym(so, "gpuarr_shutdown");
    *(void **)&api.device_find = sym(so, "gpuarr_device_find");
    *(void **)&api.host = sym(so, "gpuarr_host");
    *(void **)&api.from_host_as = sym(so, "gpuarr_from_host_as");
    *(void **)&api.convert = sym(so, "gpuarr_convert");
    *(void **)&api.to_host_as = sym(so, "gpuarr_to_host_as");
    *(void **)&api.release = sym(so, "gpuarr_release");
    *(void **)&api.last_error = sym(so, "gpuarr_last_error");
    pthread_t t;
    if (pthread_create(&t, NULL, worker, NULL) != 0) return fprintf(stderr, "plugin_driver: pthread_create failed\n"), 1;
    pthread_mutex_lock(&lock);
    while (stage != 1) pthread_cond_wait(&cond, &lock);
    pthread_mutex_unlock(&lock);
    if (dlclose(so) != 0) return fprintf(stderr, "plugin_driver: dlclose: %s\n", dlerror()), 1;
    set_stage(2); /* the worker exits now, with the plugin unloaded */
    pthread_join(t, NULL);
    if (worker_failed) return 1;
    printf("plugin_driver: the worker thread exited after dlclose; the process is fine\n");
    return 0;
}
