/*
 * A minimal stand-in for <criterion/criterion.h>, for ThreadSanitizer builds only.
 *
 * Criterion 2.4 cannot start under TSan ("Could not initialize inheritable arena: Resource
 * temporarily unavailable", Snaipe/Criterion#274): its boxfort arena is mapped where TSan keeps
 * its shadow memory. This header implements the subset of the Criterion API the gpuarr tests use
 * (Test, TestSuite with .init/.fini, cr_assert*, cr_expect*, cr_skip_test, cr_log_*,
 * criterion_current_test) and a main() that runs every test in a forked child, like Criterion.
 *
 * Use it instead of the real header and library:
 *     cc -std=c11 -fsanitize=thread -isystem tests/tsan_shim -I. -Itests tests/test_threads.c \
 *        gpuarr.c -lm -lpthread -ldl
 * Options of the resulting binary: --filter GLOB (suite::name), --verbose; others are ignored.
 * Exit status 0 when no test failed or crashed.
 */
#ifndef GPUARR_TSAN_SHIM_CRITERION_H
#define GPUARR_TSAN_SHIM_CRITERION_H
#pragma GCC system_header

#include <fnmatch.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

struct criterion_test_extra_data {
    int shim_dummy_;
    void (*init)(void);
    void (*fini)(void);
    double timeout;
    bool disabled;
    const char *description;
    int exit_code;
    int signal;
};

struct criterion_test {
    const char *name;
    const char *category;
    void (*test)(void);
    struct criterion_test_extra_data *data;
};

struct criterion_suite {
    const char *name;
    struct criterion_test_extra_data *data;
};

enum { SHIM_MAX_TESTS = 512, SHIM_MAX_SUITES = 64, SHIM_SKIP_STATUS = 77 };
static struct criterion_test *shim_tests_[SHIM_MAX_TESTS];
static int shim_ntests_;
static struct criterion_suite *shim_suites_[SHIM_MAX_SUITES];
static int shim_nsuites_;
static int shim_failed_;
const struct criterion_test *criterion_current_test;

static void shim_register_test_(struct criterion_test *t) {
    if (shim_ntests_ < SHIM_MAX_TESTS) shim_tests_[shim_ntests_++] = t;
}
static void shim_register_suite_(struct criterion_suite *s) {
    if (shim_nsuites_ < SHIM_MAX_SUITES) shim_suites_[shim_nsuites_++] = s;
}

#define SHIM_CAT2_(a, b) a##b
#define SHIM_CAT_(a, b) SHIM_CAT2_(a, b)

#define Test(suite, name, ...)                                                                     \
    static void suite##_##name##_shim_impl_(void);                                                 \
    static struct criterion_test_extra_data suite##_##name##_shim_data_ = {0, __VA_ARGS__};        \
    static struct criterion_test suite##_##name##_shim_test_ = {                                   \
        #name, #suite, suite##_##name##_shim_impl_, &suite##_##name##_shim_data_};                 \
    __attribute__((constructor)) static void suite##_##name##_shim_reg_(void) {                    \
        shim_register_test_(&suite##_##name##_shim_test_);                                         \
    }                                                                                              \
    static void suite##_##name##_shim_impl_(void)

#define TestSuite(suite, ...)                                                                      \
    static struct criterion_test_extra_data suite##_shim_suite_data_ = {0, __VA_ARGS__};           \
    static struct criterion_suite suite##_shim_suite_ = {#suite, &suite##_shim_suite_data_};       \
    __attribute__((constructor)) static void suite##_shim_suite_reg_(void) {                       \
        shim_register_suite_(&suite##_shim_suite_);                                                \
    }                                                                                              \
    struct criterion_suite *suite##_shim_suite_unused_(void)

__attribute__((format(printf, 6, 7))) static void shim_check_(int ok, int fatal, const char *file,
                                                               int line, const char *expr,
                                                               const char *fmt, ...);
