/* gpuarr-info: every device gpuarr finds, with its properties.
 *
 *   gpuarr-info           a table
 *   gpuarr-info --json    the same as JSON (one object with a "devices" array)
 *   gpuarr-info --memory  each device's memory pool: allocated, reserved, peaks, the ladder
 *   gpuarr-info --leases  every lease slot of every device and its holder (any process, from the
 *                         slot files of GPUARR_LEASE_DIR; a GPU seen by two backends once)
 *   gpuarr-info --models  every transfer model (see TRANSFER MODEL), then every task model of
 *                         gpuarr_offload (see OFFLOAD), kept in the cache folder for this
 *                         machine's devices, with its fit: a line each
 *   gpuarr-info --find SPEC  the device SPEC ("gpu", "cuda:1", "local", ...) names, or why there is none
 *                            (exit status 1)
 *   gpuarr-info --watch [SECONDS] [--count N] [--json]
 *                         every SECONDS (default 1) a line per device, like nvidia-smi dmon:
 *                         memory used/total, utilization, temperature, power (the device's
 *                         telemetry, "-" where it has none) and the pool's allocated/reserved
 *                         bytes; --json: one JSON object per device per tick, a line each
 *                         (null where a reading is missing); --count N: stop after N ticks
 *   mpirun ... gpuarr-info --mpi [--json]
 *                         every rank's machine, node-local rank (MPI_COMM_TYPE_SHARED; and the
 *                         launcher's variable), the device gpuarr_mpi_device picks for it and the
 *                         devices it sees, gathered to rank 0 and printed there, a row per rank
 *                         (--json: one object with a "ranks" array). Only in a build with MPI
 *                         (mpicc -DGPUARR_MPI, as the Makefile does where mpicc is); otherwise it
 *                         says so and exits with status 2. MPI_Init is called only for --mpi.
 *
 * GPUARR_DEVICES filters the list as it does for any program. */
#ifdef GPUARR_MPI
#include <mpi.h> /* before gpuarr.h: its MPI part */
#endif
#define GPUARR_IMPLEMENTATION
#include "gpuarr.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

static void print_leases(void) {
    static char text[1 << 16];
    for (int i = 0; i < gpuarr_device_count(); i++) {
        gpuarr_device_info d, other;
        if (gpuarr_device_get_info(gpuarr_device_at(i), &d) != GPUARR_OK) continue;
        /* a GPU seen through a second backend: listed once, through the first */
        if (d.same_as.id && gpuarr_device_get_info(d.same_as, &other) == GPUARR_OK && other.backend < d.backend) continue;
        if (gpuarr_lease_summary(d.device, text, sizeof text) != GPUARR_OK) {
            fprintf(stderr, "gpuarr-info: %s\n", gpuarr_last_error());
            continue;
        }
        fputs(text, stdout);
    }
}

