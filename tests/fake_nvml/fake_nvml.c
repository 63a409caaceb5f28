/*
 * fake_nvml.c -- a libnvidia-ml.so.1 for CI: the NVML entry points gpuarr's telemetry uses, for
 * the devices of the fake CUDA driver (tests/fake_cuda), so that gpuarr's NVML paths run without
 * a GPU. Built as build/fake-nvml/libnvidia-ml.so.1 and used through GPUARR_NVML_LIBRARY.
 *
 * Its devices are the fake CUDA driver's in REVERSED order: NVML index k is CUDA device
 * n - 1 - k (n = FAKE_NVML_DEVICES, default FAKE_CUDA_DEVICES, default 2), with that CUDA
 * device's UUID (the fake driver's formula: byte i = 0xfa ^ 17 i ^ ordinal). So a device matched
 * by index gets another device's readings; matched by UUID, CUDA device c reads:
 *   memory (_v2)   total (8 + c) GiB, reserved 64 MiB, used (1 + c) * 256 MiB, free the rest
 *   memory (v1)    the same total and free; used includes the reserved 64 MiB (as NVML's v1)
 *   utilization    gpu 10 + c %, memory 20 + c %
 *   temperature    40 + 10 c degrees C (nvmlDeviceGetTemperatureV and nvmlDeviceGetTemperature)
 *   power          100 + c W (reported in mW); enforced limit 250 + c W, management limit 300 + c W
 *   clocks         SM 1500 + c MHz, memory 5000 + c MHz
 *   clock events   1 << c (the same through ClocksEventReasons and ClocksThrottleReasons)
 *   PCIe           generation 3 + c % 3, width 16 >> c
 * Device handles check that NVML is initialized (NVML_ERROR_UNINITIALIZED otherwise) and the
 * versioned structs check their version (NVML_ERROR_ARGUMENT_VERSION_MISMATCH).
 *
 * Environment, read at each call:
 *   FAKE_NVML_INIT_FAIL=1  nvmlInit_v2 fails with NVML_ERROR_DRIVER_NOT_LOADED
 *   FAKE_NVML_NO_V2=1      the newer entry points (nvmlDeviceGetMemoryInfo_v2,
 *                          nvmlDeviceGetTemperatureV, nvmlDeviceGetCurrentClocksEventReasons,
 *                          nvmlDeviceGetEnforcedPowerLimit) answer NVML_ERROR_FUNCTION_NOT_FOUND,
 *                          as an NVML without them
 *   FAKE_NVML_DEVICES=N    N devices (0: NVML knows none of the CUDA devices)
 * Built with -DFAKE_NVML_OLD (build/fake-nvml-old/) those newer entry points are not exported at
 * all, as in an old libnvidia-ml. For tests, through dlsym: fake_nvml_inits_live() (nvmlInit_v2
 * calls not yet matched by nvmlShutdown).
 */
#define _GNU_SOURCE 1
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FAKE_API __attribute__((visibility("default")))

typedef unsigned int nvml_return;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25
};

struct nvmlDevice_st {
    int cuda_ordinal;
};
typedef struct nvmlDevice_st *nvml_device;

typedef struct {
    unsigned long long total, free, used;
} nvml_memory;
typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvml_memory_v2;
typedef struct {
    unsigned int version;
    unsigned int sensor_type;
    int temperature;
} nvml_temperature;
typedef struct {
    unsigned int gpu, memory;
} nvml_utilization;

#define MAX_DEVICES 16
static struct nvmlDevice_st devices[MAX_DEVICES];
static int inits_live;

static int env_int(const char *name, int fallback) {
    const char *v = getenv(name);
    return v && *v ? atoi(v) : fallback;
}
static int device_count(void) {
    int n = env_int("FAKE_NVML_DEVICES", env_int("FAKE_CUDA_DEVICES", 2));
    return n < 0 ? 0 : n > MAX_DEVICES ? MAX_DEVICES : n;
}
#ifndef FAKE_NVML_OLD
static int no_v2(void) { return env_int("FAKE_NVML_NO_V2", 0) != 0; }
#endif

/* A handle gpuarr may use: one of ours, NVML initialized. */
static nvml_return check(nvml_device d) {
    if (!__atomic_load_n(&inits_live, __ATOMIC_SEQ_CST)) return NVML_ERROR_UNINITIALIZED;
    if (!d || d < devices || d >= devices + device_count()) return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_SUCCESS;
}
#define CHECK(d, p)                                                                            \
    do {                                                                                       \
        nvml_return e_ = check(d);                                                             \
        if (e_ != NVML_SUCCESS) return e_;                                                     \
        if (!(p)) return NVML_ERROR_INVALID_ARGUMENT;                                          \
    } while (0)

#define GIB (1ull << 30)
#define MIB (1ull << 20)

FAKE_API int fake_nvml_inits_live(void);
FAKE_API int fake_nvml_inits_live(void) { return __atomic_load_n(&inits_live, __ATOMIC_SEQ_CST); }

