/*
 * gpuarr_local_rank.h -- the local rank (the manual's LOCAL RANK section), a layer on the core:
 * gpuarr_local_rank and the device specs "local" and "local:R", which it resolves for the core's
 * gpuarr_device_find and for the lease layer's candidate lists.
 *
 * Included by the implementation of gpuarr.h after the core; registers in gpuarr__layer_list.
 */
#ifndef GPUARR_LOCAL_RANK_LAYER_INCLUDED
#define GPUARR_LOCAL_RANK_LAYER_INCLUDED

/* ---------------------------------------------------------------------------------------------
 * Local rank (LOCAL RANK): "local" spreads a launcher's processes over the devices by the rank
 * its environment gives. Every process must map alike with no word between them, so the list is
 * the registry's order, failed devices included.
 * ------------------------------------------------------------------------------------------- */
#define GPUARR__LOCAL_RANK_MAX 999999999
#define GPUARR__LOCAL_NOTE 256 /* what a "local" item was resolved from, for messages */
static const char *const gpuarr__local_rank_vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                                                      "SLURM_LOCALID", "PMI_LOCAL_RANK"};

static gpuarr_result gpuarr__local_rank(int *rank, const char **variable) {
    for (size_t i = 0; i < sizeof gpuarr__local_rank_vars / sizeof *gpuarr__local_rank_vars; i++) {
        const char *name = gpuarr__local_rank_vars[i], *v = gpuarr__env(name, GPUARR__ENV_KEPT);
        long r;
        if (!v || !*v) continue; /* empty counts as unset, as for gpuarr's own variables */
        if (!gpuarr__parse_uint(v, strlen(v), GPUARR__LOCAL_RANK_MAX, &r))
            return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "%s=\"%.64s\" is not a local rank (a decimal integer 0..%d)", name, v,
                                GPUARR__LOCAL_RANK_MAX);
        *rank = (int)r;
        *variable = name;
        return GPUARR_OK;
    }
    *rank = 0;
    *variable = NULL;
    return GPUARR_OK;
}

GPUARR_API gpuarr_result gpuarr_local_rank(int *rank, const char **variable) {
    gpuarr__tls.api = __func__; /* the environment only: no gpuarr_init needed */
    GPUARR__REQUIRE_PTR(rank);
    int r;
    const char *name;
    GPUARR__CHECK(gpuarr__local_rank(&r, &name));
    *rank = r;
    if (variable) *variable = name;
    return GPUARR_OK;
}

static bool gpuarr__is_local_spec(const char *spec) { return strncmp(spec, "local", 5) == 0 && (!spec[5] || spec[5] == ':'); }

/* "local" or "local:R": device R % n of the n devices other than the host (a physical one once,
   through the view that represents it), else the host. note: how, for messages. */
static gpuarr_result gpuarr__find_local(const char *spec, gpuarr__dev **out, char *note, size_t cap) {
    int rank = 0, n = 0;
    const char *name = NULL;
    long given;
    if (spec[5] == ':') {
        if (!gpuarr__parse_uint(spec + 6, strlen(spec + 6), GPUARR__LOCAL_RANK_MAX, &given))
            return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "spec \"%s\": R in local:R must be a decimal integer 0..%d", spec,
                                GPUARR__LOCAL_RANK_MAX);
        rank = (int)given;
    } else if (gpuarr__local_rank(&rank, &name) != GPUARR_OK) {
        char why[sizeof gpuarr__tls.error_detail];
        gpuarr__copy_string(why, sizeof why, gpuarr__tls.error_detail);
        return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "spec \"local\": %s", why);
    }
    for (int i = 1; i < gpuarr__g.device_count; i++) n += !gpuarr__is_duplicate(&gpuarr__g.devices[i]);
    gpuarr__dev *found = gpuarr__host_dev();
    for (int i = 1, k = n ? rank % n : -1; k >= 0 && i < gpuarr__g.device_count; i++)
        if (!gpuarr__is_duplicate(&gpuarr__g.devices[i]) && k-- == 0) found = &gpuarr__g.devices[i];
    if (spec[5] == ':') snprintf(note, cap, "local rank %d from the spec", rank);
    else if (name) snprintf(note, cap, "local rank %d from %s", rank, name);
    else snprintf(note, cap, "local rank 0 (none of OMPI_COMM_WORLD_LOCAL_RANK, MV2_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID, "
                             "SLURM_LOCALID, PMI_LOCAL_RANK is set)");
    size_t len = strlen(note);
    if (n) snprintf(note + len, cap - len, ": %s (%d mod %d devices = %d)", found->info.spec, rank, n, rank % n);
    else snprintf(note + len, cap - len, ": host (no other device)");
    *out = found;
    return GPUARR_OK;
}

/* The core asks each layer for a spec it does not know itself. */
static bool gpuarr__local_find_device(const char *spec, gpuarr__dev **out, gpuarr_result *r) {
    if (!gpuarr__is_local_spec(spec)) return false;
    char note[GPUARR__LOCAL_NOTE];
    *r = gpuarr__find_local(spec, out, note, sizeof note);
    return true;
}

static void gpuarr__local_rank_layer(gpuarr__layer *l) {
    l->name = "local rank";
    l->find_device = gpuarr__local_find_device;
}

#endif /* GPUARR_LOCAL_RANK_LAYER_INCLUDED */
