/*
 * gpuarr_host.h -- the host backend: always compiled in, always one device ("host").
 *
 * Included by gpuarr.h's implementation only. Device memory is 64-byte aligned host memory from
 * the library's allocator; memory handles are plain pointers. Work is done on the calling thread
 * (split across its worker pool when large) before an enqueue returns, so streams are
 * always idle and events complete when recorded: the API, ordering and errors are the real ones.
 */
#ifndef GPUARR_HOST_BACKEND_INCLUDED
#define GPUARR_HOST_BACKEND_INCLUDED

#define GPUARR__HOST_ALIGN 64

/* ---- the cast kernels: the conversion rules (kernels/gpuarr_kernels.h, compiled by the core as C)
   in fixed-size blocks, once per instruction set ---- */
/* Fixed-size inner blocks: gcc's -O2 vectorizer only takes loops whose trip count it knows. */
#define GPUARR__CAST_BLOCK 64

/* The table is built once per instruction set: a portable one, and on x86-64 one for AVX2 (8
   lanes, 16-bit packs), picked at gpuarr_init from the CPU (GPUARR_HOST_ISA overrides). The same
   macros make both, so both follow the same rules bit for bit. No FMA: contracting a*b+c would
   change roundings. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define GPUARR__HAVE_AVX2_CASTS 1
#endif
#define GPUARR__CAST_ATTR_gpuarr__isa_base
#define GPUARR__CAST_ATTR_gpuarr__isa_avx2 __attribute__((target("avx2")))

/* gcc -O2's cost model ("very cheap") vectorizes only what needs no run-time alias check: the
   restrict parameters (gcc ignores restrict on the local pointers) spare it that, so the inner
   blocks vectorize with the user's flags, no `#pragma GCC optimize`. The tails stay scalar. */
#define GPUARR__CAST_FN(V, S, sstore, skind, scat, D, dstore, dkind, dlo, dhi)                 \
    static GPUARR__CAST_ATTR_##V void gpuarr__cast_##V##_##S##_##D(const void *GPUARR__RESTRICT src, \
                                                                 void *GPUARR__RESTRICT dst, size_t n) { \
        const sstore *s = (const sstore *)src;                                                 \
        dstore *d = (dstore *)dst;                                                             \
        size_t i = 0;                                                                          \
        for (; i + GPUARR__CAST_BLOCK <= n; i += GPUARR__CAST_BLOCK)                           \
            for (size_t j = 0; j < GPUARR__CAST_BLOCK; j++)                                    \
                d[i + j] = GPUARR_K_CONVERT_ONE(skind, scat, dkind, dstore, dlo, dhi, s[i + j]); \
        for (; i < n; i++) d[i] = GPUARR_K_CONVERT_ONE(skind, scat, dkind, dstore, dlo, dhi, s[i]); \
    }

/* The 13 x 13 casts: GPUARR__CAST_SOURCES(M, V) calls M(src, <destination row>) for every pair,
   src being (V, S, sstore, skind, scat). The destinations are GPUARR__DTYPE_TABLE; the sources
   walk the same named rows, listed again here because GPUARR__DTYPE_TABLE cannot expand inside
   itself (the count is checked below). */
#define GPUARR__CAST_SOURCES(M, V)                                                             \
    GPUARR__CAST_FROM(M, V, GPUARR__DT_BOOL) GPUARR__CAST_FROM(M, V, GPUARR__DT_I8)            \
    GPUARR__CAST_FROM(M, V, GPUARR__DT_U8) GPUARR__CAST_FROM(M, V, GPUARR__DT_I16)             \
    GPUARR__CAST_FROM(M, V, GPUARR__DT_U16) GPUARR__CAST_FROM(M, V, GPUARR__DT_I32)            \
    GPUARR__CAST_FROM(M, V, GPUARR__DT_U32) GPUARR__CAST_FROM(M, V, GPUARR__DT_I64)            \
    GPUARR__CAST_FROM(M, V, GPUARR__DT_U64) GPUARR__CAST_FROM(M, V, GPUARR__DT_F16)            \
    GPUARR__CAST_FROM(M, V, GPUARR__DT_BF16) GPUARR__CAST_FROM(M, V, GPUARR__DT_F32)           \
    GPUARR__CAST_FROM(M, V, GPUARR__DT_F64)
#define GPUARR__CAST_FROM(M, V, row) GPUARR__CAST_FROM_I(M, V, row)
#define GPUARR__CAST_FROM_I(M, V, S, sstr, sstore, ssize, skind, scat, slo, shi)                \
    GPUARR__DTYPE_TABLE(M, (V, S, sstore, skind, scat))
/* the two M: define a pair's function; fill its entry of table t */
#define GPUARR__CAST_DEFINE(src, D, dstr, dstore, dsize, dkind, dcat, dlo, dhi)                \
    GPUARR__CAST_DEFINE_I(GPUARR__UNPACK src, D, dstore, dkind, dlo, dhi)
#define GPUARR__CAST_DEFINE_I(...) GPUARR__CAST_FN(__VA_ARGS__)
#define GPUARR__CAST_SET(src, D, ...) GPUARR__CAST_SET_I(GPUARR__UNPACK src, D)
#define GPUARR__CAST_SET_I(...) GPUARR__CAST_SET_II(__VA_ARGS__)
#define GPUARR__CAST_SET_II(V, S, sstore, skind, scat, D) t[S][D] = gpuarr__cast_##V##_##S##_##D;

