/*
 * gpuarr_dlpack.h -- DLPack export and import, a layer on the core: included by the implementation
 * of gpuarr.h after the core, so it uses the core's internals, and reaches CUDA and OpenCL only
 * through their interop tables; registers in gpuarr__layer_list.
 *
 * Where the data pointer points (DLTensor.data + byte_offset is always the first element):
 *   host (and pinned host): data = the address of the first element of the memory the array
 *     shares (its root's), byte_offset = a view's offset from there (0 for other arrays);
 *   CUDA: the same with device pointers (what CuPy and PyTorch expect);
 *   OpenCL: data = the cl_mem (DLPack's rule for OpenCL: an opaque handle, not an address),
 *     byte_offset = the offset of the first element in that buffer, as gpuarr_opencl_mem_raw
 *     gives it: pool blocks are sub-allocated, so it can be non-zero for a plain array too.
 * An empty array exports data = NULL, byte_offset 0.
 */
#ifndef GPUARR_DLPACK_INCLUDED
#define GPUARR_DLPACK_INCLUDED

/* ---------------------------------------------------------------------------------------------
 * Dtypes
 * ------------------------------------------------------------------------------------------- */
static DLDataType gpuarr__dlpack_dtype(gpuarr_dtype t) {
    DLDataType d;
    d.lanes = 1;
    d.bits = (uint8_t)(gpuarr__dtype_sizes[t] * 8u);
    switch (t) {
    case GPUARR_BOOL: d.code = (uint8_t)kDLBool; break;
    case GPUARR_I8: case GPUARR_I16: case GPUARR_I32: case GPUARR_I64: d.code = (uint8_t)kDLInt; break;
    case GPUARR_U8: case GPUARR_U16: case GPUARR_U32: case GPUARR_U64: d.code = (uint8_t)kDLUInt; break;
    case GPUARR_BF16: d.code = (uint8_t)kDLBfloat; break;
    default: d.code = (uint8_t)kDLFloat; break; /* F16 F32 F64 */
    }
    return d;
}

/* The gpuarr dtype of a DLPack one, or 0. */
static gpuarr_dtype gpuarr__dlpack_dtype_back(DLDataType d) {
    for (int t = 1; t < GPUARR_DTYPE_COUNT; t++) {
        DLDataType m = gpuarr__dlpack_dtype((gpuarr_dtype)t);
        if (m.code == d.code && m.bits == d.bits) return (gpuarr_dtype)t;
    }
    return (gpuarr_dtype)0;
}

/* ---------------------------------------------------------------------------------------------
 * Export. One allocation holds the managed tensor, its shape and strides and the reference.
 * ------------------------------------------------------------------------------------------- */
typedef struct gpuarr__dlpack_ctx {
    DLManagedTensorVersioned versioned; /* the one handed out, or */
    DLManagedTensor legacy;             /* this one (gpuarr_to_dlpack_legacy) */
    int64_t shape[GPUARR_MAX_DIMS];
    int64_t strides[GPUARR_MAX_DIMS];
    gpuarr_array array; /* the reference the tensor holds: a view of the array, its handle private */
    uint32_t epoch;     /* the init cycle it belongs to */
    gpuarr_allocator allocator; /* the one that allocated this record: it outlives gpuarr_shutdown */
} gpuarr__dlpack_ctx;

static void gpuarr__dlpack_ctx_free(gpuarr__dlpack_ctx *c) {
    gpuarr_allocator al = c->allocator;
    if (al.free_fn) {
        al.free_fn(c, al.user_data);
        return;
    }
#ifdef GPUARR_FREE
    GPUARR_FREE(c);
#else
    free(c);
#endif
}

/* The deleter's work. After gpuarr_shutdown (or in a later init cycle) the reference went with
   the handle tables, so only the record is freed. Like any gpuarr call, not concurrently with
   gpuarr_shutdown. */
static void gpuarr__dlpack_ctx_drop(gpuarr__dlpack_ctx *c) {
    if (!c) return;
    if (gpuarr__initialized() && gpuarr__g.epoch == c->epoch) {
        const char *api = gpuarr__tls.api;
        (void)gpuarr_release(c->array);
        gpuarr__tls.api = api;
    }
    gpuarr__dlpack_ctx_free(c);
}

