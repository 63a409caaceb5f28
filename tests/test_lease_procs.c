/*
 * test_lease_procs.c -- leases across processes (GPUARR_LEASE_DIR): a killed holder's slot is free
 * at once, a child (exec'd or only forked) never keeps its parent's slot alive, and 4 processes of
 * 8 threads contending for 3 slots never hold more than 3 at once (a shared log of enters and
 * leaves says so). Each test has a folder of its own (mkdtemp) and starts gpuarr in the processes
 * it forks, never before forking. The device is GPUARR_TEST_DEVICE's.
 */
#include "test_common.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char dir[64];
static pid_t strays[2]; /* children to kill at the end, also after a failed assertion */

static void remove_dir(void) {
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (dir[0] && system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

/* A folder of slot files, and `slots` slots on the device under test. No gpuarr_init here. */
static void procs_setup(int slots) {
    snprintf(dir, sizeof dir, "/tmp/gpuarr-test-procs-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    cr_assert_eq(setenv("GPUARR_LEASE_DIR", dir, 1), 0);
    char text[64];
    snprintf(text, sizeof text, "%s=%d", test_device_spec(), slots);
    cr_assert_eq(setenv("GPUARR_SLOTS", text, 1), 0);
}

static void procs_teardown(void) {
    for (int i = 0; i < 2; i++)
        if (strays[i] > 0) kill(strays[i], SIGKILL);
    if (gpuarr_is_initialized()) gpuarr_shutdown();
    remove_dir();
}

TestSuite(lease_procs, .fini = procs_teardown);

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static gpuarr_lease_desc test_desc(int64_t timeout_ms) {
    gpuarr_lease_desc d;
    memset(&d, 0, sizeof d);
    d.devices = test_device_spec();
    d.timeout_ms = timeout_ms;
    return d;
}

/* In a forked child: start gpuarr and lease the device (timeout 0); the result, as a byte. */
static char child_lease(void) {
    if (gpuarr_init(NULL) != GPUARR_OK) return 'i';
    gpuarr_lease_desc d = test_desc(0);
    gpuarr_lease l;
    return gpuarr_lease_acquire(&d, &l) == GPUARR_OK ? 'y' : 'n';
}

/* Starts gpuarr here and checks that the device's one slot is free: taken at once. */
static void expect_slot_free(void) {
    TEST_OK(gpuarr_init(NULL));
    test_device();
    gpuarr_lease_desc d = test_desc(0);
    gpuarr_lease l;
    TEST_OK(gpuarr_lease_acquire(&d, &l));
    TEST_OK(gpuarr_lease_release(l));
}

Test(lease_procs, a_killed_holder_frees_its_slot_at_once) {
    procs_setup(1);
    int p[2];
    cr_assert_eq(pipe(p), 0);
    pid_t holder = fork();
    cr_assert_neq(holder, -1);
    if (holder == 0) {
        char c = child_lease();
        if (write(p[1], &c, 1) != 1) _exit(2);
        for (;;) pause();
    }
    strays[0] = holder;
    char c = 0;
    cr_assert_eq(read(p[0], &c, 1), 1);
    cr_assert_eq(c, 'y', "the holder's lease: %c", c);
    TEST_OK(gpuarr_init(NULL));
    test_device();
    gpuarr_lease_desc d = test_desc(0);
    gpuarr_lease l;
    cr_assert_eq(gpuarr_lease_acquire(&d, &l), GPUARR_ERROR_TIMEOUT);
    char who[64];
    snprintf(who, sizeof who, "in other processes (slot 0 pid %ld thread ", (long)holder);
    cr_assert(strstr(gpuarr_last_error(), who), "%s", gpuarr_last_error());
    cr_assert(strstr(gpuarr_last_error(), " program "), "%s", gpuarr_last_error());
    /* this process's count says so, and the holder's age is a duration, not the file's epoch */
    cr_assert(strstr(gpuarr_last_error(), ": 0 of 1 slots in use in this process; in other processes ("), "%s", gpuarr_last_error());
    cr_assert(strstr(gpuarr_last_error(), ", held for ") && !strstr(gpuarr_last_error(), " since "), "%s", gpuarr_last_error());
    /* gpuarr_lease_summary (gpuarr-info --leases) shows the holder of every slot */
    char text[2048], line[128];
    TEST_OK(gpuarr_device_set_slots(test_device(), 2));
    TEST_OK(gpuarr_lease_summary(test_device(), text, sizeof text));
    snprintf(line, sizeof line, "%s slot 0: pid %ld thread ", test_device_spec(), (long)holder);
    cr_assert(strstr(text, line), "%s", text);
    snprintf(line, sizeof line, "%s slot 1: free\n", test_device_spec());
    cr_assert(strstr(text, line), "%s", text);
    cr_assert_eq(gpuarr_lease_summary(test_device(), NULL, 10), GPUARR_ERROR_INVALID_ARGUMENT);
    cr_assert_eq(gpuarr_lease_summary(test_device(), text, 0), GPUARR_ERROR_INVALID_ARGUMENT);
    TEST_OK(gpuarr_lease_summary(test_device(), text, 8));
    cr_assert_eq(strlen(text), 7u, "cut to len");
    TEST_OK(gpuarr_device_set_slots(test_device(), 1));
    kill(holder, SIGKILL);
    cr_assert_eq(waitpid(holder, NULL, 0), holder);
    double t0 = now_ms();
    TEST_OK(gpuarr_lease_acquire(&d, &l)); /* timeout 0: free at once */
    cr_assert(now_ms() - t0 < 1000);
    TEST_OK(gpuarr_lease_release(l));
}

/* A holder starts a child (exec'd, or only forked) and exits without releasing: the slot is free
   while the child lives on. */
static void child_outlives_holder(bool exec) {
    procs_setup(1);
    int p[2];
    cr_assert_eq(pipe(p), 0);
    pid_t holder = fork();
    cr_assert_neq(holder, -1);
    if (holder == 0) {
        char c = child_lease();
        pid_t child = fork();
        if (child == 0) {
            if (exec) execlp("sleep", "sleep", "30", (char *)NULL);
            for (;;) pause();
        }
        long msg[2] = {c, (long)child};
        if (write(p[1], msg, sizeof msg) != (ssize_t)sizeof msg) _exit(2);
        _exit(0); /* no release, no shutdown */
    }
    long msg[2] = {0, 0};
    cr_assert_eq(read(p[0], msg, sizeof msg), (ssize_t)sizeof msg);
    cr_assert_eq(waitpid(holder, NULL, 0), holder);
    cr_assert_eq((char)msg[0], 'y', "the holder's lease: %c", (char)msg[0]);
    pid_t child = (pid_t)msg[1];
    strays[1] = child;
    cr_assert_eq(kill(child, 0), 0, "the child is alive");
    expect_slot_free();
    kill(child, SIGKILL);
}

Test(lease_procs, an_exec_child_does_not_keep_its_parents_slot) { child_outlives_holder(true); }

Test(lease_procs, a_forked_child_does_not_keep_its_parents_slot) { child_outlives_holder(false); }

/* 4 processes x 8 threads, 3 slots: each holder appends "+" after taking its lease and "-" before
   giving it back to one log (O_APPEND: each write lands whole, in order). */
enum { PROCS = 4, THREADS = 8, ROUNDS = 6, SLOTS = 3 };
static int log_fd;

static void *contender(void *arg) {
    long *failures = arg;
    gpuarr_lease_desc d = test_desc(-1);
    for (int i = 0; i < ROUNDS; i++) {
        gpuarr_lease l;
        if (gpuarr_lease_acquire(&d, &l) != GPUARR_OK) {
            __atomic_add_fetch(failures, 1, __ATOMIC_RELAXED);
            continue;
        }
        if (write(log_fd, "+", 1) != 1) __atomic_add_fetch(failures, 1, __ATOMIC_RELAXED);
        struct timespec ts = {0, 300000};
        nanosleep(&ts, NULL);
        if (write(log_fd, "-", 1) != 1) __atomic_add_fetch(failures, 1, __ATOMIC_RELAXED);
        if (gpuarr_lease_release(l) != GPUARR_OK) __atomic_add_fetch(failures, 1, __ATOMIC_RELAXED);
    }
    return NULL;
}

Test(lease_procs, four_processes_of_eight_threads_never_exceed_three_slots, .timeout = 120) {
    procs_setup(SLOTS);
    char path[128];
    snprintf(path, sizeof path, "%s/log", dir);
    log_fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    cr_assert(log_fd >= 0);
    pid_t kids[PROCS];
    for (int k = 0; k < PROCS; k++) {
        kids[k] = fork();
        cr_assert_neq(kids[k], -1);
        if (kids[k] == 0) {
            long failures = 0;
            if (gpuarr_init(NULL) != GPUARR_OK) _exit(3);
            pthread_t t[THREADS];
            for (int i = 0; i < THREADS; i++) pthread_create(&t[i], NULL, contender, &failures);
            for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
            gpuarr_shutdown();
            _exit(failures ? 4 : 0);
        }
    }
    for (int k = 0; k < PROCS; k++) {
        int status = -1;
        cr_assert_eq(waitpid(kids[k], &status, 0), kids[k]);
        cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "process %d: status 0x%x", k, status);
    }
    close(log_fd);
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f);
    int holders = 0, most = 0, enters = 0, c;
    while ((c = fgetc(f)) != EOF) {
        if (c == '+') holders++, enters++;
        else if (c == '-') holders--;
        if (holders > most) most = holders;
        cr_assert(holders >= 0);
    }
    fclose(f);
    cr_assert_eq(enters, PROCS * THREADS * ROUNDS);
    cr_assert_eq(holders, 0);
    cr_assert(most <= SLOTS && most >= 1, "%d holders at once", most);
}