GPUARR__STATIC_ASSERT(0 GPUARR__CAST_SOURCES(GPUARR__COUNT_ONE, ~) == (GPUARR_DTYPE_COUNT - 1) * (GPUARR_DTYPE_COUNT - 1),
                      "GPUARR__CAST_SOURCES must name every row of GPUARR__DTYPE_TABLE");

/* gpuarr__host_casts_<isa>(t) fills t[src][dst] (row and column 0, the invalid dtype, are left
   alone), by dtype value: the order of the lists cannot put a kernel in the wrong cell. */
GPUARR__CAST_SOURCES(GPUARR__CAST_DEFINE, gpuarr__isa_base)
static void gpuarr__host_casts_base(gpuarr__cast_fn t[GPUARR_DTYPE_COUNT][GPUARR_DTYPE_COUNT]) {
    GPUARR__CAST_SOURCES(GPUARR__CAST_SET, gpuarr__isa_base)
}
#ifdef GPUARR__HAVE_AVX2_CASTS
GPUARR__CAST_SOURCES(GPUARR__CAST_DEFINE, gpuarr__isa_avx2)
static void gpuarr__host_casts_avx2(gpuarr__cast_fn t[GPUARR_DTYPE_COUNT][GPUARR_DTYPE_COUNT]) {
    GPUARR__CAST_SOURCES(GPUARR__CAST_SET, gpuarr__isa_avx2)
}
#endif

/* f32 -> f16 is the one cast the AVX2 kernels leave compute-bound; F16C does it in one
   instruction per 8 lanes, with the same rounding and NaN rule (checked on all 2^32 inputs). */
#if defined(GPUARR__HAVE_AVX2_CASTS) && !defined(__CUDACC__)
#include <cpuid.h>
#include <immintrin.h>
#define GPUARR__HAVE_F16C_CAST 1
static __attribute__((target("avx2,f16c"))) void gpuarr__cast_f32_f16_f16c(const void *src, void *dst, size_t n) {
    const float *s = (const float *)src;
    uint16_t *d = (uint16_t *)dst;
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(void *)(d + i), _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) d[i] = gpuarr_k_f32_to_f16(s[i]);
}
static bool gpuarr__cpu_has_f16c(void) {
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}
#endif

static bool gpuarr__cpu_has_avx2(void) {
#ifdef GPUARR__HAVE_AVX2_CASTS
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2");
#else
    return false;
#endif
}

/* ---- the worker pool (its state, gpuarr__g.workers, is typed with the core's internal types) ---- */
static void gpuarr__job_run_chunk(gpuarr__workers *w, gpuarr__job *job, size_t begin) {
    size_t end = GPUARR__MIN(begin + job->chunk, job->count);
    job->fn(job->ctx, begin, end);
    pthread_mutex_lock(&w->lock);
    job->done += end - begin;
    if (job->done == job->count) pthread_cond_broadcast(&w->finished);
    pthread_mutex_unlock(&w->lock);
}

/* Under the lock: hands out the next chunk of the oldest job, unqueueing a job whose last chunk
   is taken. Returns false when nothing is queued. */
static bool gpuarr__job_take(gpuarr__workers *w, gpuarr__job **job, size_t *begin) {
    gpuarr__job *j = w->queue;
    if (!j) return false;
    *job = j;
    *begin = j->next;
    j->next += j->chunk;
    if (j->next >= j->count) w->queue = j->next_job;
    return true;
}

static void *gpuarr__worker_main(void *arg) {
    gpuarr__workers *w = (gpuarr__workers *)arg;
    pthread_mutex_lock(&w->lock);
    for (;;) {
        gpuarr__job *job;
        size_t begin;
        while (!w->stop && !gpuarr__job_take(w, &job, &begin)) pthread_cond_wait(&w->wake, &w->lock);
        if (w->stop) break;
        pthread_mutex_unlock(&w->lock);
        gpuarr__job_run_chunk(w, job, begin);
        pthread_mutex_lock(&w->lock);
    }
    pthread_mutex_unlock(&w->lock);
    return NULL;
}

/* Threads start at the first large job; if they cannot start, work runs on the caller. */
static void gpuarr__workers_start(gpuarr__workers *w) {
    w->tried = true;
    int n = w->wanted - 1;
    if (n <= 0) return;
    w->threads = (pthread_t *)gpuarr__malloc(sizeof(pthread_t) * (size_t)n);
    if (!w->threads) return;
    for (int i = 0; i < n; i++) {
        if (pthread_create(&w->threads[i], NULL, gpuarr__worker_main, w) != 0) break;
        w->started++;
    }
}

static void gpuarr__workers_init(gpuarr__workers *w, int threads) {
    memset(w, 0, sizeof *w);
    pthread_mutex_init(&w->lock, NULL);
    pthread_cond_init(&w->wake, NULL);
    pthread_cond_init(&w->finished, NULL);
    w->wanted = threads;
}

static void gpuarr__workers_stop(gpuarr__workers *w) {
    pthread_mutex_lock(&w->lock);
    w->stop = true;
    pthread_cond_broadcast(&w->wake);
    pthread_mutex_unlock(&w->lock);
    for (int i = 0; i < w->started; i++) pthread_join(w->threads[i], NULL);
    gpuarr__free(w->threads);
    pthread_cond_destroy(&w->finished);
    pthread_cond_destroy(&w->wake);
    pthread_mutex_destroy(&w->lock);
}

