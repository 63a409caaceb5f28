/*
 * fuzz_parse.c -- the configuration fuzz target, white-box: it compiles the
 * implementation itself and feeds text to the same functions gpuarr_init uses: the device filter
 * (gpuarr__parse_filter: GPUARR_DEVICES, desc.devices), GPUARR_ALLOC_CONF (gpuarr__parse_alloc_conf),
 * GPUARR_FAULTS (gpuarr__apply_faults), every other GPUARR_* setting's check (GPUARR__SETTING_LIST),
 * the byte and number parsers, device specs (gpuarr_device_find), and now and then a whole
 * gpuarr_init with the text in a desc field or a GPUARR_* variable. Each must give GPUARR_OK or
 * a specific error with a message naming gpuarr_init (or the public function), never crash or
 * leak; the global state an internal parser writes is put back after each call.
 *
 * The first input byte picks the parser, the rest (up to a NUL) is the text.
 * The third target, fuzz_dlpack.c, gives malformed tensors to the DLPack imports.
 */
#define GPUARR_IMPLEMENTATION
#include "gpuarr.h"

#include <stdio.h>
#include <stdlib.h>

static void fp_die(const char *what, const char *text) __attribute__((noreturn));
static void fp_die(const char *what, const char *text) {
    fprintf(stderr, "fuzz_parse: %s (text \"%s\", last error \"%s\")\n", what, text, gpuarr_last_error());
    abort();
}

static void fp_check(gpuarr_result r, const char *api, const char *text) {
    if (r == GPUARR_OK) return;
    if ((int)r > 0 || (int)r <= -GPUARR_RESULT_COUNT) fp_die("not a gpuarr_result", text);
    const char *m = gpuarr_last_error();
    size_t n = strlen(api);
    if (strncmp(m, api, n) != 0 || m[n] != ':' || strlen(m) < n + 4) fp_die("an error without a message naming the function", text);
}

static const gpuarr_desc *fp_desc(void) {
    static gpuarr_desc d;
    d.devices = "host";
    d.host_threads = 1;
    d.log_level = GPUARR_LOG_OFF;
    return &d;
}

static void fp_start(void) {
    if (gpuarr_is_initialized()) return;
    if (gpuarr_init(fp_desc()) != GPUARR_OK) fp_die("gpuarr_init for the parse target failed", "");
}

/* GPUARR_* variables that gpuarr_init would read: none may be set from outside */
static void fp_clear_env(void) {
#define FP_UNSET(NAME, check, trust) unsetenv("GPUARR_" #NAME);
    GPUARR__SETTING_LIST(FP_UNSET)
#undef FP_UNSET
}