static void print_models(void) {
    static char text[1 << 16];
    if (gpuarr_transfer_models_summary(text, sizeof text) != GPUARR_OK) fprintf(stderr, "gpuarr-info: %s\n", gpuarr_last_error());
    else fputs(text, stdout);
    if (gpuarr_task_models_summary(text, sizeof text) != GPUARR_OK) fprintf(stderr, "gpuarr-info: %s\n", gpuarr_last_error());
    else fputs(text, stdout);
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


/* --watch: the readings of every device, each tick. */
static void watch_sleep(double seconds) {
    struct timespec ts, rest;
    ts.tv_sec = (time_t)seconds;
    ts.tv_nsec = (long)((seconds - (double)ts.tv_sec) * 1e9);
    while (nanosleep(&ts, &rest) != 0 && errno == EINTR) ts = rest;
}

#define HAS(t, name) (((t).valid & (uint32_t)GPUARR_TELEMETRY_##name) != 0)

static void json_u64(const char *key, bool valid, uint64_t v) {
    if (valid) printf(", \"%s\": %llu", key, (unsigned long long)v);
    else printf(", \"%s\": null", key);
}
static void json_int(const char *key, bool valid, int v) {
    if (valid) printf(", \"%s\": %d", key, v);
    else printf(", \"%s\": null", key);
}
static void json_double(const char *key, bool valid, double v) {
    if (valid) printf(", \"%s\": %.3f", key, v);
    else printf(", \"%s\": null", key);
}

static void watch_json_line(long tick, double now, const gpuarr_device_info *d, const gpuarr_telemetry *t, const gpuarr_pool_stats *p) {
    printf("{\"tick\": %ld, \"time\": %.3f, \"spec\": ", tick, now);
    json_string(d->spec);
    printf(", \"valid\": [");
    int n = 0;
    for (int b = 0; b < GPUARR_TELEMETRY_COUNT; b++)
        if (t->valid & (1u << b)) printf("%s\"%s\"", n++ ? ", " : "", gpuarr_telemetry_name(1u << b));
    printf("]");
    json_u64("memory_total", HAS(*t, MEMORY_TOTAL), t->memory_total);
    json_u64("memory_used", HAS(*t, MEMORY_USAGE), t->memory_used);
    json_u64("memory_free", HAS(*t, MEMORY_USAGE), t->memory_free);
    json_int("gpu_utilization_pct", HAS(*t, GPU_UTILIZATION), t->gpu_utilization_pct);
    json_int("memory_utilization_pct", HAS(*t, MEMORY_UTILIZATION), t->memory_utilization_pct);
    json_double("temperature_c", HAS(*t, TEMPERATURE), t->temperature_c);
    json_double("power_w", HAS(*t, POWER), t->power_w);
    json_double("power_limit_w", HAS(*t, POWER_LIMIT), t->power_limit_w);
    json_int("sm_clock_mhz", HAS(*t, SM_CLOCK), t->sm_clock_mhz);
    json_int("memory_clock_mhz", HAS(*t, MEMORY_CLOCK), t->memory_clock_mhz);
    json_u64("throttle_reasons", HAS(*t, THROTTLE_REASONS), t->throttle_reasons);
    json_int("pcie_generation", HAS(*t, PCIE_GENERATION), t->pcie_generation);
    json_int("pcie_width", HAS(*t, PCIE_WIDTH), t->pcie_width);
    printf(", \"pool_allocated_bytes\": %llu, \"pool_reserved_bytes\": %llu}\n", (unsigned long long)p->allocated_bytes,
           (unsigned long long)p->reserved_bytes);
}

static void watch_table_line(long tick, const gpuarr_device_info *d, const gpuarr_telemetry *t, const gpuarr_pool_stats *p) {
    char mem[32] = "-", util[16] = "-", temp[16] = "-", power[16] = "-";
    if (HAS(*t, MEMORY_USAGE)) snprintf(mem, sizeof mem, "%.2f/%.2f", (double)t->memory_used / 1e9, (double)t->memory_total / 1e9);
    else if (HAS(*t, MEMORY_TOTAL)) snprintf(mem, sizeof mem, "-/%.2f", (double)t->memory_total / 1e9);
    if (HAS(*t, GPU_UTILIZATION)) snprintf(util, sizeof util, "%d", t->gpu_utilization_pct);
    if (HAS(*t, TEMPERATURE)) snprintf(temp, sizeof temp, "%.0f", t->temperature_c);
    if (HAS(*t, POWER)) snprintf(power, sizeof power, "%.1f", t->power_w);
    printf("%6ld %-10s %17s %5s %5s %7s %10.1f %10.1f\n", tick, d->spec, mem, util, temp, power, (double)p->allocated_bytes / 1e6,
           (double)p->reserved_bytes / 1e6);
}

static int watch(double seconds, long count, bool json) {
    if (!json)
        printf("%6s %-10s %17s %5s %5s %7s %10s %10s\n%6s %-10s %17s %5s %5s %7s %10s %10s\n", "#tick", "device", "mem used/total",
               "util", "temp", "power", "pool alloc", "reserved", "#", "", "GB", "%", "C", "W", "MB", "MB");
    int status = 0;
    for (long tick = 1; count <= 0 || tick <= count; tick++) {
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        for (int i = 0; i < gpuarr_device_count(); i++) {
            gpuarr_device dev = gpuarr_device_at(i);
            gpuarr_device_info d;
            gpuarr_telemetry t;
            gpuarr_pool_stats p;
            if (gpuarr_device_get_info(dev, &d) != GPUARR_OK || gpuarr_device_get_telemetry(dev, &t) != GPUARR_OK ||
                gpuarr_pool_get_stats(dev, &p) != GPUARR_OK) {
                fprintf(stderr, "gpuarr-info: %s\n", gpuarr_last_error());
                status = 1;
                continue;
            }
            if (json) watch_json_line(tick, (double)now.tv_sec + (double)now.tv_nsec / 1e9, &d, &t, &p);
            else watch_table_line(tick, &d, &t, &p);
        }
        fflush(stdout);
        if (count <= 0 || tick < count) watch_sleep(seconds);
    }
    return status;
}

/* --mpi: what each rank sees, gathered to rank 0 as fixed-size records. */
#ifdef GPUARR_MPI
typedef struct rank_record {
    int local_rank, launcher_rank; /* launcher_rank: -1 when no launcher variable is set */
    char host[MPI_MAX_PROCESSOR_NAME];
    char variable[64];             /* the launcher's variable gpuarr_local_rank read, or "" */
    char device[32];               /* gpuarr_mpi_device's pick, or "" */
    char devices[1024];            /* every device this rank sees, comma separated */
    char error[256];               /* what failed on this rank, or "" */
} rank_record;

static void rank_record_fill(rank_record *rec, bool initialized) {
    memset(rec, 0, sizeof *rec);
    int len, ok = 1;
    MPI_Get_processor_name(rec->host, &len);
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, &rec->local_rank);
    MPI_Comm_free(&node);
    const char *variable = NULL;
    int launcher_rank;
    rec->launcher_rank = -1;
    if (initialized && gpuarr_local_rank(&launcher_rank, &variable) != GPUARR_OK) ok = 0;
    else if (variable) rec->launcher_rank = launcher_rank, snprintf(rec->variable, sizeof rec->variable, "%s", variable);
    gpuarr_device dev;
    gpuarr_device_info info;
    if (ok && initialized && gpuarr_mpi_device(MPI_COMM_WORLD, &dev) == GPUARR_OK && gpuarr_device_get_info(dev, &info) == GPUARR_OK)
        snprintf(rec->device, sizeof rec->device, "%s", info.spec);
    else ok = 0;
    for (int i = 0; ok && i < gpuarr_device_count(); i++) {
        size_t used = strlen(rec->devices);
        if (gpuarr_device_get_info(gpuarr_device_at(i), &info) == GPUARR_OK)
            snprintf(rec->devices + used, sizeof rec->devices - used, "%s%s", used ? "," : "", info.spec);
    }
    if (!ok) snprintf(rec->error, sizeof rec->error, "%s", gpuarr_last_error()); /* gpuarr_init's too */
}