/* Runs fn over [0, count) in chunks of `chunk` items, on the workers and the calling thread. */
static void gpuarr__parallel_for(size_t count, size_t chunk, gpuarr__chunk_fn fn, void *ctx) {
    gpuarr__workers *w = &gpuarr__g.workers;
    if (count <= chunk || w->wanted <= 1) {
        fn(ctx, 0, count);
        return;
    }
    gpuarr__job job;
    memset(&job, 0, sizeof job);
    job.fn = fn;
    job.ctx = ctx;
    job.count = count;
    job.chunk = chunk;
    pthread_mutex_lock(&w->lock);
    bool first = !w->tried;
    if (first) gpuarr__workers_start(w);
    if (first && w->started < w->wanted - 1) {
        int started = w->started;
        pthread_mutex_unlock(&w->lock); /* log outside the lock: a logger may take its time */
        gpuarr__log(GPUARR_LOG_WARN, "started %d of %d host worker threads", started, w->wanted - 1);
        pthread_mutex_lock(&w->lock);
    }
    if (w->started == 0) {
        pthread_mutex_unlock(&w->lock);
        fn(ctx, 0, count);
        return;
    }
    gpuarr__job **tail = &w->queue;
    while (*tail) tail = &(*tail)->next_job;
    *tail = &job;
    pthread_cond_broadcast(&w->wake);
    /* Work on our own job until its chunks are handed out, then wait for the stragglers. */
    while (job.next < job.count) {
        size_t begin = job.next;
        job.next += job.chunk;
        if (job.next >= job.count) {
            gpuarr__job **p = &w->queue;
            while (*p != &job) p = &(*p)->next_job;
            *p = job.next_job;
        }
        pthread_mutex_unlock(&w->lock);
        gpuarr__job_run_chunk(w, &job, begin);
        pthread_mutex_lock(&w->lock);
    }
    while (job.done < job.count) pthread_cond_wait(&w->finished, &w->lock);
    pthread_mutex_unlock(&w->lock);
}

/* Items per chunk for a pass over `bytes_per_item`: ~1 MiB of the wider side, a multiple of
   the cast block, and at least 4 chunks per thread when the array is large enough. */
static size_t gpuarr__chunk_items(size_t count, size_t bytes_per_item) {
    size_t per = GPUARR__MAX((size_t)1, bytes_per_item);
    size_t items = ((size_t)1 << 20) / per;
    size_t threads = (size_t)GPUARR__MAX(1, gpuarr__g.workers.wanted);
    size_t balanced = count / (threads * 4);
    if (balanced < items) items = GPUARR__MAX(balanced, ((size_t)256 << 10) / per);
    items = (items + GPUARR__CAST_BLOCK - 1) / GPUARR__CAST_BLOCK * GPUARR__CAST_BLOCK;
    return GPUARR__MAX(items, (size_t)GPUARR__CAST_BLOCK);
}

typedef struct gpuarr__cast_job {
    gpuarr__cast_fn fn;
    const unsigned char *src;
    unsigned char *dst;
    size_t src_size, dst_size;
    bool streaming; /* a copy too large for the cache: write around it */
} gpuarr__cast_job;

/* Copies that do not fit in the cache write with non-temporal stores: the destination lines are
   not read first, which is a third of the memory traffic of a plain copy. */
#define GPUARR__STREAMING_COPY_MIN ((size_t)32 << 20)
#if defined(GPUARR__HAVE_F16C_CAST)
#define GPUARR__HAVE_STREAMING_COPY 1
static __attribute__((target("avx2"))) void gpuarr__streaming_copy(unsigned char *dst, const unsigned char *src, size_t n) {
    size_t head = (32u - ((uintptr_t)dst & 31u)) & 31u;
    if (head > n) head = n;
    memcpy(dst, src, head);
    size_t i = head;
    for (; i + 128 <= n; i += 128) {
        __m256i a = _mm256_loadu_si256((const __m256i *)(const void *)(src + i));
        __m256i b = _mm256_loadu_si256((const __m256i *)(const void *)(src + i + 32));
        __m256i c = _mm256_loadu_si256((const __m256i *)(const void *)(src + i + 64));
        __m256i e = _mm256_loadu_si256((const __m256i *)(const void *)(src + i + 96));
        _mm256_stream_si256((__m256i *)(void *)(dst + i), a);
        _mm256_stream_si256((__m256i *)(void *)(dst + i + 32), b);
        _mm256_stream_si256((__m256i *)(void *)(dst + i + 64), c);
        _mm256_stream_si256((__m256i *)(void *)(dst + i + 96), e);
    }
    _mm_sfence(); /* the streamed stores are visible before the chunk is reported done */
    memcpy(dst + i, src + i, n - i);
}
#endif

/* ---- casts, copies and fills between host pointers, split across the workers ---- */
static void gpuarr__cast_chunk(void *ctx, size_t begin, size_t end) {
    gpuarr__cast_job *j = (gpuarr__cast_job *)ctx;
    uint64_t fp = gpuarr__fp_default_enter();
    if (j->fn)
        j->fn(j->src + begin * j->src_size, j->dst + begin * j->dst_size, end - begin);
#ifdef GPUARR__HAVE_STREAMING_COPY
    else if (j->streaming)
        gpuarr__streaming_copy(j->dst + begin * j->dst_size, j->src + begin * j->src_size, (end - begin) * j->dst_size);
#endif
    else
        memcpy(j->dst + begin * j->dst_size, j->src + begin * j->src_size, (end - begin) * j->dst_size);
    gpuarr__fp_leave(fp);
}