/* a whole gpuarr_init with the text in the environment or a desc field, then back */
static void fp_init_with(int which, const char *text, uint8_t flags) {
    static const char *const names[] = {
#define FP_NAME(NAME, check, trust) "GPUARR_" #NAME,
        GPUARR__SETTING_LIST(FP_NAME)
#undef FP_NAME
    };
    gpuarr_shutdown();
    if (gpuarr_is_initialized()) fp_die("still initialized after the last shutdown", text);
    gpuarr_desc d = *fp_desc();
    /* no backend library is loaded: none that GPUARR_DEVICES could mention exists */
    setenv("GPUARR_OPENCL_LIBRARY", "/nonexistent/libOpenCL.so.1", 1);
    setenv("GPUARR_CUDA_LIBRARY", "/nonexistent/libcuda.so.1", 1);
    setenv("GPUARR_NVRTC_LIBRARY", "/nonexistent/libnvrtc.so", 1);
    setenv("GPUARR_CACHE_DIR", "off", 1);
    if (which < GPUARR__SETTING_COUNT) {
        if (which == GPUARR__SET_DEVICES) d.devices = NULL;
        if (which == GPUARR__SET_THREADS) d.host_threads = 0;
        if (which == GPUARR__SET_LOG) d.log_level = GPUARR_LOG_DEFAULT;
        if (which == GPUARR__SET_HOST_ISA && (flags & 1)) which = GPUARR__SETTING_COUNT + 2; /* AVX2 may be absent: as desc */
        else setenv(names[which], text, 1);
    }
    if (which == GPUARR__SETTING_COUNT) d.devices = text;
    if (which == GPUARR__SETTING_COUNT + 1) d.alloc_conf = text;
    d.oom_host_fallback = (flags & 2) != 0;
    d.host_threads = (flags & 4) ? (int)(int8_t)flags : d.host_threads;
    gpuarr_result r = gpuarr_init(&d);
    fp_check(r, "gpuarr_init", text);
    if (r == GPUARR_OK) {
        gpuarr_desc q;
        if (gpuarr_query_desc(&q) != GPUARR_OK) fp_die("gpuarr_query_desc after init", text);
        gpuarr_device host;
        if (gpuarr_device_find("host", &host) != GPUARR_OK) fp_die("no host after init", text);
        gpuarr_shutdown();
    } else if (gpuarr_is_initialized()) {
        fp_die("a failed gpuarr_init left the library initialized", text);
    }
    fp_clear_env();
    fp_start();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    static bool env_cleared;
    if (!env_cleared) {
        fp_clear_env();
        env_cleared = true;
    }
    fp_start();
    uint8_t mode = data[0], arg = data[1];
    size_t len = size - 2;
    if (len > 600) len = 600;
    char *text = (char *)malloc(len + 1); /* exactly the text and its NUL: ASan sees any overread */
    memcpy(text, data + 2, len);
    text[len] = '\0';
    gpuarr_result r;
    gpuarr__tls.api = "gpuarr_init";
    switch (mode % 9) {
    case 0: { /* the device filter */
        gpuarr__filter_item *f = gpuarr__g.filter;
        int n = gpuarr__g.filter_count;
        char *copy = gpuarr__g.devices_filter;
        gpuarr__g.filter = NULL;
        gpuarr__g.devices_filter = NULL;
        r = gpuarr__parse_filter(text);
        fp_check(r, "gpuarr_init", text);
        if (r == GPUARR_OK) {
            if (gpuarr__g.filter_count < 1 || !gpuarr__g.devices_filter || strcmp(gpuarr__g.devices_filter, text) != 0)
                fp_die("parse_filter: accepted, but no items or the text not kept", text);
            for (int i = 0; i < gpuarr__g.filter_count; i++) {
                gpuarr_backend b = gpuarr__g.filter[i].backend;
                if (b <= GPUARR_BACKEND_INVALID || b >= GPUARR_BACKEND_COUNT || gpuarr__g.filter[i].index < -1)
                    fp_die("parse_filter: an item out of range", text);
                (void)gpuarr__filter_allows(b, arg);
                (void)gpuarr__filter_mentions(b);
            }
        } else if (gpuarr__g.filter || gpuarr__g.devices_filter) {
            fp_die("parse_filter failed but kept a filter", text);
        }
        gpuarr__free(gpuarr__g.filter);
        gpuarr__free(gpuarr__g.devices_filter);
        gpuarr__g.filter = f;
        gpuarr__g.filter_count = n;
        gpuarr__g.devices_filter = copy;
        break;
    }
    case 1: { /* GPUARR_ALLOC_CONF */
        __typeof__(gpuarr__g.alloc_conf) saved = gpuarr__g.alloc_conf;
        r = gpuarr__parse_alloc_conf(text);
        fp_check(r, "gpuarr_init", text);
        gpuarr__g.alloc_conf = saved;
        break;
    }
    case 2: { /* GPUARR_FAULTS on the registry's devices (the host here) */
        r = gpuarr__apply_faults(text);
        fp_check(r, "gpuarr_init", text);
        for (int i = 0; i < gpuarr__g.device_count; i++) {
            gpuarr__g.devices[i].pool.fault_countdown = 0;
            gpuarr__g.devices[i].pool.fault_above = 0;
            gpuarr__g.devices[i].pinned.fault_above = 0;
        }
        break;
    }
    case 3: { /* each GPUARR_* setting's check: the core's, or its layer's */
        gpuarr__layers_register();
        int i = arg % GPUARR__SETTING_COUNT, value = -1;
        r = gpuarr__setting_checker((gpuarr__setting_id)i)(gpuarr__settings[i].name, text, &value);
        fp_check(r, "gpuarr_init", text);
        if (r == GPUARR_OK && value < 0) fp_die("a setting's check accepted the text but gave no value", text);
        break;
    }
    case 4: { /* device specs */
        gpuarr_device d = {0xA5A5A5A5u};
        r = gpuarr_device_find(text, &d);
        fp_check(r, "gpuarr_device_find", text);
        if (r != GPUARR_OK && d.id != 0xA5A5A5A5u) fp_die("gpuarr_device_find failed but wrote *out", text);
        gpuarr_backend b;
        int index;
        (void)gpuarr__parse_backend_spec(text, strlen(text), arg & 1, &b, &index);
        break;
    }
    case 5: { /* numbers and sizes */
        uint64_t n;
        long v;
        size_t l = strlen(text);
        if (gpuarr__parse_bytes(text, l, &n) && l == 0) fp_die("parse_bytes accepted \"\"", text);
        (void)gpuarr__parse_uint(text, l, (long)arg * 1000, &v);
        (void)gpuarr_dtype_from_name(text);
        (void)gpuarr__streq_nocase(text, "off");
        break;
    }
    case 6: /* a whole gpuarr_init with the text in one GPUARR_* variable */
        fp_init_with(arg % GPUARR__SETTING_COUNT, text, (uint8_t)(mode >> 4));
        break;
    case 7: /* ... or in desc.devices / desc.alloc_conf */
        fp_init_with(GPUARR__SETTING_COUNT + (arg & 1), text, (uint8_t)(mode >> 4));
        break;
    default: { /* a later gpuarr_init's desc checked against the running one */
        gpuarr_desc d;
        memset(&d, 0, sizeof d);
        if (arg & 1) d.devices = text;
        if (arg & 2) d.alloc_conf = text;
        if (arg & 4) d.host_threads = (int)(int8_t)arg;
        if (arg & 8) d.log_level = (gpuarr_log_level)((arg >> 4) % 8);
        r = gpuarr_init(&d);
        fp_check(r, "gpuarr_init", text);
        if (r == GPUARR_OK) gpuarr_shutdown();
        if (!gpuarr_is_initialized()) fp_die("a second init/shutdown dropped the library", text);
        break;
    }
    }
    free(text);
    return 0;
}
