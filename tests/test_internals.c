/*
 * test_internals.c -- white-box tests of the core's private machinery that the public API cannot
 * reach cheaply: how a failure is carried inside (code, function and reason apart, the message
 * joined at the public boundary), lookups that must not record an error, where the process-wide
 * state lives. This file compiles the implementation itself (it is linked without gpuarr.o).
 */
#define GPUARR_IMPLEMENTATION
#include "test_common.h"

#include <ctype.h>

static void init_host_only(void) {
    gpuarr_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.devices = "host";
    gpuarr_result r = gpuarr_init(&desc);
    cr_assert_eq(r, GPUARR_OK, "gpuarr_init = %s: %s", gpuarr_result_name(r), gpuarr_last_error());
}

TestSuite(internals, .init = init_host_only, .fini = gpuarr_shutdown);

Test(internals, a_failure_carries_its_code_function_and_reason_apart_and_the_message_joins_them) {
    cr_assert_eq(gpuarr_retain((gpuarr_array){0}), GPUARR_ERROR_INVALID_HANDLE);
    cr_assert_eq(gpuarr__tls.error_code, GPUARR_ERROR_INVALID_HANDLE);
    cr_assert_str_eq(gpuarr__tls.error_api, "gpuarr_retain");
    cr_assert_str_eq(gpuarr__tls.error_detail, "a is a zero array handle (never created)");
    cr_assert_str_eq(gpuarr_last_error(), "gpuarr_retain: a is a zero array handle (never created)");
    const char *first = gpuarr_last_error();
    cr_assert_eq(gpuarr_last_error(), first, "the message is not kept between calls");
    /* the function name does not take room from the reason */
    char reason[sizeof gpuarr__tls.error_detail];
    memset(reason, 'x', sizeof reason - 1);
    reason[sizeof reason - 1] = '\0';
    gpuarr__tls.api = "gpuarr_test";
    gpuarr__fail(GPUARR_ERROR_BACKEND, "%s", reason);
    cr_assert_str_eq(gpuarr__tls.error_detail, reason);
    cr_assert_eq(strlen(gpuarr_last_error()), strlen("gpuarr_test: ") + strlen(reason));
}

Test(internals, looking_up_a_destroyed_current_stream_records_no_error) {
    gpuarr_stream s;
    TEST_OK(gpuarr_stream_create(gpuarr_host(), 0, &s));
    TEST_OK(gpuarr_set_current_stream(s));
    TEST_OK(gpuarr_stream_destroy(s));
    cr_assert_eq(gpuarr_retain((gpuarr_array){0}), GPUARR_ERROR_INVALID_HANDLE);
    const char *before = gpuarr_last_error();
    gpuarr__thread_state saved = gpuarr__tls;
    cr_assert_null(gpuarr__current_stream_obj());
    cr_assert_eq(gpuarr__tls.stream_id, 0u, "the destroyed stream is still current");
    cr_assert_eq(gpuarr__tls.error_code, saved.error_code);
    cr_assert_eq(gpuarr__tls.error_api, saved.error_api);
    cr_assert_eq(gpuarr__tls.error_formatted, true, "the lookup touched the last error");
    cr_assert_eq(memcmp(gpuarr__tls.error_detail, saved.error_detail, sizeof saved.error_detail), 0);
    cr_assert_str_eq(gpuarr_last_error(), before);
}

/* STYLE rule 10: no file-level state outside the one global struct. Scans the sources for
   file-scope `static` objects that are not constant. Allowed: the global state itself, the
   per-thread state, NVRTC's (process-wide by design: tools use it without gpuarr_init) and the
   per-thread default stream key. Run from the repository root, as make does. */
static bool state_allowed(const char *name) {
    static const char *const allowed[] = {"gpuarr__g", "gpuarr__tls", "gpuarr__nvrtc", "gpuarr__thread_key_once",
                                          "gpuarr__thread_key", "gpuarr__thread_key_ok", "gpuarr__thread_serials"};
    for (size_t i = 0; i < sizeof allowed / sizeof allowed[0]; i++)
        if (strcmp(name, allowed[i]) == 0) return true;
    return false;
}

static int count_file_state(const char *path, char *found, size_t cap) {
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "cannot open %s (run from the repository root)", path);
    char line[4096];
    int count = 0;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "static ", 7) != 0 || strncmp(line, "static const ", 13) == 0 || strncmp(line, "static inline ", 14) == 0)
            continue;
        size_t end = strcspn(line, "=;[");
        if (memchr(line, '(', end)) continue; /* a function */
        while (end > 0 && (line[end - 1] == ' ' || line[end - 1] == '\n')) end--;
        size_t start = end;
        while (start > 0 && (isalnum((unsigned char)line[start - 1]) || line[start - 1] == '_')) start--;
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)(end - start), line + start);
        if (state_allowed(name)) continue;
        count++;
        size_t used = strlen(found);
        snprintf(found + used, cap - used, " %s:%s", path, name);
    }
    fclose(f);
    return count;
}

Test(internals, no_file_level_state_outside_the_global_struct) {
    static const char *const files[] = {"gpuarr.h", "backends/gpuarr_host.h", "backends/gpuarr_opencl.h", "backends/gpuarr_cuda.h"};
    char found[2048] = "";
    int count = 0;
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) count += count_file_state(files[i], found, sizeof found);
    cr_assert_eq(count, 0, "file-level state:%s", found);
}