/* Host cast (or copy when the dtypes match) of n elements, split across the workers when the
   array is large enough to pay for the hand-off. */
static void gpuarr__host_cpu_cast(void *dst, gpuarr_dtype dt, const void *src, gpuarr_dtype st, size_t n) {
    gpuarr__cast_job job;
    job.fn = st == dt ? NULL : gpuarr__g.host_casts[st][dt];
    job.src = (const unsigned char *)src;
    job.dst = (unsigned char *)dst;
    job.src_size = gpuarr__dtype_sizes[st];
    job.dst_size = gpuarr__dtype_sizes[dt];
    job.streaming = !job.fn && n * job.dst_size >= GPUARR__STREAMING_COPY_MIN && gpuarr__g.streaming_copies;
    size_t wide = GPUARR__MAX(job.src_size, job.dst_size);
    gpuarr__parallel_for(n, gpuarr__chunk_items(n, wide), gpuarr__cast_chunk, &job);
}

static void gpuarr__host_cpu_copy(void *dst, const void *src, size_t bytes) {
    gpuarr__host_cpu_cast(dst, GPUARR_U8, src, GPUARR_U8, bytes);
}

/* A fill with a 1, 2, 4 or 8-byte pattern, split across the workers like a copy: one byte (or a
   pattern of equal bytes) is a memset; a wider one is stored from a 64-byte block of the pattern
   held in a local, which the compiler turns into vector stores. A fill too large for the cache
   writes around it with non-temporal stores, like a copy (GPUARR__STREAMING_COPY_MIN). */
typedef struct gpuarr__fill_job {
    unsigned char *dst;
    size_t pattern_size;
    bool streaming;
    unsigned char block[64]; /* the pattern repeated */
} gpuarr__fill_job;

#ifdef GPUARR__HAVE_STREAMING_COPY
/* n bytes at p, the pattern's phase 0 at p; block + k for k < 8 is the pattern from its byte k. */
static __attribute__((target("avx2"))) void gpuarr__streaming_fill(unsigned char *p, const unsigned char *block, size_t pattern_size,
                                                                   size_t n) {
    size_t head = (32u - ((uintptr_t)p & 31u)) & 31u, i = head;
    if (head > n) head = i = n;
    memcpy(p, block, head);
    __m256i v = _mm256_loadu_si256((const __m256i *)(const void *)(block + head % pattern_size));
    for (; i + 128 <= n; i += 128) {
        _mm256_stream_si256((__m256i *)(void *)(p + i), v);
        _mm256_stream_si256((__m256i *)(void *)(p + i + 32), v);
        _mm256_stream_si256((__m256i *)(void *)(p + i + 64), v);
        _mm256_stream_si256((__m256i *)(void *)(p + i + 96), v);
    }
    _mm_sfence(); /* the streamed stores are visible before the chunk is reported done */
    for (size_t m; i < n; i += m) {
        m = GPUARR__MIN((size_t)32, n - i);
        memcpy(p + i, block + i % pattern_size, m);
    }
}
#endif

static void gpuarr__fill_chunk(void *ctx, size_t begin, size_t end) {
    const gpuarr__fill_job *j = (const gpuarr__fill_job *)ctx;
    unsigned char *p = j->dst + begin * j->pattern_size;
    size_t n = (end - begin) * j->pattern_size, i = 0;
#ifdef GPUARR__HAVE_STREAMING_COPY
    if (j->streaming) {
        gpuarr__streaming_fill(p, j->block, j->pattern_size, n);
        return;
    }
#endif
    if (j->pattern_size == 1) {
        memset(p, j->block[0], n);
        return;
    }
    unsigned char block[64];
    memcpy(block, j->block, sizeof block);
    for (; i + sizeof block <= n; i += sizeof block) memcpy(p + i, block, sizeof block);
    memcpy(p + i, block, n - i);
}

static void gpuarr__host_cpu_fill(void *dst, const void *pattern, size_t pattern_size, size_t bytes) {
    gpuarr__fill_job job;
    const unsigned char *pat = (const unsigned char *)pattern;
    job.dst = (unsigned char *)dst;
    job.pattern_size = 1;
    for (size_t i = 1; i < pattern_size; i++)
        if (pat[i] != pat[0]) job.pattern_size = pattern_size;
    for (size_t i = 0; i < sizeof job.block; i += job.pattern_size) memcpy(job.block + i, pat, job.pattern_size);
    job.streaming = bytes >= GPUARR__STREAMING_COPY_MIN && gpuarr__g.streaming_copies;
    size_t n = bytes / job.pattern_size;
    gpuarr__parallel_for(n, gpuarr__chunk_items(n, job.pattern_size), gpuarr__fill_chunk, &job);
}

