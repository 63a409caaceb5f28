/*
 * fault_spec.h -- the rule syntax shared by the fake CUDA driver (FAKE_CUDA_FAIL) and the OpenCL
 * interposer (FAULT_OPENCL_FAIL): comma-separated rules, each `nth=N[:CODE]` (the Nth call of the
 * process) or `ENTRY:N[:CODE]` (the Nth call of one entry point; ENTRY `*` = any). Each library
 * resolves the entry and code names itself. Static functions only: included by both.
 */
#ifndef GPUARR_TESTS_FAULT_SPEC_H
#define GPUARR_TESTS_FAULT_SPEC_H

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

typedef struct fault_spec_rule {
    char text[160];         /* the rule, cut into its parts below */
    const char *entry;      /* the entry point's name; NULL for nth= and for `*` */
    unsigned long long nth; /* >= 1 */
    const char *code;       /* the code's text; NULL when not given */
} fault_spec_rule;

/* The next rule of *p into *r, advancing *p: 1 = a rule, 0 = the end, -1 = malformed. */
static int fault_spec_next(const char **p, fault_spec_rule *r) {
    while (**p == ',') (*p)++;
    if (!**p) return 0;
    size_t len = strcspn(*p, ",");
    if (len >= sizeof r->text) return -1;
    memcpy(r->text, *p, len);
    r->text[len] = 0;
    *p += len;
    r->entry = NULL;
    char *number, *end;
    if (strncmp(r->text, "nth=", 4) == 0) {
        number = r->text + 4;
    } else {
        char *colon = strchr(r->text, ':');
        if (!colon || colon == r->text) return -1;
        *colon = 0;
        if (strcmp(r->text, "*") != 0) r->entry = r->text;
        number = colon + 1;
    }
    char *code = strchr(number, ':');
    if (code) *code++ = 0;
    r->code = code;
    r->nth = strtoull(number, &end, 10);
    return end == number || *end || r->nth == 0 ? -1 : 1;
}

#endif
