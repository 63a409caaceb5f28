/*
 * python-constants -- writes generated/gpuarr_constants.py, the dtype, result and backend constants
 * of the Python module (python/gpuarr), from gpuarr.h's own lists: the preprocessor expands
 * GPUARR_DTYPE_LIST, GPUARR_RESULT_LIST and GPUARR_BACKEND_LIST here, so the Python names,
 * values, sizes and texts are the C ones and nobody counts the enum by hand.
 *
 *   python-constants > generated/gpuarr_constants.py     (make python-constants)
 *
 * It also writes the sizes of the structs the module mirrors, which the module checks its own
 * against. make test (python-constants-check) compares a fresh output with the committed file.
 */
#include "gpuarr.h"
#include <stdio.h>

/* a Python string literal (the texts hold no control characters) */
static void put_string(const char *s) {
    putchar('"');
    for (; *s; s++) {
        if (*s == '\\' || *s == '"') putchar('\\');
        putchar(*s);
    }
    putchar('"');
}

static void put_dtypes(void) {
    puts("# dtypes: GPUARR_DTYPE_LIST. 0 (DTYPE_INVALID) also means \"keep the source's dtype\".");
    printf("DTYPE_INVALID = 0\n");
#define PUT_DTYPE_CONSTANT(NAME, str, store, size, ...) printf("%s = %d\n", &(#NAME)[7], (int)NAME);
    GPUARR_DTYPE_LIST(PUT_DTYPE_CONSTANT)
#undef PUT_DTYPE_CONSTANT
    puts("# (name, value, bytes per element), in the list's order");
    puts("DTYPES = (");
#define PUT_DTYPE_ROW(NAME, str, store, size, ...) \
    printf("    ("), put_string(str), printf(", %d, %d),\n", (int)NAME, (int)(size));
    GPUARR_DTYPE_LIST(PUT_DTYPE_ROW)
#undef PUT_DTYPE_ROW
    puts(")");
}

static void put_results(void) {
    puts("# results: GPUARR_RESULT_LIST. 0 is success, errors are negative.");
#define PUT_RESULT_CONSTANT(NAME, value, text) printf("%s = %d\n", #NAME, (int)GPUARR_##NAME);
    GPUARR_RESULT_LIST(PUT_RESULT_CONSTANT)
#undef PUT_RESULT_CONSTANT
    puts("# (name, value, description), in the list's order");
    puts("RESULTS = (");
#define PUT_RESULT_ROW(NAME, value, text) \
    printf("    (\"%s\", %d, ", #NAME, (int)GPUARR_##NAME), put_string(text), puts("),");
    GPUARR_RESULT_LIST(PUT_RESULT_ROW)
#undef PUT_RESULT_ROW
    puts(")");
}

static void put_backends(void) {
    puts("# backends: GPUARR_BACKEND_LIST (gpuarr_device_info.backend)");
#define PUT_BACKEND(NAME, str) printf("BACKEND_%s = %d\n", #NAME, (int)GPUARR_BACKEND_##NAME);
    GPUARR_BACKEND_LIST(PUT_BACKEND)
#undef PUT_BACKEND
}

/* The module mirrors these structs with ctypes field for field; it checks its sizes against these. */
static void put_sizes(void) {
    puts("# sizeof of the structs the module mirrors (python/gpuarr checks its own against them)");
    printf("SIZEOF = {\"gpuarr_device_info\": %zu, \"gpuarr_array_info\": %zu, \"gpuarr_pool_stats\": %zu}\n",
           sizeof(gpuarr_device_info), sizeof(gpuarr_array_info), sizeof(gpuarr_pool_stats));
}

int main(void) {
    puts("# Generated from gpuarr.h (GPUARR_DTYPE_LIST, GPUARR_RESULT_LIST, GPUARR_BACKEND_LIST and the");
    puts("# sizes of three structs) by tools/python-constants.c (make python-constants). Do not edit.");
    puts("\"\"\"gpuarr's constants, for the Python module (python/gpuarr).\"\"\"");
    puts("VERSION = " "\"" GPUARR_VERSION_STRING "\"");
    put_dtypes();
    put_results();
    put_backends();
    put_sizes();
    return 0;
}