FAKE_API nvml_return nvmlInit_v2(void);
FAKE_API nvml_return nvmlInit_v2(void) {
    if (env_int("FAKE_NVML_INIT_FAIL", 0)) return NVML_ERROR_DRIVER_NOT_LOADED;
    int n = device_count();
    for (int k = 0; k < n; k++) devices[k].cuda_ordinal = n - 1 - k; /* reversed */
    __atomic_add_fetch(&inits_live, 1, __ATOMIC_SEQ_CST);
    return NVML_SUCCESS;
}

FAKE_API nvml_return nvmlShutdown(void);
FAKE_API nvml_return nvmlShutdown(void) {
    if (__atomic_load_n(&inits_live, __ATOMIC_SEQ_CST) <= 0) return NVML_ERROR_UNINITIALIZED;
    __atomic_sub_fetch(&inits_live, 1, __ATOMIC_SEQ_CST);
    return NVML_SUCCESS;
}

/* Exported so that a lookup by index finds a device too, the wrong one. */
FAKE_API nvml_return nvmlDeviceGetCount_v2(unsigned int *count);
FAKE_API nvml_return nvmlDeviceGetCount_v2(unsigned int *count) {
    if (!__atomic_load_n(&inits_live, __ATOMIC_SEQ_CST)) return NVML_ERROR_UNINITIALIZED;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    *count = (unsigned int)device_count();
    return NVML_SUCCESS;
}
FAKE_API nvml_return nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvml_device *out);
FAKE_API nvml_return nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvml_device *out) {
    if (!__atomic_load_n(&inits_live, __ATOMIC_SEQ_CST)) return NVML_ERROR_UNINITIALIZED;
    if (!out || index >= (unsigned int)device_count()) return NVML_ERROR_INVALID_ARGUMENT;
    *out = &devices[index];
    return NVML_SUCCESS;
}

/* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" of the fake CUDA driver's device `ordinal`. */
static void uuid_text(int ordinal, char out[64]) {
    char *p = out + sprintf(out, "GPU-");
    for (int i = 0; i < 16; i++) {
        if (i == 4 || i == 6 || i == 8 || i == 10) *p++ = '-';
        p += sprintf(p, "%02x", (unsigned)((0xfa ^ (i * 17) ^ ordinal) & 0xff));
    }
}