/* ---- picking the kernels for this CPU ---- */
/* GPUARR_HOST_ISA: auto (default), baseline, avx2. */
static gpuarr_result gpuarr__select_host_isa(int want) {
    bool avx2 = gpuarr__cpu_has_avx2();
    if (want == GPUARR__ISA_AVX2 && !avx2)
        return gpuarr__fail(GPUARR_ERROR_UNSUPPORTED, "GPUARR_HOST_ISA=avx2, but this CPU or build lacks AVX2");
    if (want == GPUARR__ISA_BASELINE) avx2 = false;
    void (*fill)(gpuarr__cast_fn t[GPUARR_DTYPE_COUNT][GPUARR_DTYPE_COUNT]) = gpuarr__host_casts_base;
    gpuarr__g.host_isa = "baseline";
#ifdef GPUARR__HAVE_AVX2_CASTS
    if (avx2) {
        fill = gpuarr__host_casts_avx2;
        gpuarr__g.host_isa = "avx2";
    }
#endif
    memset(gpuarr__g.host_casts, 0, sizeof gpuarr__g.host_casts);
    fill(gpuarr__g.host_casts);
#ifdef GPUARR__HAVE_F16C_CAST
    if (avx2 && gpuarr__cpu_has_f16c()) {
        gpuarr__g.host_casts[GPUARR_F32][GPUARR_F16] = gpuarr__cast_f32_f16_f16c;
        gpuarr__g.host_isa = "avx2+f16c";
    }
    gpuarr__g.streaming_copies = avx2;
#endif
    return GPUARR_OK;
}

typedef struct gpuarr__host_event {
    double recorded_ms; /* monotonic time of the last record; < 0 = never */
} gpuarr__host_event;

/* The worker pool starts here, its threads at the first large job; the cast kernels for this CPU
   are picked (GPUARR_HOST_ISA). The core and the device backends reach the CPU work through
   gpuarr__g.cpu, filled here. */
static gpuarr_result gpuarr__host_load(void) {
    GPUARR__CHECK(gpuarr__select_host_isa(gpuarr__setting_value(GPUARR__SET_HOST_ISA, GPUARR__ISA_AUTO)));
    gpuarr__workers_init(&gpuarr__g.workers, gpuarr__g.host_threads);
    gpuarr__g.cpu.cast = gpuarr__host_cpu_cast;
    gpuarr__g.cpu.copy = gpuarr__host_cpu_copy;
    gpuarr__g.cpu.fill = gpuarr__host_cpu_fill;
    return GPUARR_OK;
}
static void gpuarr__host_unload(void) {
    if (gpuarr__g.workers.wanted) gpuarr__workers_stop(&gpuarr__g.workers);
}
static int gpuarr__host_device_count(void) { return 1; }

/* The value after "key<spaces>:" on the first line of a /proc-style file that starts with key. */
static bool gpuarr__host_read_field(const char *path, const char *key, char *out, size_t cap) {
    FILE *f = fopen(path, "r");
    if (!f) return false;
    char line[512];
    bool found = false;
    size_t klen = strlen(key);
    while (!found && fgets(line, sizeof line, f)) {
        if (strncmp(line, key, klen) != 0) continue;
        char *colon = strchr(line + klen, ':');
        if (!colon) continue;
        char *value = colon + 1;
        while (*value == ' ' || *value == '\t') value++;
        value[strcspn(value, "\n")] = '\0';
        gpuarr__copy_string(out, cap, value);
        found = true;
    }
    fclose(f);
    return found;
}

static uint64_t gpuarr__host_meminfo_bytes(const char *key) {
    char value[64];
    if (!gpuarr__host_read_field("/proc/meminfo", key, value, sizeof value)) return 0;
    return (uint64_t)strtoull(value, NULL, 10) * 1024u; /* reported in kB */
}

static gpuarr_result gpuarr__host_mem_info(gpuarr__dev *d, uint64_t *free_bytes, uint64_t *total_bytes) {
    GPUARR__UNUSED(d);
    uint64_t total = gpuarr__host_meminfo_bytes("MemTotal");
    if (!total) {
        long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
        total = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
    }
    uint64_t avail = gpuarr__host_meminfo_bytes("MemAvailable");
    *total_bytes = total;
    *free_bytes = avail ? avail : total;
    return GPUARR_OK;
}

static gpuarr_result gpuarr__host_device_info(int index, gpuarr_device_info *info) {
    GPUARR__UNUSED(index);
    info->type = GPUARR_DEVICE_TYPE_CPU;
    info->host_unified = true;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    info->compute_units = cpus > 0 ? (int)cpus : 1;
    if (!gpuarr__host_read_field("/proc/cpuinfo", "model name", info->name, sizeof info->name))
        gpuarr__copy_string(info->name, sizeof info->name, "host CPU");
    if (!gpuarr__host_read_field("/proc/cpuinfo", "vendor_id", info->vendor, sizeof info->vendor))
        gpuarr__copy_string(info->vendor, sizeof info->vendor, "unknown");
    char mhz[64];
    if (gpuarr__host_read_field("/proc/cpuinfo", "cpu MHz", mhz, sizeof mhz)) info->clock_mhz = (int)strtol(mhz, NULL, 10);
    struct utsname u;
    if (uname(&u) == 0) snprintf(info->version, sizeof info->version, "%.60s %.60s", u.sysname, u.release);
    gpuarr__host_mem_info(NULL, &info->free_memory, &info->total_memory);
    info->max_alloc_bytes = info->total_memory;
    return GPUARR_OK;
}

static gpuarr_result gpuarr__host_mem_alloc(gpuarr__dev *d, size_t bytes, void **mem) {
    GPUARR__UNUSED(d);
    void *p = gpuarr__aligned_malloc(bytes, GPUARR__HOST_ALIGN);
    if (!p) {
        uint64_t free_bytes = 0, total = 0;
        gpuarr__host_mem_info(NULL, &free_bytes, &total);
        return gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY,
                            "host allocation of %zu bytes failed (host total %llu, available %llu bytes)",
                            bytes, (unsigned long long)total, (unsigned long long)free_bytes);
    }
    gpuarr__advise_huge_pages(p, bytes);
    *mem = p;
    return GPUARR_OK;
}

