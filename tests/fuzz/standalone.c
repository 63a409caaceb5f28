/*
 * standalone.c -- a main() for the fuzz targets without libFuzzer: calls LLVMFuzzerTestOneInput
 * once for each file named, and for each file of each directory named (sorted, not recursive).
 * `make fuzz-replay` builds the targets with gcc's ASan+UBSan and this driver and replays the
 * committed corpus (tests/fuzz/corpus/<target>/) under `make check`.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return 1;
    }
    size_t cap = 1 << 16, n = 0;
    uint8_t *buf = (uint8_t *)malloc(cap);
    for (;;) {
        if (n == cap) buf = (uint8_t *)realloc(buf, cap *= 2);
        size_t got = fread(buf + n, 1, cap - n, f);
        if (!got) break;
        n += got;
    }
    fclose(f);
    /* a copy of exactly n bytes, so that ASan sees a read past the input */
    uint8_t *input = (uint8_t *)malloc(n ? n : 1);
    memcpy(input, buf, n);
    free(buf);
    if (getenv("FUZZ_API_TRACE")) fprintf(stderr, "input %s\n", path); /* which input the trace below is of */
    LLVMFuzzerTestOneInput(input, n);
    free(input);
    return 0;
}

static int by_name(const struct dirent **a, const struct dirent **b) { return strcmp((*a)->d_name, (*b)->d_name); }

int main(int argc, char **argv) {
    int files = 0, errors = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) {
            perror(argv[i]);
            errors++;
            continue;
        }
        if (!S_ISDIR(st.st_mode)) {
            errors += run_file(argv[i]);
            files++;
            continue;
        }
        struct dirent **list;
        int n = scandir(argv[i], &list, NULL, by_name);
        if (n < 0) {
            perror(argv[i]);
            errors++;
            continue;
        }
        for (int k = 0; k < n; k++) {
            if (list[k]->d_name[0] != '.') {
                char path[4096];
                snprintf(path, sizeof path, "%s/%s", argv[i], list[k]->d_name);
                errors += run_file(path);
                files++;
            }
            free(list[k]);
        }
        free(list);
    }
    printf("standalone: %d inputs run, %d unreadable\n", files, errors);
    return errors ? 1 : 0;
}
