/* gpuarr-info: every device gpuarr finds, with its properties.
 *
 *   gpuarr-info           a table
 *   gpuarr-info --json    the same as JSON (one object with a "devices" array)
 *   gpuarr-info --memory  each device's memory pool: allocated, reserved, peaks, the ladder
 *   gpuarr-info --find SPEC  the device SPEC ("gpu", "cuda:1", ...) names, or why there is none
 *                            (exit status 1)
 *
 * GPUARR_DEVICES filters the list as it does for any program. */
#define GPUARR_IMPLEMENTATION
#include "gpuarr.h"

#include <stdio.h>
#include <string.h>

static const char *type_name(gpuarr_device_type t) {
    static const char *const names[] = {"unknown", "cpu", "gpu", "accelerator"};
    return t < GPUARR_DEVICE_TYPE_COUNT ? names[t] : "unknown";
}

static void uuid_text(const gpuarr_device_info *d, char out[37]) {
    if (!d->has_uuid) {
        out[0] = '\0';
        return;
    }
    char *p = out;
    for (int i = 0; i < 16; i++) {
        p += sprintf(p, "%02x", d->uuid[i]);
        if (i == 3 || i == 5 || i == 7 || i == 9) *p++ = '-';
    }
    *p = '\0';
}

static void json_string(const char *s) {
    putchar('"');
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') printf("\\%c", c);
        else if (c < 0x20) printf("\\u%04x", c);
        else putchar(c);
    }
    putchar('"');
}

static void print_json(void) {
    printf("{\n  \"version\": \"%s\",\n  \"devices\": [", gpuarr_version_string());
    for (int i = 0; i < gpuarr_device_count(); i++) {
        gpuarr_device_info d;
        if (gpuarr_device_get_info(gpuarr_device_at(i), &d) != GPUARR_OK) continue;
        char uuid[37];
        uuid_text(&d, uuid);
        printf("%s\n    {\"spec\": ", i ? "," : "");
        json_string(d.spec);
        printf(", \"backend\": \"%s\", \"index\": %d, \"type\": \"%s\", \"name\": ", gpuarr_backend_name(d.backend), d.index,
               type_name(d.type));
        json_string(d.name);
        printf(", \"vendor\": ");
        json_string(d.vendor);
        printf(", \"version\": ");
        json_string(d.version);
        printf(", \"total_memory\": %llu, \"free_memory\": %llu, \"max_alloc_bytes\": %llu", (unsigned long long)d.total_memory,
               (unsigned long long)d.free_memory, (unsigned long long)d.max_alloc_bytes);
        printf(", \"compute_units\": %d, \"clock_mhz\": %d, \"compute_capability\": \"%d.%d\"", d.compute_units, d.clock_mhz,
               d.compute_capability_major, d.compute_capability_minor);
        printf(", \"copy_engines\": %d, \"host_unified\": %s, \"pci_bus_id\": ", d.copy_engines, d.host_unified ? "true" : "false");
        json_string(d.pci_bus_id);
        printf(", \"uuid\": ");
        json_string(uuid);
        if (d.same_as.id) {
            gpuarr_device_info other;
            if (gpuarr_device_get_info(d.same_as, &other) == GPUARR_OK) {
                printf(", \"same_as\": ");
                json_string(other.spec);
            }
        }
        printf("}");
    }
    printf("\n  ]\n}\n");
}

static void print_table(void) {
    printf("gpuarr %s: %d device%s\n\n", gpuarr_version_string(), gpuarr_device_count(), gpuarr_device_count() == 1 ? "" : "s");
    printf("%-10s %-5s %-36s %-16s %10s %10s %5s %6s %-12s %s\n", "device", "type", "name", "vendor", "memory", "free",
           "units", "MHz", "pci", "version");
    for (int i = 0; i < gpuarr_device_count(); i++) {
        gpuarr_device_info d;
        if (gpuarr_device_get_info(gpuarr_device_at(i), &d) != GPUARR_OK) {
            fprintf(stderr, "gpuarr-info: %s\n", gpuarr_last_error());
            continue;
        }
        printf("%-10s %-5s %-36.36s %-16.16s %7.1f GB %7.1f GB %5d %6d %-12s %s", d.spec, type_name(d.type), d.name,
               d.vendor, (double)d.total_memory / 1e9, (double)d.free_memory / 1e9, d.compute_units, d.clock_mhz,
               d.pci_bus_id[0] ? d.pci_bus_id : "-", d.version);
        if (d.compute_capability_major) printf(" (sm_%d%d)", d.compute_capability_major, d.compute_capability_minor);
        if (d.same_as.id) {
            gpuarr_device_info other;
            if (gpuarr_device_get_info(d.same_as, &other) == GPUARR_OK) printf(" [same GPU as %s]", other.spec);
        }
        putchar('\n');
    }
    printf("\nbackends compiled in:");
    for (int b = 1; b < GPUARR_BACKEND_COUNT; b++)
        if (gpuarr_backend_compiled((gpuarr_backend)b)) printf(" %s", gpuarr_backend_name((gpuarr_backend)b));
    for (int b = 1; b < GPUARR_BACKEND_COUNT; b++) { /* and why one has no devices */
        gpuarr_device none;
        if (gpuarr_backend_compiled((gpuarr_backend)b) && gpuarr_device_find(gpuarr_backend_name((gpuarr_backend)b), &none) != GPUARR_OK)
            printf("\n  %s: %s", gpuarr_backend_name((gpuarr_backend)b), gpuarr_last_error());
    }
    gpuarr_device any;
    if (gpuarr_device_find("any", &any) == GPUARR_OK) {
        gpuarr_device_info d;
        gpuarr_device_get_info(any, &d);
        printf("\nbest device (\"any\"): %s\n", d.spec);
    }
}

static void print_memory(void) {
    char text[4096];
    for (int i = 0; i < gpuarr_device_count(); i++) {
        if (gpuarr_pool_summary(gpuarr_device_at(i), text, sizeof text) != GPUARR_OK) {
            fprintf(stderr, "gpuarr-info: %s\n", gpuarr_last_error());
            continue;
        }
        printf("%s%s", i ? "\n" : "", text);
    }
}

static int find(const char *spec) {
    gpuarr_device d;
    gpuarr_device_info info;
    if (gpuarr_device_find(spec, &d) != GPUARR_OK || gpuarr_device_get_info(d, &info) != GPUARR_OK) {
        printf("%s\n", gpuarr_last_error());
        return 1;
    }
    printf("%s\n", info.spec);
    return 0;
}

int main(int argc, char **argv) {
    bool json = false, memory = false;
    const char *spec = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0) {
            json = true;
        } else if (strcmp(argv[i], "--memory") == 0) {
            memory = true;
        } else if (strcmp(argv[i], "--find") == 0 && i + 1 < argc) {
            spec = argv[++i];
        } else {
            fprintf(stderr, "usage: %s [--json | --memory | --find SPEC]\n", argv[0]);
            return strcmp(argv[i], "--help") == 0 ? 0 : 2;
        }
    }
    if (gpuarr_init(NULL) != GPUARR_OK) {
        fprintf(stderr, "gpuarr-info: %s\n", gpuarr_last_error());
        return 1;
    }
    int status = 0;
    if (spec) status = find(spec);
    else if (json) print_json();
    else if (memory) print_memory();
    else print_table();
    gpuarr_shutdown();
    return status;
}