static void gpuarr__host_mem_free(gpuarr__dev *d, void *mem) { GPUARR__UNUSED(d); gpuarr__aligned_free(mem); }
static size_t gpuarr__host_mem_alignment(gpuarr__dev *d) { GPUARR__UNUSED(d); return GPUARR__HOST_ALIGN; }

static gpuarr_result gpuarr__host_copy_h2d(gpuarr__stream *s, void *dst, size_t dst_off, const void *src, size_t bytes, bool async) {
    GPUARR__UNUSED(s);
    GPUARR__UNUSED(async);
    gpuarr__host_cpu_copy((unsigned char *)dst + dst_off, src, bytes);
    return GPUARR_OK;
}

static gpuarr_result gpuarr__host_copy_d2h(gpuarr__stream *s, void *dst, const void *src, size_t src_off, size_t bytes, bool async) {
    GPUARR__UNUSED(s);
    GPUARR__UNUSED(async);
    gpuarr__host_cpu_copy(dst, (const unsigned char *)src + src_off, bytes);
    return GPUARR_OK;
}

static gpuarr_result gpuarr__host_copy_d2d(gpuarr__stream *s, void *dst, size_t dst_off, const void *src,
                                           size_t src_off, size_t bytes) {
    GPUARR__UNUSED(s);
    gpuarr__host_cpu_copy((unsigned char *)dst + dst_off, (const unsigned char *)src + src_off, bytes);
    return GPUARR_OK;
}

static gpuarr_result gpuarr__host_cast(gpuarr__stream *s, void *dst, size_t dst_off, gpuarr_dtype dst_t,
                                       const void *src, size_t src_off, gpuarr_dtype src_t, size_t count) {
    GPUARR__TRACE_SCOPE(gpuarr__trace_cast, s, dst_t, src_t, count);
    gpuarr__host_cpu_cast((unsigned char *)dst + dst_off, dst_t, (const unsigned char *)src + src_off, src_t, count);
    return GPUARR_OK;
}

static gpuarr_result gpuarr__host_fill(gpuarr__stream *s, void *dst, size_t dst_off, const void *pattern, size_t pattern_size,
                                       size_t bytes, bool async) {
    GPUARR__UNUSED(async);
    GPUARR__TRACE_SCOPE(gpuarr__trace_fill, s, bytes, pattern_size);
    gpuarr__host_cpu_fill((unsigned char *)dst + dst_off, pattern, pattern_size, bytes);
    return GPUARR_OK;
}