static void gpuarr__dlpack_deleter(DLManagedTensorVersioned *self) {
    if (self) gpuarr__dlpack_ctx_drop((gpuarr__dlpack_ctx *)self->manager_ctx);
}

static void gpuarr__dlpack_deleter_legacy(DLManagedTensor *self) {
    if (self) gpuarr__dlpack_ctx_drop((gpuarr__dlpack_ctx *)self->manager_ctx);
}

#define GPUARR__DLPACK_INTEROP(B) \
    (gpuarr__backend_get(GPUARR_BACKEND_##B) ? (const gpuarr__interop_##B *)gpuarr__backend_get(GPUARR_BACKEND_##B)->interop : NULL)

/* The DLPack device, data and byte_offset of a (held by handle h). */
static gpuarr_result gpuarr__dlpack_place(gpuarr__array *a, gpuarr_array h, DLTensor *t) {
    size_t view = (a->base && !a->batch_member) ? a->base_offset : 0;
    t->device.device_id = 0;
    t->data = NULL;
    t->byte_offset = 0;
    switch (a->dev->backend->id) {
    case GPUARR_BACKEND_HOST:
        t->device.device_type = (a->pinned_for && a->pinned_for->backend->id == GPUARR_BACKEND_CUDA) ? kDLCUDAHost : kDLCPU;
        if (a->count > 0) {
            t->data = (unsigned char *)a->mem + a->offset - view;
            t->byte_offset = view;
        }
        return GPUARR_OK;
    case GPUARR_BACKEND_CUDA: {
        t->device.device_type = kDLCUDA;
        t->device.device_id = (int32_t)a->dev->info.index;
        if (a->count == 0) return GPUARR_OK;
        void *p = NULL;
        GPUARR__CHECK(GPUARR__DLPACK_INTEROP(CUDA)->cuda_ptr(h, &p));
        t->data = (unsigned char *)p - view;
        t->byte_offset = view;
        return GPUARR_OK;
    }
    case GPUARR_BACKEND_OPENCL: {
        t->device.device_type = kDLOpenCL;
        t->device.device_id = (int32_t)a->dev->info.index;
        if (a->count == 0) return GPUARR_OK;
        size_t off = 0;
        GPUARR__CHECK(GPUARR__DLPACK_INTEROP(OPENCL)->opencl_mem_raw(h, &t->data, &off));
        t->byte_offset = off;
        return GPUARR_OK;
    }
    default:
        return gpuarr__fail(GPUARR_ERROR_UNSUPPORTED, "a lives on %s: DLPack has no device type for its backend", a->dev->info.spec);
    }
}

/* Makes the tensor for handle h: checks, waits (or orders `consumer`), fills, takes the reference. */
static gpuarr_result gpuarr__dlpack_export(gpuarr_array h, bool async, gpuarr_stream consumer, uint64_t flags, bool legacy,
                                           gpuarr__dlpack_ctx **out) {
    if (flags & ~GPUARR_DLPACK_READ_ONLY)
        return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "flags = 0x%llx: only GPUARR_DLPACK_READ_ONLY (0x1) is defined",
                            (unsigned long long)flags);
    gpuarr__array *a;
    GPUARR__CHECK(gpuarr__get_array(h, "a", &a));
    if (legacy && a->read_only) { /* as NumPy does: a legacy tensor cannot tell its consumer not to write */
        gpuarr__obj_release(&a->obj);
        return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "a is read-only and a legacy DLManagedTensor cannot say so: "
                                                           "export it with gpuarr_to_dlpack (DLPack 1.x)");
    }
    gpuarr__dlpack_ctx *c = (gpuarr__dlpack_ctx *)gpuarr__calloc(sizeof *c);
    gpuarr_result r = c ? GPUARR_OK : gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY, "no host memory for a DLPack tensor");
    DLTensor *t = &c->versioned.dl_tensor;
    if (r == GPUARR_OK) r = gpuarr__dlpack_place(a, h, t);
    if (r == GPUARR_OK && async) {
        gpuarr__stream *s;
        r = gpuarr__resolve_stream(consumer, "consumer", &s);
        if (r == GPUARR_OK) {
            r = gpuarr__order_after_uses(s, a); /* the array's ready event and its streams */
            gpuarr__obj_release(&s->obj);
        }
    } else if (r == GPUARR_OK) {
        gpuarr__event *ready = gpuarr__ready_get(a);
        if (ready) {
            r = gpuarr__backend_event_sync(ready->dev, ready->native);
            if (r == GPUARR_OK) gpuarr__collect_device(ready->dev);
            gpuarr__obj_release(&ready->obj);
        }
    }
    /* the tensor's reference is a view of its own, not one more count on h: a release of h too many
       (the caller's bug) then fails with INVALID_HANDLE instead of freeing memory a consumer reads */
    gpuarr_array held = {0};
    if (r == GPUARR_OK) r = gpuarr__view_publish(a, a->ndim, a->shape, 0, &held);
    if (r == GPUARR_OK) {
        c->array = held;
        c->epoch = gpuarr__g.epoch;
        c->allocator = gpuarr__g.allocator;
        t->ndim = a->ndim;
        t->dtype = gpuarr__dlpack_dtype(a->dtype);
        int64_t stride = 1; /* compact row-major; an empty array's extents need not multiply within
                               int64 (only its count must), so its strides saturate: nothing is
                               addressed through them */
        for (int i = a->ndim - 1; i >= 0; i--) {
            c->shape[i] = a->shape[i];
            c->strides[i] = stride;
            int64_t e = a->shape[i] > 0 ? a->shape[i] : 1;
            stride = stride > INT64_MAX / e ? INT64_MAX : stride * e;
        }
        t->shape = c->shape;
        t->strides = c->strides;
        c->versioned.version.major = DLPACK_MAJOR_VERSION;
        c->versioned.version.minor = DLPACK_MINOR_VERSION;
        c->versioned.manager_ctx = c;
        c->versioned.deleter = gpuarr__dlpack_deleter;
        c->versioned.flags = ((flags & GPUARR_DLPACK_READ_ONLY) || a->read_only) ? (uint64_t)DLPACK_FLAG_BITMASK_READ_ONLY : 0u;
        *out = c;
    } else {
        gpuarr__free(c);
    }
    gpuarr__obj_release(&a->obj);
    return r;
}