static void shim_check_(int ok, int fatal, const char *file, int line, const char *expr,
                        const char *fmt, ...) {
    if (ok) return;
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "[----] %s:%d: Assertion Failed\n[----]   %s\n", file, line,
            msg[0] ? msg : expr);
    shim_failed_ = 1;
    if (fatal) {
        fflush(NULL);
        _exit(1);
    }
}

/* Every message is "" FORMAT, so that a missing one is the empty format; the expression text is
   printed when no message was given. */
#define SHIM_CHECK_(ok, fatal, expr, ...)                                                          \
    shim_check_((ok) ? 1 : 0, fatal, __FILE__, __LINE__, expr, "" __VA_ARGS__)

#define cr_assert(cond, ...) SHIM_CHECK_((cond), 1, #cond, __VA_ARGS__)
#define cr_expect(cond, ...) SHIM_CHECK_((cond), 0, #cond, __VA_ARGS__)
#define cr_assert_not(cond, ...) SHIM_CHECK_(!(cond), 1, "!(" #cond ")", __VA_ARGS__)
#define cr_assert_eq(a, b, ...) SHIM_CHECK_((a) == (b), 1, #a " == " #b, __VA_ARGS__)
#define cr_expect_eq(a, b, ...) SHIM_CHECK_((a) == (b), 0, #a " == " #b, __VA_ARGS__)
#define cr_assert_neq(a, b, ...) SHIM_CHECK_((a) != (b), 1, #a " != " #b, __VA_ARGS__)
#define cr_expect_neq(a, b, ...) SHIM_CHECK_((a) != (b), 0, #a " != " #b, __VA_ARGS__)
#define cr_assert_gt(a, b, ...) SHIM_CHECK_((a) > (b), 1, #a " > " #b, __VA_ARGS__)
#define cr_assert_geq(a, b, ...) SHIM_CHECK_((a) >= (b), 1, #a " >= " #b, __VA_ARGS__)
#define cr_assert_leq(a, b, ...) SHIM_CHECK_((a) <= (b), 1, #a " <= " #b, __VA_ARGS__)
#define cr_assert_lt(a, b, ...) SHIM_CHECK_((a) < (b), 1, #a " < " #b, __VA_ARGS__)
#define cr_expect_gt(a, b, ...) SHIM_CHECK_((a) > (b), 0, #a " > " #b, __VA_ARGS__)
#define cr_expect_geq(a, b, ...) SHIM_CHECK_((a) >= (b), 0, #a " >= " #b, __VA_ARGS__)
#define cr_expect_arr_eq(a, b, size, ...) SHIM_CHECK_(memcmp((a), (b), (size)) == 0, 0, #a " == " #b, __VA_ARGS__)
#define cr_assert_null(p, ...) SHIM_CHECK_((p) == NULL, 1, #p " == NULL", __VA_ARGS__)
#define cr_expect_null(p, ...) SHIM_CHECK_((p) == NULL, 0, #p " == NULL", __VA_ARGS__)
#define cr_assert_not_null(p, ...) SHIM_CHECK_((p) != NULL, 1, #p " != NULL", __VA_ARGS__)
#define cr_expect_not_null(p, ...) SHIM_CHECK_((p) != NULL, 0, #p " != NULL", __VA_ARGS__)
#define cr_assert_str_eq(a, b, ...) SHIM_CHECK_(strcmp((a), (b)) == 0, 1, #a " == " #b, __VA_ARGS__)
#define cr_expect_str_eq(a, b, ...) SHIM_CHECK_(strcmp((a), (b)) == 0, 0, #a " == " #b, __VA_ARGS__)
#define cr_expect_str_neq(a, b, ...) SHIM_CHECK_(strcmp((a), (b)) != 0, 0, #a " != " #b, __VA_ARGS__)
#define cr_assert_fail(...) SHIM_CHECK_(0, 1, "cr_assert_fail", __VA_ARGS__)
#define cr_expect_fail(...) SHIM_CHECK_(0, 0, "cr_expect_fail", __VA_ARGS__)