FAKE_API nvml_return nvmlDeviceGetHandleByUUID(const char *uuid, nvml_device *out);
FAKE_API nvml_return nvmlDeviceGetHandleByUUID(const char *uuid, nvml_device *out) {
    if (!__atomic_load_n(&inits_live, __ATOMIC_SEQ_CST)) return NVML_ERROR_UNINITIALIZED;
    if (!uuid || !out) return NVML_ERROR_INVALID_ARGUMENT;
    for (int k = 0; k < device_count(); k++) {
        char text[64];
        uuid_text(devices[k].cuda_ordinal, text);
        if (strcmp(text, uuid) == 0) {
            *out = &devices[k];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

static unsigned long long total_of(int c) { return (8ull + (unsigned long long)c) * GIB; }
static unsigned long long used_of(int c) { return (1ull + (unsigned long long)c) * 256ull * MIB; }
#define RESERVED (64ull * MIB)

#ifndef FAKE_NVML_OLD
FAKE_API nvml_return nvmlDeviceGetMemoryInfo_v2(nvml_device d, nvml_memory_v2 *m);
FAKE_API nvml_return nvmlDeviceGetMemoryInfo_v2(nvml_device d, nvml_memory_v2 *m) {
    if (no_v2()) return NVML_ERROR_FUNCTION_NOT_FOUND;
    CHECK(d, m);
    if (m->version != ((unsigned int)sizeof(nvml_memory_v2) | (2u << 24))) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    int c = d->cuda_ordinal;
    m->total = total_of(c);
    m->reserved = RESERVED;
    m->used = used_of(c);
    m->free = m->total - m->reserved - m->used;
    return NVML_SUCCESS;
}
#endif

FAKE_API nvml_return nvmlDeviceGetMemoryInfo(nvml_device d, nvml_memory *m);
FAKE_API nvml_return nvmlDeviceGetMemoryInfo(nvml_device d, nvml_memory *m) {
    CHECK(d, m);
    int c = d->cuda_ordinal;
    m->total = total_of(c);
    m->used = used_of(c) + RESERVED;
    m->free = m->total - m->used;
    return NVML_SUCCESS;
}

FAKE_API nvml_return nvmlDeviceGetUtilizationRates(nvml_device d, nvml_utilization *u);
FAKE_API nvml_return nvmlDeviceGetUtilizationRates(nvml_device d, nvml_utilization *u) {
    CHECK(d, u);
    u->gpu = 10u + (unsigned)d->cuda_ordinal;
    u->memory = 20u + (unsigned)d->cuda_ordinal;
    return NVML_SUCCESS;
}

#ifndef FAKE_NVML_OLD
FAKE_API nvml_return nvmlDeviceGetTemperatureV(nvml_device d, nvml_temperature *t);
FAKE_API nvml_return nvmlDeviceGetTemperatureV(nvml_device d, nvml_temperature *t) {
    if (no_v2()) return NVML_ERROR_FUNCTION_NOT_FOUND;
    CHECK(d, t);
    if (t->version != ((unsigned int)sizeof(nvml_temperature) | (1u << 24))) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (t->sensor_type != 0) return NVML_ERROR_INVALID_ARGUMENT;
    t->temperature = 40 + 10 * d->cuda_ordinal;
    return NVML_SUCCESS;
}
#endif

FAKE_API nvml_return nvmlDeviceGetTemperature(nvml_device d, unsigned int sensor, unsigned int *temp);
FAKE_API nvml_return nvmlDeviceGetTemperature(nvml_device d, unsigned int sensor, unsigned int *temp) {
    CHECK(d, temp);
    if (sensor != 0) return NVML_ERROR_INVALID_ARGUMENT;
    *temp = 40u + 10u * (unsigned)d->cuda_ordinal;
    return NVML_SUCCESS;
}

FAKE_API nvml_return nvmlDeviceGetPowerUsage(nvml_device d, unsigned int *mw);
FAKE_API nvml_return nvmlDeviceGetPowerUsage(nvml_device d, unsigned int *mw) {
    CHECK(d, mw);
    *mw = 100000u + 1000u * (unsigned)d->cuda_ordinal;
    return NVML_SUCCESS;
}

#ifndef FAKE_NVML_OLD
FAKE_API nvml_return nvmlDeviceGetEnforcedPowerLimit(nvml_device d, unsigned int *mw);
FAKE_API nvml_return nvmlDeviceGetEnforcedPowerLimit(nvml_device d, unsigned int *mw) {
    if (no_v2()) return NVML_ERROR_FUNCTION_NOT_FOUND;
    CHECK(d, mw);
    *mw = 250000u + 1000u * (unsigned)d->cuda_ordinal;
    return NVML_SUCCESS;
}
#endif

FAKE_API nvml_return nvmlDeviceGetPowerManagementLimit(nvml_device d, unsigned int *mw);
FAKE_API nvml_return nvmlDeviceGetPowerManagementLimit(nvml_device d, unsigned int *mw) {
    CHECK(d, mw);
    *mw = 300000u + 1000u * (unsigned)d->cuda_ordinal;
    return NVML_SUCCESS;
}

FAKE_API nvml_return nvmlDeviceGetClockInfo(nvml_device d, unsigned int type, unsigned int *mhz);
FAKE_API nvml_return nvmlDeviceGetClockInfo(nvml_device d, unsigned int type, unsigned int *mhz) {
    CHECK(d, mhz);
    if (type == 1) *mhz = 1500u + (unsigned)d->cuda_ordinal;      /* NVML_CLOCK_SM */
    else if (type == 2) *mhz = 5000u + (unsigned)d->cuda_ordinal; /* NVML_CLOCK_MEM */
    else return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_SUCCESS;
}

#ifndef FAKE_NVML_OLD
FAKE_API nvml_return nvmlDeviceGetCurrentClocksEventReasons(nvml_device d, unsigned long long *reasons);
FAKE_API nvml_return nvmlDeviceGetCurrentClocksEventReasons(nvml_device d, unsigned long long *reasons) {
    if (no_v2()) return NVML_ERROR_FUNCTION_NOT_FOUND;
    CHECK(d, reasons);
    *reasons = 1ull << d->cuda_ordinal;
    return NVML_SUCCESS;
}
#endif

FAKE_API nvml_return nvmlDeviceGetCurrentClocksThrottleReasons(nvml_device d, unsigned long long *reasons);
FAKE_API nvml_return nvmlDeviceGetCurrentClocksThrottleReasons(nvml_device d, unsigned long long *reasons) {
    CHECK(d, reasons);
    *reasons = 1ull << d->cuda_ordinal;
    return NVML_SUCCESS;
}

FAKE_API nvml_return nvmlDeviceGetCurrPcieLinkGeneration(nvml_device d, unsigned int *gen);
FAKE_API nvml_return nvmlDeviceGetCurrPcieLinkGeneration(nvml_device d, unsigned int *gen) {
    CHECK(d, gen);
    *gen = 3u + (unsigned)d->cuda_ordinal % 3u;
    return NVML_SUCCESS;
}

FAKE_API nvml_return nvmlDeviceGetCurrPcieLinkWidth(nvml_device d, unsigned int *width);
FAKE_API nvml_return nvmlDeviceGetCurrPcieLinkWidth(nvml_device d, unsigned int *width) {
    CHECK(d, width);
    *width = 16u >> d->cuda_ordinal;
    return NVML_SUCCESS;
}