GPUARR_API gpuarr_result gpuarr_to_dlpack(gpuarr_array a, uint64_t flags, DLManagedTensorVersioned **out) {
    GPUARR__BEGIN();
    GPUARR__REQUIRE_PTR(out);
    gpuarr__dlpack_ctx *c;
    gpuarr_stream none = {0};
    GPUARR__CHECK(gpuarr__dlpack_export(a, false, none, flags, false, &c));
    *out = &c->versioned;
    return GPUARR_OK;
}

GPUARR_API gpuarr_result gpuarr_to_dlpack_async(gpuarr_array a, gpuarr_stream consumer, uint64_t flags,
                                                DLManagedTensorVersioned **out) {
    GPUARR__BEGIN();
    GPUARR__REQUIRE_PTR(out);
    gpuarr__dlpack_ctx *c;
    GPUARR__CHECK(gpuarr__dlpack_export(a, true, consumer, flags, false, &c));
    *out = &c->versioned;
    return GPUARR_OK;
}

GPUARR_API gpuarr_result gpuarr_to_dlpack_legacy(gpuarr_array a, DLManagedTensor **out) {
    GPUARR__BEGIN();
    GPUARR__REQUIRE_PTR(out);
    gpuarr__dlpack_ctx *c;
    gpuarr_stream none = {0};
    GPUARR__CHECK(gpuarr__dlpack_export(a, false, none, 0, true, &c));
    c->legacy.dl_tensor = c->versioned.dl_tensor;
    c->legacy.manager_ctx = c;
    c->legacy.deleter = gpuarr__dlpack_deleter_legacy;
    memset(&c->versioned, 0, sizeof c->versioned);
    *out = &c->legacy;
    return GPUARR_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Import. `owner(ctx)` calls the producer's deleter: on every error before returning, else once
 * the array record goes (gpuarr__array.owner_release).
 * ------------------------------------------------------------------------------------------- */
static void gpuarr__dlpack_owner(void *ctx) {
    DLManagedTensorVersioned *t = (DLManagedTensorVersioned *)ctx;
    if (t->deleter) t->deleter(t);
}

static void gpuarr__dlpack_owner_legacy(void *ctx) {
    DLManagedTensor *t = (DLManagedTensor *)ctx;
    if (t->deleter) t->deleter(t);
}

/* The gpuarr device of a DLPack one. */
static gpuarr_result gpuarr__dlpack_device(DLDevice d, gpuarr__dev **out) {
    gpuarr_backend b;
    switch ((int)d.device_type) {
    case kDLCPU: case kDLCUDAHost: *out = gpuarr__host_dev(); return GPUARR_OK; /* pinned memory is host memory */
    case kDLCUDA: b = GPUARR_BACKEND_CUDA; break;
    case kDLOpenCL: b = GPUARR_BACKEND_OPENCL; break;
    default:
        return gpuarr__fail(GPUARR_ERROR_NO_DEVICE, "t's device_type %d has no gpuarr backend (kDLCPU, kDLCUDAHost, kDLCUDA "
                                                    "and kDLOpenCL have)", (int)d.device_type);
    }
    for (int i = 0; i < gpuarr__devices_total(); i++) { /* adopted devices too: their index follows the others' */
        gpuarr__dev *dev = &gpuarr__g.devices[i];
        if (dev->backend->id == b && dev->info.index == d.device_id && !__atomic_load_n(&dev->removed, __ATOMIC_ACQUIRE)) {
            *out = dev;
            return GPUARR_OK;
        }
    }
    return gpuarr__fail(GPUARR_ERROR_NO_DEVICE, "t is on %s:%d, which gpuarr does not have", gpuarr__backend_names[b], (int)d.device_id);
}

/* The checks of the tensor itself; on success *dev, *dtype and *count. */
static gpuarr_result gpuarr__dlpack_check(const DLTensor *t, gpuarr__dev **dev, gpuarr_dtype *dtype, int64_t *count) {
    if (t->ndim < 0 || t->ndim > GPUARR_MAX_DIMS)
        return gpuarr__fail(GPUARR_ERROR_UNSUPPORTED, "t has ndim = %d: gpuarr arrays have 0 to %d", (int)t->ndim, GPUARR_MAX_DIMS);
    if (t->ndim > 0 && !t->shape) return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "t has ndim = %d and a NULL shape", (int)t->ndim);
    if (t->dtype.lanes != 1)
        return gpuarr__fail(GPUARR_ERROR_UNSUPPORTED, "t's dtype has %u lanes: gpuarr has no vector dtypes (lanes must be 1)",
                            (unsigned)t->dtype.lanes);
    *dtype = gpuarr__dlpack_dtype_back(t->dtype);
    if (!*dtype)
        return gpuarr__fail(GPUARR_ERROR_UNSUPPORTED, "t's dtype (code %u, %u bits) has no gpuarr dtype", (unsigned)t->dtype.code,
                            (unsigned)t->dtype.bits);
    size_t nbytes;
    GPUARR__CHECK(gpuarr__check_shape(*dtype, (int)t->ndim, t->ndim > 0 ? t->shape : NULL, count, &nbytes));
    int64_t expect = 1;
    for (int i = t->ndim - 1; i >= 0 && t->strides && *count > 0; i--) { /* size-1 dimensions may have any stride */
        if (t->shape[i] != 1 && t->strides[i] != expect)
            return gpuarr__fail(GPUARR_ERROR_UNSUPPORTED, "t's strides are not compact row-major: dimension %d has stride %lld, "
                                                          "expected %lld (gpuarr arrays are contiguous; copy it first)",
                                i, (long long)t->strides[i], (long long)expect);
        expect *= t->shape[i]; /* no overflow: the product of all of them fits */
    }
    if (t->byte_offset % gpuarr__dtype_sizes[*dtype] != 0)
        return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "t's byte_offset %llu is not a multiple of the %s size (%zu)",
                            (unsigned long long)t->byte_offset, gpuarr__dtype_names[*dtype], gpuarr__dtype_sizes[*dtype]);
    return gpuarr__dlpack_device(t->device, dev);
}