#define cr_log_info(...) (fprintf(stderr, "[----] " __VA_ARGS__), fputc('\n', stderr))
#define cr_log_warn(...) (fprintf(stderr, "[WARN] " __VA_ARGS__), fputc('\n', stderr))
#define cr_log_error(...) (fprintf(stderr, "[ERR ] " __VA_ARGS__), fputc('\n', stderr))

#define cr_skip_test(...)                                                                          \
    do {                                                                                           \
        fprintf(stderr, "[SKIP] " __VA_ARGS__);                                                    \
        fputc('\n', stderr);                                                                       \
        fflush(NULL);                                                                              \
        _exit(SHIM_SKIP_STATUS);                                                                   \
    } while (0)

static struct criterion_suite *shim_find_suite_(const char *name) {
    for (int i = 0; i < shim_nsuites_; i++)
        if (strcmp(shim_suites_[i]->name, name) == 0) return shim_suites_[i];
    return NULL;
}

static int shim_run_one_(struct criterion_test *t) {
    struct criterion_suite *s = shim_find_suite_(t->category);
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        criterion_current_test = t;
        if (s && s->data->init) s->data->init();
        if (t->data->init) t->data->init();
        t->test();
        if (t->data->fini) t->data->fini();
        if (s && s->data->fini) s->data->fini();
        fflush(NULL);
        _exit(shim_failed_ ? 1 : 0);
    }
    int status = 0;
    if (waitpid(pid, &status, 0) < 0) return -1;
    return status;
}

int main(int argc, char **argv) {
    const char *filter = NULL;
    bool verbose = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--filter") == 0 && i + 1 < argc) filter = argv[++i];
        else if (strncmp(argv[i], "--filter=", 9) == 0) filter = argv[i] + 9;
        else if (strncmp(argv[i], "--verbose", 9) == 0) verbose = true;
    }
    int tested = 0, passed = 0, failed = 0, crashed = 0, skipped = 0;
    for (int i = 0; i < shim_ntests_; i++) {
        struct criterion_test *t = shim_tests_[i];
        char full[512];
        snprintf(full, sizeof full, "%s/%s", t->category, t->name);
        if (filter && fnmatch(filter, full, 0) != 0) continue;
        if (t->data->disabled) continue;
        if (verbose) fprintf(stderr, "[RUN ] %s::%s\n", t->category, t->name);
        int st = shim_run_one_(t);
        if (st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == SHIM_SKIP_STATUS) {
            skipped++;
            fprintf(stderr, "[SKIP] %s::%s\n", t->category, t->name);
            continue;
        }
        tested++;
        if (st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0) {
            passed++;
            if (verbose) fprintf(stderr, "[PASS] %s::%s\n", t->category, t->name);
        } else if (st >= 0 && WIFEXITED(st)) {
            failed++;
            fprintf(stderr, "[FAIL] %s::%s\n", t->category, t->name);
        } else {
            crashed++;
            fprintf(stderr, "[CRASH] %s::%s (%s %d)\n", t->category, t->name,
                    st >= 0 && WIFSIGNALED(st) ? "signal" : "status",
                    st >= 0 && WIFSIGNALED(st) ? WTERMSIG(st) : st);
        }
    }
    fprintf(stderr,
            "[====] Synthesis: Tested: %d | Passing: %d | Failing: %d | Crashing: %d "
            "(skipped %d; TSan stand-in runner)\n",
            tested, passed, failed, crashed, skipped);
    if (tested + skipped == 0 && !filter) {
        fprintf(stderr, "[FAIL] no test was registered: the stand-in runner saw nothing to run\n");
        return 1;
    }
    return failed || crashed ? 1 : 0;
}

#endif /* GPUARR_TSAN_SHIM_CRITERION_H */