static void print_mpi_json(const rank_record *recs, int ranks) {
    printf("{\n  \"version\": \"%s\",\n  \"ranks\": [", gpuarr_version_string());
    for (int r = 0; r < ranks; r++) {
        const rank_record *rec = &recs[r];
        printf("%s\n    {\"rank\": %d, \"host\": ", r ? "," : "", r);
        json_string(rec->host);
        printf(", \"local_rank\": %d, \"launcher_variable\": ", rec->local_rank);
        if (rec->variable[0]) json_string(rec->variable), printf(", \"launcher_local_rank\": %d", rec->launcher_rank);
        else printf("null, \"launcher_local_rank\": null");
        printf(", \"device\": ");
        if (rec->device[0]) json_string(rec->device);
        else printf("null");
        printf(", \"devices\": [");
        char list[sizeof rec->devices];
        snprintf(list, sizeof list, "%s", rec->devices);
        int n = 0;
        for (char *save = NULL, *spec = strtok_r(list, ",", &save); spec; spec = strtok_r(NULL, ",", &save)) {
            printf("%s", n++ ? ", " : "");
            json_string(spec);
        }
        printf("], \"error\": ");
        if (rec->error[0]) json_string(rec->error);
        else printf("null");
        printf("}");
    }
    printf("\n  ]\n}\n");
}

static void print_mpi_table(const rank_record *recs, int ranks) {
    printf("gpuarr %s: %d rank%s\n\n%-5s %-20s %5s %-32s %-10s %s\n", gpuarr_version_string(), ranks, ranks == 1 ? "" : "s", "rank",
           "host", "local", "launcher variable", "device", "devices");
    for (int r = 0; r < ranks; r++) {
        const rank_record *rec = &recs[r];
        char launcher[96] = "-";
        if (rec->variable[0]) snprintf(launcher, sizeof launcher, "%s=%d", rec->variable, rec->launcher_rank);
        printf("%-5d %-20.20s %5d %-32.32s %-10s %s\n", r, rec->host, rec->local_rank, launcher,
               rec->device[0] ? rec->device : "-", rec->error[0] ? rec->error : rec->devices);
    }
}