/* Wraps t's memory; calls owner(ctx) itself when it fails. */
static gpuarr_result gpuarr__dlpack_import(const DLTensor *t, bool read_only, void (*owner)(void *), void *ctx, gpuarr_array *out) {
    gpuarr__dev *dev = NULL;
    gpuarr_dtype dtype = (gpuarr_dtype)0;
    gpuarr_array h = {0};
    int64_t count = 0;
    gpuarr_result r = gpuarr__dlpack_check(t, &dev, &dtype, &count);
    const int64_t *shape = t->ndim > 0 ? t->shape : NULL;
    gpuarr__array *a = NULL;
    if (r == GPUARR_OK && count > 0 && !t->data)
        r = gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "t's data is NULL but its shape holds %lld elements", (long long)count);
    if (r == GPUARR_OK && (count == 0 || dev->backend->id == GPUARR_BACKEND_HOST)) {
        r = gpuarr__array_alloc_struct(count == 0 ? dev : gpuarr__host_dev(), dtype, (int)t->ndim, shape, &a);
        if (r == GPUARR_OK && count > 0) {
            a->mem = (unsigned char *)t->data + t->byte_offset;
            if ((uintptr_t)a->mem % gpuarr__dtype_sizes[dtype] != 0)
                r = gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "t's data + byte_offset (%p) is not aligned to %zu bytes", a->mem,
                                 gpuarr__dtype_sizes[dtype]);
        }
        if (r == GPUARR_OK) {
            a->wrapped = count > 0;
            r = gpuarr__table_insert(&gpuarr__g.arrays, &a->obj, &h.id);
        }
        if (r != GPUARR_OK && a) gpuarr__free(a);
        a = NULL;
    } else if (r == GPUARR_OK && dev->backend->id == GPUARR_BACKEND_CUDA) {
        r = GPUARR__DLPACK_INTEROP(CUDA)->cuda_wrap_ptr(dev->info.device, (unsigned char *)t->data + t->byte_offset, dtype, (int)t->ndim,
                                                        shape, NULL, NULL, &h);
    } else if (r == GPUARR_OK) {
        r = GPUARR__DLPACK_INTEROP(OPENCL)->opencl_wrap_mem_raw(dev->info.device, t->data, (size_t)t->byte_offset, dtype, (int)t->ndim,
                                                                shape, &h);
    }
    if (r == GPUARR_OK) r = gpuarr__get_array(h, "out", &a);
    if (r != GPUARR_OK) {
        if (h.id) { /* cannot happen (the id is new and unknown to others), but never leak it */
            gpuarr__obj *dropped;
            if (gpuarr__table_release(&gpuarr__g.arrays, h.id, "out", &dropped) == GPUARR_OK) gpuarr__obj_release(dropped);
        }
        if (owner) owner(ctx);
        return r;
    }
    a->read_only = read_only; /* safe: nobody else knows the new id yet */
    a->owner_release = owner;
    a->owner_ctx = ctx;
    gpuarr__obj_release(&a->obj);
    *out = h;
    return GPUARR_OK;
}

