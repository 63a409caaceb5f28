/*
 * test_local_rank.c -- the manual's LOCAL RANK: gpuarr_local_rank reads the launcher's variables
 * (which wins, what counts as unset, bad values named), "local" and "local:R" map ranks over the
 * devices other than the host (R mod n, in registry order; the host when there is none), and
 * leases on "local" keep one process per slot: 4 processes with local ranks 0..3 on two PoCL
 * devices of one slot each take turns (a shared log of enters and leaves says so), and a timeout
 * names the variable, the rank and the device. Each Criterion test runs in a process of its own,
 * so the variables set here (before gpuarr_init) stay in it. The mapping tests need PoCL's two
 * devices (POCL_DEVICES="pthread pthread"); GPUARR_DEVICES=host,opencl keeps CUDA out of them.
 */
#include "test_common.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static const char *const vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID",
                                   "PMI_LOCAL_RANK"};
enum { NVARS = 5 };

static void clear_vars(void) {
    for (int i = 0; i < NVARS; i++) cr_assert_eq(unsetenv(vars[i]), 0);
}

static char dir[64];

static void local_teardown(void) {
    if (gpuarr_is_initialized()) gpuarr_shutdown();
    if (dir[0]) {
        char cmd[160];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    }
}

TestSuite(local_rank, .init = clear_vars, .fini = local_teardown);

static const char *spec_of(gpuarr_device d) {
    static gpuarr_device_info info;
    TEST_OK(gpuarr_device_get_info(d, &info));
    return info.spec;
}

/* gpuarr_device_find(spec) and the spec of what it found */
static const char *found(const char *spec) {
    gpuarr_device d;
    TEST_OK(gpuarr_device_find(spec, &d));
    return spec_of(d);
}

