/*
 * gpuarr_toy.h -- a made-up backend for tests/compile/toy_backend.c, which checks that adding a
 * backend takes what the top of gpuarr.h says. Its one device, "toy:0", keeps its arrays in host
 * memory through the host backend's procedures; its one interop function, gpuarr_toy_answer,
 * says 42.
 */
#ifndef GPUARR_TOY_BACKEND_INCLUDED
#define GPUARR_TOY_BACKEND_INCLUDED

static gpuarr_result gpuarr__toy_answer(gpuarr_device d, int *out) {
    GPUARR__REQUIRE_PTR(out);
    gpuarr__dev *dev;
    GPUARR__CHECK(gpuarr__get_dev(d, "d", &dev));
    if (dev->backend->id != GPUARR_BACKEND_TOY)
        return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "d is %s, not a toy device", dev->info.spec);
    *out = 42;
    return GPUARR_OK;
}

static const gpuarr__interop_TOY gpuarr__toy_interop = {GPUARR_BACKEND_TOY, GPUARR__INTEROP_TOY(GPUARR__INTEROP_IMPL)};

/* The host's table under another name: synchronous, host memory, but not builtin ("toy:0"). */
static void gpuarr__toy_backend_fill(gpuarr__backend *b) {
    gpuarr__host_backend_fill(b);
    b->id = GPUARR_BACKEND_TOY;
    b->name = "toy";
    b->flags = GPUARR__BACKEND_SYNCHRONOUS | GPUARR__BACKEND_HOST_MEMORY | GPUARR__BACKEND_PAGEABLE_ASYNC;
    b->interop = &gpuarr__toy_interop;
}
#define GPUARR__BACKEND_FILL_TOY gpuarr__toy_backend_fill

#endif /* GPUARR_TOY_BACKEND_INCLUDED */