/* The checks both imports make before reading the tensor; the caller then gives t back on failure. */
static gpuarr_result gpuarr__dlpack_import_begin(gpuarr_array *out) {
    if (!gpuarr__initialized()) return gpuarr__fail(GPUARR_ERROR_NOT_INITIALIZED, "gpuarr is not initialized (call gpuarr_init first)");
    if (!out) return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "out is NULL");
    return GPUARR_OK;
}

GPUARR_API gpuarr_result gpuarr_from_dlpack(DLManagedTensorVersioned *t, gpuarr_array *out) {
    gpuarr__tls.api = __func__;
    if (!t) return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "t is NULL");
    gpuarr_result r = gpuarr__dlpack_import_begin(out);
    if (r == GPUARR_OK && t->version.major != DLPACK_MAJOR_VERSION) /* other fields may lie elsewhere: only the deleter is read */
        r = gpuarr__fail(GPUARR_ERROR_UNSUPPORTED, "t is DLPack %u.%u: gpuarr reads major version %d", (unsigned)t->version.major,
                         (unsigned)t->version.minor, DLPACK_MAJOR_VERSION);
    if (r != GPUARR_OK) {
        gpuarr__dlpack_owner(t);
        return r;
    }
    return gpuarr__dlpack_import(&t->dl_tensor, (t->flags & DLPACK_FLAG_BITMASK_READ_ONLY) != 0, gpuarr__dlpack_owner, t, out);
}