/* A folder of slot files of its own, and one slot on each OpenCL device. */
static void lease_dir(void) {
    if (dir[0]) return;
    snprintf(dir, sizeof dir, "/tmp/gpuarr-test-local-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    cr_assert_eq(setenv("GPUARR_LEASE_DIR", dir, 1), 0);
    cr_assert_eq(setenv("GPUARR_SLOTS", "opencl:*=1", 1), 0);
}

/* gpuarr_init with the devices filter (and lease_dir); skips (or fails, where make test requires
   PoCL) without PoCL's two devices when they are wanted */
static void start(const char *filter, bool two_pocl) {
    lease_dir();
    cr_assert_eq(setenv("GPUARR_DEVICES", filter, 1), 0);
    TEST_OK(gpuarr_init(NULL));
    gpuarr_device d;
    if (two_pocl && gpuarr_device_find("opencl:1", &d) != GPUARR_OK) {
        if (test_devices_required()) cr_assert_fail("needs opencl:1 (POCL_DEVICES=\"pthread pthread\"): %s", gpuarr_last_error());
        test_skip("needs opencl:0 and opencl:1 (PoCL, POCL_DEVICES=\"pthread pthread\"): %s", gpuarr_last_error());
    }
}

Test(local_rank, a_lone_process_is_rank_0_with_no_variable) {
    int rank = -1;
    const char *name = "unchanged";
    TEST_OK(gpuarr_local_rank(&rank, &name)); /* no gpuarr_init needed */
    cr_assert_eq(rank, 0);
    cr_assert_null(name);
    rank = -1;
    TEST_OK(gpuarr_local_rank(&rank, NULL));
    cr_assert_eq(rank, 0);
}

Test(local_rank, each_variable_alone_gives_its_value_and_name) {
    for (int i = 0; i < NVARS; i++) {
        clear_vars();
        char value[16];
        snprintf(value, sizeof value, "%d", 10 + i);
        cr_assert_eq(setenv(vars[i], value, 1), 0);
        int rank = -1;
        const char *name = NULL;
        TEST_OK(gpuarr_local_rank(&rank, &name));
        cr_assert_eq(rank, 10 + i, "%s", vars[i]);
        cr_assert_str_eq(name, vars[i]);
    }
}

/* the first present in the list wins: with variables i..4 set, variable i */
Test(local_rank, the_first_present_variable_wins) {
    for (int i = NVARS - 1; i >= 0; i--) {
        char value[16];
        snprintf(value, sizeof value, "%d", 20 + i);
        cr_assert_eq(setenv(vars[i], value, 1), 0);
        int rank = -1;
        const char *name = NULL;
        TEST_OK(gpuarr_local_rank(&rank, &name));
        cr_assert_eq(rank, 20 + i);
        cr_assert_str_eq(name, vars[i]);
    }
    /* an empty one counts as unset, also a bad-looking empty one ahead of a good one */
    cr_assert_eq(setenv(vars[0], "", 1), 0);
    int rank = -1;
    const char *name = NULL;
    TEST_OK(gpuarr_local_rank(&rank, &name));
    cr_assert_eq(rank, 21);
    cr_assert_str_eq(name, vars[1]);
}

Test(local_rank, bad_values_are_invalid_argument_naming_the_variable_and_value) {
    static const char *const bad[] = {"abc", "-1", "1x", " 1", "+2", "1.0", "1000000000", "99999999999999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cr_assert_eq(setenv("MPI_LOCALRANKID", bad[i], 1), 0);
        int rank = -7;
        const char *name = "unchanged";
        char want[96];
        snprintf(want, sizeof want, "MPI_LOCALRANKID=\"%s\"", bad[i]);
        TEST_FAIL_WITH(gpuarr_local_rank(&rank, &name), GPUARR_ERROR_INVALID_ARGUMENT, want);
        cr_assert_eq(rank, -7, "nothing written");
        cr_assert_str_eq(name, "unchanged");
    }
    /* a bad value behind a good one is never read */
    cr_assert_eq(setenv("OMPI_COMM_WORLD_LOCAL_RANK", "007", 1), 0);
    int rank = -1;
    TEST_OK(gpuarr_local_rank(&rank, NULL));
    cr_assert_eq(rank, 7);
    TEST_FAIL_WITH(gpuarr_local_rank(NULL, NULL), GPUARR_ERROR_INVALID_ARGUMENT, "rank is NULL");
}

/* R mod 2 over opencl:0, opencl:1, from the spec and from each variable */
Test(local_rank, local_maps_rank_mod_n_over_the_devices_but_the_host) {
    start("host,opencl", true);
    static const char *const want[] = {"opencl:0", "opencl:1"};
    for (int r = 0; r < 6; r++) {
        char spec[24];
        snprintf(spec, sizeof spec, "local:%d", r);
        cr_assert_str_eq(found(spec), want[r % 2], "%s", spec);
    }
    cr_assert_str_eq(found("local:999999999"), "opencl:1");
    cr_assert_str_eq(found("local"), "opencl:0", "no variable: rank 0");
    for (int i = 0; i < NVARS; i++) {
        clear_vars();
        cr_assert_eq(setenv(vars[i], i % 2 ? "2" : "3", 1), 0);
        cr_assert_str_eq(found("local"), want[i % 2 ? 0 : 1], "%s", vars[i]);
    }
}

Test(local_rank, local_is_the_host_when_the_filter_leaves_no_other_device) {
    start("host", false);
    cr_assert_eq(setenv("SLURM_LOCALID", "5", 1), 0);
    cr_assert_str_eq(found("local"), "host");
    cr_assert_str_eq(found("local:3"), "host");
}

Test(local_rank, local_counts_only_the_devices_the_filter_allows) {
    start("host,opencl:1", true);
    cr_assert_str_eq(found("local:0"), "opencl:1");
    cr_assert_str_eq(found("local:1"), "opencl:1");
    cr_assert_str_eq(found("local:2"), "opencl:1");
}

/* the fake driver's two GPUs and PoCL's two devices: four, CUDA first (registry order) */
Test(local_rank, local_spans_backends_in_registry_order) {
    cr_assert_eq(setenv("GPUARR_DEVICES", "host,cuda,opencl", 1), 0);
    TEST_OK(gpuarr_init(NULL));
    gpuarr_device d;
    if (gpuarr_device_find("cuda:1", &d) != GPUARR_OK || gpuarr_device_find("opencl:1", &d) != GPUARR_OK)
        test_skip("needs cuda:0, cuda:1 (the fake CUDA driver, GPUARR_CUDA_LIBRARY) and opencl:0, opencl:1 (PoCL): %s",
                  gpuarr_last_error());
    static const char *const want[] = {"cuda:0", "cuda:1", "opencl:0", "opencl:1"};
    for (int r = 0; r < 8; r++) {
        char spec[24];
        snprintf(spec, sizeof spec, "local:%d", r);
        cr_assert_str_eq(found(spec), want[r % 4], "%s", spec);
    }
}

Test(local_rank, bad_specs_and_bad_variables_fail_find_and_leases) {
    start("host,opencl", false);
    gpuarr_device d = {12345};
    static const char *const bad[] = {"local:", "local:x", "local:-1", "local:1x", "local: 1", "local:1000000000", "local:0:1"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        TEST_FAIL_WITH(gpuarr_device_find(bad[i], &d), GPUARR_ERROR_INVALID_ARGUMENT, "R in local:R");
        cr_assert_eq(d.id, 12345u, "nothing written");
    }
    TEST_FAIL_WITH(gpuarr_device_find("locals", &d), GPUARR_ERROR_INVALID_ARGUMENT, "local, local:R");
    TEST_FAIL_WITH(gpuarr_device_find("Local", &d), GPUARR_ERROR_INVALID_ARGUMENT, "is not one of");
    cr_assert_eq(setenv("MV2_COMM_WORLD_LOCAL_RANK", "two", 1), 0);
    TEST_FAIL_WITH(gpuarr_device_find("local", &d), GPUARR_ERROR_INVALID_ARGUMENT, "MV2_COMM_WORLD_LOCAL_RANK=\"two\"");
    cr_assert_eq(d.id, 12345u);
    cr_assert_str_eq(found("local:1"), found("local:1"), "an explicit rank reads no variable");
    gpuarr_lease_desc ld;
    memset(&ld, 0, sizeof ld);
    ld.devices = "local";
    gpuarr_lease l = {777};
    TEST_FAIL_WITH(gpuarr_lease_acquire(&ld, &l), GPUARR_ERROR_INVALID_ARGUMENT, "desc->devices = \"local\": ");
    TEST_FAIL_WITH(gpuarr_lease_acquire(&ld, &l), GPUARR_ERROR_INVALID_ARGUMENT, "MV2_COMM_WORLD_LOCAL_RANK=\"two\"");
    ld.devices = "host,local:x";
    TEST_FAIL_WITH(gpuarr_lease_acquire(&ld, &l), GPUARR_ERROR_INVALID_ARGUMENT, "R in local:R");
    cr_assert_eq(l.id, 777u);
    gpuarr_plan_step step = {"solve", "local", 0, 0};
    TEST_FAIL_WITH(gpuarr_plan(&step, 1, GPUARR_PLACE_DEFAULT, &d), GPUARR_ERROR_INVALID_ARGUMENT, "MV2_COMM_WORLD_LOCAL_RANK");
    cr_assert_eq(d.id, 12345u);
}

/* the rank variables are read by the calls that use them: a bad one set before gpuarr_init does
   not stop it (the manual's CONFIGURATION), and a fixed one counts at the next call */
Test(local_rank, a_bad_rank_variable_fails_its_use_not_gpuarr_init) {
    gpuarr_shutdown();
    cr_assert_eq(setenv("MPI_LOCALRANKID", "abc", 1), 0);
    start("host,opencl", false);
    gpuarr_device d = {12345};
    TEST_FAIL_WITH(gpuarr_device_find("local", &d), GPUARR_ERROR_INVALID_ARGUMENT, "MPI_LOCALRANKID=\"abc\"");
    cr_assert_eq(setenv("MPI_LOCALRANKID", "0", 1), 0);
    TEST_OK(gpuarr_device_find("local", &d));
}

/* leases and plans take "local" as a candidate: the rank's device */
Test(local_rank, leases_and_plans_on_local_use_the_ranks_device) {
    start("host,opencl", true);
    cr_assert_eq(setenv("PMI_LOCAL_RANK", "3", 1), 0);
    gpuarr_lease_desc ld;
    memset(&ld, 0, sizeof ld);
    ld.devices = "local";
    gpuarr_lease l;
    gpuarr_device d;
    TEST_OK(gpuarr_lease_acquire(&ld, &l));
    TEST_OK(gpuarr_lease_device(l, &d));
    cr_assert_str_eq(spec_of(d), "opencl:1");
    TEST_OK(gpuarr_lease_release(l));
    ld.devices = "local:2";
    TEST_OK(gpuarr_lease_acquire(&ld, &l));
    TEST_OK(gpuarr_lease_device(l, &d));
    cr_assert_str_eq(spec_of(d), "opencl:0");
    TEST_OK(gpuarr_lease_release(l));
    gpuarr_plan_step steps[2] = {{"a", "local", 0, 0}, {"b", "local:0", 0, 0}};
    gpuarr_device out[2];
    TEST_OK(gpuarr_plan(steps, 2, GPUARR_PLACE_DEFAULT, out));
    cr_assert_str_eq(spec_of(out[0]), "opencl:1");
    cr_assert_str_eq(spec_of(out[1]), "opencl:0");
}

/* The device's one slot held by a forked process of the same local rank: a "local" lease with a
   timeout fails naming the variable, the rank, the device and the holder. */
Test(local_rank, a_timeout_names_the_variable_the_rank_the_device_and_the_holder) {
    lease_dir();
    cr_assert_eq(setenv("OMPI_COMM_WORLD_LOCAL_RANK", "3", 1), 0);
    int p[2];
    cr_assert_eq(pipe(p), 0);
    pid_t holder = fork();
    cr_assert_neq(holder, -1);
    if (holder == 0) {
        char c = 'i';
        gpuarr_lease_desc ld;
        memset(&ld, 0, sizeof ld);
        ld.devices = "local";
        gpuarr_lease l;
        cr_assert_eq(setenv("GPUARR_DEVICES", "host,opencl", 1), 0);
        if (gpuarr_init(NULL) == GPUARR_OK) c = gpuarr_lease_acquire(&ld, &l) == GPUARR_OK ? 'y' : 'n';
        if (write(p[1], &c, 1) != 1) _exit(2);
        for (;;) pause();
    }
    char c = 0;
    cr_assert_eq(read(p[0], &c, 1), 1);
    if (c != 'y') kill(holder, SIGKILL);
    cr_assert_eq(c, 'y', "the holder's lease: %c", c);
    start("host,opencl", true);
    gpuarr_lease_desc ld;
    memset(&ld, 0, sizeof ld);
    ld.devices = "local";
    ld.timeout_ms = 100;
    gpuarr_lease l = {777};
    gpuarr_result r = gpuarr_lease_acquire(&ld, &l);
    char msg[1200];
    snprintf(msg, sizeof msg, "%s", gpuarr_last_error());
    char who[64];
    snprintf(who, sizeof who, "slot 0 pid %ld thread ", (long)holder);
    /* the other rank of the device is blocked too; rank 2 (opencl:0) is not */
    gpuarr_lease other;
    ld.devices = "local:1";
    gpuarr_result r1 = gpuarr_lease_acquire(&ld, &other);
    ld.devices = "local:2";
    ld.timeout_ms = 0;
    TEST_OK(gpuarr_lease_acquire(&ld, &other));
    kill(holder, SIGKILL);
    cr_assert_eq(waitpid(holder, NULL, 0), holder);
    cr_assert_eq(r, GPUARR_ERROR_TIMEOUT, "%s: %s", gpuarr_result_name(r), msg);
    cr_assert_eq(l.id, 777u, "nothing written");
    cr_assert(strstr(msg, "\"local\" (local rank 3 from OMPI_COMM_WORLD_LOCAL_RANK: opencl:1 (3 mod 2 devices = 1)) within 100 ms"),
              "%s", msg);
    cr_assert(strstr(msg, who), "names the holder: %s", msg);
    cr_assert_eq(r1, GPUARR_ERROR_TIMEOUT, "%s", gpuarr_last_error());
    TEST_OK(gpuarr_lease_release(other));
    /* the holder is gone: its slot is free */
    ld.devices = "local";
    TEST_OK(gpuarr_lease_acquire(&ld, &l));
    TEST_OK(gpuarr_lease_release(l));
}

Test(local_rank, a_timeout_with_no_variable_says_none_is_set) {
    start("host,opencl", true);
    gpuarr_lease_desc ld;
    memset(&ld, 0, sizeof ld);
    ld.devices = "local";
    gpuarr_lease l, l2;
    TEST_OK(gpuarr_lease_acquire(&ld, &l));
    TEST_FAIL_WITH(gpuarr_lease_acquire(&ld, &l2), GPUARR_ERROR_TIMEOUT,
                   "\"local\" (local rank 0 (none of OMPI_COMM_WORLD_LOCAL_RANK, MV2_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID, SLURM_LOCALID, "
                   "PMI_LOCAL_RANK is set): opencl:0 (0 mod 2 devices = 0)) within 0 ms");
    TEST_OK(gpuarr_lease_release(l));
}

/* 4 processes, local ranks 0..3, on two devices of one slot each: each takes a "local" lease for
   its life (waiting, timeout -1), logs "+D" after taking it and "-D" before giving it back (D its
   device, 0 or 1; O_APPEND: each write lands whole, in order), holding it 50 ms. */
enum { PROCS = 4, HOLD_MS = 50 };

static int rank_process(int rank, int log_fd) {
    char value[8];
    snprintf(value, sizeof value, "%d", rank % 100);
    if (setenv("OMPI_COMM_WORLD_LOCAL_RANK", value, 1) != 0 || setenv("GPUARR_DEVICES", "host,opencl", 1) != 0 ||
        gpuarr_init(NULL) != GPUARR_OK)
        return 3;
    gpuarr_device d;
    if (gpuarr_device_find("opencl:1", &d) != GPUARR_OK) return 9; /* no PoCL's two devices */
    gpuarr_lease_desc ld;
    memset(&ld, 0, sizeof ld);
    ld.devices = "local";
    ld.timeout_ms = -1;
    gpuarr_lease l;
    gpuarr_device_info info;
    if (gpuarr_lease_acquire(&ld, &l) != GPUARR_OK || gpuarr_lease_device(l, &d) != GPUARR_OK ||
        gpuarr_device_get_info(d, &info) != GPUARR_OK || info.backend != GPUARR_BACKEND_OPENCL)
        return 4;
    char enter[2] = {'+', (char)('0' + info.index)}, leave[2] = {'-', (char)('0' + info.index)};
    if (write(log_fd, enter, 2) != 2) return 5;
    struct timespec ts = {0, HOLD_MS * 1000000L};
    nanosleep(&ts, NULL);
    if (write(log_fd, leave, 2) != 2) return 5;
    if (gpuarr_lease_release(l) != GPUARR_OK) return 6;
    gpuarr_shutdown();
    return info.index == rank % 2 ? 0 : 7;
}

Test(local_rank, four_ranks_on_two_devices_of_one_slot_take_turns, .timeout = 60) {
    lease_dir(); /* no gpuarr_init here before forking: PoCL's threads would not come along */
    char path[128];
    snprintf(path, sizeof path, "%s/log", dir);
    int log_fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    cr_assert(log_fd >= 0);
    pid_t kids[PROCS];
    for (int k = 0; k < PROCS; k++) {
        kids[k] = fork();
        cr_assert_neq(kids[k], -1);
        if (kids[k] == 0) _exit(rank_process(k, log_fd));
    }
    for (int k = 0; k < PROCS; k++) {
        int status = -1;
        cr_assert_eq(waitpid(kids[k], &status, 0), kids[k]);
        if (WIFEXITED(status) && WEXITSTATUS(status) == 9 && !test_devices_required())
            test_skip("needs opencl:0 and opencl:1 (PoCL, POCL_DEVICES=\"pthread pthread\")");
        cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "rank %d: status 0x%x", k, status);
    }
    close(log_fd);
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f);
    int holders[2] = {0, 0}, enters[2] = {0, 0}, most[2] = {0, 0}, c, dev;
    while ((c = fgetc(f)) != EOF && (dev = fgetc(f)) != EOF) {
        cr_assert(dev == '0' || dev == '1', "log byte %c", dev);
        int i = dev - '0';
        if (c == '+') holders[i]++, enters[i]++;
        else holders[i]--;
        if (holders[i] > most[i]) most[i] = holders[i];
        cr_assert(holders[i] >= 0);
    }
    fclose(f);
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(enters[i], 2, "opencl:%d: 2 ranks each", i);
        cr_assert_eq(holders[i], 0);
        cr_assert_eq(most[i], 1, "opencl:%d: %d holders at once", i, most[i]);
    }
}