/* Every rank fills its record; rank 0 prints them all. 1 if any rank failed. */
static int mpi_ranks(bool initialized, bool json) {
    int rank, ranks, status = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &ranks);
    rank_record mine, *all = NULL;
    rank_record_fill(&mine, initialized);
    if (rank == 0 && !(all = calloc((size_t)ranks, sizeof *all))) MPI_Abort(MPI_COMM_WORLD, 1);
    MPI_Gather(&mine, (int)sizeof mine, MPI_BYTE, all, (int)sizeof mine, MPI_BYTE, 0, MPI_COMM_WORLD);
    if (rank == 0) {
        if (json) print_mpi_json(all, ranks);
        else print_mpi_table(all, ranks);
        for (int r = 0; r < ranks; r++) status |= all[r].error[0] != 0;
        free(all);
    }
    MPI_Bcast(&status, 1, MPI_INT, 0, MPI_COMM_WORLD);
    return status;
}
#endif

int main(int argc, char **argv) {
    bool json = false, memory = false, watching = false, leases = false, models = false, mpi = false;
    double seconds = 1.0;
    long count = 0;
    const char *spec = NULL;
    for (int i = 1; i < argc; i++) {
        char *end;
        if (strcmp(argv[i], "--json") == 0) {
            json = true;
        } else if (strcmp(argv[i], "--watch") == 0) {
            watching = true;
            if (i + 1 < argc && argv[i + 1][0] != '-') { /* SECONDS, if given */
                seconds = strtod(argv[++i], &end);
                if (*end || !(seconds >= 0 && seconds <= 86400)) {
                    fprintf(stderr, "gpuarr-info: --watch %s: expected seconds from 0 to 86400\n", argv[i]);
                    return 2;
                }
            }
        } else if (strcmp(argv[i], "--count") == 0 && i + 1 < argc) {
            count = strtol(argv[++i], &end, 10);
            if (*end || count < 1) {
                fprintf(stderr, "gpuarr-info: --count %s: expected a number of ticks, 1 or more\n", argv[i]);
                return 2;
            }
        } else if (strcmp(argv[i], "--memory") == 0) {
            memory = true;
        } else if (strcmp(argv[i], "--leases") == 0) {
            leases = true;
        } else if (strcmp(argv[i], "--models") == 0) {
            models = true;
        } else if (strcmp(argv[i], "--mpi") == 0) {
            mpi = true;
        } else if (strcmp(argv[i], "--find") == 0 && i + 1 < argc) {
            spec = argv[++i];
        } else {
            fprintf(stderr, "usage: %s [--json | --memory | --leases | --models | --find SPEC | --watch [SECONDS] [--count N] [--json] | --mpi [--json]]\n", argv[0]);
            return strcmp(argv[i], "--help") == 0 ? 0 : 2;
        }
    }
    if (count && !watching) {
        fprintf(stderr, "gpuarr-info: --count goes with --watch\n");
        return 2;
    }
    if (mpi) {
#ifdef GPUARR_MPI
        MPI_Init(&argc, &argv);
        bool initialized = gpuarr_init(NULL) == GPUARR_OK; /* a rank that fails still reports */
        int status = mpi_ranks(initialized, json);
        if (initialized) gpuarr_shutdown();
        MPI_Finalize();
        return status;
#else
        fprintf(stderr, "gpuarr-info: --mpi: this gpuarr-info was built without MPI (make builds it with mpicc -DGPUARR_MPI where mpicc is found)\n");
        return 2;
#endif
    }
    if (gpuarr_init(NULL) != GPUARR_OK) {
        fprintf(stderr, "gpuarr-info: %s\n", gpuarr_last_error());
        return 1;
    }
    int status = 0;
    if (spec) status = find(spec);
    else if (watching) status = watch(seconds, count, json);
    else if (json) print_json();
    else if (memory) print_memory();
    else if (leases) print_leases();
    else if (models) print_models();
    else print_table();
    gpuarr_shutdown();
    return status;
}