GPUARR_API gpuarr_result gpuarr_from_dlpack_legacy(DLManagedTensor *t, gpuarr_array *out) {
    gpuarr__tls.api = __func__;
    if (!t) return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "t is NULL");
    gpuarr_result r = gpuarr__dlpack_import_begin(out);
    if (r != GPUARR_OK) {
        gpuarr__dlpack_owner_legacy(t);
        return r;
    }
    return gpuarr__dlpack_import(&t->dl_tensor, false, gpuarr__dlpack_owner_legacy, t, out);
}

/* ---------------------------------------------------------------------------------------------
 * Python capsules (DLPack's Python protocol) for ctypes users: no extension module, no Python
 * headers. A destructor written in Python cannot run safely while its capsule is being freed,
 * so this one is C; it finds CPython's capsule functions in the running process.
 * ------------------------------------------------------------------------------------------- */
static const char *const gpuarr__dlpack_capsule_names[2][2] = {
    {"dltensor", "used_dltensor"}, {"dltensor_versioned", "used_dltensor_versioned"}};

GPUARR_API const char *gpuarr_dlpack_capsule_name(bool versioned, bool used) {
    return gpuarr__dlpack_capsule_names[versioned ? 1 : 0][used ? 1 : 0];
}

typedef int (*gpuarr__py_capsule_is_valid_fn)(void *capsule, const char *name);
typedef void *(*gpuarr__py_capsule_get_pointer_fn)(void *capsule, const char *name);

/* dlsym in the program and what it loaded globally (CPython's symbols, in a Python process). */
static void gpuarr__dlpack_python_symbol(const char *name, void *fn, size_t fn_size) {
    void *program = dlopen(NULL, RTLD_NOW);
    void *sym = program ? dlsym(program, name) : NULL;
    memcpy(fn, &sym, fn_size); /* object pointer to function pointer, portably (see the CUDA loader) */
    if (program) dlclose(program);
}

GPUARR_API void gpuarr_dlpack_capsule_destructor(void *capsule) {
    gpuarr__py_capsule_is_valid_fn is_valid = NULL;
    gpuarr__py_capsule_get_pointer_fn get_pointer = NULL;
    if (!capsule) return;
    gpuarr__dlpack_python_symbol("PyCapsule_IsValid", &is_valid, sizeof is_valid);
    gpuarr__dlpack_python_symbol("PyCapsule_GetPointer", &get_pointer, sizeof get_pointer);
    if (!is_valid || !get_pointer) return; /* not a Python process: nothing can be a capsule */
    /* a consumer renames what it took ("used_..."): then the deleter is the consumer's to call */
    if (is_valid(capsule, gpuarr__dlpack_capsule_names[1][0])) {
        DLManagedTensorVersioned *t = (DLManagedTensorVersioned *)get_pointer(capsule, gpuarr__dlpack_capsule_names[1][0]);
        if (t && t->deleter) t->deleter(t);
    } else if (is_valid(capsule, gpuarr__dlpack_capsule_names[0][0])) {
        DLManagedTensor *t = (DLManagedTensor *)get_pointer(capsule, gpuarr__dlpack_capsule_names[0][0]);
        if (t && t->deleter) t->deleter(t);
    }
}

#undef GPUARR__DLPACK_INTEROP
static void gpuarr__dlpack_layer(gpuarr__layer *l) {
    l->name = "dlpack"; /* nothing to start or stop: every call stands alone */
}

#endif /* GPUARR_DLPACK_INCLUDED */