static gpuarr_result gpuarr__host_event_create(gpuarr__dev *d, bool timing, void **native) {
    GPUARR__UNUSED(d); GPUARR__UNUSED(timing);
    gpuarr__host_event *e = (gpuarr__host_event *)gpuarr__malloc(sizeof *e);
    if (!e) return gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY, "no host memory for an event");
    e->recorded_ms = -1.0;
    *native = e;
    return GPUARR_OK;
}
static void gpuarr__host_event_destroy(gpuarr__dev *d, void *native) { GPUARR__UNUSED(d); gpuarr__free(native); }
static gpuarr_result gpuarr__host_event_record(gpuarr__dev *d, void *event, void *stream) {
    GPUARR__UNUSED(d); GPUARR__UNUSED(stream);
    ((gpuarr__host_event *)event)->recorded_ms = gpuarr__now_ms();
    return GPUARR_OK;
}
static gpuarr_result gpuarr__host_event_elapsed(gpuarr__dev *d, void *start, void *end, double *ms) {
    GPUARR__UNUSED(d);
    *ms = ((gpuarr__host_event *)end)->recorded_ms - ((gpuarr__host_event *)start)->recorded_ms;
    return GPUARR_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Telemetry: memory from /proc/meminfo, CPU utilization from /proc/stat, the CPU's temperature
 * from hwmon. Every path is read under gpuarr__g.host_telemetry.fs_root ("" = the real /proc and
 * /sys; white-box tests point it at fixture files).
 * ------------------------------------------------------------------------------------------- */
static FILE *gpuarr__host_open_fs(const char *path) {
    char full[512];
    int n = snprintf(full, sizeof full, "%s%s", gpuarr__g.host_telemetry.fs_root, path);
    if (n < 0 || (size_t)n >= sizeof full) return NULL;
    return fopen(full, "r");
}

/* An unsigned decimal at *p (after blanks), moving p past it; false if there is none or it
   does not fit in 64 bits. */
static bool gpuarr__host_parse_u64(const char **p, uint64_t *out) {
    const char *s = *p;
    while (*s == ' ' || *s == '\t') s++;
    if (*s < '0' || *s > '9') return false;
    uint64_t v = 0;
    for (; *s >= '0' && *s <= '9'; s++) {
        uint64_t digit = (uint64_t)(*s - '0');
        if (v > (UINT64_MAX - digit) / 10u) return false;
        v = v * 10u + digit;
    }
    *p = s;
    *out = v;
    return true;
}

/* "MemTotal:  16314080 kB": the bytes of one /proc/meminfo line; false if absent or malformed. */
static bool gpuarr__host_meminfo_line(const char *line, const char *key, uint64_t *bytes) {
    size_t n = strlen(key);
    if (strncmp(line, key, n) != 0 || line[n] != ':') return false;
    const char *p = line + n + 1;
    uint64_t kb;
    if (!gpuarr__host_parse_u64(&p, &kb) || kb > UINT64_MAX / 1024u) return false;
    while (*p == ' ' || *p == '\t') p++;
    if (strncmp(p, "kB", 2) != 0) return false;
    *bytes = kb * 1024u;
    return true;
}

static void gpuarr__host_telemetry_memory(gpuarr_telemetry *out) {
    FILE *f = gpuarr__host_open_fs("/proc/meminfo");
    if (!f) return;
    char line[256];
    uint64_t total = 0, avail = 0;
    bool have_total = false, have_avail = false;
    while (fgets(line, sizeof line, f)) {
        if (!have_total) have_total = gpuarr__host_meminfo_line(line, "MemTotal", &total);
        if (!have_avail) have_avail = gpuarr__host_meminfo_line(line, "MemAvailable", &avail);
    }
    fclose(f);
    if (!have_total || total == 0) return;
    out->memory_total = total;
    out->valid |= (uint32_t)GPUARR_TELEMETRY_MEMORY_TOTAL;
    if (!have_avail || avail > total) return;
    out->memory_free = avail;
    out->memory_used = total - avail;
    out->valid |= (uint32_t)GPUARR_TELEMETRY_MEMORY_USAGE;
}

/* The first line of /proc/stat, "cpu  user nice system idle iowait irq softirq steal ...": the
   ticks spent busy and in all (guest time is already in user and nice). At least user, nice,
   system and idle; false if malformed. */
static bool gpuarr__host_stat_sample(uint64_t *busy, uint64_t *total) {
    FILE *f = gpuarr__host_open_fs("/proc/stat");
    if (!f) return false;
    char line[512];
    bool ok = fgets(line, sizeof line, f) != NULL && strncmp(line, "cpu ", 4) == 0;
    fclose(f);
    if (!ok) return false;
    const char *p = line + 4;
    uint64_t v[8] = {0}, sum = 0;
    int n = 0;
    while (n < 8 && gpuarr__host_parse_u64(&p, &v[n])) {
        if (sum > UINT64_MAX - v[n]) return false;
        sum += v[n++];
    }
    if (n < 4 || (*p != '\n' && *p != '\0' && *p != ' ')) return false;
    uint64_t idle = v[3] + v[4]; /* idle and iowait */
    *busy = sum - idle;
    *total = sum;
    return true;
}

/* CPU utilization since the previous call in this gpuarr_init cycle (the first: since boot).
   Two calls within one tick report the previous value again. */
static void gpuarr__host_telemetry_cpu(gpuarr_telemetry *out) {
    uint64_t busy, total;
    if (!gpuarr__host_stat_sample(&busy, &total)) return;
    pthread_mutex_lock(&gpuarr__g.host_telemetry.lock);
    uint64_t busy0 = 0, total0 = 0;
    if (gpuarr__g.host_telemetry.sampled && total >= gpuarr__g.host_telemetry.total && busy >= gpuarr__g.host_telemetry.busy) {
        busy0 = gpuarr__g.host_telemetry.busy;
        total0 = gpuarr__g.host_telemetry.total;
    } /* else the first sample, or the counters went back (another fs_root): since boot */
    int pct = gpuarr__g.host_telemetry.last_pct;
    if (total > total0) {
        uint64_t db = busy - busy0, dt = total - total0;
        pct = (int)((db * 100u + dt / 2u) / dt);
        if (pct > 100) pct = 100;
    }
    gpuarr__g.host_telemetry.sampled = true;
    gpuarr__g.host_telemetry.busy = busy;
    gpuarr__g.host_telemetry.total = total;
    gpuarr__g.host_telemetry.last_pct = pct;
    pthread_mutex_unlock(&gpuarr__g.host_telemetry.lock);
    out->gpu_utilization_pct = pct;
    out->valid |= (uint32_t)GPUARR_TELEMETRY_GPU_UTILIZATION;
}

/* One line holding a signed decimal (hwmon's millidegrees); false if malformed. */
static bool gpuarr__host_read_long(const char *path, long *out) {
    FILE *f = gpuarr__host_open_fs(path);
    if (!f) return false;
    char line[64];
    bool ok = fgets(line, sizeof line, f) != NULL;
    fclose(f);
    if (!ok) return false;
    char *end;
    errno = 0;
    long v = strtol(line, &end, 10);
    if (end == line || errno || (*end != '\n' && *end != '\0')) return false;
    *out = v;
    return true;
}

/* The first hwmon device (by number) whose name is a CPU sensor gpuarr knows, and its first
   temperature input (by number) that reads. */
static void gpuarr__host_telemetry_temperature(gpuarr_telemetry *out) {
    static const char *const sensors[] = {"k10temp", "coretemp", "zenpower", "cpu_thermal"};
    char path[128], name[64];
    for (int h = 0; h < 64; h++) {
        snprintf(path, sizeof path, "/sys/class/hwmon/hwmon%d/name", h);
        FILE *f = gpuarr__host_open_fs(path);
        if (!f) continue;
        bool got = fgets(name, sizeof name, f) != NULL;
        fclose(f);
        if (!got) continue;
        name[strcspn(name, "\n")] = '\0';
        bool cpu = false;
        for (size_t i = 0; i < sizeof sensors / sizeof sensors[0]; i++) cpu = cpu || strcmp(name, sensors[i]) == 0;
        if (!cpu) continue;
        for (int t = 1; t <= 64; t++) {
            long milli;
            snprintf(path, sizeof path, "/sys/class/hwmon/hwmon%d/temp%d_input", h, t);
            if (!gpuarr__host_read_long(path, &milli) || milli < -273150 || milli > 1000000) continue;
            out->temperature_c = (double)milli / 1000.0;
            out->valid |= (uint32_t)GPUARR_TELEMETRY_TEMPERATURE;
            return;
        }
    }
}

static void gpuarr__host_telemetry(gpuarr__dev *d, gpuarr_telemetry *out) {
    GPUARR__UNUSED(d);
    gpuarr__host_telemetry_memory(out);
    gpuarr__host_telemetry_cpu(out);
    gpuarr__host_telemetry_temperature(out);
}

/* ---- portable kernels: the body the program's compiler made, run over the index space by the
   worker pool, split along the last dimension ---- */
typedef struct gpuarr__host_kernel_job {
    const gpuarr__kernel_call *call;
    void *args[GPUARR_KERNEL_MAX_PARAMS];
} gpuarr__host_kernel_job;

static void gpuarr__host_kernel_chunk(void *ctx, size_t begin, size_t end) {
    gpuarr__host_kernel_job *job = (gpuarr__host_kernel_job *)ctx;
    job->call->kernel->host(job->args, job->call->global, job->call->ndim, (int64_t)begin, (int64_t)end);
}

static gpuarr_result gpuarr__host_kernel_build(gpuarr__dev *d, const gpuarr_kernel *k) {
    GPUARR__UNUSED(d);
    GPUARR__UNUSED(k);
    return GPUARR_OK; /* compiled with the program */
}

static gpuarr_result gpuarr__host_kernel_launch(gpuarr__stream *s, const gpuarr__kernel_call *call) {
    GPUARR__UNUSED(s);
    gpuarr__host_kernel_job job;
    job.call = call;
    const gpuarr_kernel *k = call->kernel;
    for (int i = 0; i < k->nparams; i++)
        job.args[i] = k->params[i].kind == GPUARR_PARAM_SCALAR ? (void *)(uintptr_t)call->scalar[i] : (char *)call->mem[i] + call->offset[i];
    int64_t outer = call->global[call->ndim - 1], inner = 1;
    for (int d = 0; d < call->ndim - 1; d++) inner *= call->global[d];
    /* chunks of at most about 64 Ki indices (large enough to pay for a hand-off), and at least 4
       per thread, so that a kernel whose indices do much work (a reduction level) still spreads */
    int64_t threads = GPUARR__MAX(1, gpuarr__g.workers.wanted);
    int64_t chunk = GPUARR__MIN(((int64_t)1 << 16) / GPUARR__MAX(inner, (int64_t)1), outer / (4 * threads));
    chunk = GPUARR__MAX(chunk, (int64_t)1);
    gpuarr__parallel_for((size_t)outer, (size_t)chunk, gpuarr__host_kernel_chunk, &job);
    return GPUARR_OK;
}

static const gpuarr__interop_HOST gpuarr__host_interop = {GPUARR_BACKEND_HOST, GPUARR__INTEROP_HOST(GPUARR__INTEROP_IMPL)};

/* The host's table. Synchronous, so it leaves the stream procedures and the event waits NULL;
   no driver to load, nothing to open, no pinned memory, no peers, no context to activate: those
   are NULL too. */
static void gpuarr__host_backend_fill(gpuarr__backend *b) {
    b->id = GPUARR_BACKEND_HOST;
    b->name = "host";
    b->flags = GPUARR__BACKEND_SYNCHRONOUS | GPUARR__BACKEND_BUILTIN | GPUARR__BACKEND_HOST_MEMORY | GPUARR__BACKEND_PAGEABLE_ASYNC;
    b->max_alloc_name = NULL; /* no allocation limit of its own */
    b->interop = &gpuarr__host_interop;
    b->load = gpuarr__host_load;
    b->unload = gpuarr__host_unload;
    b->device_count = gpuarr__host_device_count;
    b->device_info = gpuarr__host_device_info;
    b->mem_info = gpuarr__host_mem_info;
    b->mem_alloc = gpuarr__host_mem_alloc;
    b->mem_free = gpuarr__host_mem_free;
    b->mem_alignment = gpuarr__host_mem_alignment;
    b->copy_h2d = gpuarr__host_copy_h2d;
    b->copy_d2h = gpuarr__host_copy_d2h;
    b->copy_d2d = gpuarr__host_copy_d2d;
    b->cast = gpuarr__host_cast;
    b->fill = gpuarr__host_fill;
    b->kernel_build = gpuarr__host_kernel_build;
    b->kernel_launch = gpuarr__host_kernel_launch;
    b->event_create = gpuarr__host_event_create;
    b->event_destroy = gpuarr__host_event_destroy;
    b->event_record = gpuarr__host_event_record;
    b->event_elapsed = gpuarr__host_event_elapsed;
    b->telemetry = gpuarr__host_telemetry;
}
#define GPUARR__BACKEND_FILL_HOST gpuarr__host_backend_fill

#endif /* GPUARR_HOST_BACKEND_INCLUDED */
