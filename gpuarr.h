/*
 * gpuarr.h -- arrays on the host, on CUDA GPUs and on OpenCL devices, with one C11 API.
 *
 * Version 0.1.0. MIT license: see the end of this file.
 *
 * =============================================================================================
 * WHAT IT IS
 * =============================================================================================
 * A header-only library. It gives a C program (or a CUDA C++ .cu file) a registry of every
 * device of every compiled-in backend -- the host always among them --, typed N-d arrays on any
 * of them, conversions of those arrays between any two memory spaces with a dtype cast on the
 * way, streams, events and per-thread device/stream scopes.
 *
 * Backends: the host (always), CUDA (every NVIDIA GPU the driver shows, through the driver API)
 * and OpenCL (every platform and device the ICD loader finds). Both are loaded at run time: a
 * program built with plain cc runs on a machine without them and just finds no such devices.
 *
 * Adding a backend takes four things: its header, backends/gpuarr_<name>.h, which defines
 * gpuarr__<name>_backend_fill (it fills a struct gpuarr__backend by assignment: its id, name,
 * flags and procedures, the optional ones left NULL, as that struct's comments say), its interop
 * table and GPUARR__BACKEND_FILL_<NAME> naming the fill function; a line X(<NAME>, "<name>") in
 * GPUARR_BACKEND_LIST; for each public interop function (none is fine), its declaration in the
 * public interop section and a row in its list GPUARR__INTEROP_<NAME> in the implementation,
 * from which its call through the backend's interop table and, in a build without the backend,
 * its GPUARR_ERROR_UNSUPPORTED answer are generated; and its #include, under its
 * GPUARR_NO_<NAME> switch (with GPUARR__BACKEND_FILL_<NAME> NULL otherwise), in the
 * implementation's list of backends.
 *
 * =============================================================================================
 * HOW TO USE IT
 * =============================================================================================
 * Copy gpuarr.h and its four folders into your project: backends/ (host, CUDA, OpenCL), layers/
 * (what is built on the core: trace, local rank, DLPack, leases and plans, transfer models,
 * offload and map, MPI), kernels/ (the conversion rules the host and device kernels share) and
 * generated/ (the embedded kernel text and PTX). Or copy one file: `make single-header` writes
 * build/single-header/gpuarr.h, the same library with those folders inlined. Or `make install`
 * them: they go to $(PREFIX)/include/gpuarr/, and programs include <gpuarr/gpuarr.h>. In exactly
 * ONE C (or C++) file:
 *
 *     #define GPUARR_IMPLEMENTATION
 *     #include "gpuarr.h"
 *
 * Everywhere else include gpuarr.h as a normal header. Build with
 *
 *     cc -std=c11 app.c -lm -lpthread -ldl          (no CUDA or OpenCL library to link)
 *     nvcc -std=c++17 app.cu -ldl                   (the same, with your own kernels in it)
 *
 * The implementation takes a while to compile (bench/results/compile.md), so it is best kept in
 * a file of its own, like gpuarr.c, compiled once: with CUDA, `cc -std=c11 -O2 -c gpuarr.c` and
 * `nvcc -std=c++17 app.cu gpuarr.o -lm -lpthread -ldl`, and editing a kernel does not recompile
 * it (examples/custom_kernel.cu).
 *
 * Defining GPUARR_IMPLEMENTATION after an earlier plain include in the same file still works
 * (the implementation sits outside the include guard); defining it twice in one translation unit
 * is harmless (the second is ignored). In strict ISO mode (-std=c11) the implementation needs
 * POSIX declarations the C library then hides (clock_gettime, madvise); it asks for them itself
 * when nothing was included before it, as in gpuarr.c. Where a C library header or a plain
 * include of gpuarr.h comes first in that file, put #define _DEFAULT_SOURCE (or _GNU_SOURCE)
 * above the first #include; the header stops with an #error saying so otherwise, rather than
 * build with a wall clock for events and no huge pages.
 *
 * Do not compile the implementation with -ffast-math: the conversion rules below depend on IEEE
 * NaN and infinity handling, and the header refuses to build that way.
 *
 * A minimal program:
 *
 *     gpuarr_init(NULL);                               // NULL = defaults
 *     gpuarr_device dev;
 *     gpuarr_device_find("any", &dev);                 // best GPU, else the host
 *     double in[6] = {1, 2, 3, 4, 5, 6}, back[6];
 *     int64_t shape[2] = {2, 3};
 *     gpuarr_array a, b;
 *     gpuarr_from_host(dev, in, 2, shape, &a);         // typed: picks F64 from `double *`
 *     gpuarr_convert(a, dev, GPUARR_F32, &b);          // cast on the device
 *     gpuarr_to_host(b, back, 6);                      // cast back into double
 *     gpuarr_release(a); gpuarr_release(b);
 *     gpuarr_shutdown();
 *
 * Every fallible call returns a gpuarr_result (0 = GPUARR_OK, negative = error). On an error,
 * gpuarr_last_error() returns a message for the calling thread that names the function, the
 * argument and the reason, e.g. "gpuarr_empty: shape[1] = -3: dimensions must be >= 0".
 *
 * The version of the header: GPUARR_VERSION_MAJOR, _MINOR, _PATCH, GPUARR_VERSION_STRING ("0.1.0")
 * and GPUARR_VERSION_NUMBER, MAJOR * 10000 + MINOR * 100 + PATCH (100 for 0.1.0), for #if tests.
 * gpuarr_version_string() is the version of the compiled implementation: the same string, unless
 * a program built against one header links a library (`make lib`) built from another.
 *
 * =============================================================================================
 * CONFIGURATION
 * =============================================================================================
 * Compile-time macros (define before including the implementation):
 *   GPUARR_IMPLEMENTATION    compile the implementation into this translation unit
 *   GPUARR_MALLOC(size)      replace malloc for every allocation the library makes; must be
 *   GPUARR_FREE(ptr)         defined together with GPUARR_FREE (all or none, else #error)
 *   GPUARR_API               storage/visibility of public functions (default: nothing = extern)
 *   GPUARR_STATIC            make the public functions static, for a program whose only unit
 *                            using gpuarr has the implementation; unused ones draw no warning
 *                            (plain GPUARR_API=static warns about each one not called)
 *   GPUARR_NO_CUDA           leave the CUDA backend out
 *   GPUARR_NO_OPENCL         leave the OpenCL backend out
 *   GPUARR_MPI               declare and compile the MPI part (see MPI); <mpi.h> first
 *   GPUARR_NO_TRACE          leave the trace's hooks out (see TRACING; gpuarr_trace_start then
 *                            fails with GPUARR_ERROR_UNSUPPORTED)
 *   GPUARR_NO_RUNTIME_LINKING  link the backends' libraries (-lcuda, -lOpenCL) instead of loading
 *                            them at run time; <cuda.h> and <CL/cl.h> must then be on the
 *                            include path (define GPUARR_NO_CUDA or GPUARR_NO_OPENCL for one)
 *
 * Run-time: gpuarr_desc passed to gpuarr_init (zero or NULL = default for every field), then the
 * environment for fields left zero. gpuarr_init reads each variable below once (an empty one
 * counts as unset) and the library uses what it parsed then, except the launchers' local ranks
 * and the GPUARR_MPI_* ones at the end of the list, read by the calls that use them. Keywords
 * match in any case ("OFF" = "off"); a switch takes on|off, 1|0, true|false or yes|no; paths and
 * lists are taken as written, at most 480 characters.
 *   GPUARR_DEVICES   device filter, comma separated: host, cuda, cuda:*, cuda:N, opencl,
 *                    opencl:*, opencl:N. The host is always present. Default: every device. An
 *                    item naming a device this machine lacks is logged as a warning.
 *   GPUARR_LOG       off | error | warn (or warning) | info | debug. Default: warn (to stderr unless a logger
 *                    is given).
 *   GPUARR_THREADS   host worker threads for large casts and copies, 1..256. Default: the number
 *                    of online CPUs (at most 64). 1 = no worker threads.
 *   GPUARR_HOST_ISA  auto | baseline | avx2: the host cast kernels. Default auto = AVX2 kernels
 *                    when the CPU has AVX2 (x86-64, gcc/clang), else portable ones.
 *   GPUARR_CACHE_DIR where compiled device kernels, transfer models (see TRANSFER MODEL) and task
 *                    models (see OFFLOAD) are kept: an absolute path, or off (nowhere).
 *                    Default $XDG_CACHE_HOME/gpuarr, else $HOME/.cache/gpuarr. Used only when
 *                    it is this user's and no one else can write it: see FILES AND FOLDERS.
 *   GPUARR_OPENCL_LIBRARY  the ICD loader to open (default libOpenCL.so.1).
 *   GPUARR_OPENCL_BUILD_OPTIONS  appended to the OpenCL kernel build options.
 *   GPUARR_OPENCL_FP64  switch, default on. off: treat OpenCL devices as lacking doubles (slow or
 *                       emulated fp64).
 *   GPUARR_OPENCL_UNIFIED  switch, default on. off: handle every OpenCL device as discrete (own
 *                          memory, staged copies): how PoCL exercises the paths of a discrete GPU.
 *   GPUARR_CUDA_LIBRARY  the driver to open (default libcuda.so.1).
 *   GPUARR_CUDA_KERNELS  auto | ptx | nvrtc: where CUDA cast kernels come from (see CUDA); ptx
 *                        also makes portable kernels PTX for the driver to compile (see KERNELS).
 *   GPUARR_NVRTC_LIBRARY  the NVRTC to open (default: libnvrtc.so.13, .12, .11.2, then
 *                         $CUDA_HOME/lib64/libnvrtc.so).
 *   GPUARR_NVML_LIBRARY  the NVML to open for CUDA devices' telemetry (default libnvidia-ml.so.1;
 *                        see TELEMETRY).
 *   GPUARR_PEER_COPIES  switch, default on. off sends device-to-device copies through pinned
 *                       host memory even where the devices could copy directly (P2P trouble,
 *                       testing).
 *   GPUARR_ALLOC_CONF, GPUARR_FAULTS  memory pools: see MEMORY POOLS.
 *   GPUARR_TRACE, GPUARR_TRACE_EVENTS  the trace: see TRACING.
 *   GPUARR_SLOTS     lease slots per device, "cuda:0=4,opencl:*=2": see LEASES.
 *   GPUARR_LEASE_DIR the folder of the lease slot files shared by processes (an absolute path, or
 *                    off): see LEASES.
 *   GPUARR_CALIBRATE switch, default on. off: no transfer model is fitted unless gpuarr_calibrate
 *                    asks (see TRANSFER MODEL).
 *   GPUARR_OFFLOAD   auto | host | gpu: where gpuarr_offload and gpuarr_map run a task when the
 *                    call's policy is DEFAULT (see OFFLOAD). Default auto.
 *   OMPI_COMM_WORLD_LOCAL_RANK, MV2_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID, SLURM_LOCALID,
 *   PMI_LOCAL_RANK   a launcher's node-local rank, for the spec "local" (see LOCAL RANK); read
 *                    at each use, not by gpuarr_init.
 *   GPUARR_MPI_CHUNK, GPUARR_MPI_TIMEOUT_MS, GPUARR_MPI_CUDA_AWARE  the MPI part's, read by each
 *                    call that starts a transfer, not at gpuarr_init: see MPI.
 * A malformed value makes gpuarr_init fail with GPUARR_ERROR_INVALID_ARGUMENT naming it (one of
 * those read at use: the call that reads it, never gpuarr_init). A library that cannot be loaded
 * is not an error: its backend has no devices, and gpuarr_device_find's error for them gives the
 * path and the loader's reason.
 *
 * Privileged programs. In a process that runs with more privilege than the user who started it
 * (setuid, setgid or file capabilities: what the kernel marks AT_SECURE, as glibc's
 * secure_getenv checks), the environment is that user's to write. gpuarr then ignores every
 * variable that names a file, folder or library, hands text to a compiler, injects failures or
 * vouches for another library: GPUARR_CACHE_DIR, GPUARR_OPENCL_LIBRARY,
 * GPUARR_OPENCL_BUILD_OPTIONS, GPUARR_CUDA_LIBRARY, GPUARR_NVRTC_LIBRARY, GPUARR_NVML_LIBRARY,
 * GPUARR_FAULTS, GPUARR_TRACE, GPUARR_LEASE_DIR and GPUARR_MPI_CUDA_AWARE, and HOME,
 * XDG_CACHE_HOME, XDG_RUNTIME_DIR and CUDA_HOME. Otherwise GPUARR_TRACE=/etc/passwd would have
 * a setuid-root program overwrite that file, and GPUARR_OPENCL_LIBRARY run anyone's code as
 * root. Their defaults hold instead: the default libraries, no kernel cache (and no transfer or
 * task models kept), the default lease folder (see LEASES), no trace, MPI's own answer about
 * CUDA. gpuarr_init logs each GPUARR_* one that is set but ignored as a warning naming it, the
 * others at info level (HOME is in nearly every environment). The rest are kept --
 * GPUARR_DEVICES, _LOG, _THREADS, _HOST_ISA, _OPENCL_FP64, _OPENCL_UNIFIED, _CUDA_KERNELS,
 * _PEER_COPIES, _ALLOC_CONF, _TRACE_EVENTS, _SLOTS, _CALIBRATE, _OFFLOAD, _MPI_CHUNK,
 * _MPI_TIMEOUT_MS and the launchers' local ranks --: they choose devices, threads, kernels,
 * limits, waits and the log's detail, checked as everywhere, and the worst they do is a slower
 * run or a failed call. A privileged program that wants a trace calls gpuarr_trace_start with a
 * path of its own choosing.
 *
 * =============================================================================================
 * DEVICES
 * =============================================================================================
 * gpuarr_init builds the registry once: the host first, then every device of every backend that
 * is compiled in and present at run time, in a stable order. A backend whose library is missing
 * at run time contributes zero devices; that is never an error. gpuarr_device_find accepts:
 *   "host"       the host (also "cpu")
 *   "cuda:N"     the N-th CUDA device, "opencl:N" the N-th OpenCL device (N counts every device
 *                of that backend, before GPUARR_DEVICES filtering, so an index names the same
 *                device whatever the filter)
 *   "gpu"        the best GPU (most compute units x clock, then memory), else GPUARR_ERROR_NO_DEVICE
 *   "any"        the best GPU, else the host
 *   "local"      this process's device by its launcher's node-local rank r: device r mod n of the
 *                n devices other than the host, else the host; "local:R" with rank R given
 *                (see LOCAL RANK)
 * A malformed spec is GPUARR_ERROR_INVALID_ARGUMENT; a well-formed spec naming no present device
 * is GPUARR_ERROR_NO_DEVICE (the message says when the device exists but GPUARR_DEVICES leaves it
 * out, or why its backend is unavailable).
 *
 * =============================================================================================
 * ARRAYS
 * =============================================================================================
 * An array is a C-contiguous block of `count` elements of one dtype on one device, with 0..8
 * dimensions (0 dimensions = a scalar with count 1; any dimension may be 0 = an empty array).
 * Handles are {uint32_t id} values: a slot index and a 16-bit generation counter, scrambled with
 * a key drawn at each gpuarr_init. A released, stale or forged handle is refused
 * (GPUARR_ERROR_INVALID_HANDLE), never dereferenced: a released id names nothing until the
 * generation of its slot comes round (about 65536 reuses), and a freed slot waits until 1024
 * others are free, so over 67 million releases in between; ids near a live one (id + 1, id ^ 1)
 * are unrelated to it, so a forged id, or one from an earlier gpuarr_init, names a live object
 * only by chance (about one in 2^32 per live handle of its kind). An array, stream or event id
 * given where another kind is expected is refused (the message says which kind a live one is).
 * At most 65536 arrays (and as many streams, and events) are alive at once; one more is
 * GPUARR_ERROR_OUT_OF_MEMORY. Arrays are reference counted: gpuarr_retain adds a reference,
 * gpuarr_release drops one and frees the memory with the last. Work still queued on a stream
 * keeps the memory alive until it completes, so releasing early is always safe.
 *
 * Output handles are written only on success: on any error *out is left exactly as it was.
 *
 * Batches. gpuarr_stack(src, n, dst, t, &out) makes one new array of shape [n, ...] on dst from
 * n arrays of one shape and dtype on any devices (row i = src[i], cast to t; 0 keeps the dtype);
 * gpuarr_convert_many(src, n, dst, t, out) sets out[i] as gpuarr_convert(src[i], dst, t) would
 * (src[i] itself, retained, where neither device nor dtype changes). Both are synchronous. The
 * sources are grouped by device: the host's are packed with memcpy (cast first when the cast is
 * narrowing) into one buffer, from dst's pinned pool where it has one, a device's by copies into
 * one temporary there, and each group crosses to dst in one transfer with one cast; sources
 * already on dst are copied into place. In gpuarr_convert_many the arrays of up to 1 MiB that
 * move or change dtype share one block of dst's memory: each output holds the block, which is
 * freed when the last of them is released; they are ordinary arrays (info.is_view false, offset
 * 0) and outlive their sources and each other. Larger ones are converted one by one. Every
 * argument is checked before anything is allocated: n < 0, src NULL with n > 0, out NULL, t not
 * a dtype (GPUARR_ERROR_INVALID_ARGUMENT), dst or a src[i] not a live handle
 * (GPUARR_ERROR_INVALID_HANDLE, the message names "src[i]"), for gpuarr_stack n = 0 (the
 * result's shape comes from src[0]), a shape or dtype differing from src[0]'s, or src[0] with 8
 * dimensions (INVALID_ARGUMENT naming src[i]), and a cast the device that must run it cannot run
 * (GPUARR_ERROR_UNSUPPORTED). gpuarr_convert_many with n = 0 does nothing. On any error, also one
 * part-way through, nothing the call allocated is left (the pool stats are what they were) and no
 * output is written.
 *
 * =============================================================================================
 * WRITING INTO ARRAYS, VIEWS AND ALIASING
 * =============================================================================================
 * Arrays are mutable buffers. gpuarr_copy(dst, src) copies (and casts) into an existing array;
 * gpuarr_write / gpuarr_read move elements [first, first + count), in C order, between an array
 * and host memory, cast to or from the host dtype given; gpuarr_fill_as (or the typed
 * gpuarr_fill(a, x), which takes x's C type) sets every element to one value, cast by the rules
 * below. Several handles can name the same memory, and a write through one is seen through all:
 *   - gpuarr_convert to the same device and dtype returns the source itself (retained);
 *   - gpuarr_host_data hands out the memory of a host array;
 *   - gpuarr_reshape(a, ...) (the same elements in a new shape) and gpuarr_slice(a, begin, end)
 *     (rows [begin, end) of dimension 0) make views: new handles on a's memory, starting
 *     array_info.offset bytes into the array that owns it. A view holds a reference to that
 *     memory: it stays valid after the handle it was made from is released, and is freed with
 *     the last view. Views of views share the same memory.
 * gpuarr_copy between two arrays whose memory overlaps is GPUARR_ERROR_INVALID_ARGUMENT, unless
 * they are the very same elements, when it does nothing. Writes are ordered after the work
 * gpuarr queued earlier that reads or writes the same memory (views included), on any stream:
 * the device waits for it, the calling thread does not (in the _async calls; work that runs on
 * the host itself, as a copy between two host arrays, runs at the call and so waits). Work you queue
 * yourself through native interop (a kernel on gpuarr_opencl_queue(s) or gpuarr_cuda_stream(s))
 * is unknown to gpuarr until you say so: gpuarr_array_record_stream(a, s) after queueing it makes
 * every later gpuarr call that reads or writes a (or a view of it), synchronous or async, on any
 * stream or device, the host included, run after the work queued on s before that call (s also
 * waits there for a's earlier gpuarr work); a host array may be recorded on any device's stream,
 * for work that writes it through pinned, mapped or wrapped memory. Before your own work reads
 * or writes a, gpuarr_stream_wait_array(s, a) makes s wait for gpuarr's. gpuarr_array_query says
 * whether the work writing an array, and every stream it was used on asynchronously, has
 * finished; gpuarr_array_sync waits for that.
 *
 * The _async forms (gpuarr_copy_async, gpuarr_write_async, gpuarr_read_async) return without
 * waiting for the device. The caller's host memory must stay valid, and a read's destination
 * untouched, until the stream passes that point (gpuarr_stream_sync, an event, or
 * gpuarr_array_sync on the array).
 *
 * gpuarr_empty_pinned(d, ...) makes a host array in page-locked memory from d's pinned pool
 * (counted in gpuarr_pool_get_pinned_stats(d)): its info says pinned, and copies between it and d
 * are DMA on the stream, never staged, so async ones return at once on CUDA too. With d = the
 * host it is an ordinary host array.
 *
 * =============================================================================================
 * CONVERSION RULES (identical on every backend, bit for bit)
 * =============================================================================================
 *   - integer -> integer wraps modulo 2^bits (two's complement for signed targets);
 *   - float -> integer truncates toward zero, saturates at the target's range, NaN -> 0;
 *   - anything -> bool is (x != 0) (so NaN -> true, -0.0 -> false); bool -> anything is 0 or 1,
 *     and a stored bool byte other than 0 counts as 1;
 *   - to f16, bf16, f32 and f64 the result is correctly rounded, nearest-even, from the exact
 *     source value (no double rounding, including i64/u64 -> bf16 and f64 -> f16);
 *   - between float types -0.0, infinities and NaN are preserved. A NaN keeps its sign, gets
 *     the quiet bit set and keeps the top bits of its payload (what x86 and ARM hardware do).
 * Host casts and the scalar helpers (gpuarr_f16_from_float & co) follow these rules whatever
 * rounding mode (fesetround) or flush-to-zero the calling thread set, on x86-64 and AArch64
 * with gcc or clang (elsewhere they assume the default floating-point environment).
 * gpuarr_convert(src, dev, dtype, &out) with dev = src's device and dtype = src's dtype (or 0)
 * returns src itself, retained, without a copy. Otherwise the cast is done on the side of a
 * transfer that makes it narrower: narrowing casts (and casts between types of equal width) run
 * before data leaves the source device, widening casts after it arrives. A cast that the device
 * doing it cannot run (f64 on an OpenCL device without cl_khr_fp64) fails with
 * GPUARR_ERROR_UNSUPPORTED before anything is allocated or moved. Large host casts and copies
 * run on a small internal pool of worker threads (GPUARR_THREADS).
 *
 * =============================================================================================
 * STREAMS, EVENTS AND SCOPES
 * =============================================================================================
 * A stream orders work on one device. gpuarr_convert is synchronous; gpuarr_convert_async
 * enqueues the same work on a stream and returns at once: the result is ready when the stream
 * (or an event recorded after it) is. An array produced on one stream and used on another is
 * waited for automatically. The stream handle {0} means "the calling thread's current stream if
 * it belongs to the device doing the work, else the thread's default stream on that device".
 * Default streams are per thread (as CUDA's per-thread default stream): threads that share a
 * device without naming streams do not wait for each other's work, and work a thread leaves
 * queued there is finished, and its stream dropped, when the thread exits (or, for a thread
 * still alive then, at the last gpuarr_shutdown, after which no gpuarr code runs when a thread
 * exits: a plugin that contains gpuarr may be dlclose'd once it has shut down). gpuarr_device_sync
 * waits for every thread's default stream and every stream made on the device. On the host
 * backend work runs to completion when it is enqueued, with the same API, ordering and errors.
 * In gpuarr_convert the steps that run on the host (host-side casts) wait for their input; in
 * gpuarr_convert_async they are queued on the stream as host functions (cuLaunchHostFunc, an
 * OpenCL event callback), which run once their input has arrived, so the call never waits for
 * the device. Three exceptions wait: on CUDA without pinned memory left for the transfer the
 * calling thread does the host's part; an array used by async work on a fifth stream makes the
 * call wait for the oldest of the four streams it remembers (so its memory is freed in their
 * order); and a copy between two devices through the host whose pinned buffer comes from the
 * destination's pool (OpenCL to CUDA) waits for that buffer's earlier users, if any are still
 * queued.
 *
 * Each thread has a current device (initially the "any" device) and a current stream (initially
 * none). GPUARR_WITH_DEVICE(dev) { ... } and GPUARR_WITH_STREAM(s) { ... } set them for the block
 * and restore them when the block ends normally, by `continue` or by `break` (a `break` leaves
 * the scope, not an enclosing loop). `return` and `goto` out of the block SKIP the restore: use
 * GPUARR_SCOPED_DEVICE(dev); / GPUARR_SCOPED_STREAM(s); (GCC/Clang cleanup attribute in C, RAII
 * in C++), which restore at the end of the enclosing block on every exit. If the device or
 * stream is invalid (or cannot be made current), GPUARR_WITH_* skip the block and
 * gpuarr_last_error() says why; GPUARR_SCOPED_* cannot skip the rest of the block, so there
 * the thread has NO current device or stream until the block ends: every call that would use
 * them (a {0} stream, work placed on the current stream, gpuarr_current_device() = {0}) fails
 * with the scope's result and a message saying that the scope did not start, so the block never
 * runs on the device it meant to replace. The _R forms, GPUARR_WITH_DEVICE_R(dev, &result),
 * GPUARR_WITH_STREAM_R, GPUARR_SCOPED_DEVICE_R and GPUARR_SCOPED_STREAM_R, also write the
 * scope's result (GPUARR_OK or the error) to a gpuarr_result.
 *
 * =============================================================================================
 * MEMORY POOLS
 * =============================================================================================
 * Each device (the host too) caches the memory its arrays free, so allocating and freeing in a
 * loop costs a few hundred nanoseconds instead of a device allocation. Arrays are blocks of
 * segments the device allocated: up to 1 MiB they share 2 MiB segments, larger ones get
 * segments rounded up to 2 MiB; a free block is found in O(1) (two-level segregated fit), split
 * when larger than asked, and merged with its free neighbours when freed (the last 16 blocks
 * of up to 64 KiB freed with no work pending wait whole for the next request of their size;
 * they are merged first when a request finds no other fit, and before a trim, a limit, the
 * out-of-memory ladder or gpuarr_pool_snapshot looks at the pool). Before that, each thread
 * keeps the last 4 arrays of up to 64 KiB it released with no stream work on them (never used
 * on an asynchronous stream) whole, record and block, for its next array of exactly that block
 * size on that device: that pair takes no pool lock. These blocks are the pool's: the same
 * points (a request with no other fit, a trim, a limit, the ladder, a snapshot, a release
 * threshold), on any thread, return every thread's to the pool, and a thread's exit returns its
 * own. gpuarr_pool_get_stats counts them as free (allocated_bytes, requested_bytes and
 * allocations leave them out; their reuse counts in cache_hits and the totals); the peaks are
 * kept by the pool itself, which counts them as allocated until they come back. Frees follow stream
 * order: a block freed while work on stream S still uses it can be reused by S at once; another
 * stream first makes the device wait for S's work (never the host). gpuarr_array_record_stream
 * names further streams an array is used on (native interop). When the device has no memory
 * left, gpuarr walks a ladder, each step counted in gpuarr_pool_stats: the cache, the handlers
 * added with gpuarr_oom_handler_add (each may free memory and ask for a retry), cached blocks too
 * big to split go back, finished work's frees are collected and the cache searched again, every
 * cached segment goes back and the device is tried once more; then GPUARR_ERROR_OUT_OF_MEMORY
 * with the request, the device's total and free memory, the pool's limit, allocated and cached
 * bytes in the message. With desc.oom_host_fallback (or host_fallback:1) a new array that does
 * not fit goes to the host instead and the call succeeds (GPUARR_OK): the array's info gives the
 * host as its device and host_fallback = true, the device's pool counts it in host_fallbacks,
 * and a warning is logged once the host memory is there.
 *
 * GPUARR_ALLOC_CONF="key:value,..." (or desc.alloc_conf), an unknown key or bad value failing
 * gpuarr_init with the key named:
 *   limit:<bytes or N%>          cap on reserved bytes of each device's pool (percent of its
 *                                memory), the host's excepted
 *   host_limit:<bytes or N%>     the same for the host's pool
 *   release_threshold:<bytes>    cached bytes above this go back at sync points (default none)
 *   max_split_size:<bytes>       larger cached blocks are not split (and serve only requests
 *                                within 20 MiB of their size); default: any block is split
 *   caching:0                    every free goes back to the device: valgrind and
 *                                compute-sanitizer see each allocation
 *   host_fallback:0|1            sets desc.oom_host_fallback's policy, whatever the desc said
 * Sizes take K, M, G suffixes (KiB, MiB, GiB). gpuarr_pool_set_limit and gpuarr_pool_trim change
 * and shed it at run time; gpuarr_pool_get_stats, _summary and _snapshot show it.
 * GPUARR_FAULTS="<device>:nth=N,<device>:above=BYTES" (or gpuarr_pool_inject_faults) makes the
 * nth raw allocation of a device fail, or every one above a size: for testing recovery paths;
 * "<device>:pinned_above=BYTES" does the same to its pinned staging pool.
 *
 * Synchronous transfers of 1 MiB or more between pageable host memory and a device with its
 * own memory are staged through a ring of three 8 MiB chunks of pinned host memory (a second
 * pool per device, gpuarr_pool_get_pinned_stats): the host copies or casts one chunk while the
 * device copies the previous one, and a chunk is refilled only once its copy has completed.
 * Without pinned memory the transfer copies directly. Devices that share the host's memory
 * need no staging. An async transfer never waits for chunks: when it needs the host between
 * device steps (a host-side cast, a CUDA copy from or to pageable memory) it takes up to three
 * such chunks for the stream and has host functions on the stream fill or drain them in turn,
 * the stream's order making reuse safe; a hop between two devices through the host uses one
 * pinned buffer of its size. OpenCL copies from and to pageable memory in queue order, so there
 * an upload or download without a host-side cast is one direct copy.
 *
 * =============================================================================================
 * TELEMETRY
 * =============================================================================================
 * gpuarr_device_get_telemetry(dev, &t) reads what the device reports about itself now. Each group
 * of fields it read sets its bit in t.valid (GPUARR_TELEMETRY_LIST: memory_total, memory_usage =
 * memory_used and memory_free, gpu_utilization, memory_utilization, temperature, power,
 * power_limit, sm_clock, memory_clock, throttle_reasons, pcie_generation, pcie_width;
 * gpuarr_telemetry_name gives each bit's name); the fields of a clear bit are 0. A reading the
 * device cannot give is never an error: the call fails only for a NULL out
 * (GPUARR_ERROR_INVALID_ARGUMENT), a handle that is not a device (GPUARR_ERROR_INVALID_HANDLE) and
 * before gpuarr_init. Every device reports its total memory (the host where /proc/meminfo reads).
 * By kind of device:
 *   - CUDA: NVML (libnvidia-ml.so.1, or GPUARR_NVML_LIBRARY; always loaded at run time), loaded
 *     and started (nvmlInit_v2) by the first telemetry call on a CUDA device, stopped by the
 *     last gpuarr_shutdown. The NVML device is found by the CUDA device's UUID (info.uuid written
 *     "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", else "MIG-..." for a MIG instance), never by
 *     index: NVML's order and CUDA_VISIBLE_DEVICES do not matter. It gives memory as NVML counts
 *     it (nvmlDeviceGetMemoryInfo_v2, whose used leaves out what the driver reserves, else
 *     nvmlDeviceGetMemoryInfo, whose used includes it), GPU and memory utilization (percent of
 *     NVML's last sample period), the GPU's temperature, power draw and limit (the enforced limit,
 *     else the management limit), SM and memory clocks, NVML's clock event (throttle) reasons bit
 *     mask as it defines them, and the PCIe link's current generation and width. Each reading
 *     comes from the newest entry point the NVML has (nvmlDeviceGetTemperatureV,
 *     nvmlDeviceGetCurrentClocksEventReasons, ...), else from the older one; one that fails
 *     leaves its bit clear. Without NVML (not loadable, nvmlInit_v2 failing, or no NVML device
 *     with the UUID: logged at info level) a CUDA device reports the driver's figures: its total
 *     memory, and free and used (cuMemGetInfo) once the device is open or its primary context is
 *     active (none is made just for this).
 *   - OpenCL: a device that is the same GPU as a CUDA device (info.same_as) reports what that
 *     CUDA device does. Others report CL_DEVICE_GLOBAL_MEM_SIZE, and free and used memory where
 *     the device has cl_amd_device_attribute_query (CL_DEVICE_GLOBAL_FREE_MEMORY_AMD). PoCL: the
 *     total only.
 *   - The host: total and free memory (MemTotal and MemAvailable of /proc/meminfo; used is the
 *     difference), the CPUs' utilization in gpu_utilization_pct (from the first line of
 *     /proc/stat: the share of time neither idle nor waiting for I/O since the host's previous
 *     telemetry call in this gpuarr_init cycle; the first call gives the average since boot),
 *     and the temperature of the first hwmon device named k10temp, coretemp, zenpower or
 *     cpu_thermal (its first temp*_input that reads), where there is one.
 * A failed device (see FAILURES) still answers: NVML's readings, and the total memory, without a
 * call into its dead context.
 * Thread-safe: NVML is started once, and the host's previous /proc/stat sample is kept under a
 * lock. `gpuarr-info --watch [SECONDS] [--count N] [--json]` prints the readings of every device
 * with its pool's allocated and reserved bytes every SECONDS (default 1), as a table or as one
 * JSON object per device per tick.
 *
 * =============================================================================================
 * FAILURES
 * =============================================================================================
 * Some errors leave a device's context unusable: every later call in it would fail the same way.
 * gpuarr calls them sticky, and the first one a call meets marks the device FAILED:
 *   CUDA    CUDA_ERROR_ILLEGAL_ADDRESS (700), LAUNCH_TIMEOUT (702), ASSERT (710),
 *           HARDWARE_STACK_ERROR (714), ILLEGAL_INSTRUCTION (715), MISALIGNED_ADDRESS (716),
 *           INVALID_ADDRESS_SPACE (717), INVALID_PC (718), LAUNCH_FAILED (719) and EXTERNAL_DEVICE
 *           (911): the errors the driver documents as leaving "an inconsistent state". A kernel's
 *           or a copy's usually shows at a later synchronize or query of its stream.
 *   OpenCL  CL_DEVICE_NOT_AVAILABLE from a call on the device; or the context's error callback
 *           (pfn_notify of clCreateContext), which does not say which device: every open device
 *           of that platform's context fails.
 * The call that meets the error returns GPUARR_ERROR_DEVICE_LOST with the driver's words. From
 * then on every call on the device, or on one of its arrays, streams or events, returns
 * GPUARR_ERROR_DEVICE_LOST at once, without calling the driver, and gpuarr_last_error() names
 * the first error: "cuda:0 failed earlier: CUDA_ERROR_ILLEGAL_ADDRESS in cuStreamSynchronize".
 * A copy between the failed device and another fails the same way; other devices are not
 * affected. gpuarr_device_get_info still answers: state is GPUARR_DEVICE_FAILED, and failure
 * holds the first error ("CUDA_ERROR_ILLEGAL_ADDRESS in cuStreamSynchronize"). gpuarr_release,
 * gpuarr_stream_destroy and gpuarr_event_destroy work as ever and free what gpuarr holds on the
 * host; memory, streams and events in a dead CUDA context are not handed to the driver (they go
 * with the context).
 *
 * Other errors never fail a device: out of memory (the driver's, or injected with GPUARR_FAULTS),
 * an invalid value (GPUARR_ERROR_BACKEND), CL_OUT_OF_RESOURCES, a refused argument.
 *
 * gpuarr_device_reset(d) brings a device back, or resets a healthy one. Every array, stream and
 * event of d must have been released first (else GPUARR_ERROR_INVALID_ARGUMENT, saying how many
 * of each are alive); the threads' default streams on d go, the pools give their memory back,
 * and the device is closed and opened anew. Streams and events of d that other devices' arrays
 * or cached blocks still hold inside (work ordered across devices) are collected first, trimming
 * the other pools if need be; any left make the reset fail with GPUARR_ERROR_INVALID_ARGUMENT
 * saying so. CUDA: cuDevicePrimaryCtxReset destroys the primary
 * context (as cudaDeviceReset, for the program's own runtime code in it too) and a fresh one is
 * made; gpuarr's kernels load again at their next use and peer access is enabled again. NVIDIA
 * documents the sticky errors as needing a new process: whether a real GPU works again after
 * the reset is up to its driver (gpuarr's tests run on the fake driver of tests/fake_cuda). OpenCL:
 * the platform's context is shared by its devices and stays; the device's queues and kernels
 * are made anew, and while the device is still gone the reset fails with
 * GPUARR_ERROR_DEVICE_LOST and the device stays FAILED. The host never fails; its reset does
 * nothing. No other thread may use d during gpuarr_device_reset.
 *
 * =============================================================================================
 * KERNELS
 * =============================================================================================
 * The program's own computation, written once, runs on every device: on the host compiled by
 * the program's compiler (no compiler at run time), on OpenCL and CUDA built from the body's
 * text at its first use on a device.
 *
 *     #include <tgmath.h>  // in C, the file that defines kernels includes it (see below)
 *     GPUARR_KERNEL(saxpy, (GPUARR_SCALAR(float, a), GPUARR_IN(float, x), GPUARR_INOUT(float, y)), {
 *         int64_t i = gpuarr_index(0);
 *         y[i] = a * x[i] + y[i];
 *     })
 *     saxpy(NULL, 2.0f, x, y);  // 1-D over x's elements, on x's device, its current stream
 *     gpuarr_launch l = {.ndim = 2, .global = {w, h}};
 *     blur3(&l, in, out, w, h);
 *
 * GPUARR_KERNEL(name, (parameters), { body }), in one .c (or C++) file, defines the kernel's
 * description, `const gpuarr_kernel name_gpuarr_kernel`, and its typed launcher,
 * `gpuarr_result name(const gpuarr_launch *l, ...)`, which takes a value for each scalar and a
 * gpuarr_array for each array parameter: anything else there does not compile.
 * GPUARR_KERNEL_DECLARE(name, (parameters)) declares both for other files. Parameters, 1 to 16,
 * at least one an array: GPUARR_SCALAR(T, name) a value; GPUARR_IN(T, name) an array the body
 * reads (const T *); GPUARR_OUT(T, name) and GPUARR_INOUT(T, name) arrays it writes (T *). T is
 * one of int8_t, uint8_t, int16_t, uint16_t, int32_t, uint32_t, int64_t, uint64_t, float, double,
 * gpuarr_f16, gpuarr_bf16; any other type does not compile.
 *
 * The launch. l = NULL, or a zero field, takes the default. l->ndim 0 is 1-D over the first
 * array parameter's elements; 1..3 runs over l->global[0..ndim) (a 0 there: nothing runs, OK).
 * l->stream {0} is the arrays' device's current stream (as for conversions). Every array must
 * live on one device, where the launch runs. An array is passed as its first element, so a view
 * (gpuarr_slice, gpuarr_reshape) at any element offset works: x[i] is its element i. Ordering is
 * gpuarr's: a launch waits for the arrays' pending work (the work making them, and for a written
 * array every earlier reader and writer) and records their use on its stream, so a later gpuarr
 * call on any stream sees the results, and their memory is not reused before the kernel is done;
 * no gpuarr_array_record_stream is needed. On the host a launch runs at once over gpuarr's worker
 * threads (the index space split along its last dimension) and returns when done.
 *
 * The body is C that is also OpenCL C and CUDA C++. Besides its parameters it may use
 *   gpuarr_index(d), gpuarr_size(d)  the index along dimension d (0..2) and the index space's
 *                                    size there (int64_t; past ndim: 0 and 1)
 *   the fixed-width types, float, double; local variables and arrays; if, for, while, switch;
 *   `return`, which ends this index only
 *   gpuarr_load_f16(p, i), gpuarr_load_bf16(p, i)        element i of an f16/bf16 array as float
 *   gpuarr_store_f16(p, i, v), gpuarr_store_bf16(p, i, v) v stored rounding as conversions do
 *   sqrt fabs floor ceil round trunc fmod fmin fmax exp exp2 log log2 log10 sin cos tan atan
 *   tanh pow atan2 hypot: of float arguments a float, of double ones a double (give every
 *   argument one type: pow(x, 2.0f), not pow(x, 2))
 * and nothing else: no macros but these (the devices get the body's text as written, before the
 * program's macros expand), no other functions, globals, statics, printf, long double or
 * pointers but the parameters. The host build catches what is not C; what OpenCL or CUDA refuses
 * fails the build there (below). In C the file that defines kernels includes <tgmath.h>, so
 * that sqrt of a float is computed in float, as on the devices (with <math.h> alone C computes
 * it in double: other bits); GPUARR_KERNEL checks: without it the file does not compile, the
 * error naming `<name>_gpuarr_kernel_needs_tgmath_h_included`. C++ has the overloads (<cmath>).
 *
 * The same bits on every device for + - * / and sqrt in float and double: no contraction into
 * fma anywhere (the host's kernel functions are compiled with fp-contract off, OpenCL gets
 * #pragma OPENCL FP_CONTRACT OFF, NVRTC --fmad=false), and float division and sqrt correctly
 * rounded (NVRTC -prec-div=true -prec-sqrt=true; OpenCL -cl-fp32-correctly-rounded-divide-sqrt
 * where the device reports CL_FP_CORRECTLY_ROUNDED_DIVIDE_SQRT: PoCL does; on a device that
 * does not, OpenCL 1.2 allows 2.5 ulp for division and 3 ulp for sqrt, and the bits may differ).
 * Integer arithmetic is the same everywhere, as are the f16/bf16 loads and stores. The host
 * must evaluate float in float (FLT_EVAL_METHOD 0: x86-64 and AArch64 do), and the file that
 * defines kernels must not be compiled with -ffast-math, or with clang's -ffp-contract=fast,
 * which overrides the pragma that keeps its kernels from contracting. The math list is
 * within these bounds, in ulp of the result (the largest |result - exact|; 0.5: correctly
 * rounded, 0: exact), float / double:
 *   function                 host (glibc 2.36)   OpenCL (PoCL 3.1)   CUDA
 *   sqrt                     0.5 / 0.5           0.5 / 0.5           0.5 / 0.5
 *   fabs floor ceil round
 *   trunc fmod fmin fmax     0 / 0               0 / 0               0 / 0
 *   exp exp2                 1 / 1               1.5 / 1.5           2.5 / 1.5
 *   log log2                 1 / 1               1 / 1               1.5 / 1.5
 *   log10                    2 / 2               1 / 1               2.5 / 1.5
 *   sin cos                  1 / 1               2 / 2               2.5 / 2.5
 *   tan                      1 / 1               4 / 3               4.5 / 2.5
 *   atan                     1 / 1               1 / 1               2.5 / 2.5
 *   tanh                     2 / 2.5             1.5 / 1.5           2.5 / 1.5
 *   pow                      1 / 1               1.5 / 1.5           4.5 / 2.5
 *   atan2                    1.5 / 1             1.5 / 1.5           3.5 / 2.5
 *   hypot                    1 / 1               1 / 1               3.5 / 2.5
 * Host and OpenCL are measured by tests/test_kernel_math.c (20000 inputs per function; another
 * libm or OpenCL driver has bounds of its own). CUDA's are NVIDIA's documented maximum errors
 * plus the 0.5 of rounding, not measured: the tests run without a GPU.
 *
 * Building. OpenCL: at the first launch on a device, the body's text after a prelude (the types,
 * the conversion rules, the names above), built with -cl-std=CL1.2, the rounding option above and
 * GPUARR_OPENCL_BUILD_OPTIONS. CUDA: NVRTC (loaded at run time, see CONFIGURATION's
 * GPUARR_NVRTC_LIBRARY) compiles it for the GPU's architecture (a cubin for sm_XY; with
 * GPUARR_CUDA_KERNELS=ptx, PTX for compute_XY that the driver compiles); without NVRTC a launch
 * fails with GPUARR_ERROR_UNSUPPORTED saying what to install. Either binary is kept in the cache
 * folder (GPUARR_CACHE_DIR; see FILES AND FOLDERS for how it is trusted), keyed by the source,
 * the device, the driver or NVRTC version and the options, so a later process loads it without
 * compiling. A kernel with a double parameter on an OpenCL device without cl_khr_fp64 (or with
 * GPUARR_OPENCL_FP64=off): GPUARR_ERROR_UNSUPPORTED naming the parameter. A build that fails
 * returns GPUARR_ERROR_BUILD, its message naming the kernel, the device and the compiler's first
 * lines ("kernel blur3 did not compile for opencl:0 (clBuildProgram failed: ...): <log>");
 * gpuarr_kernel_build_log(k, d, buf, len) gives the whole log. The failure is remembered: later
 * launches on that device fail the same way without compiling again, until its reset or the
 * last gpuarr_shutdown. gpuarr_kernel_build(k, d) builds ahead of the first launch.
 *
 * Errors, found before anything is enqueued, each message naming the kernel and the parameter:
 * k NULL or not made by GPUARR_KERNEL, args NULL, a scalar's value NULL, arrays on different
 * devices, an array whose dtype is not its parameter's, a read-only array (an import marked
 * read-only) as OUT or INOUT, l->ndim outside 0..3, a negative l->global, l->stream of another
 * device, an index space CUDA cannot launch (over 2^31 - 1 blocks of 256, or y or z over 65535
 * blocks): GPUARR_ERROR_INVALID_ARGUMENT; an array not live: GPUARR_ERROR_INVALID_HANDLE; an
 * index space of more than INT64_MAX indices: GPUARR_ERROR_OVERFLOW; a wrapped array that does
 * not start at a whole element: GPUARR_ERROR_UNSUPPORTED. Launches are thread-safe.
 *
 * gpuarr_reduce(a, op, out_dtype, &out): GPUARR_SUM, GPUARR_MIN or GPUARR_MAX of every element
 * of a (any dtype and shape), converted to out_dtype (0: a's dtype) by the conversion rules, into
 * out, a new 0-d array on a's device (queued on its current stream, as a conversion). One fixed
 * tree: blocks of 256 consecutive elements folded left to right, then the blocks' results the
 * same way, until one is left, computed in out_dtype (f16 and bf16: in f32, rounded at the end),
 * so the result is the same bits on every device. Integer sums wrap. MIN and MAX: a NaN wins;
 * of equal values (-0 and +0) the first in order. SUM of an empty array is 0; MIN or MAX of one:
 * GPUARR_ERROR_INVALID_ARGUMENT; out_dtype bool: GPUARR_ERROR_UNSUPPORTED (reduce to u8).
 *
 * =============================================================================================
 * CUDA
 * =============================================================================================
 * gpuarr talks to the driver (libcuda.so.1) directly, loaded at run time: no -lcudart, no nvcc
 * needed. "cuda:N" is the runtime's device N (CUDA_VISIBLE_DEVICES applies). Each device's
 * primary context -- the one the CUDA runtime uses -- is made current around gpuarr's own
 * driver calls and the thread's previous context put back, so a program's runtime code is
 * undisturbed; GPUARR_WITH_DEVICE(dev) makes it current for the block, and
 * gpuarr_set_current_device(dev) makes it current as cudaSetDevice does, until the thread's
 * current device changes: setting another device or {0}, or the last gpuarr_shutdown (on the
 * thread that calls it; other threads set {0} before), puts back the context the thread had
 * before. gpuarr's streams are non-blocking (they never wait for the legacy stream 0); events
 * time nothing unless created with GPUARR_EVENT_TIMING. Copies from and to page-locked memory
 * (cudaHostAlloc, cudaHostRegister) are DMA on the stream. Larger ones from ordinary malloc
 * memory go through pinned staging (see MEMORY POOLS), and a cast that narrows runs on the GPU
 * before the bytes leave it. Between two GPUs that can reach each other, copies are peer to
 * peer (access is enabled once, both ways); otherwise, and between CUDA and OpenCL, through
 * pinned host memory (pipelined in synchronous calls). A CUDA device and an OpenCL device that are the same GPU (same
 * UUID, else the same full PCI address) are linked in their infos (same_as) and counted once by
 * "gpu" and "any".
 *
 * Cast kernels come from kernels/gpuarr_kernels.h, the same source as everywhere, loaded per
 * dtype pair at first use: the PTX committed in generated/gpuarr_cuda_ptx.h (made by NVRTC for
 * sm_75 and later, PTX ISA 7.0: drivers from CUDA 11.0 on), which the driver compiles for the
 * GPU and caches; if the driver refuses it, NVRTC compiles for the exact GPU, cached in
 * GPUARR_CACHE_DIR. GPUARR_CUDA_KERNELS=ptx or =nvrtc forces one way. Without either, a cast on
 * the GPU fails with GPUARR_ERROR_BACKEND giving both reasons; copies still work.
 * gpuarr_cuda_* (below) give the context, ordinal, streams and device pointers, and wrap a
 * caller's pointer or stream without taking ownership.
 *
 * A context the program made itself (cuCtxCreate) becomes a device with gpuarr_cuda_adopt(ctx,
 * &d): "cuda:N" after the devices gpuarr_init found, info.adopted set, info.same_as the cuda:K of
 * the same GPU. Every gpuarr driver call for d runs with ctx current (put back after, as for
 * primary contexts); d's memory, streams, events and kernels are made in ctx, and
 * gpuarr_cuda_context(d) returns ctx. A context is its own GPU address space: with unified
 * addressing (every 64-bit platform) a pointer's value is unique in the process, but the memory
 * belongs to the context that allocated it, and a kernel of another context -- even on the same
 * GPU -- cannot read it (two contexts of one GPU cannot enable peer access to each other). So an
 * array of d and an array of cuda:K are not interchangeable: gpuarr_cuda_wrap_ptr and
 * gpuarr_cuda_wrap_stream on d take only pointers and streams of ctx (one of the primary context
 * is refused, saying so, and the other way round), and gpuarr_convert / gpuarr_copy between d
 * and cuda:K copy the bytes on the GPU (cuMemcpyPeer, which works across contexts); to other GPUs
 * they go peer to peer where the GPUs can, else through pinned host memory, as between any two
 * devices. gpuarr holds no reference on ctx (CUDA counts none on created contexts): the caller
 * must keep it alive until gpuarr_device_remove(d) or gpuarr_shutdown, after which gpuarr never
 * touches it. gpuarr_device_reset(d) never destroys ctx: it drops gpuarr's own objects in it and
 * makes them anew; when a sticky error has corrupted ctx, which only the caller's cuCtxDestroy
 * ends, it fails with GPUARR_ERROR_DEVICE_LOST saying to remove d and adopt a new context.
 *
 * =============================================================================================
 * OPENCL
 * =============================================================================================
 * Each platform gets one context holding its devices, so arrays move between devices of one
 * platform with clEnqueueCopyBuffer and between platforms through host memory. A stream is an
 * in-order command queue with profiling on; an event is a marker. A device's global memory is
 * its allocation limit (PoCL would otherwise hand out buffers until the host runs out), a
 * request above CL_DEVICE_MAX_MEM_ALLOC_SIZE fails saying so, and buffers are made resident when
 * allocated, so running out shows at allocation. On devices that share the host's memory (PoCL,
 * integrated GPUs) arrays live in memory gpuarr allocates (CL_MEM_USE_HOST_PTR); a synchronous
 * copy below 4 MiB is one clEnqueueWriteBuffer or clEnqueueReadBuffer (the least latency), a
 * larger one runs on the host's worker threads through a map of the buffer, and an async one
 * maps too (the map is queued and the copy runs as a host function once it is done, so the call
 * does not wait). Casts run in
 * kernels built from kernels/gpuarr_kernels.h, one dtype pair at its first use, cached on disk;
 * f16 and bf16 need no cl_khr_fp16, f64 needs cl_khr_fp64 (else GPUARR_ERROR_UNSUPPORTED). A kernel build failure is GPUARR_ERROR_BACKEND with
 * the start of the build log in the message. gpuarr_opencl_* (below) give the native context,
 * queue and buffer, and wrap a caller's cl_mem or queue without taking ownership; a context
 * gpuarr did not make becomes a device of its own (ADOPTED DEVICES).
 *
 * =============================================================================================
 * ADOPTED DEVICES
 * =============================================================================================
 * A program that already owns an OpenCL context (pyopencl, clesperanto, an application that
 * makes its own at start) or a CUDA context (cuCtxCreate) hands it to gpuarr, which makes a
 * device of it; gpuarr's own devices stay as they were.
 *
 *   gpuarr_device mine;
 *   gpuarr_opencl_adopt(ctx, dev_id, queue, &mine);   // queue: in order, or NULL
 *   gpuarr_opencl_wrap_mem(mine, buf, 0, GPUARR_F32, 1, &n, &a);   // the caller's buffer
 *   gpuarr_opencl_export_mem(b, &out);                // b's bytes as a cl_mem the caller owns
 *   ...
 *   gpuarr_device_remove(mine);                       // or gpuarr_shutdown
 *
 * The new device is "opencl:N" (or "cuda:N"), N following the devices gpuarr_init found; its
 * info says adopted, and same_as names gpuarr's own view of the same device. It is a device like
 * any other -- gpuarr_device_count and gpuarr_device_at include it, its spec finds it and names it
 * in traces; pools,
 * streams, portable kernels and conversions to and from every other device work on it -- except
 * that everything gpuarr makes for it (buffers, queues, programs) is made in the caller's
 * context. OpenCL: gpuarr retains the context and, if given, the queue, on which every thread's
 * default stream of the device runs (NULL: gpuarr makes queues in that context), and releases
 * both at gpuarr_device_remove or gpuarr_shutdown. CUDA: gpuarr_cuda_adopt(ctx, &d) takes a
 * context of cuCtxCreate, which gpuarr cannot retain: keep it alive until then (the CUDA section
 * says how its arrays relate to the primary context's). Leases, plans, slots, transfer models and
 * telemetry count the device as gpuarr's own view of it: a lease or a plan step naming the
 * adopted device is given gpuarr's own view, the two share their slots, and telemetry reports
 * what the own view does.
 *
 * Buffers go both ways. gpuarr_opencl_wrap_mem on the adopted device makes an array of a buffer
 * of the caller's context (retained until the array and its views are gone: a destructor
 * callback the caller set on the buffer tells when). gpuarr_opencl_export_mem hands out an
 * array's elements as a new cl_mem (a sub-buffer of exactly its bytes), once the array's pending
 * work is complete; the caller releases it with clReleaseMemObject, and until then the memory
 * stays allocated whatever becomes of the array's handle (it returns to the pool at the next
 * array creation, gpuarr_device_sync, gpuarr_pool_get_stats, gpuarr_pool_trim,
 * gpuarr_device_remove or gpuarr_shutdown after that release; a release after
 * gpuarr_shutdown only frees the buffer, one during it is not allowed). An array that starts at
 * an offset OpenCL cannot make a sub-buffer at (not a multiple of CL_DEVICE_MEM_BASE_ADDR_ALIGN)
 * or that is empty is refused; export a copy. Work the caller enqueues on a wrapped or exported
 * buffer must be complete (clFinish, or an event gpuarr waits for) before gpuarr uses the array.
 *
 * OpenCL adoptions are refused with GPUARR_ERROR_INVALID_ARGUMENT and the reason: a NULL context or device, a device
 * that is not one of the context's, an object the driver says is not a context, a queue of
 * another context or device, an out-of-order queue, a context and device adopted already (the
 * message names that device), and a device gpuarr_init did not find itself (one GPUARR_DEVICES
 * leaves out, a sub-device): gpuarr needs its own view of the device. An OpenCL backend that is
 * not loaded (GPUARR_DEVICES leaves it out, no OpenCL library) gives GPUARR_ERROR_UNSUPPORTED.
 * OpenCL cannot tell a dangling or garbage pointer from an object: pass live ones. One gpuarr_init
 * cycle adopts 64 devices at most, removed ones included (GPUARR_ERROR_OUT_OF_MEMORY after
 * that): a removed device's handle stays refused, so its row is never reused.
 *
 * gpuarr_device_remove(d) takes an adopted device away once every array, stream and event of it
 * is released and no export holds its memory (else GPUARR_ERROR_INVALID_ARGUMENT saying what is
 * alive): it waits for the device's work, closes it and gives the context and queue back. The
 * handle then fails with GPUARR_ERROR_INVALID_HANDLE, and its spec with GPUARR_ERROR_NO_DEVICE.
 * A device gpuarr_init found is not removed (GPUARR_ERROR_INVALID_ARGUMENT).
 *
 * =============================================================================================
 * LAYERS
 * =============================================================================================
 * What follows is built on the core and lives in layers/, one header each: the trace recorder,
 * the local rank, DLPack, leases and plans, transfer models, offload and map, and (opt-in) MPI.
 * Each registers with the core (its start at gpuarr_init, its stop at the last gpuarr_shutdown,
 * the GPUARR_* variables it owns) and uses only the core and the layers listed before it. No
 * backend uses a layer.
 *
 * =============================================================================================
 * TRACING
 * =============================================================================================
 * gpuarr_trace_start(path) ... gpuarr_trace_stop(), or GPUARR_TRACE=path (started by gpuarr_init,
 * written at the last gpuarr_shutdown), records what the library does into a Chrome trace-event
 * JSON file that Perfetto (ui.perfetto.dev) and chrome://tracing open. The file is created when
 * the trace starts and written when it stops. One trace at a time. The two calls work with or
 * without gpuarr_init, and a trace they start runs across gpuarr_shutdown and a later
 * gpuarr_init (its events join the same file); stop it before the program ends, or nothing is
 * written. Errors: a second start, or a stop with no trace running, GPUARR_ERROR_UNSUPPORTED; a
 * path that is NULL, empty or cannot be written (the message gives the system's reason),
 * GPUARR_ERROR_INVALID_ARGUMENT; gpuarr_init fails the same way for a bad GPUARR_TRACE. When
 * GPUARR_TRACE is set but a trace is already running, that one goes on (a warning says so).
 *
 * What is recorded, each a complete event ("ph":"X", ts and dur in microseconds, with ns digits):
 *   transfer h2d | d2h | d2d | h2h   args bytes, count, direction, path: direct, mapped (the
 *                    device shares host memory), staged (pinned chunks), host-temp (a host cast
 *                    through a temporary), queued (async, through a host buffer), local (within
 *                    one device), peer (device to device), bounce (device to device through the
 *                    host) -- the transfer engine's own choice
 *   cast             from, to (dtypes; equal ones for the host's chunk copies of a staged
 *                    transfer, which go through the host backend's cast), count, device
 *   fill             bytes, pattern_size, device
 *   kernel build     kernel ("cast f32->i32"), origin (OpenCL: source or disk cache; CUDA:
 *                    committed ptx or nvrtc), cached (OpenCL: a binary from the disk cache was
 *                    loaded; CUDA: always false for now, NVRTC cubins from the cache included)
 *   alloc            pool (device or pinned), bytes, cache: thread (this thread's cached array),
 *                    hit (the pool's cache), miss (new memory from the backend)
 *   free             pool, bytes, to: thread (kept in this thread's cache) or pool
 *   oom: <step>      each rung of the out-of-memory ladder (handler, release oversize cached,
 *                    wait for pending frees, trim cache; shed staging cache for pinned pools):
 *                    requested, outcome (served or still out of memory)
 *   stream wait      a stream made to wait for another stream's work or an event (the waits
 *                    between streams that conversions, allocations and frees add)
 *   gpuarr_convert, gpuarr_from_host, ...  each conversion on the calling thread (the public
 *                    function's name): src, dst, count, mode (sync or async)
 * Tracks: one per thread (tid 1, 2, ... named "thread N") holds the calls, allocations, frees,
 * kernel builds and the OOM ladder; one per gpuarr stream (tid 100000 + the stream's serial,
 * named "stream opencl:0#3") holds the transfers, casts, fills and waits enqueued on it. Events
 * on a track nest (a cast inside the transfer that needed it).
 *
 * Times: begin and end are read on the calling thread around each call (args "timing":"host"),
 * so a synchronous call shows the device's time and an async one the cost of queueing it. On
 * OpenCL, whose queues have profiling on, an event on a stream's track also ends no earlier than
 * its commands' run on the device ("timing":"host+device"): their timing events are read when the
 * trace stops, or at the last gpuarr_shutdown before the backend unloads (a command not complete
 * by then leaves host times, as does one whose times are out of order or span over an hour: NVIDIA's
 * OpenCL gives a marker that waits on events such an end), and the device's clock is put on the host's by the smallest offset
 * seen between a command's queued time and the host's clock right after its enqueue (accurate to
 * about the cost of one enqueue). CUDA events here are made without timing: CUDA is host-timed
 * for now. Where
 * threads enqueue on one stream at once, an event that would overlap an earlier one on that
 * stream without fitting inside it is shown starting when that one ends (a stream runs in order).
 *   lease acquire    each gpuarr_lease_acquire (and GPUARR_WITH_LEASE), its wait included, on the
 *                    calling thread: args device (when granted), slots, waited (whether it had to
 *                    wait), outcome (granted, or the result's name: GPUARR_ERROR_TIMEOUT, ...)
 *
 * Bounds: each thread records into a buffer of its own of GPUARR_TRACE_EVENTS events (every
 * event it records, whichever track it is drawn on; 1..2^24, default 65536, 112 bytes each; read
 * at gpuarr_init, or at gpuarr_trace_start when not initialized); when it is full, that
 * thread's further events are dropped and counted. An event is recorded when it ends, so an outer
 * event may be the one dropped while the events inside it were kept. The file gives the total in
 * otherData.dropped_events and each thread's in its thread_name args. A thread that exits during
 * a trace hands its buffer to the writer. A buffer is kept by its thread for the next trace.
 *
 * Cost: off, each hook is one relaxed load and a predicted branch (bench/results/
 * trace-overhead.md measures it against a build with the hooks compiled out, GPUARR_NO_TRACE);
 * on, each event costs two clock reads and an uncontended lock of the thread's buffer (that file
 * gives the figure), an OpenCL command a retain of its event, and gpuarr_trace_stop reads the
 * device times, sorts and writes everything.
 * tests/python/check_trace.py validates a trace file against the format.
 *
 * =============================================================================================
 * LOCAL RANK
 * =============================================================================================
 * A program started as several processes on one machine (mpirun, srun) gives each process a
 * device of its own with the spec "local", and gpuarr's core needs no MPI for it.
 * gpuarr_local_rank(&rank, &variable) reads the node-local rank that the launcher puts in the
 * environment. It takes the first of these that is set and not empty: OMPI_COMM_WORLD_LOCAL_RANK
 * (Open MPI), MV2_COMM_WORLD_LOCAL_RANK (MVAPICH2), MPI_LOCALRANKID (MPICH, Intel MPI),
 * SLURM_LOCALID (srun), PMI_LOCAL_RANK. It reads them at each call and needs no gpuarr_init.
 * variable is set to the name it used; when none is set, variable is NULL and rank is 0 (a lone
 * process is local rank 0). A value that is not a decimal integer 0..999999999 is
 * GPUARR_ERROR_INVALID_ARGUMENT, and the message names the variable and the value.
 *
 * "local" is device r mod n of the n devices other than the host that GPUARR_DEVICES allows,
 * in registry order (CUDA's, then OpenCL's). A GPU seen through CUDA and OpenCL counts once,
 * through its CUDA view. Every device counts, not only GPUs: PoCL's two CPU devices are two. A
 * FAILED device keeps its place, so that processes map alike without talking to each other;
 * give them all the same GPUARR_DEVICES. When no device other than the host is left, "local" is
 * the host. "local:R" is the same with the rank R given (a decimal integer 0..999999999), reading
 * no variable. Both work in gpuarr_device_find, in the candidate lists of leases and plans, and
 * in `gpuarr-info --find`. A bad variable makes "local" fail as gpuarr_local_rank does; a malformed
 * R ("local:", "local:x", "local:-1") is GPUARR_ERROR_INVALID_ARGUMENT.
 *
 * "local" by itself places processes, and limits nothing: with more processes than devices,
 * several share one. A lease on "local" keeps each device to its slots, through the slot files
 * that processes share (see LEASES: the same GPUARR_LEASE_DIR and GPUARR_SLOTS in every
 * process). A process that holds such a lease for its lifetime waits while other processes hold
 * its device's slots, or fails once desc.timeout_ms has passed:
 *
 *     gpuarr_lease_desc ld = {0};
 *     ld.devices = "local"; ld.timeout_ms = -1;        // wait as long as it takes
 *     gpuarr_lease lease;
 *     gpuarr_device dev;
 *     gpuarr_lease_acquire(&ld, &lease);               // with GPUARR_SLOTS="opencl:*=1": one
 *     gpuarr_lease_device(lease, &dev);                // process per device at a time
 *
 * On a timeout, GPUARR_ERROR_TIMEOUT's message says how the device was chosen, then who holds
 * it: 'no 1 free slot on "local" (local rank 3 from OMPI_COMM_WORLD_LOCAL_RANK: opencl:1 (3 mod 2
 * devices = 1)) within 100 ms: opencl:1: 0 of 1 slots in use in this process; in other processes
 * (slot 0 pid 4242 thread 4242 host H program NAME, held for 12 s)'. When the
 * device has failed, GPUARR_ERROR_DEVICE_LOST's message says the same.
 *
 * =============================================================================================
 * DLPACK
 * =============================================================================================
 * Arrays go to and come from other libraries (NumPy, PyTorch, CuPy, ...) through DLPack v1.1
 * without a copy. Include <dlpack/dlpack.h> (1.x) before gpuarr.h to use its types; otherwise
 * gpuarr.h declares the same ones under DLPack's names and include guard.
 *
 *   DLManagedTensorVersioned *t;
 *   gpuarr_to_dlpack(a, 0, &t);          // or GPUARR_DLPACK_READ_ONLY; _legacy: DLManagedTensor
 *   ... the consumer uses t, then calls t->deleter(t) exactly once ...
 *   gpuarr_from_dlpack(t2, &b);          // b shares t2's memory; gpuarr now owns t2
 *
 * Export: the tensor holds the array's memory, as a view does, until its deleter runs: the
 * handle may be released first, and is then gone (a release too many fails with
 * GPUARR_ERROR_INVALID_HANDLE and takes nothing from the tensor); the deleter may run on any thread, and after gpuarr_shutdown (then it only
 * frees the tensor: the array went with the shutdown), but not during it. gpuarr_to_dlpack
 * returns when the array's contents are complete; gpuarr_to_dlpack_async(a, consumer, ...)
 * instead makes the `consumer` stream wait for them and returns at once. A read-only array
 * exports with DLPACK_FLAG_BITMASK_READ_ONLY set; gpuarr_to_dlpack_legacy refuses it
 * (GPUARR_ERROR_INVALID_ARGUMENT: a legacy tensor cannot carry the flag). Devices: host ->
 * kDLCPU, pinned host memory of a CUDA device -> kDLCUDAHost, cuda:N -> kDLCUDA N, opencl:N ->
 * kDLOpenCL N. Dtypes: bool -> kDLBool 8 bits, i8..i64 -> kDLInt, u8..u64 -> kDLUInt,
 * f16/f32/f64 -> kDLFloat, bf16 -> kDLBfloat 16, lanes 1. shape and strides (compact, in
 * elements) are always filled.
 * data + byte_offset is the first element: on the host and CUDA data is the start of the
 * memory the array shares and byte_offset a view's offset into it; on OpenCL data is the cl_mem
 * and byte_offset the first element's offset in that buffer in bytes, as gpuarr_opencl_mem gives
 * it (non-zero for pooled arrays too).
 *
 * Import: version major 1 (else GPUARR_ERROR_UNSUPPORTED), lanes 1 and a dtype above
 * (UNSUPPORTED), compact strides or NULL (non-compact: UNSUPPORTED), kDLCPU / kDLCUDAHost (the
 * host), kDLCUDA, kDLOpenCL of a device gpuarr has (else GPUARR_ERROR_NO_DEVICE), ndim 0..8.
 * gpuarr takes the tensor whatever the outcome (t not NULL): the producer's deleter is called
 * exactly once, when the last reference to the array and its views goes, or before an error
 * returns. A tensor flagged DLPACK_FLAG_BITMASK_READ_ONLY gives a read-only array
 * (gpuarr_array_info.read_only, inherited by views, exported read-only): gpuarr_write(_async),
 * gpuarr_fill(_as) and gpuarr_copy(_async) into it fail with GPUARR_ERROR_INVALID_ARGUMENT
 * (gpuarr_host_data still returns its address: do not write through it).
 *
 * From Python, the module python/gpuarr (ctypes, no build step; installed by make install) does
 * all of this: gpuarr.Array's __dlpack__ hands out a DLManagedTensorVersioned when the consumer
 * passes max_version >= (1, 0), and a legacy DLManagedTensor (gpuarr_to_dlpack_legacy) when it
 * passes none, as JAX does; gpuarr.from_dlpack takes whichever capsule the producer returns
 * (JAX returns a legacy one even when asked for 1.0). Without the module, with ctypes alone
 * (tests/python/test_numpy.py): wrap an exported tensor in a capsule made by CPython's
 * PyCapsule_New with the name gpuarr_dlpack_capsule_name(true, false) ("dltensor_versioned";
 * false, false: "dltensor" for a legacy one) and gpuarr_dlpack_capsule_destructor as its
 * destructor, which calls the tensor's deleter unless a consumer took the capsule (renamed it
 * "used_..."). To import, take the pointer out of a producer's capsule, rename the capsule
 * gpuarr_dlpack_capsule_name(versioned, true) and pass the pointer to gpuarr_from_dlpack, or to
 * gpuarr_from_dlpack_legacy for a "dltensor" capsule. The names are static strings, valid as
 * long as the library is loaded; the destructor finds CPython's functions in the running process
 * (dlsym) and does nothing outside Python.
 *
 * =============================================================================================
 * LEASES
 * =============================================================================================
 * A lease is a slot on a device, taken for a piece of work and given back after it, so that
 * threads sharing a few devices spread over them and never crowd one. Each device has a number
 * of slots; gpuarr_lease_acquire(&desc, &lease) takes desc.slots of them (0 = 1) on one device
 * among desc.devices, gpuarr_lease_device(lease, &dev) says which, and gpuarr_lease_release
 * gives them back. A lease says where work runs, not how much memory it may use: nothing stops
 * the holder from allocating more than its share. Pair it with a pool limit for that:
 *
 *     gpuarr_lease_desc ld = {0};
 *     ld.devices = "opencl:*"; ld.timeout_ms = 5000;
 *     GPUARR_WITH_LEASE(&ld, dev) {                       // dev: the leased device, current here
 *         gpuarr_pool_set_limit(dev, 2ull << 30);         // and its pool capped (per device)
 *         gpuarr_zeros(dev, GPUARR_F32, 1, shape, &a); ...
 *     }                                                   // released here
 *
 * Slots count per physical device: a GPU seen through CUDA and OpenCL (info.same_as) has one count,
 * whichever view is leased. Defaults: the host has one slot per online CPU; every other device
 * ceil(online CPUs / devices other than the host) (OpenHCS's rule; a GPU seen through two backends
 * counts once). GPUARR_SLOTS (or desc.slots, which takes its place) sets them at gpuarr_init:
 * comma separated <device>=<slots>, device host, cpu, cuda, cuda:*, cuda:N, opencl, opencl:*,
 * opencl:N, slots 1..65536, later items over earlier ones; an item naming no present device is
 * ignored (logged at info level); a malformed one fails gpuarr_init with
 * GPUARR_ERROR_INVALID_ARGUMENT naming the variable. A second gpuarr_init whose desc.slots
 * differs fails like any other differing field. gpuarr_device_set_slots(d, n) changes them at
 * run time (n from 1, not below the slots in use: else GPUARR_ERROR_INVALID_ARGUMENT);
 * gpuarr_device_get_slots(d, &total, &in_use) reads them.
 *
 * desc.devices lists the candidates (NULL = "gpu"): "gpu" is every GPU (GPUARR_ERROR_NO_DEVICE
 * when there is none), "any" every GPU, else the host; "all" every device, the host included,
 * each physical device once; "cuda" or "cuda:*" every CUDA device, "cuda:N" one, the same for
 * opencl; "host"; "local" or "local:R", the one device of a local rank (see LOCAL RANK). A
 * malformed item is GPUARR_ERROR_INVALID_ARGUMENT, a device not present (or left out by
 * GPUARR_DEVICES) GPUARR_ERROR_NO_DEVICE. A device that has FAILED (see FAILURES) is never
 * leased; when every candidate has failed the call returns GPUARR_ERROR_DEVICE_LOST at once.
 * Among the candidates with enough free slots (and, when
 * desc.memory_bytes is set, at least that much free memory: the device's, less what its pool's
 * limit leaves), desc.placement chooses: DEFAULT and LEAST_LEASED the smallest share of slots in
 * use, ties by most free memory, then list order; MOST_FREE the most free memory, ties by least
 * leased; ROUND_ROBIN the next candidate in list order after the one this process leased last.
 * Before that, desc.affinity: a lease whose key matches a live lease goes to that lease's
 * physical device while it has free slots (and is a candidate), through whichever view the
 * candidates name, so a "cuda:0" lease and an "opencl:*" lease with one key share the GPU when
 * the registry links the two.
 *
 * With no slot free, the call waits up to desc.timeout_ms (0 = try once, < 0 = forever), first
 * come, first served: a waiter takes a slot of a device only when no waiter that came before it
 * also wants that device (so one waiting for a busy device never holds up one for a free device).
 * Releases and gpuarr_device_set_slots wake waiters; a wait for memory also looks again every
 * 50 ms. When the time is up: GPUARR_ERROR_TIMEOUT, and gpuarr_last_error() says, per candidate,
 * how many slots are in use and by whom (pid, thread id, slots, for how long), or that it failed.
 * *out is written only on success.
 *
 * GPUARR_WITH_LEASE(&desc, dev) { ... } acquires a lease, declares gpuarr_device dev for the
 * block and makes it the current device, and releases the lease when the block ends normally,
 * by break or by continue (return and goto skip the release, as in GPUARR_WITH_DEVICE); when no
 * lease can be had the block is skipped, and GPUARR_WITH_LEASE_R(&desc, dev, &result) says why.
 * The lower level: gpuarr_scope_enter_lease(&desc) / gpuarr_scope_leave.
 *
 * Errors: out NULL, desc.placement not a gpuarr_placement, desc.slots < 0 or more than any
 * candidate has, desc.affinity "" or longer than 127 characters, desc.devices "" or malformed:
 * GPUARR_ERROR_INVALID_ARGUMENT naming the field. A zero, released (the message says "released
 * already"), stale or forged lease, also one from an earlier gpuarr_init: GPUARR_ERROR_INVALID_HANDLE.
 * gpuarr_shutdown drops the leases still held (with a warning); no call may wait in
 * gpuarr_lease_acquire when the last gpuarr_shutdown runs. All lease calls are thread-safe.
 *
 * Across processes. Slots are shared by every process of the user that uses the same folder,
 * GPUARR_LEASE_DIR (an absolute path; default $XDG_RUNTIME_DIR/gpuarr, else /tmp/gpuarr-<euid>,
 * the effective uid, so a setuid program uses its own; made, mode 0700, at the first acquire, and
 * used only as FILES AND FOLDERS says; off: leases are per process). Slot k of a device is the
 * file <folder>/<key>.<k>.slot, key = the device's UUID ("GPU-..."), else its PCI address
 * ("pci-0000:3b:00.0"), else the host name and spec ("myhost-opencl-0"): two views of one GPU, and
 * two processes that number devices differently, meet in the same files. A lease holds an flock on
 * one file per slot, and the file says who: "pid P thread T host H program NAME since UNIX-TIME".
 * The kernel drops the lock when the holder exits or is killed, so a crashed holder's slot is free
 * at once. The files are opened O_CLOEXEC, and a child made by fork closes its copies (a
 * pthread_atfork handler), so a child, exec'd or not, never keeps its parent's slot alive; in the
 * child, the parent's leases are still handles there but hold nothing. The processes should agree
 * on the slots (the same GPUARR_SLOTS): each counts files up to its own number. Between processes
 * there is no queue: a waiter looks again every 25 ms, so first come, first served holds within a
 * process only; placement counts this process's leases only. A folder or file that cannot be
 * made or opened, or is refused (another user's folder, a symlink, ...), fails gpuarr_lease_acquire
 * with GPUARR_ERROR_BACKEND giving the path and the reason ("the lease folder /tmp/gpuarr-1000 is
 * owned by uid 1001, not by this user (uid 1000): not used"); gpuarr_lease_summary fails alike
 * for a refused folder, and shows a slot file it cannot use as "not usable: ...". The timeout message names other processes' holders as their files do.
 * gpuarr_lease_summary(d, buf, len) writes a line per slot of d ("opencl:0 slot 1: free", or what
 * its file says of the holder), and `gpuarr-info --leases` prints it for every device (a GPU seen
 * by two backends once).
 *
 * =============================================================================================
 * PLANS
 * =============================================================================================
 * gpuarr_plan(steps, count, placement, out) chooses a device for each step of a pipeline before
 * any of it runs, so that a pipeline that cannot run fails at once, naming the step, rather
 * than midway. A step says where it may run (devices, a list as for leases: "host", "gpu",
 * "any", "cuda", "opencl:1", ...; NULL = "gpu"), what it needs (GPUARR_NEED_FP64: f64
 * arithmetic, which an OpenCL device without cl_khr_fp64, or with GPUARR_OPENCL_FP64=off,
 * lacks) and the device memory it uses at its peak (memory_bytes). A candidate can take a step
 * when it has not FAILED, has what the step needs, and its capacity is at least memory_bytes:
 * capacity is the device's total memory, or its pool's limit when lower. Capacity, not free
 * memory: what is free changes before the step runs (a lease's memory_bytes waits for free
 * memory when it does). Steps run one after another, so each step's memory is checked alone.
 *
 * The physical device that can take the most steps takes them all, so a pipeline stays on one
 * GPU where it fits and its arrays need no transfer between steps; the next takes the most of
 * the rest, and so on (host steps go to the host). A GPU seen through CUDA and OpenCL is one
 * physical device: a "cuda" step and an "opencl" step land on the same GPU, each through the
 * view its list names. Ties go as placement says (as for leases, counting this process's
 * leases): DEFAULT and LEAST_LEASED the smaller share of slots in use, then more free memory,
 * then registry order; MOST_FREE free memory first; ROUND_ROBIN the device after the one the
 * previous plan (of any thread) chose first, so plans made in a loop spread over the GPUs.
 *
 * out[i] is written for every step on success, and nothing is written on failure. A step no
 * candidate can take: GPUARR_ERROR_NO_DEVICE, "steps[2] ("denoise"): no device can take it:
 * opencl:0 has no fp64; cuda:0 has 8.0 GiB, the step needs 12.0 GiB". Bad arguments (steps or
 * out NULL, count outside 1..4096, placement, a step's needs with bits that are no
 * GPUARR_NEED_*, devices "" or malformed): GPUARR_ERROR_INVALID_ARGUMENT naming them. A plan
 * reserves nothing: to hold its devices while the pipeline runs, take a lease on each (desc
 * devices = the device's spec).
 *
 * =============================================================================================
 * TRANSFER MODEL
 * =============================================================================================
 * gpuarr_transfer_estimate(src, dst, t, bytes, &seconds) predicts how long moving data to device
 * dst takes, so that a program (or a scheduler) can weigh a transfer against the work it saves.
 * src is an array -- its device, its dtype, its memory: pinned when it is a pinned host array made
 * for dst, else pageable host memory or its device's memory; bytes 0 = the whole array -- or a
 * device: pageable host memory for the host, else its device memory, and t its dtype too. The data
 * arrives as dtype t (for an array, 0 = its own). _Generic picks the form from src in C, two
 * overloads in C++; gpuarr_transfer_estimate_array and gpuarr_transfer_estimate_device are the
 * plain names.
 *
 * Moving nothing costs 0 s: the same device and dtype, or no bytes. The host and a device that
 * shares its memory (info.host_unified) are no exception: gpuarr_convert and gpuarr_copy between
 * them copy the data into another array, so that transfer is modeled like any other. Otherwise
 * the estimate is latency + bytes / bandwidth, from a model of the transfer's kind: per source device,
 * destination device, source memory (pageable, pinned or device) and whether the dtype changes.
 * A model is fitted the first time it is needed, from gpuarr's own synchronous copies: 64 KiB,
 * 1 MiB and 16 MiB, the median of 5 each (one spike in five changes nothing), by least squares on
 * the relative error, with latency >= 0. A cast is measured f32 -> i32; other casts scale the bytes
 * by the bytes read and written (f32 -> f16: 3/4). gpuarr_calibrate(d) fits every kind that
 * involves d at once, replacing the models there were: host <-> d both ways, pageable and pinned,
 * with a cast and without (a unified d too); d -> d with a cast; d <-> every other
 * device; for the host, host -> host with a cast and host <-> every device. `gpuarr-bench
 * --calibrate` calibrates every device and prints the models. A fit that fails (out of memory, say)
 * leaves its transfer at the fallback below for the rest of the process unless gpuarr_calibrate
 * fits it; gpuarr_calibrate fails with the first such error, naming the transfer ("fitting host ->
 * opencl:0 pinned copy: ...").
 *
 * Models are kept in <cache dir>/models (GPUARR_CACHE_DIR; off: in the process only), a file per
 * pair of devices named by their UUID, else PCI address, else host name and spec, written and
 * read as FILES AND FOLDERS says. A file records the host's name and both devices'
 * info.version (driver, platform or OS version): a file whose record differs (a new driver) is
 * not used, and its models are fitted again when needed. A file that is corrupted or cut short is
 * ignored with a warning naming it, and written whole again when its models are fitted.
 * GPUARR_CALIBRATE=off fits nothing that gpuarr_calibrate does not ask for. A transfer with no
 * model (fitted, or read from a file) is estimated at bytes / 1 GB/s (0 within one device), the
 * fallback; with GPUARR_CALIBRATE=off and no file, no file is written.
 *
 * gpuarr_transfer_models_summary(buf, len) writes a line per model of this process, those in the
 * files of its devices included: "host -> opencl:0 pinned copy: latency 21.0 us, 14.817 GB/s
 * (measured)" (measured, loaded or set), NUL-terminated; every line ends with a newline, and a
 * summary longer than len keeps the whole lines that fit. Errors: seconds or buf NULL,
 * len 0, t not a dtype (for a device src, 0 too), bytes more than the array holds:
 * GPUARR_ERROR_INVALID_ARGUMENT; src, dst or d not live: GPUARR_ERROR_INVALID_HANDLE; one of them
 * FAILED (see FAILURES): GPUARR_ERROR_DEVICE_LOST; *seconds is written only on success. The calls are thread-safe, and threads that need a model being fitted
 * wait for that fit rather than run their own. An estimate is no promise: on a machine busy with
 * other work a transfer takes longer (bench/results/transfer-model.md compares both).
 *
 * =============================================================================================
 * OFFLOAD
 * =============================================================================================
 * A task is a piece of the program's own work with an implementation per backend it has (a host
 * function, a CUDA launcher, an OpenCL launcher); gpuarr_offload runs it where it is predicted
 * to finish first, and gpuarr_map runs it over many items on every candidate device at once.
 *
 *     static gpuarr_result widen(const gpuarr_array *in, int n_in, gpuarr_array *out, int n_out,
 *                                gpuarr_stream s, void *user) {  // on the current device, on s
 *         return gpuarr_convert_async(in[0], gpuarr_current_device(), GPUARR_F64, s, &out[0]);
 *     }
 *     gpuarr_task_desc td = {0};
 *     td.name = "widen"; td.n_in = td.n_out = 1;
 *     td.impl[GPUARR_BACKEND_HOST] = td.impl[GPUARR_BACKEND_OPENCL] = widen;
 *     gpuarr_task_create(&td, &task);
 *     gpuarr_offload(task, &in, 1, &out, 1, NULL, &ran_on);     // NULL desc: every device, auto
 *
 * An implementation is called with every input on its device (converted to desc.in_dtype[i]
 * when set, 0 = as given; gpuarr_convert's rules), that device current, and a stream of it to
 * enqueue on; it makes its outputs (out[] are {0} on entry) and returns OK or an error. A task
 * desc: name (1 to 63 of A-Z a-z 0-9 _ . -: it names the model files), impl[] indexed by backend
 * (at least one unless desc.kernel, below; impl[0] must be NULL), n_in and n_out 1..8, in_dtype,
 * size (the size metric the models fit against; NULL = elements of in[0]), user_data. A bad field:
 * GPUARR_ERROR_INVALID_ARGUMENT naming it. gpuarr_task_destroy ends the handle (a destroyed, zero
 * or forged task: GPUARR_ERROR_INVALID_HANDLE; "destroyed already" for one destroyed); a call
 * running the task on another thread keeps it until it returns. gpuarr_shutdown drops the tasks
 * left (with a warning), and a task of an earlier gpuarr_init is stale.
 *
 * A task from a portable kernel (see KERNELS) needs no implementation at all: desc.kernel =
 * &name_gpuarr_kernel (impl[] all NULL) runs on every device whose backend runs portable kernels.
 *
 *     GPUARR_KERNEL(scale, (GPUARR_SCALAR(float, a), GPUARR_IN(float, x), GPUARR_OUT(double, y)), {
 *         int64_t i = gpuarr_index(0);
 *         y[i] = (double)(a * x[i]);
 *     })
 *     float a = 2.0f;
 *     gpuarr_task_desc td = {0};
 *     td.kernel = &scale_gpuarr_kernel;     // name "scale", n_in 1, n_out 1, in_dtype[0] f32
 *     td.kernel_scalars[0] = &a;            // parameter 0's value, copied now
 *     gpuarr_task_create(&td, &task);
 *
 * Its IN parameters take the inputs in order (each converted to the parameter's dtype on the way,
 * as in_dtype does); each OUT parameter is an array it makes on the chosen device, of in[0]'s
 * shape and the parameter's dtype; the launch is the default one (1-D over the kernel's first
 * array parameter's elements) on the call's stream. Scalars are bound at gpuarr_task_create:
 * kernel_scalars[i] is the address of parameter i's value (NULL for an array parameter), copied
 * by the parameter's size; a scalar that changes per call is another task (or an input array). A
 * name NULL takes the kernel's name; n_in and n_out 0 take the kernel's IN and OUT counts, and
 * in_dtype[i] 0 the i-th IN parameter's dtype. GPUARR_ERROR_INVALID_ARGUMENT naming the field or
 * the parameter: impl[] set as well; an INOUT parameter (a task never writes its inputs: an IN and
 * an OUT instead); no IN or no OUT parameter, or more than 8; n_in, n_out or in_dtype[i] set and
 * not the kernel's; a scalar's address NULL, or one given for an array parameter. A device that
 * runs portable kernels but cannot build this one (CUDA without NVRTC, a double kernel without
 * fp64) fails the call with the build's error: leave it out of desc.devices.
 *
 * Where it runs. Candidates: desc.devices, a list as for leases (NULL = "all": every device, the
 * host included, each physical device once), less those with no implementation for their
 * backend and those FAILED. desc.policy (DEFAULT: GPUARR_OFFLOAD, else AUTO): HOST runs on the
 * host always (GPUARR_ERROR_UNSUPPORTED when the task has no host implementation,
 * GPUARR_ERROR_NO_DEVICE when desc.devices leaves the host out); GPU on a candidate other than
 * the host always (GPUARR_ERROR_NO_DEVICE when there is none), chosen as AUTO chooses; AUTO
 * picks the candidate with the least predicted cost: input transfers (each input from where it
 * is to the candidate, at the task's dtype) + compute (the task's model there) + output transfers
 * (to desc.out_device, when set) + queue wait (the predicted compute of the work this process's
 * gpuarr_offload and gpuarr_map calls have running or waiting there). While no candidate has a
 * measurement of the task, the 1 MiB rule decides: more than 1 MiB of input goes to the best
 * device other than the host, the rest to the host.
 *
 * Models. One per (task name, device), over the last 32 runs: the median time and size per
 * power-of-two size bucket, so a few slow runs move nothing. The prediction at a size measured
 * is its bucket's median; between two buckets, on the line joining their medians; beyond the
 * largest, its median plus the slope b of a robust line t = a + b * size through the buckets
 * (Theil-Sen; a single bucket: t proportional to size); below the smallest, the smallest's median,
 * never less: a call smaller than any measured costs at least the fixed cost the small calls
 * measured (a line fitted over a wide range of sizes loses it). Once a model has
 * 5 samples, a run outside x3 or /3 of its prediction is refused as an outlier (counted in
 * stats.rejected), so a spike cannot poison it, except at a new size: more than 4x above the
 * largest or below the smallest size the model has samples of, where an extrapolation is no
 * measure of what is normal. 4
 * outliers in a row on the same side mean the device itself changed, and the model starts over
 * from them. A run's time is wall time from the call to the end of a sync of its stream (the
 * host: the call). The first run of a task on a device in a process is a warm-up (PoCL building
 * the kernel, first touches of memory: up to 100x the steady time), and so is every run that
 * started there before it finished (gpuarr_map's streams start together): while the model has
 * fewer than 5 samples such a run counts in stats.calls but its time is not added, so one slow
 * first run cannot make a device look too slow ever to be tried again; a model of 5 samples or
 * more (read from the cache folder, say) judges it as any run. A program that runs a task once
 * per process on a device teaches a young model nothing there. Exploration: a run on a candidate
 * other than the models' choice, to measure it, only while its estimate (unknown compute taken
 * as the fastest measured one) is within 10x of the best candidate's: a device with fewer than 2
 * samples, at most 3 times per task, device and process (the warm-up and 2 samples); a device
 * measured, at a new size (as above), at most twice per task, device, size octave and process
 * (a warm-up, then a sample). A sanity bound between twins (same backend, name, vendor and compute units): a
 * model more than 3x slower than the median of its measured twins' at the same size is taken for
 * a poisoned one; its twins' median stands in, and it is explored again. Models live in the cache
 * folder (GPUARR_CACHE_DIR, see CONFIGURATION; off = this process only), a file per task and
 * device, task-<name>-<hash>.model, keyed by host name, backend, the device's UUID (else PCI
 * address, else spec), name and driver version: a changed driver starts from nothing. Written
 * atomically (see FILES AND FOLDERS) at once while a model is young, then at most once a second
 * and at gpuarr_shutdown; a corrupted or refused file is ignored with a warning naming it, and rebuilt.
 *
 * Outputs land where they were computed, or on desc.out_device, as desc.out_dtype when set (the
 * implementation's own outputs are released then). desc.lease: the call holds a lease on the
 * chosen device while it runs (waiting as long as it takes; see LEASES), and chooses among the
 * candidates with a free slot when any has one. out[] and *ran_on are written only on success;
 * an implementation's error is the call's ("task "widen" on opencl:0: ..."), with the message of
 * the gpuarr call that failed in it, or its own: an implementation returns
 * gpuarr_set_error(r, "...") to say why (a bare error result: "the implementation returned
 * GPUARR_ERROR_..."). Bad arguments (in,
 * out NULL; n_in or n_out not the task's; an input that is not a live array; desc.policy,
 * desc.out_dtype, desc.streams out of range; desc.devices "" or malformed; desc.out_device):
 * GPUARR_ERROR_INVALID_ARGUMENT or GPUARR_ERROR_INVALID_HANDLE naming them.
 *
 * gpuarr_map(task, in, n_items, out, &desc, &failed_item) runs item i on in[i * n_in ...] and
 * puts its outputs at out[i * n_out ...]. Each candidate device gets desc.streams worker threads
 * (0 = 2, at most 16), each with its own stream; they take items in index order from one shared
 * counter, so one thread's upload overlaps another's compute and a faster device comes back for
 * more; a device whose measured time for an item is more than 4x the best candidate's leaves the
 * rest to the others. Every input is checked before any item runs. When an item fails, no new
 * item starts, the running ones finish, every output made is released (out[] all {0}),
 * *failed_item (may be NULL; untouched otherwise) is the lowest index among the failed items,
 * and the error is that item's, with its implementation's message ("item 5: task "widen" on
 * opencl:0: ..."). desc.item_devices (NULL = not wanted) receives, on success only, n_items
 * entries: the device item i ran on, one of the candidates (gpuarr_offload ignores it: its ran_on
 * says). Its runs feed the models and statistics as gpuarr_offload's do.
 *
 * gpuarr_task_get_stats(task, d, &stats): per task name and device, this process's runs (calls),
 * explorations and how many of them changed the choice, the sums of predicted and measured
 * seconds, and the model (the robust line's a and b, samples, rejected). gpuarr_task_models_summary(buf, len) writes a
 * line per model known, those in the cache folder for this machine's devices included (each line
 * ending with a newline; the whole lines that fit in len, as for the transfer models):
 * `gpuarr-info --models` prints it, after the transfer models. All of these calls are thread-safe; no call may run in them
 * when the last gpuarr_shutdown runs.
 *
 * =============================================================================================
 * MPI
 * =============================================================================================
 * An opt-in part for programs that run as MPI ranks: define GPUARR_MPI and include <mpi.h> before
 * gpuarr.h (in every file that uses it, and in the one with the implementation, which then needs
 * the MPI library: mpicc, or the flags of `mpicc --showme`). GPUARR_MPI without <mpi.h> stops at
 * an #error. The core never needs MPI, and libgpuarr (make lib) is built without this part.
 *
 *     MPI_Init(&argc, &argv);
 *     gpuarr_init(NULL);
 *     gpuarr_device dev;
 *     gpuarr_mpi_device(MPI_COMM_WORLD, &dev);           // this rank's device on its node
 *     ...
 *     gpuarr_mpi_sendrecv(out, 0, -1, right, 0,           // all of out to rank `right`
 *                         in, 0, -1, GPUARR_F32, left, 0, // into in, from rank `left`, cast
 *                         MPI_COMM_WORLD);                // from f32 to in's dtype
 *
 * gpuarr_mpi_device(comm, &dev) is collective over comm: the rank's number among comm's ranks on
 * its node (MPI_Comm_split_type with MPI_COMM_TYPE_SHARED) is R, and dev is gpuarr_device_find
 * of "local:R" (see LOCAL RANK).
 *
 * gpuarr_mpi_send(a, first, count, dest, tag, comm) sends elements [first, first + count) of a,
 * in C order (count -1 = to the end), and gpuarr_mpi_recv(a, first, count, sent, source, tag,
 * comm) receives into them; a may be on any device, the two ranks' devices need not be alike.
 * The elements travel in the sender's dtype (a send never casts); the receiver names that dtype
 * in `sent` (0 = its own) and the elements are cast to its array's dtype on the way in, by the
 * CONVERSION RULES. gpuarr_mpi_isend and gpuarr_mpi_irecv start the same and return a request;
 * gpuarr_mpi_wait(&req) finishes it and sets req to {0} ({0} itself returns GPUARR_OK at once).
 * gpuarr_mpi_sendrecv does a receive and a send together (halo exchanges, rings). Every wait (the
 * blocking calls wait too) moves every pending transfer of the process on, so a ring of isends and
 * irecvs, waited for in any order, completes; between gpuarr_mpi calls nothing moves (MPI itself
 * may still deliver what was posted). source and dest may be MPI_PROC_NULL (nothing happens, as
 * in MPI); source MPI_ANY_SOURCE and tag MPI_ANY_TAG work in receives. As with MPI's own buffers, the
 * elements of a pending transfer must not be written (a send's) or used (a receive's) until its
 * wait has returned: a send may read them, chunk by chunk, until then. The array itself may be
 * released while a transfer of it is pending: the transfer holds a reference of its own until
 * its wait returns, and a release of the array too many fails (GPUARR_ERROR_INVALID_HANDLE) as
 * for any stale handle.
 *
 * On the wire a transfer is several MPI messages on comm with the given peer and tag: a 32-byte
 * header (dtype, count, chunk size; both ranks must share the byte order) and the elements in
 * chunks of GPUARR_MPI_CHUNK bytes (the sender's; default 4 MiB, from 8 bytes to 1 GiB, K/M/G
 * suffixes). Transfers between two ranks on one comm and tag arrive whole and in the order they
 * were started: a send posts nothing until the sends started before it to that rank and tag
 * have posted their last chunk, and a receive nothing until the receives started before it that
 * could take the same messages (the same or a wildcard source and tag) have taken their header
 * and posted their last chunk. So a receive with a wildcard also waits for an earlier receive
 * whose message has not come yet, where MPI would let it match another message first. Do not
 * mix gpuarr transfers with your own MPI messages on that tag and peer: a plain MPI message
 * where a gpuarr one is expected is refused (GPUARR_ERROR_INVALID_ARGUMENT). Host arrays with
 * no cast go to and from MPI directly. Other transfers are staged through two chunk-sized
 * buffers from the device's pinned pool (gpuarr_empty_pinned; for a host array with a cast, the
 * host's pool), with the device copies (gpuarr_read_async / gpuarr_write_async, which cast) on
 * the stream {0} of the thread whose call moves the transfer: while one chunk travels, the next
 * is copied. With a
 * CUDA-aware MPI, CUDA arrays with no cast skip the staging: their device memory goes to MPI.
 * That happens when GPUARR_MPI_CUDA_AWARE is on, or auto (the default) and gpuarr was built
 * with Open MPI's MPIX_CUDA_AWARE_SUPPORT (from <mpi-ext.h>) and MPIX_Query_cuda_support() says
 * yes at run time; off never does it (CUDA arrays are staged). on asks MPI nothing: it hands
 * device memory to an MPI that is not CUDA-aware too, which then crashes; use it only for a
 * CUDA-aware MPI that auto cannot detect. (Debian's Open MPI is not CUDA-aware: gpuarr's tests
 * build this branch but cannot run it; they run off, auto and on, the latter not on CUDA arrays.)
 *
 * Checks and errors: a handle that is not a live array (GPUARR_ERROR_INVALID_HANDLE), a range
 * not within the array, `sent` not a dtype, a rank outside comm, a tag outside 0..MPI_TAG_UB,
 * comm MPI_COMM_NULL, req NULL, a malformed GPUARR_MPI_* variable (all three are read when the
 * transfer is made, by the call that starts it) (GPUARR_ERROR_INVALID_ARGUMENT) fail before
 * anything is sent. Before MPI_Init and after MPI_Finalize every gpuarr_mpi function returns
 * GPUARR_ERROR_NOT_INITIALIZED, saying which. A receive whose header says
 * another count or dtype than the receive expects fails with GPUARR_ERROR_INVALID_ARGUMENT
 * saying what arrived and what was expected ("rank 1 sent 10 elements of i32 (tag 9); this
 * receive expected 12 elements of i32"); its chunks are still taken (and dropped, through two
 * chunk-sized buffers of the host's pool), so the next transfer from that rank on that tag
 * arrives intact; the sender is not told. Where the host's pool cannot give those buffers the
 * receive fails with GPUARR_ERROR_OUT_OF_MEMORY ("... cannot be drained ...") and the chunks
 * are left behind (see below). A header for more elements of its dtype than an array can hold
 * (over PTRDIFF_MAX bytes) fails the receive at once, naming the peer ("rank 1 sent a header for
 * 9223372036854775807 elements of i32 (tag 5): more bytes than an array can hold ..."), its
 * chunks not taken (see below). gpuarr_mpi_wait
 * on a request that is not pending: GPUARR_ERROR_INVALID_HANDLE, the request left as it was; a
 * wait that finds its request sets it to {0} whatever the transfer's result (which may be
 * GPUARR_ERROR_INVALID_HANDLE too, from a call inside: a staging copy on a current stream that
 * is not valid, say). The errors of a receive with
 * MPI_ANY_SOURCE or MPI_ANY_TAG name the rank and tag its header came with, once it came. MPI
 * errors come back as gpuarr results with MPI_Error_string's words (MPI_ERR_TRUNCATE, from a
 * plain MPI message too long for a header, as GPUARR_ERROR_INVALID_ARGUMENT): while gpuarr_mpi
 * calls run on a comm its error handler is MPI_ERRORS_RETURN (for every thread's MPI calls on
 * it), and the caller's handler is put back when the last of them returns (no duplicate comm:
 * MPI_Comm_dup would be collective). A transfer that ends in an error or a timeout after its
 * first part was posted or taken may leave parts of its message behind or missing (only a count
 * or dtype mismatch is drained): that comm, peer and tag are then out of step, a later receive
 * may take a leftover part as its own, and they should not carry gpuarr transfers again.
 *
 * A wait gives up once no pending transfer of the process has moved (whichever thread's wait
 * moved it) for GPUARR_MPI_TIMEOUT_MS milliseconds, counted from the wait's start at the
 * earliest (default 60000; -1 waits forever; the value the transfer was made with): it cancels
 * what the transfer posted and returns GPUARR_ERROR_TIMEOUT naming the peer rank and tag ("the
 * receive from rank 3 (tag 77) did not move for 2000 ms (GPUARR_MPI_TIMEOUT_MS): cancelled,
 * ..."), so a rank that has left makes its peers fail, not hang (but while other transfers of
 * the process keep moving, a wait on a rank that has left goes on with them). What MPI cannot
 * cancel (a send no receive has matched yet, in Open MPI) keeps its memory, the array's
 * reference and the staging buffers, until a later call that starts or waits for a gpuarr_mpi
 * transfer finds MPI done with it.
 *
 * The last gpuarr_shutdown ends every transfer not waited for yet (finished or not) before it
 * frees anything: it cancels what each posted (MPI_Cancel), gives MPI up to 1 s to complete what was
 * cancelled and what earlier timeouts kept (MPI_Test), then releases the arrays and staging
 * buffers, with a warning saying how many transfers it ended. Memory MPI still holds after that
 * second (a send no receive has matched, which Open MPI cannot cancel, or a receive whose message
 * is partly in) is never freed: its MPI requests are freed (MPI_Request_free; MPI completes them
 * on its own) and a warning says how many bytes were left to MPI. So a message that arrives after
 * gpuarr_shutdown lands in no memory gpuarr freed: it waits, unmatched, for a later receive from
 * that peer on that tag. A request from before that shutdown is refused by gpuarr_mpi_wait after
 * a later gpuarr_init (GPUARR_ERROR_INVALID_HANDLE, "req {...} is from an earlier gpuarr_init").
 * gpuarr_shutdown calls MPI only where transfers are left, on the thread that calls it: call it
 * before MPI_Finalize, from a thread that may call MPI. Where MPI was finalized first (with
 * requests pending, which MPI itself calls erroneous) it calls no MPI function but
 * MPI_Initialized and MPI_Finalized, and frees the transfers' memory at once: MPI touches no
 * buffer after MPI_Finalize.
 *
 * Threads: the gpuarr_mpi functions call MPI on the calling thread. Called from several threads
 * at once they need MPI_Init_thread with MPI_THREAD_MULTIPLE; below that level call them from one
 * thread at a time (at MPI_THREAD_FUNNELED or MPI_THREAD_SINGLE, MPI's main thread). Waits on
 * several threads all move every transfer on (each lets the others poll between its polls), and
 * a request is waited for by one thread: a second gpuarr_mpi_wait on it while the first runs
 * returns GPUARR_ERROR_INVALID_HANDLE.
 *
 * gpuarr_mpi_allreduce(a, op, comm) (collective) replaces every element of a by the sum, minimum
 * or maximum of that element over comm's ranks (GPUARR_MPI_SUM, _MIN, _MAX); every rank passes an
 * array of the same count and dtype, on any device. It goes through host memory (a's count in
 * host memory, at most INT_MAX elements): integer sums wrap as the dtype does (modulo 2^bits),
 * f16 and bf16 are reduced as f32 and rounded back once, bool sum and max are "any", min "all".
 *
 * tests/mpi/test_mpi.c runs these calls under mpirun (make mpi-tests), 4 ranks on the host and
 * PoCL devices, then with ranks on the fake CUDA driver (staged: the CUDA-aware path is compiled,
 * never run), MPI_THREAD_MULTIPLE with two threads. tests/fuzz's api target and the soak call
 * them too, in a one-rank MPI job the harness starts itself (every message to the rank itself).
 *
 * =============================================================================================
 * FILES AND FOLDERS
 * =============================================================================================
 * What gpuarr keeps on disk is read back as input that someone else may have planted or damaged:
 * the lease folder and its slot files (LEASES), the cache folder (GPUARR_CACHE_DIR) with its
 * kernel binaries, task models (OFFLOAD) and, in its models folder, transfer models (TRANSFER
 * MODEL). The rules:
 *
 * - Folders are made with mode 0700 (the cache folder with its missing parents, 0700 too) and
 *   used only when they are a real folder, not a symlink (the last part of the path; the parents
 *   are taken as they are), owned by the effective user, that neither group nor others can
 *   write. Otherwise nothing in it is read or written: a lease acquire fails (see LEASES); the
 *   cache is off for this gpuarr_init, said once as a warning naming the folder and what is wrong
 *   ("is owned by uid 1001, not by this user (uid 1000)", "is writable by others (mode 0777)",
 *   "is a symlink (not followed)"), and kernels are built from source each time.
 * - Files are opened relative to their folder's descriptor, never through a symlink and without
 *   waiting on a FIFO, and used only when they are regular files owned by the effective user.
 *   Each has a size cap, checked before reading: 64 MiB for a kernel binary, 3 KiB for a task
 *   model, 64 KiB for a transfer model; a larger file is refused unread, ignored and replaced.
 * - Files are written to a new file of an unpredictable name in the same folder (created
 *   exclusively, mode 0600), synced, then renamed over the old one: readers never see half a
 *   file, and a link planted under any name is never written through.
 * - A kernel binary (an OpenCL program binary, a CUDA cubin from NVRTC), cache file
 *   "opencl-<key>.bin" or "cuda-<key>.cubin", starts with a 48-byte header in the machine's byte
 *   order: the magic "gpuarr-cache\n" padded with NULs to 16 bytes, the format version (uint32,
 *   1), the header size (uint32, 48), the payload's size, its 64-bit FNV-1a hash and the key (the
 *   hash of the kernel's source, device, driver and options the name is made of; uint64 each).
 *   No byte reaches a driver before all of it checks out. A file that fails the check, or that the
 *   driver refuses afterwards (a failed clCreateProgramWithBinary, clBuildProgram or
 *   clCreateKernel; a failed cuModuleLoadDataEx), is rebuilt from source and replaced (said at
 *   info level). The hash finds damage (a file cut short by a full disk or a crash); it is no
 *   signature: the owner checks are what keep other users out.
 *
 * A lease folder shared on purpose by several users (GPUARR_LEASE_DIR naming the same folder in
 * each) must be sticky (mode 1770 or 1777) and owned by root (an administrator makes it, e.g.
 * `install -d -m 1770 -g gpuusers /srv/gpuarr-leases`) or by the user: such a folder is accepted
 * although its group or others can write it, and its slot files are used whoever owns them (made
 * 0660 so the folder's group can take them), still opened without following a symlink and only
 * when regular files. A sticky folder another user owns is refused like any folder of another
 * user (its owner could replace everyone's files). Its users trust each other with their slots: any of them can hold
 * a slot forever, write a misleading holder line, or plant a file that makes the others' acquires
 * fail (a symlink, a FIFO, a file they cannot open); none of them can make another write anywhere
 * else or read anything but the holder lines. The users of one cache folder are its owner alone.
 *
 * =============================================================================================
 * CALLBACKS
 * =============================================================================================
 * The allocator, the logger and release callbacks (gpuarr_wrap_host) can run on any thread,
 * sometimes with an internal lock held: they must not call gpuarr functions. Bytes of a BOOL
 * array given through the _as functions should be 0 or 1: copies keep other values as they are,
 * casts count them as 1.
 *
 * =============================================================================================
 * THREAD SAFETY
 * =============================================================================================
 * gpuarr_init and gpuarr_shutdown are reference counted and may race each other from any number
 * of threads; every other call must happen between a successful gpuarr_init and its matching
 * gpuarr_shutdown, but for gpuarr_local_rank, which reads only the environment (and, as getenv,
 * must not run while another thread calls setenv). All other functions are thread-safe, but for
 * the gpuarr_mpi_* ones, which are as far as MPI's thread level allows (see MPI).
 * gpuarr_last_error(), the current device and the current stream are per thread.
 */
#ifndef GPUARR_H_INCLUDED
#define GPUARR_H_INCLUDED

/* In strict ISO mode (-std=c11) the C library hides the POSIX and Linux declarations the
   implementation needs (clock_gettime, madvise). Ask for them in that mode only, and only in the
   implementation's unit: in GNU mode the user's feature macros are left alone. This works only
   before the first C library header (glibc reads feature macros once); the implementation stops
   with an #error where it came too late. */
#if defined(GPUARR_IMPLEMENTATION) && defined(__STRICT_ANSI__) && !defined(_POSIX_C_SOURCE) && \
    !defined(_GNU_SOURCE) && !defined(_XOPEN_SOURCE) && !defined(_DEFAULT_SOURCE)
#define _DEFAULT_SOURCE 1
#endif

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GPUARR_VERSION_MAJOR 0
#define GPUARR_VERSION_MINOR 1
#define GPUARR_VERSION_PATCH 0
#define GPUARR_VERSION_STRING "0.1.0"
#define GPUARR_VERSION_NUMBER \
    (GPUARR_VERSION_MAJOR * 10000 + GPUARR_VERSION_MINOR * 100 + GPUARR_VERSION_PATCH)

#define GPUARR_MAX_DIMS 8

/* GPUARR_STATIC: every public function static to the one unit that has the implementation. The
   attribute keeps gcc and clang from warning about each one the unit does not call (a plain
   -DGPUARR_API=static draws one -Wunused-function per public function). */
#if defined(GPUARR_STATIC) && !defined(GPUARR_API)
#if defined(__GNUC__) || defined(__clang__)
#define GPUARR_API static __attribute__((unused))
#else
#define GPUARR_API static
#endif
#endif
#ifndef GPUARR_API
#define GPUARR_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------
 * Results. X(NAME, value, description). 0 is success, errors are negative.
 * ------------------------------------------------------------------------------------------- */
#define GPUARR_RESULT_LIST(X)                                                                  \
    X(OK, 0, "success")                                                                        \
    X(ERROR_INVALID_ARGUMENT, -1, "invalid argument")                                          \
    X(ERROR_INVALID_HANDLE, -2, "invalid, released or stale handle")                           \
    X(ERROR_OUT_OF_MEMORY, -3, "out of memory")                                                \
    X(ERROR_NO_DEVICE, -4, "no such device")                                                   \
    X(ERROR_UNSUPPORTED, -5, "not supported by this device or build")                          \
    X(ERROR_BACKEND, -6, "backend error")                                                      \
    X(ERROR_NOT_INITIALIZED, -7, "gpuarr is not initialized")                                  \
    X(ERROR_OVERFLOW, -8, "size or count overflow")                                            \
    X(ERROR_TIMEOUT, -9, "timed out")                                                          \
    X(ERROR_NOT_READY, -10, "work has not completed yet")                                    \
    X(ERROR_DEVICE_LOST, -11, "the device failed earlier; gpuarr_device_reset brings it back") \
    X(ERROR_BUILD, -12, "a kernel did not compile for the device")

typedef enum gpuarr_result {
#define GPUARR__RESULT_ENUM(name, value, text) GPUARR_##name = value,
    GPUARR_RESULT_LIST(GPUARR__RESULT_ENUM)
#undef GPUARR__RESULT_ENUM
    GPUARR_RESULT_COUNT = 13 /* number of codes; checked against the list in the implementation */
} gpuarr_result;

/* ---------------------------------------------------------------------------------------------
 * Dtypes. One table; the dtype enum, names, sizes and the 13x13 host cast table are generated
 * from it. Columns:
 *   NAME   the enumerator (GPUARR_F32)       str    name string
 *   store  C storage type                    size   bytes per element
 *   kind   how values are written (internal) cat    the exact type values are read into
 *   lo hi  range of the integer types (0 for the others)
 * bool is stored as one byte; f16 and bf16 as their 16 bits (gpuarr_f16 / gpuarr_bf16 below).
 * Every token is an enumerator, a type or a gpuarr__ name, so no user macro can change the
 * table. The `c` parameter is passed through to M. The rows are named (GPUARR__DT_*) so that the
 * implementation can walk them a second time inside this table's expansion (the cast table
 * crosses the dtypes with themselves; a macro is not expanded inside its own expansion).
 * ------------------------------------------------------------------------------------------- */
#define GPUARR__DT_BOOL GPUARR_BOOL, "bool", uint8_t, 1, gpuarr__k_bool, int32_t, 0, 1
#define GPUARR__DT_I8 GPUARR_I8, "i8", int8_t, 1, gpuarr__k_int, int32_t, INT8_MIN, INT8_MAX
#define GPUARR__DT_U8 GPUARR_U8, "u8", uint8_t, 1, gpuarr__k_int, int32_t, 0, UINT8_MAX
#define GPUARR__DT_I16 GPUARR_I16, "i16", int16_t, 2, gpuarr__k_int, int32_t, INT16_MIN, INT16_MAX
#define GPUARR__DT_U16 GPUARR_U16, "u16", uint16_t, 2, gpuarr__k_int, int32_t, 0, UINT16_MAX
#define GPUARR__DT_I32 GPUARR_I32, "i32", int32_t, 4, gpuarr__k_int, int32_t, INT32_MIN, INT32_MAX
#define GPUARR__DT_U32 GPUARR_U32, "u32", uint32_t, 4, gpuarr__k_int, uint32_t, 0, UINT32_MAX
#define GPUARR__DT_I64 GPUARR_I64, "i64", int64_t, 8, gpuarr__k_int, int64_t, INT64_MIN, INT64_MAX
#define GPUARR__DT_U64 GPUARR_U64, "u64", uint64_t, 8, gpuarr__k_int, uint64_t, 0, UINT64_MAX
#define GPUARR__DT_F16 GPUARR_F16, "f16", uint16_t, 2, gpuarr__k_f16, float, 0, 0
#define GPUARR__DT_BF16 GPUARR_BF16, "bf16", uint16_t, 2, gpuarr__k_bf16, float, 0, 0
#define GPUARR__DT_F32 GPUARR_F32, "f32", float, 4, gpuarr__k_f32, float, 0, 0
#define GPUARR__DT_F64 GPUARR_F64, "f64", double, 8, gpuarr__k_f64, double, 0, 0
#define GPUARR__DTYPE_TABLE(M, c)                                                              \
    GPUARR__DT_ROW(M, c, GPUARR__DT_BOOL) GPUARR__DT_ROW(M, c, GPUARR__DT_I8)                  \
    GPUARR__DT_ROW(M, c, GPUARR__DT_U8) GPUARR__DT_ROW(M, c, GPUARR__DT_I16)                   \
    GPUARR__DT_ROW(M, c, GPUARR__DT_U16) GPUARR__DT_ROW(M, c, GPUARR__DT_I32)                  \
    GPUARR__DT_ROW(M, c, GPUARR__DT_U32) GPUARR__DT_ROW(M, c, GPUARR__DT_I64)                  \
    GPUARR__DT_ROW(M, c, GPUARR__DT_U64) GPUARR__DT_ROW(M, c, GPUARR__DT_F16)                  \
    GPUARR__DT_ROW(M, c, GPUARR__DT_BF16) GPUARR__DT_ROW(M, c, GPUARR__DT_F32)                 \
    GPUARR__DT_ROW(M, c, GPUARR__DT_F64)
/* the row's name expands to its columns before M sees them */
#define GPUARR__DT_ROW(M, c, row) GPUARR__DT_ROW_I(M, c, row)
#define GPUARR__DT_ROW_I(M, c, ...) M(c, __VA_ARGS__)

/* The public form: X(NAME, str, store, size, kind, cat, lo, hi), e.g. for a switch:
       #define CASE(NAME, str, ...) case NAME: return str;   GPUARR_DTYPE_LIST(CASE)        */
#define GPUARR__APPLY_ROW(X, ...) X(__VA_ARGS__)
#define GPUARR_DTYPE_LIST(X) GPUARR__DTYPE_TABLE(GPUARR__APPLY_ROW, X)

typedef enum gpuarr_dtype {
    GPUARR_DTYPE_INVALID = 0, /* also "keep the source's dtype" where a target dtype is asked */
#define GPUARR__DTYPE_ENUM(NAME, ...) NAME,
    GPUARR_DTYPE_LIST(GPUARR__DTYPE_ENUM)
#undef GPUARR__DTYPE_ENUM
    GPUARR_DTYPE_COUNT
} gpuarr_dtype;

/* 16-bit float storage types, distinct so that _Generic and C++ overloads can tell them apart. */
typedef struct gpuarr_f16 { uint16_t bits; } gpuarr_f16;
typedef struct gpuarr_bf16 { uint16_t bits; } gpuarr_bf16;

/* ---------------------------------------------------------------------------------------------
 * Backends. X(NAME, name). The host is always compiled in. Each backend's public interop
 * functions are declared in its interop section below (the host has none).
 * ------------------------------------------------------------------------------------------- */
#define GPUARR_BACKEND_LIST(X) X(HOST, "host") X(CUDA, "cuda") X(OPENCL, "opencl")

typedef enum gpuarr_backend {
    GPUARR_BACKEND_INVALID = 0,
#define GPUARR__BACKEND_ENUM(NAME, str) GPUARR_BACKEND_##NAME,
    GPUARR_BACKEND_LIST(GPUARR__BACKEND_ENUM)
#undef GPUARR__BACKEND_ENUM
    GPUARR_BACKEND_COUNT
} gpuarr_backend;

typedef enum gpuarr_device_type {
    GPUARR_DEVICE_TYPE_UNKNOWN = 0,
    GPUARR_DEVICE_TYPE_CPU,
    GPUARR_DEVICE_TYPE_GPU,
    GPUARR_DEVICE_TYPE_ACCELERATOR,
    GPUARR_DEVICE_TYPE_COUNT
} gpuarr_device_type;

typedef enum gpuarr_log_level {
    GPUARR_LOG_DEFAULT = 0, /* GPUARR_LOG, else WARN */
    GPUARR_LOG_OFF,
    GPUARR_LOG_ERROR,
    GPUARR_LOG_WARN,
    GPUARR_LOG_INFO,
    GPUARR_LOG_DEBUG,
    GPUARR_LOG_LEVEL_COUNT
} gpuarr_log_level;

/* ---------------------------------------------------------------------------------------------
 * Handles. id 0 is never valid.
 * ------------------------------------------------------------------------------------------- */
typedef struct gpuarr_device { uint32_t id; } gpuarr_device;
typedef struct gpuarr_array { uint32_t id; } gpuarr_array;
typedef struct gpuarr_stream { uint32_t id; } gpuarr_stream;
typedef struct gpuarr_event { uint32_t id; } gpuarr_event;
typedef struct gpuarr_lease { uint32_t id; } gpuarr_lease; /* a slot on a device (LEASES) */
typedef struct gpuarr_task { uint32_t id; } gpuarr_task;   /* a piece of user work (OFFLOAD) */

/* ---------------------------------------------------------------------------------------------
 * Initialization
 * ------------------------------------------------------------------------------------------- */
typedef struct gpuarr_allocator {
    void *(*alloc_fn)(size_t size, void *user_data); /* NULL on failure */
    void (*free_fn)(void *ptr, void *user_data);
    void *user_data;
} gpuarr_allocator; /* both functions or neither */

typedef void (*gpuarr_log_fn)(gpuarr_log_level level, const char *message, void *user_data);
typedef struct gpuarr_logger {
    gpuarr_log_fn fn; /* NULL: messages go to stderr */
    void *user_data;
} gpuarr_logger;

typedef struct gpuarr_desc {
    gpuarr_allocator allocator; /* library-internal host memory; zero = GPUARR_MALLOC or malloc */
    gpuarr_logger logger;
    gpuarr_log_level log_level; /* 0 = GPUARR_LOG, else WARN */
    const char *devices;        /* NULL = GPUARR_DEVICES, else every device (copied by init) */
    int host_threads;           /* 0 = GPUARR_THREADS, else online CPUs (at most 64) */
    const char *alloc_conf;     /* NULL = GPUARR_ALLOC_CONF: "key:value,..." (see MEMORY POOLS) */
    bool oom_host_fallback;     /* out of device memory: place new arrays on the host instead
                                   (alloc_conf host_fallback:0 or :1 overrides it) */
    const char *slots;          /* NULL = GPUARR_SLOTS: lease slots per device, "cuda:0=4,opencl:*=2"
                                   (see LEASES; copied by init) */
} gpuarr_desc;

/* Starts the library, or adds a reference when it is already running. A later call's desc (when
   not NULL) must agree with the running configuration in every field it sets (non-zero): a field
   that differs fails with GPUARR_ERROR_INVALID_ARGUMENT naming it and adds no reference; fields
   left zero accept what is running. Thread-safe: racing callers all get the one registry. Each
   successful call needs one gpuarr_shutdown. */
GPUARR_API gpuarr_result gpuarr_init(const gpuarr_desc *desc);
/* Drops a reference; the last one frees every array, stream and event still alive (with a
   warning naming how many) and unloads the backends, after ending the gpuarr_mpi transfers
   still pending (see MPI). Harmless when not initialized. */
GPUARR_API void gpuarr_shutdown(void);
GPUARR_API bool gpuarr_is_initialized(void);
/* The desc in effect, with every default resolved: the desc's fields, else the environment's,
   else the defaults; devices, alloc_conf and slots are NULL when neither gave one. out->devices,
   out->alloc_conf and out->slots stay valid until shutdown. */
GPUARR_API gpuarr_result gpuarr_query_desc(gpuarr_desc *out);

/* ---------------------------------------------------------------------------------------------
 * Errors and names (these work without gpuarr_init)
 * ------------------------------------------------------------------------------------------- */
GPUARR_API const char *gpuarr_result_string(gpuarr_result r); /* "out of memory" */
GPUARR_API const char *gpuarr_result_name(gpuarr_result r);   /* "GPUARR_ERROR_OUT_OF_MEMORY" */
/* The message of the most recent failed call on this thread ("" if none). Successful calls do
   not clear it: check the returned result first. The pointer is valid until the thread's next
   gpuarr call. */
GPUARR_API const char *gpuarr_last_error(void);
/* Leaves this thread's error: gpuarr_last_error() then returns the formatted message as it is
   (no function name before it), and r comes back, so that a task's implementation can fail with
   its own reason: `return gpuarr_set_error(GPUARR_ERROR_INVALID_ARGUMENT, "rows = %d", rows);`
   (gpuarr_offload and gpuarr_map name it; see OFFLOAD). r must be an error result and fmt not
   NULL (else GPUARR_ERROR_INVALID_ARGUMENT, with that as the message). The message is cut to
   1023 bytes. */
GPUARR_API gpuarr_result gpuarr_set_error(gpuarr_result r, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
GPUARR_API size_t gpuarr_dtype_size(gpuarr_dtype t);      /* 0 for an invalid dtype */
GPUARR_API const char *gpuarr_dtype_name(gpuarr_dtype t); /* "f32"; "invalid" otherwise */
GPUARR_API gpuarr_dtype gpuarr_dtype_from_name(const char *name); /* 0 if unknown */
GPUARR_API const char *gpuarr_backend_name(gpuarr_backend b);
GPUARR_API bool gpuarr_backend_compiled(gpuarr_backend b); /* compiled into this build */
GPUARR_API const char *gpuarr_version_string(void);

/* f16 / bf16 scalars, with the conversion rules above, whatever the caller's rounding mode. */
GPUARR_API gpuarr_f16 gpuarr_f16_from_float(float x);
GPUARR_API gpuarr_f16 gpuarr_f16_from_double(double x);
GPUARR_API float gpuarr_f16_to_float(gpuarr_f16 h);
GPUARR_API gpuarr_bf16 gpuarr_bf16_from_float(float x);
GPUARR_API gpuarr_bf16 gpuarr_bf16_from_double(double x);
GPUARR_API float gpuarr_bf16_to_float(gpuarr_bf16 h);

/* ---------------------------------------------------------------------------------------------
 * Devices
 * ------------------------------------------------------------------------------------------- */
/* OK until a sticky error makes the device FAILED; gpuarr_device_reset makes it OK again. */
typedef enum gpuarr_device_state {
    GPUARR_DEVICE_OK = 0,
    GPUARR_DEVICE_FAILED = 1,
    GPUARR_DEVICE_STATE_COUNT
} gpuarr_device_state;

typedef struct gpuarr_device_info {
    gpuarr_device device;
    gpuarr_backend backend;
    int index;                 /* within its backend: "cuda:<index>" */
    gpuarr_device_type type;
    char spec[32];             /* "host", "cuda:0", "opencl:1" */
    char name[256];
    char vendor[128];
    char version[128];         /* driver / platform / OS version */
    int compute_capability_major, compute_capability_minor; /* CUDA; 0 elsewhere */
    uint64_t total_memory;     /* bytes */
    uint64_t free_memory;      /* bytes, read when this info is asked for */
    uint64_t max_alloc_bytes;  /* largest single allocation the device allows */
    int compute_units;         /* SMs, OpenCL compute units, online CPUs */
    int copy_engines;          /* CUDA: copies that can run alongside kernels; 0 if unknown */
    int clock_mhz;             /* 0 if unknown */
    bool host_unified;         /* device memory is host memory */
    bool has_pci;              /* pci_* fields valid */
    int pci_domain, pci_bus, pci_device, pci_function;
    char pci_bus_id[32];       /* "0000:3b:00.0" or "" */
    bool has_uuid;
    uint8_t uuid[16];
    gpuarr_device same_as;     /* the same physical device through another backend or, for an
                                  adopted device, gpuarr's own view of it; {0} if none */
    gpuarr_device_state state; /* GPUARR_DEVICE_FAILED after a sticky error (see FAILURES) */
    char failure[256];         /* the first error that failed it ("" while OK) */
    bool adopted;              /* made of the caller's context (see ADOPTED DEVICES) */
} gpuarr_device_info;

GPUARR_API int gpuarr_device_count(void);           /* the host included; 0 if not initialized */
GPUARR_API gpuarr_device gpuarr_device_at(int index); /* {0} if out of range */
GPUARR_API gpuarr_device gpuarr_host(void);         /* {0} if not initialized */
GPUARR_API gpuarr_result gpuarr_device_find(const char *spec, gpuarr_device *out);
GPUARR_API gpuarr_result gpuarr_device_get_info(gpuarr_device d, gpuarr_device_info *out);
/* Waits for all work gpuarr has queued on every stream of the device. */
GPUARR_API gpuarr_result gpuarr_device_sync(gpuarr_device d);
/* Brings a device back after a failure (see FAILURES), or resets a healthy one: its context,
   queues, pools and kernels are made anew (CUDA: cuDevicePrimaryCtxReset, which also ends the
   CUDA runtime's use of the primary context). Every array, stream and event of d must have been
   released: otherwise GPUARR_ERROR_INVALID_ARGUMENT saying how many are alive. No other thread may
   use d during the call. The host has nothing to reset (GPUARR_OK). */
GPUARR_API gpuarr_result gpuarr_device_reset(gpuarr_device d);
/* Removes a device made of the caller's context (gpuarr_opencl_adopt, gpuarr_cuda_adopt; see
   ADOPTED DEVICES): waits for its work, closes it and drops what gpuarr holds of the caller's
   context and queue; its handle then fails with GPUARR_ERROR_INVALID_HANDLE. Every array, stream
   and event of d must have been released (else GPUARR_ERROR_INVALID_ARGUMENT saying how many are
   alive), and d must be adopted (a device gpuarr found is refused the same way). No other thread
   may use d during the call. */
GPUARR_API gpuarr_result gpuarr_device_remove(gpuarr_device d);

/* ---------------------------------------------------------------------------------------------
 * Telemetry (see TELEMETRY). X(NAME, bit, "name", fields): one bit of gpuarr_telemetry.valid per
 * group of fields read together; a clear bit means those fields were not read (left 0).
 * ------------------------------------------------------------------------------------------- */
#define GPUARR_TELEMETRY_LIST(X)                                                               \
    X(MEMORY_TOTAL, 0, "memory_total", "memory_total")                                         \
    X(MEMORY_USAGE, 1, "memory_usage", "memory_used, memory_free")                             \
    X(GPU_UTILIZATION, 2, "gpu_utilization", "gpu_utilization_pct")                            \
    X(MEMORY_UTILIZATION, 3, "memory_utilization", "memory_utilization_pct")                   \
    X(TEMPERATURE, 4, "temperature", "temperature_c")                                          \
    X(POWER, 5, "power", "power_w")                                                            \
    X(POWER_LIMIT, 6, "power_limit", "power_limit_w")                                          \
    X(SM_CLOCK, 7, "sm_clock", "sm_clock_mhz")                                                 \
    X(MEMORY_CLOCK, 8, "memory_clock", "memory_clock_mhz")                                     \
    X(THROTTLE_REASONS, 9, "throttle_reasons", "throttle_reasons")                             \
    X(PCIE_GENERATION, 10, "pcie_generation", "pcie_generation")                               \
    X(PCIE_WIDTH, 11, "pcie_width", "pcie_width")

typedef enum gpuarr_telemetry_bit {
#define GPUARR__TELEMETRY_ENUM(NAME, bit, name, fields) GPUARR_TELEMETRY_##NAME = 1 << (bit),
    GPUARR_TELEMETRY_LIST(GPUARR__TELEMETRY_ENUM)
#undef GPUARR__TELEMETRY_ENUM
    GPUARR_TELEMETRY_COUNT = 12 /* number of bits; checked against the list in the implementation */
} gpuarr_telemetry_bit;

typedef struct gpuarr_telemetry {
    uint32_t valid;                                  /* GPUARR_TELEMETRY_* bits: the fields read */
    uint64_t memory_total, memory_used, memory_free; /* bytes, the device's own view */
    int gpu_utilization_pct, memory_utilization_pct; /* 0..100 */
    double temperature_c, power_w, power_limit_w;
    int sm_clock_mhz, memory_clock_mhz;
    uint64_t throttle_reasons; /* NVML's clock event reasons, as NVML defines them */
    int pcie_generation, pcie_width;
} gpuarr_telemetry;

/* What the device reports about itself now (see TELEMETRY): *out is overwritten, out->valid says
   which fields were read. A reading the device cannot give is never an error. Errors: out NULL
   (GPUARR_ERROR_INVALID_ARGUMENT), d not a device (GPUARR_ERROR_INVALID_HANDLE), not initialized.
   Thread-safe. */
GPUARR_API gpuarr_result gpuarr_device_get_telemetry(gpuarr_device d, gpuarr_telemetry *out);
/* "temperature" for GPUARR_TELEMETRY_TEMPERATURE; "unknown" for anything but one bit of the list.
   Works without gpuarr_init. */
GPUARR_API const char *gpuarr_telemetry_name(uint32_t bit);

/* ---------------------------------------------------------------------------------------------
 * Arrays
 * ------------------------------------------------------------------------------------------- */
typedef struct gpuarr_array_info {
    gpuarr_device device;
    gpuarr_dtype dtype;
    int ndim;
    int64_t shape[GPUARR_MAX_DIMS]; /* entries past ndim are 0 */
    int64_t count;                  /* product of shape (1 for ndim 0) */
    size_t itemsize;
    size_t nbytes;
    bool host_accessible;           /* gpuarr_host_data works on it */
    bool wrapped;                   /* memory adopted from the caller (gpuarr_wrap_host) */
    bool host_fallback;             /* placed on the host because the device asked for was out
                                       of memory (desc.oom_host_fallback) */
    bool pinned;                    /* page-locked host memory (gpuarr_empty_pinned) */
    bool is_view;                   /* made by gpuarr_reshape or gpuarr_slice: shares the memory of
                                       the array it was made from */
    size_t offset;                  /* bytes from the start of the memory it shares (0 if none) */
    uint32_t refcount;              /* references held through the handle */
    bool read_only;                 /* writes refused (gpuarr_from_dlpack of a READ_ONLY tensor) */
} gpuarr_array_info;

typedef void (*gpuarr_release_fn)(void *data, void *user_data);

/* Uninitialized / zero-filled array. ndim 0..8; shape may be NULL only when ndim is 0. */
GPUARR_API gpuarr_result gpuarr_empty(gpuarr_device d, gpuarr_dtype t, int ndim,
                                      const int64_t *shape, gpuarr_array *out);
GPUARR_API gpuarr_result gpuarr_zeros(gpuarr_device d, gpuarr_dtype t, int ndim,
                                      const int64_t *shape, gpuarr_array *out);
/* Copies count(shape) elements of dtype t from host memory into a new array on d. */
GPUARR_API gpuarr_result gpuarr_from_host_as(gpuarr_device d, gpuarr_dtype t, const void *data,
                                             int ndim, const int64_t *shape, gpuarr_array *out);
/* Writes the array's elements, cast to dtype t (0 = the array's dtype), into host memory that
   holds `count` elements of t; count smaller than the array's count is an error. */
GPUARR_API gpuarr_result gpuarr_to_host_as(gpuarr_array a, gpuarr_dtype t, void *data,
                                           size_t count);
/* The same two, for the typed wrappers below: `api` is the name errors give the call. */
GPUARR_API gpuarr_result gpuarr__from_host_named(const char *api, gpuarr_device d, gpuarr_dtype t, const void *data,
                                                 int ndim, const int64_t *shape, gpuarr_array *out);
GPUARR_API gpuarr_result gpuarr__to_host_named(const char *api, gpuarr_array a, gpuarr_dtype t, void *data, size_t count);
GPUARR_API gpuarr_result gpuarr__fill_named(const char *api, gpuarr_array a, gpuarr_dtype t, const void *value);
/* Adopts host memory without copying. `release` (may be NULL) is called with (data, user_data)
   when the last reference goes, and never if this call fails. data must be aligned to the
   dtype's size; it may be NULL only for an empty array. */
GPUARR_API gpuarr_result gpuarr_wrap_host(void *data, gpuarr_dtype t, int ndim,
                                          const int64_t *shape, gpuarr_release_fn release,
                                          void *user_data, gpuarr_array *out);
/* A new array on device `dst` with dtype t (0 = keep), or `src` itself, retained, when neither
   changes. Synchronous. */
GPUARR_API gpuarr_result gpuarr_convert(gpuarr_array src, gpuarr_device dst, gpuarr_dtype t,
                                        gpuarr_array *out);
GPUARR_API gpuarr_result gpuarr_convert_async(gpuarr_array src, gpuarr_device dst, gpuarr_dtype t,
                                              gpuarr_stream s, gpuarr_array *out);
GPUARR_API gpuarr_result gpuarr_retain(gpuarr_array a);
GPUARR_API gpuarr_result gpuarr_release(gpuarr_array a);
GPUARR_API gpuarr_result gpuarr_array_get_info(gpuarr_array a, gpuarr_array_info *out);
/* The host pointer of an array on the host device, after any pending work producing it has
   completed. Valid while the array is referenced. GPUARR_ERROR_UNSUPPORTED for device arrays. */
GPUARR_API gpuarr_result gpuarr_host_data(gpuarr_array a, void **out);

/* Arrays are mutable: the calls below write into existing arrays, and views share memory.
   dst and src hold the same element count (shapes may differ); src is cast to dst's dtype; any
   two devices. Overlapping memory (views of one array) is GPUARR_ERROR_INVALID_ARGUMENT unless
   dst and src are the same elements (then nothing is done). */
GPUARR_API gpuarr_result gpuarr_copy(gpuarr_array dst, gpuarr_array src);
GPUARR_API gpuarr_result gpuarr_copy_async(gpuarr_array dst, gpuarr_array src, gpuarr_stream s);
/* Elements [first, first + count) of a, in C order, from / to host memory holding count elements
   of dtype t (0 = a's dtype), cast on the way. The _async forms return without waiting for the
   device: the host memory must stay valid (and, for a read, unread) until s passes that point. */
GPUARR_API gpuarr_result gpuarr_write(gpuarr_array a, int64_t first, int64_t count, gpuarr_dtype t, const void *src);
GPUARR_API gpuarr_result gpuarr_write_async(gpuarr_array a, int64_t first, int64_t count, gpuarr_dtype t,
                                            const void *src, gpuarr_stream s);
GPUARR_API gpuarr_result gpuarr_read(gpuarr_array a, int64_t first, int64_t count, gpuarr_dtype t, void *dst);
GPUARR_API gpuarr_result gpuarr_read_async(gpuarr_array a, int64_t first, int64_t count, gpuarr_dtype t,
                                           void *dst, gpuarr_stream s);
/* Every element set to *value, given as dtype t and cast to a's dtype by the conversion rules.
   gpuarr_fill(a, x) picks t from x's C type. */
GPUARR_API gpuarr_result gpuarr_fill_as(gpuarr_array a, gpuarr_dtype t, const void *value);
/* Views: new handles on a's memory, holding a reference to it (a may be released first).
   reshape: the same count in a new shape; slice: rows [begin, end) of dimension 0. */
GPUARR_API gpuarr_result gpuarr_reshape(gpuarr_array a, int ndim, const int64_t *shape, gpuarr_array *out);
GPUARR_API gpuarr_result gpuarr_slice(gpuarr_array a, int64_t begin, int64_t end, gpuarr_array *out);
/* A host array in page-locked memory registered for transfers with device d (CUDA pinned memory,
   OpenCL CL_MEM_ALLOC_HOST_PTR mapped), from d's pinned pool: copies between it and d are DMA on
   the stream, with no staging. d = the host gives an ordinary host array. */
GPUARR_API gpuarr_result gpuarr_empty_pinned(gpuarr_device d, gpuarr_dtype t, int ndim, const int64_t *shape,
                                             gpuarr_array *out);
/* ready = every piece of work gpuarr queued that writes a, and every stream a was used on
   asynchronously, has finished. _sync waits for that. */
GPUARR_API gpuarr_result gpuarr_array_query(gpuarr_array a, bool *ready);
GPUARR_API gpuarr_result gpuarr_array_sync(gpuarr_array a);
/* n arrays of one shape and dtype, anywhere, into one new array of shape [n, ...] on dst, cast to
   t (0 = keep): one packed transfer per source device. */
GPUARR_API gpuarr_result gpuarr_stack(const gpuarr_array *src, int n, gpuarr_device dst, gpuarr_dtype t, gpuarr_array *out);
/* n conversions as one batch (out[i] = gpuarr_convert(src[i], dst, t)): small arrays share one
   staging transfer and one cast. On an error nothing is left allocated and no out[i] is set. */
GPUARR_API gpuarr_result gpuarr_convert_many(const gpuarr_array *src, int n, gpuarr_device dst, gpuarr_dtype t,
                                             gpuarr_array *out);

/* Says that work queued on s so far (e.g. your own kernel, through native interop) reads or
   writes a: every later gpuarr call on a runs after it, and when a is freed its memory is not
   reused until s has passed that point. s is on a's device, or any device for a host array. */
GPUARR_API gpuarr_result gpuarr_array_record_stream(gpuarr_array a, gpuarr_stream s);

/* ---------------------------------------------------------------------------------------------
 * Typed host I/O. X(C type, suffix, dtype). Each line makes gpuarr_from_host_<suffix> and
 * gpuarr_to_host_<suffix>, and one association of the generic gpuarr_from_host / gpuarr_to_host
 * (_Generic in C, overloads in C++). Keyed on fundamental types: `long` and `long long` are
 * both listed (both map to I64 on LP64 systems), so int64_t works whichever it is.
 * ------------------------------------------------------------------------------------------- */
#define GPUARR__INT_DTYPE(T, is_signed)                                                        \
    (sizeof(T) == 1   ? ((is_signed) ? GPUARR_I8 : GPUARR_U8)                                  \
     : sizeof(T) == 2 ? ((is_signed) ? GPUARR_I16 : GPUARR_U16)                                \
     : sizeof(T) == 4 ? ((is_signed) ? GPUARR_I32 : GPUARR_U32)                                \
                      : ((is_signed) ? GPUARR_I64 : GPUARR_U64))

#define GPUARR_CTYPE_LIST(X)                                                                   \
    X(bool, bool, GPUARR_BOOL)                                                                 \
    X(signed char, i8, GPUARR_I8)                                                              \
    X(unsigned char, u8, GPUARR_U8)                                                            \
    X(short, i16, GPUARR__INT_DTYPE(short, 1))                                                 \
    X(unsigned short, u16, GPUARR__INT_DTYPE(unsigned short, 0))                               \
    X(int, i32, GPUARR__INT_DTYPE(int, 1))                                                     \
    X(unsigned int, u32, GPUARR__INT_DTYPE(unsigned int, 0))                                   \
    X(long, long, GPUARR__INT_DTYPE(long, 1))                                                  \
    X(unsigned long, ulong, GPUARR__INT_DTYPE(unsigned long, 0))                               \
    X(long long, llong, GPUARR__INT_DTYPE(long long, 1))                                       \
    X(unsigned long long, ullong, GPUARR__INT_DTYPE(unsigned long long, 0))                    \
    X(float, f32, GPUARR_F32)                                                                  \
    X(double, f64, GPUARR_F64)                                                                 \
    X(gpuarr_f16, f16, GPUARR_F16)                                                             \
    X(gpuarr_bf16, bf16, GPUARR_BF16)

#define GPUARR__TYPED_IO(ctype, suffix, dtype)                                                 \
    static inline gpuarr_result gpuarr_from_host_##suffix(gpuarr_device d, const ctype *data,  \
                                                          int ndim, const int64_t *shape,      \
                                                          gpuarr_array *out) {                 \
        return gpuarr__from_host_named("gpuarr_from_host", d, dtype, data, ndim, shape, out);  \
    }                                                                                          \
    static inline gpuarr_result gpuarr_to_host_##suffix(gpuarr_array a, ctype *data,           \
                                                        size_t count) {                        \
        return gpuarr__to_host_named("gpuarr_to_host", a, dtype, data, count);                 \
    }                                                                                          \
    static inline gpuarr_result gpuarr_fill_##suffix(gpuarr_array a, ctype value) {            \
        return gpuarr__fill_named("gpuarr_fill", a, dtype, &value);                            \
    }
GPUARR_CTYPE_LIST(GPUARR__TYPED_IO)
#undef GPUARR__TYPED_IO

/* Exact-width spellings for direct calls (int64_t is `long` or `long long`). */
static inline gpuarr_result gpuarr_from_host_i64(gpuarr_device d, const int64_t *data, int ndim,
                                                 const int64_t *shape, gpuarr_array *out) {
    return gpuarr__from_host_named("gpuarr_from_host_i64", d, GPUARR_I64, data, ndim, shape, out);
}
static inline gpuarr_result gpuarr_from_host_u64(gpuarr_device d, const uint64_t *data, int ndim,
                                                 const int64_t *shape, gpuarr_array *out) {
    return gpuarr__from_host_named("gpuarr_from_host_u64", d, GPUARR_U64, data, ndim, shape, out);
}
static inline gpuarr_result gpuarr_to_host_i64(gpuarr_array a, int64_t *data, size_t count) {
    return gpuarr__to_host_named("gpuarr_to_host_i64", a, GPUARR_I64, data, count);
}
static inline gpuarr_result gpuarr_to_host_u64(gpuarr_array a, uint64_t *data, size_t count) {
    return gpuarr__to_host_named("gpuarr_to_host_u64", a, GPUARR_U64, data, count);
}

/* ---------------------------------------------------------------------------------------------
 * Streams and events
 * ------------------------------------------------------------------------------------------- */
enum { GPUARR_EVENT_TIMING = 1u }; /* gpuarr_event_create flags */

/* flags must be 0 (reserved). The stream belongs to device d. */
GPUARR_API gpuarr_result gpuarr_stream_create(gpuarr_device d, uint32_t flags, gpuarr_stream *out);
/* Waits for the stream's work, then destroys it. */
GPUARR_API gpuarr_result gpuarr_stream_destroy(gpuarr_stream s);
GPUARR_API gpuarr_result gpuarr_stream_sync(gpuarr_stream s);
GPUARR_API gpuarr_result gpuarr_stream_query(gpuarr_stream s, bool *done);
GPUARR_API gpuarr_result gpuarr_stream_get_device(gpuarr_stream s, gpuarr_device *out);
/* Makes later work on s wait for e (across backends the calling thread waits instead). */
GPUARR_API gpuarr_result gpuarr_stream_wait(gpuarr_stream s, gpuarr_event e);
/* Makes later work on s wait until a's contents are complete (a may be the pending result of
   async work on another stream). For native work on gpuarr's streams; gpuarr's own calls wait
   by themselves. */
GPUARR_API gpuarr_result gpuarr_stream_wait_array(gpuarr_stream s, gpuarr_array a);

GPUARR_API gpuarr_result gpuarr_event_create(gpuarr_device d, uint32_t flags, gpuarr_event *out);
GPUARR_API gpuarr_result gpuarr_event_destroy(gpuarr_event e);
/* Captures the work enqueued on s so far; s must be on the event's device. Re-recording is
   allowed. */
GPUARR_API gpuarr_result gpuarr_event_record(gpuarr_event e, gpuarr_stream s);
GPUARR_API gpuarr_result gpuarr_event_sync(gpuarr_event e);
GPUARR_API gpuarr_result gpuarr_event_query(gpuarr_event e, bool *done);
/* Milliseconds between two completed events created with GPUARR_EVENT_TIMING. */
GPUARR_API gpuarr_result gpuarr_event_elapsed_ms(gpuarr_event start, gpuarr_event end, double *ms);

/* ---------------------------------------------------------------------------------------------
 * Per-thread current device and stream, and scopes
 * ------------------------------------------------------------------------------------------- */
GPUARR_API gpuarr_device gpuarr_current_device(void);
/* Also makes a CUDA device's context current on the thread until the current device changes
   (see CUDA). {0}: back to "any", and the thread's own CUDA context back. */
GPUARR_API gpuarr_result gpuarr_set_current_device(gpuarr_device d);
GPUARR_API gpuarr_stream gpuarr_current_stream(void);             /* {0} if none */
GPUARR_API gpuarr_result gpuarr_set_current_stream(gpuarr_stream s); /* {0} clears it */

typedef struct gpuarr_scope {
    gpuarr_device previous_device;
    gpuarr_stream previous_stream;
    gpuarr_result result; /* GPUARR_OK, or why the scope did not start (then active is false) */
    bool active;
    bool held;             /* a failed scope kept by gpuarr_scope_hold: the thread has no device */
    gpuarr_result previous_failure; /* the thread's failed-scope state before this scope */
    gpuarr_device device;  /* the scope's device */
    void *native_previous; /* the backend's previous native context (CUDA), restored on leave */
    gpuarr_lease lease;    /* GPUARR_WITH_LEASE: released on leave; {0} otherwise */
} gpuarr_scope;
/* Enter: save the thread's current device and stream and set the new ones (a stream scope also
   makes the stream's device current). Leave: restore them; a second leave does nothing. */
GPUARR_API gpuarr_scope gpuarr_scope_enter_device(gpuarr_device d);
GPUARR_API gpuarr_scope gpuarr_scope_enter_stream(gpuarr_stream s);
/* Returns s. If s failed to start, the thread is left with no current device or stream until
   gpuarr_scope_leave(&s): every call that would use them (a {0} stream, work placed on the
   current stream, gpuarr_current_device) fails with s.result, saying that the scope did not
   start. What GPUARR_SCOPED_DEVICE / _STREAM use, so that their block never runs on the device
   it replaced. */
GPUARR_API gpuarr_scope gpuarr_scope_hold(gpuarr_scope s);
GPUARR_API void gpuarr_scope_leave(gpuarr_scope *scope);
/* Stores s.result in *result (when result is not NULL) and returns s: for the _R macros. */
static inline gpuarr_scope gpuarr__scope_report(gpuarr_scope s, gpuarr_result *result) {
    if (result) *result = s.result;
    return s;
}

#define GPUARR__CAT2(a, b) a##b
#define GPUARR__CAT(a, b) GPUARR__CAT2(a, b)
#define GPUARR__ID(name) GPUARR__CAT(gpuarr__##name##_, __LINE__)
/* The inner one-pass loop turns `break` and `continue` into "leave the block"; the outer loop's
   step then restores. */
#define GPUARR__WITH(enter)                                                                    \
    for (gpuarr_scope GPUARR__ID(scope) = enter; GPUARR__ID(scope).active;                     \
         gpuarr_scope_leave(&GPUARR__ID(scope)))                                               \
        for (int GPUARR__ID(once) = 1; GPUARR__ID(once); GPUARR__ID(once) = 0)
#define GPUARR_WITH_DEVICE(dev) GPUARR__WITH(gpuarr_scope_enter_device(dev))
#define GPUARR_WITH_STREAM(stream) GPUARR__WITH(gpuarr_scope_enter_stream(stream))
/* The same, writing the scope's result to *(result) before the block would run: GPUARR_OK, or
   the error that made it skip the block. */
#define GPUARR_WITH_DEVICE_R(dev, result) GPUARR__WITH(gpuarr__scope_report(gpuarr_scope_enter_device(dev), result))
#define GPUARR_WITH_STREAM_R(stream, result) GPUARR__WITH(gpuarr__scope_report(gpuarr_scope_enter_stream(stream), result))

/* ---------------------------------------------------------------------------------------------
 * Portable kernels (see KERNELS): one source compiled by the program's compiler for the host,
 * carried as text to OpenCL and CUDA, launched on arrays through a typed launcher.
 * ------------------------------------------------------------------------------------------- */
#define GPUARR_KERNEL_MAX_PARAMS 16
typedef enum gpuarr_param_kind {
    GPUARR_PARAM_SCALAR = 1, /* a value, the same for every index */
    GPUARR_PARAM_IN,         /* an array the kernel reads (a read-only array is allowed) */
    GPUARR_PARAM_OUT,        /* an array the kernel writes */
    GPUARR_PARAM_INOUT       /* an array the kernel reads and writes */
} gpuarr_param_kind;
typedef struct gpuarr_kernel_param {
    gpuarr_param_kind kind;
    gpuarr_dtype dtype; /* the element (an array) or value (a scalar) type */
    const char *type;   /* its C spelling: "float", "int32_t", "gpuarr_f16" */
    const char *name;   /* the parameter's name in the body */
} gpuarr_kernel_param;
/* The host form of a kernel: args[i] is parameter i (a scalar: its value's address; an array:
   its first element), global the index space (3 entries, 1 past ndim); runs the indices whose
   last dimension (ndim - 1) is in [begin, end). */
typedef void (*gpuarr_kernel_host_fn)(void *const *args, const int64_t *global, int ndim, int64_t begin, int64_t end);
/* What GPUARR_KERNEL makes: the kernel's description. Read it, never build one by hand. */
typedef struct gpuarr_kernel {
    const char *name;                  /* the C identifier */
    const char *body;                  /* the body's text, for the device compilers */
    int nparams;                       /* 1..GPUARR_KERNEL_MAX_PARAMS */
    const gpuarr_kernel_param *params;
    gpuarr_kernel_host_fn host;        /* the body compiled for the host */
} gpuarr_kernel;
/* Where and over what a launch runs; a zero field takes its default. */
typedef struct gpuarr_launch {
    gpuarr_stream stream; /* {0}: the arrays' device's current stream (see STREAMS) */
    int ndim;             /* 1..3; 0: 1-D over the first array parameter's elements */
    int64_t global[3];    /* the index space, global[0..ndim); each >= 0 (0: nothing runs) */
} gpuarr_launch;
/* One argument as the launcher passes it: an array parameter's array, or a scalar's address. */
typedef struct gpuarr_kernel_arg {
    gpuarr_array array;
    const void *scalar;
} gpuarr_kernel_arg;
/* Launches k over l's index space (NULL: the defaults) with args[0..k->nparams): checks every
   argument, orders the launch after the arrays' pending work, enqueues it, and records the
   arrays' use. The typed launchers GPUARR_KERNEL makes call this. */
GPUARR_API gpuarr_result gpuarr_kernel_launch(const gpuarr_kernel *k, const gpuarr_launch *l, const gpuarr_kernel_arg *args);
/* Builds k for device d now (a launch builds at first use): OK, GPUARR_ERROR_BUILD with the
   first compiler lines in the message, or UNSUPPORTED. */
GPUARR_API gpuarr_result gpuarr_kernel_build(const gpuarr_kernel *k, gpuarr_device d);
/* The whole compiler log of k's last build on d (NUL-terminated, cut to len); "" when the build
   succeeded without messages or never ran. */
GPUARR_API gpuarr_result gpuarr_kernel_build_log(const gpuarr_kernel *k, gpuarr_device d, char *buf, size_t len);

typedef enum gpuarr_reduce_op {
    GPUARR_SUM = 1, /* in out_dtype, integers wrapping */
    GPUARR_MIN,     /* a NaN wins */
    GPUARR_MAX,
    GPUARR_REDUCE_OP_COUNT
} gpuarr_reduce_op;
/* Reduces every element of a (converted to out_dtype by the conversion rules; 0 = a's dtype)
   with op, along one fixed tree, into *out: a new 0-d array on a's device. */
GPUARR_API gpuarr_result gpuarr_reduce(gpuarr_array a, gpuarr_reduce_op op, gpuarr_dtype out_dtype, gpuarr_array *out);

/* ---- the kernel language: GPUARR_KERNEL(name, (params...), { body }) ---- */
/* Parameters are written GPUARR_SCALAR(T, name), GPUARR_IN(T, name), GPUARR_OUT(T, name) and
   GPUARR_INOUT(T, name); the macros below give them their meaning in each place. */
/* In a body: the index along dimension d, and the index space's size there (int64_t). */
#define gpuarr_index(d) ((d) == 0 ? gpuarr__i0 : (d) == 1 ? gpuarr__i1 : gpuarr__i2)
#define gpuarr_size(d) ((d) == 0 ? gpuarr__g0 : (d) == 1 ? gpuarr__g1 : gpuarr__g2)
/* f16 and bf16 elements, read as float and written from float, rounding as conversions do. */
#define gpuarr_load_f16(p, i) gpuarr_f16_to_float((p)[i])
#define gpuarr_store_f16(p, i, v) ((p)[i] = gpuarr_f16_from_float(v))
#define gpuarr_load_bf16(p, i) gpuarr_bf16_to_float((p)[i])
#define gpuarr_store_bf16(p, i, v) ((p)[i] = gpuarr_bf16_from_float(v))

/* The types a parameter may have, and their dtypes (a type not listed does not compile). */
#define GPUARR__KT_int8_t GPUARR_I8
#define GPUARR__KT_uint8_t GPUARR_U8
#define GPUARR__KT_int16_t GPUARR_I16
#define GPUARR__KT_uint16_t GPUARR_U16
#define GPUARR__KT_int32_t GPUARR_I32
#define GPUARR__KT_uint32_t GPUARR_U32
#define GPUARR__KT_int64_t GPUARR_I64
#define GPUARR__KT_uint64_t GPUARR_U64
#define GPUARR__KT_float GPUARR_F32
#define GPUARR__KT_double GPUARR_F64
#define GPUARR__KT_gpuarr_f16 GPUARR_F16
#define GPUARR__KT_gpuarr_bf16 GPUARR_BF16

/* GPUARR__KEACH(M, ctx, (a, b, c)) -> M(ctx, a) M(ctx, b) M(ctx, c), for 1..16 parameters. */
#define GPUARR__KSTRIP(...) __VA_ARGS__
#define GPUARR__KEXP(x) x
#define GPUARR__KCOUNT(...) GPUARR__KEXP(GPUARR__KCOUNT_I(__VA_ARGS__, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0))
#define GPUARR__KCOUNT_I(a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, n, ...) n
#define GPUARR__KEACH(M, ctx, list) GPUARR__KEACH_N(GPUARR__KCOUNT list, M, ctx, GPUARR__KSTRIP list)
#define GPUARR__KEACH_N(n, M, ctx, ...) GPUARR__KEACH_NI(n, M, ctx, __VA_ARGS__)
#define GPUARR__KEACH_NI(n, M, ctx, ...) GPUARR__KEXP(GPUARR__KE##n(M, ctx, __VA_ARGS__))
#define GPUARR__KE1(M, c, a) M(c, a)
#define GPUARR__KE2(M, c, a, ...) M(c, a) GPUARR__KEXP(GPUARR__KE1(M, c, __VA_ARGS__))
#define GPUARR__KE3(M, c, a, ...) M(c, a) GPUARR__KEXP(GPUARR__KE2(M, c, __VA_ARGS__))
#define GPUARR__KE4(M, c, a, ...) M(c, a) GPUARR__KEXP(GPUARR__KE3(M, c, __VA_ARGS__))
#define GPUARR__KE5(M, c, a, ...) M(c, a) GPUARR__KEXP(GPUARR__KE4(M, c, __VA_ARGS__))
#define GPUARR__KE6(M, c, a, ...) M(c, a) GPUARR__KEXP(GPUARR__KE5(M, c, __VA_ARGS__))
#define GPUARR__KE7(M, c, a, ...) M(c, a) GPUARR__KEXP(GPUARR__KE6(M, c, __VA_ARGS__))
#define GPUARR__KE8(M, c, a, ...) M(c, a) GPUARR__KEXP(GPUARR__KE7(M, c, __VA_ARGS__))
#define GPUARR__KE9(M, c, a, ...) M(c, a) GPUARR__KEXP(GPUARR__KE8(M, c, __VA_ARGS__))
#define GPUARR__KE10(M, c, a, ...) M(c, a) GPUARR__KEXP(GPUARR__KE9(M, c, __VA_ARGS__))
#define GPUARR__KE11(M, c, a, ...) M(c, a) GPUARR__KEXP(GPUARR__KE10(M, c, __VA_ARGS__))
#define GPUARR__KE12(M, c, a, ...) M(c, a) GPUARR__KEXP(GPUARR__KE11(M, c, __VA_ARGS__))
#define GPUARR__KE13(M, c, a, ...) M(c, a) GPUARR__KEXP(GPUARR__KE12(M, c, __VA_ARGS__))
#define GPUARR__KE14(M, c, a, ...) M(c, a) GPUARR__KEXP(GPUARR__KE13(M, c, __VA_ARGS__))
#define GPUARR__KE15(M, c, a, ...) M(c, a) GPUARR__KEXP(GPUARR__KE14(M, c, __VA_ARGS__))
#define GPUARR__KE16(M, c, a, ...) M(c, a) GPUARR__KEXP(GPUARR__KE15(M, c, __VA_ARGS__))
/* M(ctx, GPUARR_IN(float, x)) -> ctx##GPUARR_IN(float, x): a macro per context and kind. */
#define GPUARR__KPASTE(ctx, p) ctx##p

/* The launcher's parameters: ", float a", ", gpuarr_array x". */
#define GPUARR__KDECL_(c, p) GPUARR__KPASTE(GPUARR__KDECL_, p)
#define GPUARR__KDECL_GPUARR_SCALAR(T, n) , T n
#define GPUARR__KDECL_GPUARR_IN(T, n) , gpuarr_array n
#define GPUARR__KDECL_GPUARR_OUT(T, n) , gpuarr_array n
#define GPUARR__KDECL_GPUARR_INOUT(T, n) , gpuarr_array n
/* The launcher's argument list: {{0}, &a}, {x, NULL}. */
#define GPUARR__KARG_(c, p) GPUARR__KPASTE(GPUARR__KARG_, p)
#define GPUARR__KARG_GPUARR_SCALAR(T, n) {{0}, &n},
#define GPUARR__KARG_GPUARR_IN(T, n) {n, 0},
#define GPUARR__KARG_GPUARR_OUT(T, n) {n, 0},
#define GPUARR__KARG_GPUARR_INOUT(T, n) {n, 0},
/* The parameter table. */
#define GPUARR__KPARAM_(c, p) GPUARR__KPASTE(GPUARR__KPARAM_, p)
#define GPUARR__KPARAM_GPUARR_SCALAR(T, n) {GPUARR_PARAM_SCALAR, GPUARR__KT_##T, #T, #n},
#define GPUARR__KPARAM_GPUARR_IN(T, n) {GPUARR_PARAM_IN, GPUARR__KT_##T, #T, #n},
#define GPUARR__KPARAM_GPUARR_OUT(T, n) {GPUARR_PARAM_OUT, GPUARR__KT_##T, #T, #n},
#define GPUARR__KPARAM_GPUARR_INOUT(T, n) {GPUARR_PARAM_INOUT, GPUARR__KT_##T, #T, #n},
/* The host function's locals, one per parameter, from args[]. */
#define GPUARR__KLOCAL_(c, p) GPUARR__KPASTE(GPUARR__KLOCAL_, p)
#define GPUARR__KLOCAL_GPUARR_SCALAR(T, n) const T n = *(const T *)gpuarr__args[gpuarr__at++];
#define GPUARR__KLOCAL_GPUARR_IN(T, n) const T *const n = (const T *)gpuarr__args[gpuarr__at++];
#define GPUARR__KLOCAL_GPUARR_OUT(T, n) T *const n = (T *)gpuarr__args[gpuarr__at++];
#define GPUARR__KLOCAL_GPUARR_INOUT(T, n) T *const n = (T *)gpuarr__args[gpuarr__at++];
/* The one-index function's parameters (a body may leave any unused) and the call's arguments. */
#define GPUARR__KITEM_(c, p) GPUARR__KPASTE(GPUARR__KITEM_, p)
#define GPUARR__KITEM_GPUARR_SCALAR(T, n) GPUARR__KUNUSED const T n,
#define GPUARR__KITEM_GPUARR_IN(T, n) GPUARR__KUNUSED const T *const n,
#define GPUARR__KITEM_GPUARR_OUT(T, n) GPUARR__KUNUSED T *const n,
#define GPUARR__KITEM_GPUARR_INOUT(T, n) GPUARR__KUNUSED T *const n,
#define GPUARR__KCALL_(c, p) GPUARR__KPASTE(GPUARR__KCALL_, p)
#define GPUARR__KCALL_GPUARR_SCALAR(T, n) n,
#define GPUARR__KCALL_GPUARR_IN(T, n) n,
#define GPUARR__KCALL_GPUARR_OUT(T, n) n,
#define GPUARR__KCALL_GPUARR_INOUT(T, n) n,

#ifdef __cplusplus
#define GPUARR__KLINK extern "C"
#else
#define GPUARR__KLINK extern
#endif
/* No contraction of a * b + c into an fma on the host either: the same bits as the devices. The
   body runs as a function of one index (so that `return` ends that index only), inlined. */
#if defined(__GNUC__) || defined(__clang__)
#define GPUARR__KUNUSED __attribute__((unused))
#define GPUARR__KINLINE static inline __attribute__((always_inline))
#else
#define GPUARR__KUNUSED
#define GPUARR__KINLINE static inline
#endif
#if defined(__clang__)
#define GPUARR__KHOST_ATTR
#define GPUARR__KHOST_PRAGMA _Pragma("clang fp contract(off)")
#elif defined(__GNUC__)
#define GPUARR__KHOST_ATTR __attribute__((optimize("fp-contract=off")))
#define GPUARR__KHOST_PRAGMA
#else
#define GPUARR__KHOST_ATTR
#define GPUARR__KHOST_PRAGMA
#endif

/* In C, a file that defines kernels includes <tgmath.h>, so that sqrt of a float is sqrtf as on
   the devices (with <math.h> alone it is computed in double: other bits). The check: tgmath's
   sqrt is a macro, so its expansion's text is longer than "sqrt(0)". C++ has the overloads. */
#define GPUARR__KSTR(...) #__VA_ARGS__
#define GPUARR__KXSTR(...) GPUARR__KSTR(__VA_ARGS__)
#ifdef __cplusplus
#define GPUARR__KTGMATH(name)
#else
#define GPUARR__KTGMATH(name) \
    typedef char name##_gpuarr_kernel_needs_tgmath_h_included[sizeof(GPUARR__KXSTR(sqrt(0))) > sizeof("sqrt(0)") ? 1 : -1];
#endif

/* Declares the kernel `name` defined elsewhere: its description and its typed launcher
   gpuarr_result name(const gpuarr_launch *l, <a value per SCALAR, a gpuarr_array per array>). */
#define GPUARR_KERNEL_DECLARE(name, params)                                                    \
    GPUARR__KLINK const gpuarr_kernel name##_gpuarr_kernel;                                    \
    GPUARR__KLINK gpuarr_result name(const gpuarr_launch *gpuarr__launch GPUARR__KEACH(GPUARR__KDECL_, ~, params))

/* Defines the kernel `name` (in one .c or .cu file): the host function, the description with the
   body's text, and the typed launcher. The body is C that is also OpenCL C and CUDA C++ (see
   KERNELS for what it may use). */
#define GPUARR_KERNEL(name, params, ...)                                                       \
    GPUARR__KTGMATH(name)                                                                      \
    GPUARR_KERNEL_DECLARE(name, params);                                                       \
    GPUARR__KERNEL_DEFINE(, name, #__VA_ARGS__, params, __VA_ARGS__)
/* The definitions; link: empty (external, as declared) or static (the library's own kernels);
   text: the body as written (stringized where it is an argument not yet expanded). */
#define GPUARR__KERNEL_DEFINE(link, name, text, params, ...)                                       \
    GPUARR__KHOST_ATTR GPUARR__KINLINE void name##_gpuarr_item(                                \
        GPUARR__KEACH(GPUARR__KITEM_, ~, params) GPUARR__KUNUSED int64_t gpuarr__i0, GPUARR__KUNUSED int64_t gpuarr__i1, \
        GPUARR__KUNUSED int64_t gpuarr__i2, GPUARR__KUNUSED int64_t gpuarr__g0, GPUARR__KUNUSED int64_t gpuarr__g1, \
        GPUARR__KUNUSED int64_t gpuarr__g2) {                                                  \
        GPUARR__KHOST_PRAGMA                                                                   \
        __VA_ARGS__                                                                            \
    }                                                                                          \
    GPUARR__KHOST_ATTR static void name##_gpuarr_host(void *const *gpuarr__args, const int64_t *gpuarr__global, int gpuarr__ndim, \
                                                      int64_t gpuarr__begin, int64_t gpuarr__end) { \
        int gpuarr__at = 0;                                                                    \
        GPUARR__KEACH(GPUARR__KLOCAL_, ~, params)                                              \
        const int64_t gpuarr__g0 = gpuarr__global[0], gpuarr__g1 = gpuarr__global[1], gpuarr__g2 = gpuarr__global[2]; \
        int64_t gpuarr__lo[3] = {0, 0, 0}, gpuarr__hi[3] = {gpuarr__g0, gpuarr__g1, gpuarr__g2}; \
        gpuarr__lo[gpuarr__ndim - 1] = gpuarr__begin;                                          \
        gpuarr__hi[gpuarr__ndim - 1] = gpuarr__end;                                            \
        (void)gpuarr__at;                                                                      \
        for (int64_t gpuarr__i2 = gpuarr__lo[2]; gpuarr__i2 < gpuarr__hi[2]; gpuarr__i2++)     \
            for (int64_t gpuarr__i1 = gpuarr__lo[1]; gpuarr__i1 < gpuarr__hi[1]; gpuarr__i1++) \
                for (int64_t gpuarr__i0 = gpuarr__lo[0]; gpuarr__i0 < gpuarr__hi[0]; gpuarr__i0++) \
                    name##_gpuarr_item(GPUARR__KEACH(GPUARR__KCALL_, ~, params) gpuarr__i0, gpuarr__i1, gpuarr__i2, \
                                       gpuarr__g0, gpuarr__g1, gpuarr__g2);                    \
    }                                                                                          \
    static const gpuarr_kernel_param name##_gpuarr_params[] = {GPUARR__KEACH(GPUARR__KPARAM_, ~, params)}; \
    link const gpuarr_kernel name##_gpuarr_kernel = {#name, text, (int)(sizeof name##_gpuarr_params / sizeof name##_gpuarr_params[0]), \
                                                name##_gpuarr_params, name##_gpuarr_host}; \
    link gpuarr_result name(const gpuarr_launch *gpuarr__launch GPUARR__KEACH(GPUARR__KDECL_, ~, params)) { \
        const gpuarr_kernel_arg gpuarr__args[] = {GPUARR__KEACH(GPUARR__KARG_, ~, params)};   \
        return gpuarr_kernel_launch(&name##_gpuarr_kernel, gpuarr__launch, gpuarr__args);      \
    }

/* ---------------------------------------------------------------------------------------------
 * Memory pools: one caching allocator per device (see MEMORY POOLS in the manual).
 * ------------------------------------------------------------------------------------------- */
typedef struct gpuarr_pool_stats {
    /* bytes of live arrays (rounded to blocks), and as asked for; current, peak, total */
    uint64_t allocated_bytes, peak_allocated_bytes, total_allocated_bytes;
    uint64_t requested_bytes, peak_requested_bytes, total_requested_bytes;
    /* bytes held from the device (live + cached) */
    uint64_t reserved_bytes, peak_reserved_bytes, total_reserved_bytes;
    uint64_t allocations, peak_allocations, total_allocations; /* live blocks */
    uint64_t segments, peak_segments, total_segments;          /* device allocations held */
    uint64_t limit_bytes;             /* reserved bytes may not exceed this */
    uint64_t release_threshold_bytes; /* cached bytes above this go back at sync points */
    uint64_t cache_hits, cache_misses, backend_allocs, backend_frees, cross_stream_waits;
    /* the out-of-memory ladder, step by step */
    uint64_t oom_handler_calls, oom_oversize_releases, oom_waits, oom_trims, oom_retries, oom_failures;
    uint64_t host_fallbacks;
} gpuarr_pool_stats;

typedef struct gpuarr_pool_segment_info {
    uint64_t size;
    bool small_pool;
    uint32_t first_block, block_count; /* into the blocks array of gpuarr_pool_snapshot */
} gpuarr_pool_segment_info;

typedef struct gpuarr_pool_block_info {
    uint64_t offset, size, requested; /* requested: 0 when free */
    bool allocated;
    uint32_t pending_events;          /* free, but reusable elsewhere only after these complete */
} gpuarr_pool_block_info;

/* Asked, in order, when a device allocation fails: return true to have gpuarr retry (say, after
   freeing arrays of your own). Called without gpuarr's locks held, from the allocating thread. */
typedef bool (*gpuarr_oom_fn)(gpuarr_device d, uint64_t requested_bytes, void *user_data);

GPUARR_API gpuarr_result gpuarr_pool_get_stats(gpuarr_device d, gpuarr_pool_stats *out);
/* The same counters for d's pinned host pool: the staging chunks that large transfers between
   pageable host memory and a discrete device go through (all zero where the device needs none). */
GPUARR_API gpuarr_result gpuarr_pool_get_pinned_stats(gpuarr_device d, gpuarr_pool_stats *out);
GPUARR_API gpuarr_result gpuarr_pool_reset_peaks(gpuarr_device d);
/* bytes = 0: no limit beyond the device's memory. Lowering it below what is reserved releases
   cached memory as far as it can; live arrays are never affected. */
GPUARR_API gpuarr_result gpuarr_pool_set_limit(gpuarr_device d, uint64_t bytes);
/* Gives every cached segment of d back to the device (after the work that used it completes). */
GPUARR_API gpuarr_result gpuarr_pool_trim(gpuarr_device d);
/* A human-readable table of the stats, NUL-terminated, truncated to len. */
GPUARR_API gpuarr_result gpuarr_pool_summary(gpuarr_device d, char *buf, size_t len);
/* The pool's segments and their blocks in address order. Writes at most max_* entries and sets
   *segment_count / *block_count to the totals (call with max 0 to size the arrays). */
GPUARR_API gpuarr_result gpuarr_pool_snapshot(gpuarr_device d, gpuarr_pool_segment_info *segments, size_t max_segments,
                                              size_t *segment_count, gpuarr_pool_block_info *blocks, size_t max_blocks,
                                              size_t *block_count);
GPUARR_API gpuarr_result gpuarr_oom_handler_add(gpuarr_oom_fn fn, void *user_data); /* at most 16 */
GPUARR_API gpuarr_result gpuarr_oom_handler_remove(gpuarr_oom_fn fn, void *user_data);
/* Fault injection for tests: the nth raw device allocation from now fails (0 = off), and every
   raw allocation above above_bytes fails (0 = off). Also GPUARR_FAULTS (see the manual). */
GPUARR_API gpuarr_result gpuarr_pool_inject_faults(gpuarr_device d, uint64_t nth, uint64_t above_bytes);

/* ---------------------------------------------------------------------------------------------
 * OpenCL interop. Native handles travel as void * here; with <CL/cl.h> included, the typed
 * gpuarr_opencl_* forms below are declared too. What gpuarr returns stays owned by gpuarr and
 * valid while its device, stream or array lives (but gpuarr_opencl_export_mem's buffer, the
 * caller's). Wrapping adds a reference to the caller's object and drops it when gpuarr is done:
 * the caller keeps theirs. A wrapped buffer or queue must belong to the device's context
 * (gpuarr_opencl_context_raw: the caller's for an adopted device); a wrapped queue
 * must be in order (gpuarr orders a stream's work by its queue: an out-of-order queue is refused
 * with GPUARR_ERROR_INVALID_ARGUMENT). Without the OpenCL backend these return
 * GPUARR_ERROR_UNSUPPORTED.
 * ------------------------------------------------------------------------------------------- */
/* The cl_context gpuarr uses for d (its platform's, shared by the platform's devices). */
GPUARR_API gpuarr_result gpuarr_opencl_context_raw(gpuarr_device d, void **cl_context_out);
/* The cl_device_id of d. */
GPUARR_API gpuarr_result gpuarr_opencl_device_id_raw(gpuarr_device d, void **cl_device_id_out);
/* The in-order cl_command_queue that runs s's work. */
GPUARR_API gpuarr_result gpuarr_opencl_queue_raw(gpuarr_stream s, void **cl_command_queue_out);
/* The buffer holding a's elements, and the byte offset where they start. */
GPUARR_API gpuarr_result gpuarr_opencl_mem_raw(gpuarr_array a, void **cl_mem_out, size_t *offset);
/* An array on d over the caller's cl_mem from byte `offset` on, shape[ndim] elements of t. */
GPUARR_API gpuarr_result gpuarr_opencl_wrap_mem_raw(gpuarr_device d, void *cl_mem, size_t offset, gpuarr_dtype t, int ndim,
                                                    const int64_t *shape, gpuarr_array *out);
/* A stream on d whose work runs on the caller's in-order cl_command_queue. */
GPUARR_API gpuarr_result gpuarr_opencl_wrap_queue_raw(gpuarr_device d, void *cl_command_queue, gpuarr_stream *out);
/* A new device made of the caller's cl_context and one of its devices (see ADOPTED DEVICES),
   with the caller's in-order cl_command_queue of that context and device as every thread's
   default stream there, or NULL for queues gpuarr makes in that context. gpuarr retains the
   context and the queue until gpuarr_device_remove or gpuarr_shutdown. */
GPUARR_API gpuarr_result gpuarr_opencl_adopt_raw(void *cl_context, void *cl_device_id, void *cl_command_queue,
                                                 gpuarr_device *out);
/* A new cl_mem over exactly a's elements (a sub-buffer), the caller's to release with
   clReleaseMemObject: a's memory stays allocated until that release, whatever becomes of a's
   handle. Returns once a's pending work is complete. */
GPUARR_API gpuarr_result gpuarr_opencl_export_mem_raw(gpuarr_array a, void **cl_mem_out);

/* ---------------------------------------------------------------------------------------------
 * CUDA interop. The handles are the driver's, declared with CUDA's own struct tags, so CUcontext,
 * CUstream and cudaStream_t pass as they are (no cast, no CUDA header needed here). The context
 * is the device's primary context: the CUDA runtime uses the same one, so runtime pointers,
 * streams and kernels work with gpuarr's and the other way round. What gpuarr returns stays
 * owned by gpuarr and valid while its device, stream or array lives. Wrapping never takes
 * ownership; a wrapped pointer's `release` (if not NULL) is called once gpuarr no longer uses it.
 * A wrapped stream's CUstream must live until gpuarr_stream_destroy of the wrap returns, which
 * waits for it; after that gpuarr never touches it, though arrays used on it live on.
 * Without the CUDA backend these return GPUARR_ERROR_UNSUPPORTED.
 * ------------------------------------------------------------------------------------------- */
struct CUctx_st;
struct CUstream_st;
/* d's primary context (the CUDA runtime's for that device too); an adopted device's: the caller's. */
GPUARR_API gpuarr_result gpuarr_cuda_context(gpuarr_device d, struct CUctx_st **out);
/* The CUDA device ordinal (cudaSetDevice's; "cuda:N" is ordinal N). */
GPUARR_API gpuarr_result gpuarr_cuda_device_ordinal(gpuarr_device d, int *out);
/* The CUstream (a cudaStream_t) that runs s's work. */
GPUARR_API gpuarr_result gpuarr_cuda_stream(gpuarr_stream s, struct CUstream_st **out);
/* The device address of a's first element. */
GPUARR_API gpuarr_result gpuarr_cuda_ptr(gpuarr_array a, void **out);
/* An array on d over ptr: device memory of d's primary context (cudaMalloc, cuMemAlloc), aligned
   for t, holding the whole array; release(user_data) runs once gpuarr no longer uses it. */
GPUARR_API gpuarr_result gpuarr_cuda_wrap_ptr(gpuarr_device d, void *ptr, gpuarr_dtype t, int ndim, const int64_t *shape,
                                              gpuarr_release_fn release, void *user_data, gpuarr_array *out);
/* A stream on d whose work runs on `stream`, one of d's primary context (runtime's or driver's). */
GPUARR_API gpuarr_result gpuarr_cuda_wrap_stream(gpuarr_device d, struct CUstream_st *stream, gpuarr_stream *out);
/* A new device (*out, "cuda:N" after those gpuarr_init found; info.adopted, info.same_as = the
   cuda:K of the same GPU) whose driver calls all run in ctx, a context the caller made with
   cuCtxCreate (see CUDA in the manual). The caller keeps ctx alive until gpuarr_device_remove(*out)
   or gpuarr_shutdown: CUDA counts no references on such contexts, so gpuarr holds none. Errors:
   GPUARR_ERROR_INVALID_ARGUMENT for ctx NULL, not a usable context (destroyed, never one, or
   corrupted by a sticky error, where the driver can tell: its answer is named; a dangling pointer
   may crash a real driver, so pass a live context), a device's primary context (use
   that cuda:K), or a context adopted already (the message names its device); UNSUPPORTED without
   the CUDA backend; OUT_OF_MEMORY past GPUARR__ADOPT_MAX adoptions in one gpuarr_init cycle.
   Thread-safe. */
GPUARR_API gpuarr_result gpuarr_cuda_adopt(struct CUctx_st *ctx, gpuarr_device *out);

/* ---------------------------------------------------------------------------------------------
 * Tracing (see TRACING in the manual). These work with or without gpuarr_init.
 * ------------------------------------------------------------------------------------------- */
/* Starts recording a Chrome trace-event JSON file at path (created or truncated now; written at
   gpuarr_trace_stop). Errors: GPUARR_ERROR_INVALID_ARGUMENT (path NULL, empty, longer than 480
   characters, or not writable: the message gives the system's reason), GPUARR_ERROR_UNSUPPORTED
   (a trace is already being recorded: one at a time). Thread-safe. */
GPUARR_API gpuarr_result gpuarr_trace_start(const char *path);
/* Stops recording and writes the file. Errors: GPUARR_ERROR_UNSUPPORTED (no trace is being
   recorded), GPUARR_ERROR_INVALID_ARGUMENT (the file could not be written: the reason),
   GPUARR_ERROR_OUT_OF_MEMORY (no host memory to gather the events; the file is then closed
   holding an empty trace). Thread-safe. */
GPUARR_API gpuarr_result gpuarr_trace_stop(void);

/* ---------------------------------------------------------------------------------------------
 * Local rank (see LOCAL RANK): a device per process of a launcher, by its node-local rank.
 * ------------------------------------------------------------------------------------------- */
/* The node-local rank the launcher gives: the first of OMPI_COMM_WORLD_LOCAL_RANK,
   MV2_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID, SLURM_LOCALID, PMI_LOCAL_RANK that is set (not
   empty). *variable (unless variable is NULL) = its name, a static string, or NULL when none is
   set: then *rank = 0 (a lone process is local rank 0). Read at each call; needs no gpuarr_init.
   Errors: rank NULL, or the variable's value not a decimal integer 0..999999999: INVALID_ARGUMENT
   naming the variable and its value (nothing is written). */
GPUARR_API gpuarr_result gpuarr_local_rank(int *rank, const char **variable);

/* ---------------------------------------------------------------------------------------------
 * DLPack (v1.1 ABI). With <dlpack/dlpack.h> (v1.x) included before gpuarr.h its types are used;
 * otherwise the declarations below, written for gpuarr with DLPack's names, field order, types
 * and include guard, stand in for it (tests/compile/dlpack_abi.c checks sizes and offsets).
 * ------------------------------------------------------------------------------------------- */
#if defined(DLPACK_DLPACK_H_) && (!defined(DLPACK_MAJOR_VERSION) || DLPACK_MAJOR_VERSION != 1)
#error "gpuarr.h needs DLPack 1.x: <dlpack/dlpack.h> included before it is another major version"
#endif
#ifndef DLPACK_DLPACK_H_
#define DLPACK_DLPACK_H_
#define DLPACK_MAJOR_VERSION 1
#define DLPACK_MINOR_VERSION 1
typedef struct {
    uint32_t major;
    uint32_t minor;
} DLPackVersion;
#ifdef __cplusplus
typedef enum : int32_t {
#else
typedef enum {
#endif
    kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3, kDLOpenCL = 4, kDLVulkan = 7, kDLMetal = 8, kDLVPI = 9,
    kDLROCM = 10, kDLROCMHost = 11, kDLExtDev = 12, kDLCUDAManaged = 13, kDLOneAPI = 14, kDLWebGPU = 15,
    kDLHexagon = 16, kDLMAIA = 17, kDLTrn = 18
} DLDeviceType;
typedef struct {
    DLDeviceType device_type;
    int32_t device_id;
} DLDevice;
typedef enum {
    kDLInt = 0U, kDLUInt = 1U, kDLFloat = 2U, kDLOpaqueHandle = 3U, kDLBfloat = 4U, kDLComplex = 5U, kDLBool = 6U,
    kDLFloat8_e3m4 = 7U, kDLFloat8_e4m3 = 8U, kDLFloat8_e4m3b11fnuz = 9U, kDLFloat8_e4m3fn = 10U,
    kDLFloat8_e4m3fnuz = 11U, kDLFloat8_e5m2 = 12U, kDLFloat8_e5m2fnuz = 13U, kDLFloat8_e8m0fnu = 14U,
    kDLFloat6_e2m3fn = 15U, kDLFloat6_e3m2fn = 16U, kDLFloat4_e2m1fn = 17U
} DLDataTypeCode;
typedef struct {
    uint8_t code;   /* a DLDataTypeCode */
    uint8_t bits;
    uint16_t lanes;
} DLDataType;
typedef struct {
    void *data;     /* CPU: address; CUDA: device pointer; OpenCL: the cl_mem */
    DLDevice device;
    int32_t ndim;
    DLDataType dtype;
    int64_t *shape;
    int64_t *strides; /* in elements; NULL means compact row-major */
    uint64_t byte_offset;
} DLTensor;
typedef struct DLManagedTensor {
    DLTensor dl_tensor;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensor *self);
} DLManagedTensor;
#define DLPACK_FLAG_BITMASK_READ_ONLY (1UL << 0UL)
#define DLPACK_FLAG_BITMASK_IS_COPIED (1UL << 1UL)
#define DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED (1UL << 2UL)
struct DLManagedTensorVersioned {
    DLPackVersion version;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensorVersioned *self);
    uint64_t flags;
    DLTensor dl_tensor;
};
#endif /* DLPACK_DLPACK_H_ */
/* dlpack.h 1.1 declares this one as a plain struct (C code must say `struct`); the typedef gives
   it its bare name either way (C11 and C++ allow a typedef to be repeated, should a later
   dlpack.h add it). */
typedef struct DLManagedTensorVersioned DLManagedTensorVersioned;

/* gpuarr_to_dlpack's flags: the consumer must not write (DLPACK_FLAG_BITMASK_READ_ONLY). */
#define GPUARR_DLPACK_READ_ONLY ((uint64_t)1)

/* Export: a DLManagedTensorVersioned sharing a's memory (no copy), holding it (as a view of a
   does, not through a's handle) until the consumer calls its deleter (exactly once, from any
   thread, also after gpuarr_shutdown).
   Returns once a's contents are complete; _async instead orders `consumer` (a stream of any
   device, {0} = the current one) after the work producing a, without waiting. flags: 0 or
   GPUARR_DLPACK_READ_ONLY (always set for a read-only array). *out is set only on success. */
GPUARR_API gpuarr_result gpuarr_to_dlpack(gpuarr_array a, uint64_t flags, DLManagedTensorVersioned **out);
GPUARR_API gpuarr_result gpuarr_to_dlpack_async(gpuarr_array a, gpuarr_stream consumer, uint64_t flags,
                                                DLManagedTensorVersioned **out);
/* Import: an array on the tensor's memory (no copy). gpuarr takes t in every case: its deleter
   (if not NULL) is called exactly once, when the last reference to the array (and its views)
   goes, or before this call returns an error. */
GPUARR_API gpuarr_result gpuarr_from_dlpack(DLManagedTensorVersioned *t, gpuarr_array *out);
/* The same for the pre-1.0 DLManagedTensor (no version, no flags: a read-only array is refused
   with GPUARR_ERROR_INVALID_ARGUMENT, since its consumer could not be told). */
GPUARR_API gpuarr_result gpuarr_to_dlpack_legacy(gpuarr_array a, DLManagedTensor **out);
GPUARR_API gpuarr_result gpuarr_from_dlpack_legacy(DLManagedTensor *t, gpuarr_array *out);
/* DLPack's Python protocol through ctypes, with no extension module (see the manual and
   python/gpuarr): the capsule names ("dltensor_versioned", "dltensor", and the
   "used_" names a consumer gives what it took), static strings that outlive every capsule, and a
   PyCapsule destructor that calls the tensor's deleter unless a consumer took the capsule. It
   finds CPython's functions in the running process; outside Python it does nothing. */
GPUARR_API const char *gpuarr_dlpack_capsule_name(bool versioned, bool used);
GPUARR_API void gpuarr_dlpack_capsule_destructor(void *capsule);


#ifdef __cplusplus
} /* extern "C" */
#endif

/* ---------------------------------------------------------------------------------------------
 * Leases (see LEASES): a slot on a device, taken for a piece of work and given back after it.
 * ------------------------------------------------------------------------------------------- */
typedef enum gpuarr_placement {
    GPUARR_PLACE_DEFAULT = 0,  /* least leased (share of slots in use), ties by most free memory */
    GPUARR_PLACE_LEAST_LEASED, /* the same */
    GPUARR_PLACE_MOST_FREE,    /* most free memory, ties by least leased */
    GPUARR_PLACE_ROUND_ROBIN,  /* the candidate after the one this process leased last */
    GPUARR_PLACEMENT_COUNT
} gpuarr_placement;
typedef struct gpuarr_lease_desc {
    const char *devices;        /* candidates, comma separated: "gpu" (every GPU; the default), "any"
                                   (every GPU, else the host), "all" (every device, the host included),
                                   host, cuda, cuda:*, cuda:N, opencl..., local, local:R */
    gpuarr_placement placement;
    const char *affinity;       /* leases with the same key go to the same physical device while it
                                   has free slots; NULL = none (at most 127 characters) */
    int slots;                  /* slots this lease takes on its device; 0 = 1 */
    uint64_t memory_bytes;      /* free device memory the work needs (0 = no condition) */
    int64_t timeout_ms;         /* 0 = try once, < 0 = wait forever */
} gpuarr_lease_desc;
/* Takes desc->slots slots on one candidate device (NULL desc = defaults), waiting for them in
   FIFO order up to desc->timeout_ms; writes *out only on success. A FAILED device is never
   leased. Errors: INVALID_ARGUMENT (a desc field or out, named), NO_DEVICE (no candidate
   present), DEVICE_LOST (every candidate failed), TIMEOUT (no slot in time; the message says who
   holds them). Thread-safe. */
GPUARR_API gpuarr_result gpuarr_lease_acquire(const gpuarr_lease_desc *desc, gpuarr_lease *out);
/* Gives the slots back and wakes waiters. A released or unknown lease: INVALID_HANDLE. */
GPUARR_API gpuarr_result gpuarr_lease_release(gpuarr_lease l);
/* The device the lease is on (the view its candidates named: "opencl:0" stays opencl:0). */
GPUARR_API gpuarr_result gpuarr_lease_device(gpuarr_lease l, gpuarr_device *out);
/* The slots of d's physical device (shared by its views through other backends): at least 1, and
   not below the slots in use. Raising them wakes waiters. */
GPUARR_API gpuarr_result gpuarr_device_set_slots(gpuarr_device d, int slots);
GPUARR_API gpuarr_result gpuarr_device_get_slots(gpuarr_device d, int *total, int *in_use);
/* Every slot of d's physical device, a line each, into buf (NUL-terminated, cut to len):
   "opencl:0 slot 0: free", or "... slot 1: pid P thread T host H program NAME since UNIX-TIME"
   (from the slot files: any process; per process, with GPUARR_LEASE_DIR=off: this one's leases).
   What gpuarr-info --leases prints. Errors: buf NULL or len 0 (INVALID_ARGUMENT), d (INVALID_HANDLE). */
GPUARR_API gpuarr_result gpuarr_lease_summary(gpuarr_device d, char *buf, size_t len);

/* Placement before running (see PLANS): a device for each step of a pipeline. */
#define GPUARR_NEED_FP64 0x1u   /* the step computes in f64: not on OpenCL devices without cl_khr_fp64 */
typedef struct gpuarr_plan_step {
    const char *name;           /* for messages; NULL = its index */
    const char *devices;        /* candidates, as gpuarr_lease_desc.devices (NULL = "gpu"): "host",
                                   "gpu", "any", "cuda", "opencl:1", lists */
    uint32_t needs;             /* GPUARR_NEED_* bits */
    uint64_t memory_bytes;      /* device memory the step uses at its peak (0 = no condition) */
} gpuarr_plan_step;
/* Writes out[i], the device of steps[i], for all count steps, or nothing: the physical device
   that can take the most steps takes them (ties: placement, as for leases), then the next for
   the rest. Errors: INVALID_ARGUMENT (steps, out, count, placement, a step's needs or devices,
   named), NO_DEVICE (a step no candidate can take: the message names the step and says why of
   each candidate). Thread-safe. */
GPUARR_API gpuarr_result gpuarr_plan(const gpuarr_plan_step *steps, int count, gpuarr_placement placement, gpuarr_device *out);

/* Acquires a lease (gpuarr_lease_acquire) and makes its device current; leave releases it. */
GPUARR_API gpuarr_scope gpuarr_scope_enter_lease(const gpuarr_lease_desc *desc);
/* GPUARR_WITH_LEASE(desc_ptr, dev) { ... }: leases a device, declares `gpuarr_device dev` for the
   block and makes it current, and releases the lease when the block ends (normally, by break or
   by continue; as GPUARR_WITH_DEVICE, return and goto skip the release). No slot in time (or a bad
   desc): the block is skipped and gpuarr_last_error() says why; the _R form writes the result. */
#define GPUARR__WITH_LEASE(enter, dev)                                                         \
    for (gpuarr_scope GPUARR__ID(scope) = enter; GPUARR__ID(scope).active;                     \
         gpuarr_scope_leave(&GPUARR__ID(scope)))                                               \
        for (int GPUARR__ID(once) = 1; GPUARR__ID(once); GPUARR__ID(once) = 0)                 \
            for (gpuarr_device dev = GPUARR__ID(scope).device; GPUARR__ID(once); GPUARR__ID(once) = 0)
#define GPUARR_WITH_LEASE(desc, dev) GPUARR__WITH_LEASE(gpuarr_scope_enter_lease(desc), dev)
#define GPUARR_WITH_LEASE_R(desc, dev, result)                                                 \
    GPUARR__WITH_LEASE(gpuarr__scope_report(gpuarr_scope_enter_lease(desc), result), dev)

/* ---------------------------------------------------------------------------------------------
 * Transfer estimates (see TRANSFER MODEL): predicted seconds to move data between devices.
 * ------------------------------------------------------------------------------------------- */
/* Seconds predicted to move `bytes` of src's data (bytes == 0: the whole array; at most its
   nbytes) to dst as dtype t (0 = src's dtype), from the memory src is in: pinned when src is a
   pinned host array made for dst, else pageable host memory, or src's device memory. Fits the
   pair's model first when it has none (GPUARR_CALIBRATE=on: a few transfers, under a second on
   most machines). *seconds is written only on success. Errors: seconds NULL or t not a dtype
   (INVALID_ARGUMENT), bytes more than the array holds (INVALID_ARGUMENT), src or dst not live
   (INVALID_HANDLE), a FAILED device (DEVICE_LOST). Thread-safe. */
GPUARR_API gpuarr_result gpuarr_transfer_estimate_array(gpuarr_array src, gpuarr_device dst, gpuarr_dtype t,
                                                        uint64_t bytes, double *seconds);
/* The same from a device: pageable host memory when src is the host, its device memory otherwise,
   dtype t (1..13, required) on both sides. */
GPUARR_API gpuarr_result gpuarr_transfer_estimate_device(gpuarr_device src, gpuarr_device dst, gpuarr_dtype t,
                                                         uint64_t bytes, double *seconds);
/* Fits every pair that involves d now (host <-> d both ways, pageable and pinned, cast and not;
   d -> d cast; d <-> every other device; for d = the host: host -> host cast and host <-> every
   device), replacing the models it had, and saves them. Seconds per device on most machines.
   Errors: d not live (INVALID_HANDLE), FAILED (DEVICE_LOST); a transfer that fails: its error,
   naming the pair. Thread-safe: a pair being fitted by another thread is waited for. */
GPUARR_API gpuarr_result gpuarr_calibrate(gpuarr_device d);
/* Every model known in this process (those on disk for these devices are read first), a line
   each: "host -> opencl:0 pinned copy: latency 12.0 us, 5.123 GB/s (measured)"; origin measured,
   loaded (from the cache) or set. NUL-terminated, the whole lines that fit in len. Errors: buf NULL or len 0
   (INVALID_ARGUMENT). */
GPUARR_API gpuarr_result gpuarr_transfer_models_summary(char *buf, size_t len);

/* ---------------------------------------------------------------------------------------------
 * Tasks and offload (see OFFLOAD): the library picks the device a piece of user work runs on.
 * ------------------------------------------------------------------------------------------- */
#define GPUARR_TASK_MAX_ARRAYS 8 /* inputs, and outputs, of a task */
#define GPUARR_TASK_MAX_BACKENDS 8 /* entries of gpuarr_task_desc.impl: room for backends to come,
                                      so the struct does not change size when one is added */
/* An implementation: called with every input already on its device (in[i] there, as the task's
   dtype), that device current, and a stream s of it to enqueue on (the host: runs at once); it
   makes its outputs on the same device (out[0..n_out) are {0} on entry) and returns OK or an
   error. It may be called from several threads at once (gpuarr_map). */
typedef gpuarr_result (*gpuarr_task_fn)(const gpuarr_array *in, int n_in, gpuarr_array *out, int n_out, gpuarr_stream s,
                                        void *user_data);
/* The size metric the task's models fit time against. */
typedef uint64_t (*gpuarr_task_size_fn)(const gpuarr_array *in, int n_in, void *user_data);
typedef struct gpuarr_task_desc {
    const char *name;                          /* the models' key (persisted): [A-Za-z0-9_.-]{1,63};
                                                  NULL with a kernel: the kernel's name */
    gpuarr_task_fn impl[GPUARR_TASK_MAX_BACKENDS]; /* by backend (impl[GPUARR_BACKEND_HOST], ...); NULL =
                                                      none; at least one, or a kernel; none past the last backend */
    void *user_data;
    int n_in, n_out;                           /* 1..8 each; with a kernel, 0 = its IN and OUT counts */
    gpuarr_dtype in_dtype[GPUARR_TASK_MAX_ARRAYS]; /* what each input is converted to; 0 = as given
                                                      (with a kernel: its IN parameter's dtype) */
    gpuarr_task_size_fn size;                  /* the size metric; NULL = elements of in[0] */
    /* A portable kernel instead of impl[] (all NULL then): runs on every device whose backend runs
       portable kernels (see KERNELS), its IN parameters given the inputs in order, its OUT
       parameters arrays it makes like in[0] (shape) of the parameter's dtype, over the default
       launch; no INOUT parameter. */
    const gpuarr_kernel *kernel;
    /* kernel_scalars[i]: the value of the kernel's parameter i when it is a SCALAR (the address of
       a value of its type, copied at gpuarr_task_create), NULL for an array parameter. */
    const void *kernel_scalars[GPUARR_KERNEL_MAX_PARAMS];
} gpuarr_task_desc;
/* Checks desc and makes a task (the desc is copied; name and scalars too). Errors: INVALID_ARGUMENT
   naming the field. Thread-safe. */
GPUARR_API gpuarr_result gpuarr_task_create(const gpuarr_task_desc *desc, gpuarr_task *out);
/* Ends the handle; a gpuarr_offload or gpuarr_map running the task (on any thread, the task's own
   implementation included) keeps it until that call returns. A destroyed or unknown task:
   INVALID_HANDLE. The task's models and statistics stay (they belong to its name). */
GPUARR_API gpuarr_result gpuarr_task_destroy(gpuarr_task t);

typedef enum gpuarr_offload_policy {
    GPUARR_OFFLOAD_DEFAULT = 0, /* GPUARR_OFFLOAD=auto|host|gpu; auto when unset */
    GPUARR_OFFLOAD_AUTO,        /* the models' choice; the 1 MiB rule while nothing is measured */
    GPUARR_OFFLOAD_HOST,        /* the host always (the seeds' "force CPU") */
    GPUARR_OFFLOAD_GPU,         /* a device other than the host always, the models choosing among them */
    GPUARR_OFFLOAD_POLICY_COUNT
} gpuarr_offload_policy;
typedef struct gpuarr_offload_desc {
    const char *devices;        /* candidates, a list as for leases; NULL = "all" (every device, the
                                   host included, each physical device once) */
    gpuarr_offload_policy policy;
    gpuarr_device out_device;   /* where outputs go; {0} = where they were computed */
    gpuarr_dtype out_dtype;     /* outputs converted to this; 0 = as computed */
    bool lease;                 /* hold a lease (waiting as long as it takes) on the chosen device while
                                   it runs, choosing among candidates with a free slot */
    int streams;                /* gpuarr_map: streams (worker threads) per device, 0 = 2; 1..16 */
    gpuarr_device *item_devices; /* gpuarr_map: n_items entries, item i's device written there; NULL = not
                                    wanted; written only on success (gpuarr_offload: ran_on says it) */
} gpuarr_offload_desc;
/* Runs t once (NULL desc = defaults): picks the candidate with the least predicted input
   transfer + compute + output transfer + queue wait, moves inputs there, runs, gives outputs back
   where asked. out[0..n_out) and *ran_on (may be NULL) are written only on success. */
GPUARR_API gpuarr_result gpuarr_offload(gpuarr_task t, const gpuarr_array *in, int n_in, gpuarr_array *out, int n_out,
                                        const gpuarr_offload_desc *desc, gpuarr_device *ran_on);
/* n_items items: in holds n_items * n_in arrays (item i's inputs at in[i * n_in]), out receives
   n_items * n_out in item order. On a failure: no new items start, running ones finish, every
   output made is released (out all {0}), *failed_item (may be NULL) = the lowest index among the
   items that failed, and the error is that item's. */
GPUARR_API gpuarr_result gpuarr_map(gpuarr_task t, const gpuarr_array *in, int n_items, gpuarr_array *out,
                                    const gpuarr_offload_desc *desc, int *failed_item);
typedef struct gpuarr_task_stats {
    uint64_t calls;                   /* runs of the task on this device (offload and map) */
    uint64_t explorations;            /* of them, runs chosen to measure the device */
    uint64_t changed_by_exploration;  /* of those, runs where the models would have chosen another */
    double predicted_s, measured_s;   /* sums over the calls (compute: the model's prediction, the time) */
    double model_a_s, model_b_s;      /* the robust line t = a + b * size (0, 0 while not fitted); predictions: see OFFLOAD */
    uint64_t samples;                 /* in the model's window */
    uint64_t rejected;                /* samples refused as outliers */
} gpuarr_task_stats;
/* The task's statistics and model on d (zeros where it never ran). Thread-safe. */
GPUARR_API gpuarr_result gpuarr_task_get_stats(gpuarr_task t, gpuarr_device d, gpuarr_task_stats *out);
/* One line per task model known to this process (those measured, and those in the cache folder
   for this machine's devices) with its statistics: what `gpuarr-info --models` prints. buf is
   NUL-terminated and holds the whole lines that fit in len, each ending with a newline. */
GPUARR_API gpuarr_result gpuarr_task_models_summary(char *buf, size_t len);

/* ---------------------------------------------------------------------------------------------
 * Generic typed I/O: gpuarr_from_host(dev, data, ndim, shape, &out), gpuarr_to_host(a, data, n)
 * ------------------------------------------------------------------------------------------- */
#ifdef __cplusplus
#define GPUARR__OVERLOADS(ctype, suffix, dtype)                                                \
    inline gpuarr_result gpuarr_from_host(gpuarr_device d, const ctype *data, int ndim,        \
                                          const int64_t *shape, gpuarr_array *out) {           \
        return gpuarr_from_host_##suffix(d, data, ndim, shape, out);                           \
    }                                                                                          \
    inline gpuarr_result gpuarr_to_host(gpuarr_array a, ctype *data, size_t count) {           \
        return gpuarr_to_host_##suffix(a, data, count);                                        \
    }                                                                                          \
    inline gpuarr_result gpuarr_fill(gpuarr_array a, ctype value) { return gpuarr_fill_##suffix(a, value); }
GPUARR_CTYPE_LIST(GPUARR__OVERLOADS)
#undef GPUARR__OVERLOADS
/* from an array or a device (see TRANSFER MODEL) */
inline gpuarr_result gpuarr_transfer_estimate(gpuarr_array src, gpuarr_device dst, gpuarr_dtype t, uint64_t bytes,
                                              double *seconds) {
    return gpuarr_transfer_estimate_array(src, dst, t, bytes, seconds);
}
inline gpuarr_result gpuarr_transfer_estimate(gpuarr_device src, gpuarr_device dst, gpuarr_dtype t, uint64_t bytes,
                                              double *seconds) {
    return gpuarr_transfer_estimate_device(src, dst, t, bytes, seconds);
}

/* Restores the thread's device (and stream) at the end of the enclosing block, on every exit. A
   scope that failed leaves the block without a current device (gpuarr_scope_hold). */
struct gpuarr_scope_guard {
    gpuarr_scope scope;
    explicit gpuarr_scope_guard(gpuarr_scope s) : scope(gpuarr_scope_hold(s)) {}
    ~gpuarr_scope_guard() { gpuarr_scope_leave(&scope); }
    gpuarr_scope_guard(const gpuarr_scope_guard &) = delete;
    gpuarr_scope_guard &operator=(const gpuarr_scope_guard &) = delete;
};
#define GPUARR_SCOPED_DEVICE(dev)                                                              \
    gpuarr_scope_guard GPUARR__ID(guard)(gpuarr_scope_enter_device(dev))
#define GPUARR_SCOPED_STREAM(stream)                                                           \
    gpuarr_scope_guard GPUARR__ID(guard)(gpuarr_scope_enter_stream(stream))
#define GPUARR_SCOPED_DEVICE_R(dev, result)                                                    \
    gpuarr_scope_guard GPUARR__ID(guard)(gpuarr__scope_report(gpuarr_scope_enter_device(dev), result))
#define GPUARR_SCOPED_STREAM_R(stream, result)                                                 \
    gpuarr_scope_guard GPUARR__ID(guard)(gpuarr__scope_report(gpuarr_scope_enter_stream(stream), result))
#else
#define GPUARR__GENERIC_FROM(ctype, suffix, dtype)                                             \
    , const ctype * : gpuarr_from_host_##suffix, ctype * : gpuarr_from_host_##suffix
#define GPUARR__GENERIC_TO(ctype, suffix, dtype) , ctype * : gpuarr_to_host_##suffix
#define gpuarr_from_host(dev, data, ndim, shape, out)                                          \
    _Generic((data)GPUARR_CTYPE_LIST(GPUARR__GENERIC_FROM))(dev, data, ndim, shape, out)
#define gpuarr_to_host(arr, data, count)                                                       \
    _Generic((data)GPUARR_CTYPE_LIST(GPUARR__GENERIC_TO))(arr, data, count)
#define GPUARR__GENERIC_FILL(ctype, suffix, dtype) , ctype : gpuarr_fill_##suffix
/* from an array or a device (see TRANSFER MODEL) */
#define gpuarr_transfer_estimate(src, dst, t, bytes, seconds)                                  \
    _Generic((src), gpuarr_array: gpuarr_transfer_estimate_array,                              \
             gpuarr_device: gpuarr_transfer_estimate_device)(src, dst, t, bytes, seconds)
#define gpuarr_fill(arr, value) _Generic((value)GPUARR_CTYPE_LIST(GPUARR__GENERIC_FILL))(arr, value)
#if defined(__GNUC__) || defined(__clang__)
#define GPUARR_SCOPED_DEVICE(dev) GPUARR_SCOPED_DEVICE_R(dev, NULL)
#define GPUARR_SCOPED_STREAM(stream) GPUARR_SCOPED_STREAM_R(stream, NULL)
#define GPUARR_SCOPED_DEVICE_R(dev, result)                                                    \
    gpuarr_scope GPUARR__ID(guard) __attribute__((cleanup(gpuarr_scope_leave), unused)) =            \
        gpuarr_scope_hold(gpuarr__scope_report(gpuarr_scope_enter_device(dev), result))
#define GPUARR_SCOPED_STREAM_R(stream, result)                                                 \
    gpuarr_scope GPUARR__ID(guard) __attribute__((cleanup(gpuarr_scope_leave), unused)) =            \
        gpuarr_scope_hold(gpuarr__scope_report(gpuarr_scope_enter_stream(stream), result))
#endif
#endif /* __cplusplus */

#endif /* GPUARR_H_INCLUDED */

/* Typed OpenCL interop, declared once <CL/cl.h> has been included (before or after gpuarr.h). */
#if defined(CL_VERSION_1_0) && !defined(GPUARR_OPENCL_TYPED_INTEROP)
#define GPUARR_OPENCL_TYPED_INTEROP
static inline gpuarr_result gpuarr_opencl_context(gpuarr_device d, cl_context *out) {
    void *p = NULL;
    gpuarr_result r = gpuarr_opencl_context_raw(d, &p);
    if (r == GPUARR_OK) *out = (cl_context)p;
    return r;
}
static inline gpuarr_result gpuarr_opencl_device_id(gpuarr_device d, cl_device_id *out) {
    void *p = NULL;
    gpuarr_result r = gpuarr_opencl_device_id_raw(d, &p);
    if (r == GPUARR_OK) *out = (cl_device_id)p;
    return r;
}
static inline gpuarr_result gpuarr_opencl_queue(gpuarr_stream s, cl_command_queue *out) {
    void *p = NULL;
    gpuarr_result r = gpuarr_opencl_queue_raw(s, &p);
    if (r == GPUARR_OK) *out = (cl_command_queue)p;
    return r;
}
static inline gpuarr_result gpuarr_opencl_mem(gpuarr_array a, cl_mem *out, size_t *offset) {
    void *p = NULL;
    gpuarr_result r = gpuarr_opencl_mem_raw(a, &p, offset);
    if (r == GPUARR_OK) *out = (cl_mem)p;
    return r;
}
static inline gpuarr_result gpuarr_opencl_wrap_mem(gpuarr_device d, cl_mem mem, size_t offset, gpuarr_dtype t, int ndim,
                                                   const int64_t *shape, gpuarr_array *out) {
    return gpuarr_opencl_wrap_mem_raw(d, (void *)mem, offset, t, ndim, shape, out);
}
static inline gpuarr_result gpuarr_opencl_wrap_queue(gpuarr_device d, cl_command_queue q, gpuarr_stream *out) {
    return gpuarr_opencl_wrap_queue_raw(d, (void *)q, out);
}
static inline gpuarr_result gpuarr_opencl_adopt(cl_context context, cl_device_id device, cl_command_queue queue,
                                                gpuarr_device *out) {
    return gpuarr_opencl_adopt_raw((void *)context, (void *)device, (void *)queue, out);
}
static inline gpuarr_result gpuarr_opencl_export_mem(gpuarr_array a, cl_mem *out) {
    void *p = NULL;
    gpuarr_result r = gpuarr_opencl_export_mem_raw(a, &p);
    if (r == GPUARR_OK) *out = (cl_mem)p;
    return r;
}
#endif

/* ---------------------------------------------------------------------------------------------
 * MPI (the manual's MPI section): declared when GPUARR_MPI is defined, <mpi.h> included first.
 * ------------------------------------------------------------------------------------------- */
#if defined(GPUARR_MPI) && !defined(GPUARR__MPI_DECLARED)
#define GPUARR__MPI_DECLARED
#ifndef MPI_VERSION
#error "gpuarr: GPUARR_MPI is defined but <mpi.h> is not included: include <mpi.h> before gpuarr.h"
#endif
#ifdef __cplusplus
extern "C" {
#endif
typedef struct gpuarr_mpi_request { uint32_t id; } gpuarr_mpi_request; /* 0 = none */
typedef enum gpuarr_mpi_op { GPUARR_MPI_SUM, GPUARR_MPI_MIN, GPUARR_MPI_MAX, GPUARR_MPI_OP_COUNT } gpuarr_mpi_op;
/* The device of this rank: "local:R", R its rank among comm's ranks on this node. Collective. */
GPUARR_API gpuarr_result gpuarr_mpi_device(MPI_Comm comm, gpuarr_device *out);
/* Elements [first, first + count) of a (count -1 = to the end) to / from rank dest / source.
   The wire carries the sender's dtype; the receiver names it in `sent` (0 = its own dtype) and
   casts on the way in. */
GPUARR_API gpuarr_result gpuarr_mpi_send(gpuarr_array a, int64_t first, int64_t count, int dest, int tag, MPI_Comm comm);
GPUARR_API gpuarr_result gpuarr_mpi_recv(gpuarr_array a, int64_t first, int64_t count, gpuarr_dtype sent, int source,
                                         int tag, MPI_Comm comm);
GPUARR_API gpuarr_result gpuarr_mpi_isend(gpuarr_array a, int64_t first, int64_t count, int dest, int tag, MPI_Comm comm,
                                          gpuarr_mpi_request *req);
GPUARR_API gpuarr_result gpuarr_mpi_irecv(gpuarr_array a, int64_t first, int64_t count, gpuarr_dtype sent, int source,
                                          int tag, MPI_Comm comm, gpuarr_mpi_request *req);
/* Waits for *req (moving every pending gpuarr MPI transfer of the process on), then sets it to
   {0}; {0} returns GPUARR_OK at once. */
GPUARR_API gpuarr_result gpuarr_mpi_wait(gpuarr_mpi_request *req);
GPUARR_API gpuarr_result gpuarr_mpi_sendrecv(gpuarr_array send, int64_t send_first, int64_t send_count, int dest,
                                             int send_tag, gpuarr_array recv, int64_t recv_first, int64_t recv_count,
                                             gpuarr_dtype sent, int source, int recv_tag, MPI_Comm comm);
/* In place over every rank of comm; every rank passes an array of the same dtype and count. */
GPUARR_API gpuarr_result gpuarr_mpi_allreduce(gpuarr_array a, gpuarr_mpi_op op, MPI_Comm comm);
#ifdef __cplusplus
}
#endif
#endif /* GPUARR_MPI */

/* =============================================================================================
 * IMPLEMENTATION
 * ============================================================================================= */
#if defined(GPUARR_IMPLEMENTATION) && !defined(GPUARR__IMPLEMENTATION_INCLUDED)
#define GPUARR__IMPLEMENTATION_INCLUDED

#ifdef __FAST_MATH__
#error "gpuarr: do not compile the implementation with -ffast-math: the conversion rules need IEEE NaN and infinity semantics"
#endif
#if defined(GPUARR_MALLOC) != defined(GPUARR_FREE)
#error "gpuarr: define both GPUARR_MALLOC and GPUARR_FREE, or neither"
#endif
#if defined(_WIN32)
#error "gpuarr: only POSIX systems are supported for now (pthreads, dlopen)"
#endif

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>
#if defined(__linux__)
#include <sys/auxv.h> /* getauxval(AT_SECURE): needs no feature macro, unlike secure_getenv */
#endif

/* Without these the implementation would quietly time events with the wall clock and lose huge
   pages: refuse instead. */
#if !defined(CLOCK_MONOTONIC) || (defined(__linux__) && !defined(MADV_HUGEPAGE))
#error "gpuarr: the implementation needs clock_gettime and madvise, which this unit's feature macros hide (in strict ISO mode a C library header, or a plain #include of gpuarr.h, came before the implementation). Put #define _DEFAULT_SOURCE (or _GNU_SOURCE) above the first #include of this file, or compile the implementation in its own file as gpuarr.c does"
#endif

/* ---------------------------------------------------------------------------------------------
 * Portability: the implementation compiles as C11, C++17 and inside .cu files.
 * ------------------------------------------------------------------------------------------- */
#ifdef __cplusplus
#define GPUARR__THREAD_LOCAL thread_local
#define GPUARR__RESTRICT __restrict
#define GPUARR__STATIC_ASSERT(cond, msg) static_assert(cond, msg)
#else
#define GPUARR__THREAD_LOCAL _Thread_local
#define GPUARR__RESTRICT restrict
#define GPUARR__STATIC_ASSERT(cond, msg) _Static_assert(cond, msg)
#endif
#define GPUARR__PRINTF(fmt_index, args_index) __attribute__((format(printf, fmt_index, args_index)))
#define GPUARR__UNUSED(x) ((void)(x))
#define GPUARR__MIN(a, b) ((a) < (b) ? (a) : (b))
#define GPUARR__MAX(a, b) ((a) > (b) ? (a) : (b))
#define GPUARR__ATOMIC_LOAD(p) __atomic_load_n(p, __ATOMIC_ACQUIRE)
#define GPUARR__ATOMIC_STORE(p, v) __atomic_store_n(p, v, __ATOMIC_RELEASE)
#define GPUARR__ATOMIC_INC(p) __atomic_add_fetch(p, 1, __ATOMIC_RELAXED)
#define GPUARR__ATOMIC_DEC(p) __atomic_sub_fetch(p, 1, __ATOMIC_ACQ_REL)

GPUARR__STATIC_ASSERT(sizeof(short) == 2 && sizeof(int) == 4 && sizeof(long long) == 8,
                      "gpuarr needs 16-bit short, 32-bit int and 64-bit long long");
GPUARR__STATIC_ASSERT(sizeof(float) == 4 && sizeof(double) == 8, "gpuarr needs IEEE binary32/64");
GPUARR__STATIC_ASSERT(sizeof(bool) == 1, "gpuarr stores bool as one byte");
GPUARR__STATIC_ASSERT(sizeof(void *) == 8, "gpuarr needs a 64-bit system");

/* Every result code is in the list, so the count in the enum must match it. */
#define GPUARR__COUNT_ONE(...) +1
GPUARR__STATIC_ASSERT(0 GPUARR_RESULT_LIST(GPUARR__COUNT_ONE) == GPUARR_RESULT_COUNT,
                      "GPUARR_RESULT_COUNT does not match GPUARR_RESULT_LIST");
GPUARR__STATIC_ASSERT(0 GPUARR_TELEMETRY_LIST(GPUARR__COUNT_ONE) == GPUARR_TELEMETRY_COUNT,
                      "GPUARR_TELEMETRY_COUNT does not match GPUARR_TELEMETRY_LIST");

#define GPUARR__UNPACK(...) __VA_ARGS__

/* ---------------------------------------------------------------------------------------------
 * Internal types shared by the core and the backends
 * ------------------------------------------------------------------------------------------- */
typedef struct gpuarr__obj gpuarr__obj;
typedef struct gpuarr__dev gpuarr__dev;
typedef struct gpuarr__stream gpuarr__stream;
typedef struct gpuarr__event gpuarr__event;
typedef struct gpuarr__array gpuarr__array;
typedef struct gpuarr__backend gpuarr__backend;
typedef struct gpuarr__kernel_call gpuarr__kernel_call;

/* A host cast kernel (tables of them are indexed [src dtype][dst dtype]). */
typedef void (*gpuarr__cast_fn)(const void *src, void *dst, size_t n);

/* Reference-counted objects behind handles; destroy runs when the count reaches zero. */
struct gpuarr__obj {
    uint32_t refs;
    void (*destroy)(gpuarr__obj *self);
};

/* What sets a backend apart, for the core to ask instead of testing which backend it is: the bits
   of gpuarr__backend.flags (gpuarr__backend_has). */
enum gpuarr__backend_flag {
    /* Work is complete when it is enqueued (the host): streams are always idle, events complete
       when recorded, and the stream procedures and the event waits may be NULL. */
    GPUARR__BACKEND_SYNCHRONOUS = 1u << 0,
    /* The embedded default: one device, named by the backend's name alone ("host", not "host:0"),
       that GPUARR_DEVICES never filters out. */
    GPUARR__BACKEND_BUILTIN = 1u << 1,
    /* Its memory handles are host pointers the program may use: moving data to or from it is a
       host step, never a device transfer (the host). */
    GPUARR__BACKEND_HOST_MEMORY = 1u << 2,
    /* Copies from and to pageable host memory are queued like any work; without it (CUDA) the
       driver consumes them at the call, so queued host steps and bounce chunks use its own
       pinned memory. */
    GPUARR__BACKEND_PAGEABLE_ASYNC = 1u << 3
};

/* Work a stream runs on the host (launch_host_fn). */
typedef void (*gpuarr__host_fn)(void *ctx);

/* The backend table: the only way the core reaches a backend. Each backend fills one by
   assignment (gpuarr__<name>_backend_fill), once per process. Memory handles are void *: a host
   pointer, a CUdeviceptr or a cl_mem; offsets are in bytes. A native stream or event is the
   backend's own (void *). Every procedure that enqueues work puts it on stream s in order; a
   backend with GPUARR__BACKEND_SYNCHRONOUS completes it before returning. A procedure marked
   "optional" may be NULL: the core then does what the member's comment says, through its helper
   gpuarr__backend_<name>. Failures set the error message (gpuarr__fail) and return its code. */
struct gpuarr__backend {
    gpuarr_backend id;          /* GPUARR_BACKEND_<NAME>; 0 in the slot of a backend left out */
    const char *name;           /* "host", "cuda", "opencl": the device specs' prefix */
    uint32_t flags;             /* GPUARR__BACKEND_SYNCHRONOUS | _BUILTIN | _HOST_MEMORY | _PAGEABLE_ASYNC */
    const char *max_alloc_name; /* the native name of the largest-allocation limit, for messages; NULL: none */
    const void *interop;        /* its gpuarr__interop_<NAME> table (its public interop functions) */

    /* ---- lifecycle: gpuarr_init loads each backend the device filter mentions, the last
       gpuarr_shutdown unloads those loaded ---- */
    /* Finds the native library and the devices. A failure means zero devices of this backend (its
       message is kept for the device-finding messages), not a failed gpuarr_init, unless it is
       GPUARR_ERROR_OUT_OF_MEMORY. Optional: NULL means there is nothing to load. */
    gpuarr_result (*load)(void);
    /* Releases what load took; runs after every device is closed. Optional: NULL, nothing to release. */
    void (*unload)(void);

    /* ---- devices: an index is the backend's own, 0 .. device_count() - 1 ---- */
    /* How many devices load found (asked only of a loaded backend). */
    int (*device_count)(void);
    /* Fills the zeroed *info of device `index` (the core then sets backend, index, device and
       spec); works on a device that is not opened yet. */
    gpuarr_result (*device_info)(int index, gpuarr_device_info *info);
    /* Opens d at its first use (under d's lock, once until device_close). Optional: NULL, nothing to open. */
    gpuarr_result (*device_open)(gpuarr__dev *d);
    /* Closes an opened d (at shutdown or gpuarr_device_reset). Optional: NULL, nothing to close. */
    void (*device_close)(gpuarr__dev *d);
    /* Checks the caller's native objects and appends a device of them to the backend's own list,
       so that device_info answers for it (ADOPTED DEVICES): OpenCL gets a cl_context, one of its
       cl_device_ids and an in-order cl_command_queue of both or NULL; CUDA a CUcontext, NULL,
       NULL. The backend takes its references here and keeps room for GPUARR__ADOPT_MAX such
       devices from load on (its entries never move). *index = the new device's index; *same =
       the index of the same device among those load found, or -1. Runs under the registry lock.
       Optional: NULL means the backend adopts nothing (UNSUPPORTED). */
    gpuarr_result (*device_adopt)(void *context, void *device, void *queue, int *index, int *same);
    /* Drops what device_adopt took, after device_close (gpuarr_device_remove, gpuarr_shutdown);
       the backend never touches the caller's objects again. Optional with device_adopt. */
    void (*device_forget)(gpuarr__dev *d);
    /* Runs between device_close and the next device_open of gpuarr_device_reset: it discards what
       the driver still keeps for the device (CUDA: cuDevicePrimaryCtxReset). Optional: NULL,
       nothing to discard. */
    gpuarr_result (*device_reset)(gpuarr__dev *d);

    /* ---- memory: the pool carves arrays out of segments mem_alloc gave ---- */
    /* The device's free and total memory now; works on a device that is not opened yet. */
    gpuarr_result (*mem_info)(gpuarr__dev *d, uint64_t *free_bytes, uint64_t *total_bytes);
    /* A segment of `bytes` device memory, aligned to mem_alignment. */
    gpuarr_result (*mem_alloc)(gpuarr__dev *d, size_t bytes, void **mem);
    /* Frees a segment of mem_alloc; the core has waited for the work that used it. */
    void (*mem_free)(gpuarr__dev *d, void *mem);
    /* The alignment of mem_alloc's segments; the pool carves blocks at multiples of it. */
    size_t (*mem_alignment)(gpuarr__dev *d);
    /* The handle and offset an array uses for the block at `offset` of `segment` (the segment
       itself, or a sub-buffer). Optional: NULL means the segment's handle at that offset. */
    gpuarr_result (*mem_view)(gpuarr__dev *d, void *segment, size_t offset, size_t bytes, void **mem, size_t *mem_offset);
    /* Drops a view mem_view made. Optional: NULL, views hold nothing (as with mem_view NULL). */
    void (*mem_view_release)(gpuarr__dev *d, void *mem);
    /* Host memory the device copies from and to at full speed: *handle for pinned_free, *host_ptr
       for the host's reads and writes. Optional: NULL means the backend has none
       (GPUARR_ERROR_UNSUPPORTED), and its transfers get no staging. */
    gpuarr_result (*pinned_alloc)(gpuarr__dev *d, size_t bytes, void **handle, void **host_ptr);
    /* Frees what pinned_alloc gave. Optional with pinned_alloc: NULL only where that is NULL. */
    void (*pinned_free)(gpuarr__dev *d, void *handle);
    /* Whether the device copies from and to host memory at p at full speed as it is (page-locked
       by the caller), so staging would only cost. Optional: NULL means never. */
    bool (*host_ptr_pinned)(gpuarr__dev *d, const void *p);

    /* ---- copies and kernels, enqueued on s; async: the call is an _async one, so no step may
       wait for work already queued (a blocking map would) ---- */
    /* Host memory at src -> device memory at dst + dst_off. */
    gpuarr_result (*copy_h2d)(gpuarr__stream *s, void *dst, size_t dst_off, const void *src, size_t bytes, bool async);
    /* Device memory at src + src_off -> host memory at dst. */
    gpuarr_result (*copy_d2h)(gpuarr__stream *s, void *dst, const void *src, size_t src_off, size_t bytes, bool async);
    /* Device memory to device memory of s's device. */
    gpuarr_result (*copy_d2d)(gpuarr__stream *s, void *dst, size_t dst_off, const void *src, size_t src_off, size_t bytes);
    /* Whether copy_peer can copy from src's memory to dst's (two devices of this backend).
       Optional: NULL means never (then copy_peer may be NULL too). */
    bool (*can_copy_peer)(gpuarr__dev *dst, gpuarr__dev *src);
    /* Device memory of src_dev -> device memory of dst_dev, on s (src_dev's stream); called only
       where can_copy_peer said yes. */
    gpuarr_result (*copy_peer)(gpuarr__stream *s, gpuarr__dev *dst_dev, void *dst, size_t dst_off, gpuarr__dev *src_dev,
                               const void *src, size_t src_off, size_t bytes);
    /* count elements of src_t at src + src_off -> dst_t at dst + dst_off on s's device, by the
       conversion rules (bit for bit the host reference's). */
    gpuarr_result (*cast)(gpuarr__stream *s, void *dst, size_t dst_off, gpuarr_dtype dst_t, const void *src, size_t src_off,
                          gpuarr_dtype src_t, size_t count);
    /* Before any data moves: whether d can run the cast kernel of a pair (UNSUPPORTED and why if
       not). Optional: NULL means every pair. */
    gpuarr_result (*cast_supported)(gpuarr__dev *d, gpuarr_dtype dst_t, gpuarr_dtype src_t);
    /* Writes `bytes` bytes at dst + dst_off with the pattern repeated (pattern_size is 1, 2, 4 or
       8; bytes and dst_off are multiples of it), enqueued on s like a copy. */
    gpuarr_result (*fill)(gpuarr__stream *s, void *dst, size_t dst_off, const void *pattern, size_t pattern_size, size_t bytes,
                          bool async);

    /* ---- portable kernels (KERNELS) ---- */
    /* Builds k for d unless built (thread-safe; cached in memory and in the kernel cache
       folder): OK, GPUARR_ERROR_BUILD through gpuarr__kernel_build_failed, UNSUPPORTED when d
       cannot run k (a double parameter without fp64, no run-time compiler) saying why. Optional:
       NULL means the backend runs no portable kernels (UNSUPPORTED). */
    gpuarr_result (*kernel_build)(gpuarr__dev *d, const gpuarr_kernel *k);
    /* Enqueues a checked launch on s (building first as kernel_build does). A shape the device
       cannot launch is INVALID_ARGUMENT before anything is enqueued. Optional with kernel_build. */
    gpuarr_result (*kernel_launch)(gpuarr__stream *s, const gpuarr__kernel_call *call);

    /* ---- streams: a native stream runs its work in order ---- */
    /* Runs fn(ctx) on some host thread once the work queued on s so far has completed, and s's
       later work waits for it; fn must not call s's backend (CUDA forbids driver calls there); on
       failure fn never runs. Optional: NULL means the work is done already (a synchronous
       backend): fn runs at once on the calling thread. */
    gpuarr_result (*launch_host_fn)(gpuarr__stream *s, gpuarr__host_fn fn, void *ctx);
    /* A new native stream of d. Optional: NULL means there is nothing to queue on (a synchronous
       backend): the device itself serves as the native stream. */
    gpuarr_result (*stream_create)(gpuarr__dev *d, void **native);
    /* The native stream of a thread's default stream on d. Optional: NULL means stream_create. */
    gpuarr_result (*stream_create_default)(gpuarr__dev *d, void **native);
    /* Destroys a native stream once its work is done. Optional: NULL, nothing to destroy. */
    void (*stream_destroy)(gpuarr__dev *d, void *native);
    /* Waits for the stream's work. Optional: NULL means it is always done. */
    gpuarr_result (*stream_sync)(gpuarr__dev *d, void *native);
    /* *done: whether the stream's work is done, without waiting. Optional: NULL, always done. */
    gpuarr_result (*stream_query)(gpuarr__dev *d, void *native, bool *done);
    /* Makes the native stream wait for an event, which may be of another device of this backend
       (waiting on the host if the native API cannot). Optional: NULL means the event's work is
       done already. */
    gpuarr_result (*stream_wait_event)(gpuarr__dev *d, void *stream, void *event);

    /* ---- events: a point in a stream's work ---- */
    /* A new native event; timing: event_elapsed will be asked about it. */
    gpuarr_result (*event_create)(gpuarr__dev *d, bool timing, void **native);
    void (*event_destroy)(gpuarr__dev *d, void *native);
    /* Records the event at the current end of the native stream's work. */
    gpuarr_result (*event_record)(gpuarr__dev *d, void *event, void *stream);
    /* The same, right after gpuarr enqueued work on the stream itself (a kernel launch): the
       backend may take that work's own completion instead of enqueueing a marker. Optional: NULL
       means event_record. */
    gpuarr_result (*event_record_after_own)(gpuarr__dev *d, void *event, void *stream);
    /* Waits for the recorded event. Optional: NULL means it completed when recorded. */
    gpuarr_result (*event_sync)(gpuarr__dev *d, void *event);
    /* *done: whether the recorded event completed, without waiting. Optional: NULL, always. */
    gpuarr_result (*event_query)(gpuarr__dev *d, void *event, bool *done);
    /* Milliseconds between two completed timing events. */
    gpuarr_result (*event_elapsed)(gpuarr__dev *d, void *start, void *end, double *ms);

    /* ---- context: the scopes' native context on the calling thread ---- */
    /* Makes d's native context current on the calling thread (replacing, not pushing) and returns
       the one it replaced. Optional: NULL means there is no current context (*previous = NULL). */
    gpuarr_result (*activate)(gpuarr__dev *d, void **previous);
    /* Puts back the context activate replaced. Optional: NULL, nothing to put back. */
    void (*deactivate)(gpuarr__dev *d, void *previous);

    /* ---- telemetry ---- */
    /* Fills what the device reports now into a zeroed *out, setting a valid bit for each group it
       read; never fails (a reading it cannot get leaves its bit clear) and works on a device that
       is not opened yet. Optional: NULL means no readings. */
    void (*telemetry)(gpuarr__dev *d, gpuarr_telemetry *out);
};

/* Whether backend b has the flag GPUARR__BACKEND_<FLAG>. */
static inline bool gpuarr__backend_has(const gpuarr__backend *b, enum gpuarr__backend_flag flag) {
    return (b->flags & (uint32_t)flag) != 0;
}

/* Memory pools (see the pool section): a device's arrays are blocks carved out of segments the
   backend allocated. A free block remembers the events to pass before a stream other than the
   one that freed it may reuse it. */
typedef struct gpuarr__segment gpuarr__segment;
typedef struct gpuarr__block gpuarr__block;
#define GPUARR__POOL_EVENTS 4
#define GPUARR__POOL_QUICK 16                     /* freed blocks a pool keeps unmerged */
#define GPUARR__POOL_QUICK_MAX ((size_t)64 << 10) /* the largest of them */
#define GPUARR__TCACHE_SLOTS 4 /* freed arrays a thread keeps per pool, record and block whole */
#define GPUARR__TLSF_SL_BITS 4u
#define GPUARR__TLSF_SL (1u << GPUARR__TLSF_SL_BITS)
#define GPUARR__TLSF_FL 48u

typedef struct gpuarr__block_event {
    uint64_t stream_serial;
    uint64_t seq; /* order of recording, process-wide: of two on one stream, the later covers both */
    gpuarr__event *event;
} gpuarr__block_event;

struct gpuarr__block {
    gpuarr__segment *seg;
    size_t offset, size, requested;
    gpuarr__block *prev, *next;           /* neighbours in the segment, by address */
    gpuarr__block *free_prev, *free_next; /* in a free list */
    bool allocated;
    bool quick;     /* free, in the pool's quick list: neither in the index nor merged */
    uint64_t owner; /* serial of the stream that freed it; it may reuse the block at once */
    uint32_t nevents;
    gpuarr__block_event events[GPUARR__POOL_EVENTS];
    void *view; /* the handle arrays use while allocated, at view_offset */
    size_t view_offset;
};

struct gpuarr__segment {
    void *mem;
    void *host_base; /* pinned pools: the host address of mem */
    size_t size;
    bool small;
    gpuarr__block *first;
    gpuarr__segment *prev, *next;
};

/* Free blocks by size: two-level segregated fit (TLSF), O(1) search with bounded waste. */
typedef struct gpuarr__tlsf {
    uint64_t fl_map;
    uint32_t sl_map[GPUARR__TLSF_FL];
    gpuarr__block *heads[GPUARR__TLSF_FL][GPUARR__TLSF_SL];
} gpuarr__tlsf;

/* A thread's cache of its freed small arrays for one pool: the record with its block (and the
   block's view) kept whole, for the thread's next array of that size, without the pool lock.
   Only blocks no stream has pending work on go in, so reuse needs no wait. The pool owns it (its
   list, under its lock): the owner stores a record only into an empty slot, and anyone takes one
   by exchanging the slot with NULL, so a trim, a limit, the out-of-memory ladder or a snapshot on
   any thread can return every cached block. The owner's counters (atomic, written by it alone)
   let gpuarr_pool_get_stats count what it served. */
typedef struct gpuarr__tcache {
    struct gpuarr__tcache *prev, *next;               /* the pool's list */
    struct gpuarr__array *slot[GPUARR__TCACHE_SLOTS]; /* atomic */
    uint64_t size[GPUARR__TCACHE_SLOTS], requested[GPUARR__TCACHE_SLOTS]; /* of each slot's block */
    uint64_t hits, hit_bytes, hit_requested;
    uint64_t requested_adjust; /* modulo 2^64: the requested bytes the pool's count lacks */
} gpuarr__tcache;

typedef struct gpuarr__pool {
    pthread_mutex_t lock;
    gpuarr__dev *dev;
    bool pinned; /* pinned host memory for staging (mem = the backend's handle, view = host pointer) */
    size_t align;
    bool caching;
    gpuarr__tlsf free_small, free_large;
    /* recently freed small blocks with no pending work, kept whole and out of the index: the
       next allocation of the same size takes one back without splitting or merging */
    gpuarr__block *quick[GPUARR__POOL_QUICK];
    uint32_t nquick;
    gpuarr__segment *segments;
    gpuarr__tcache *tcaches; /* the threads' caches; their blocks count as allocated in stats */
    gpuarr_pool_stats stats; /* limit and threshold live here too */
    uint64_t fault_countdown, fault_above;
} gpuarr__pool;

struct gpuarr__dev {
    gpuarr_device_info info; /* static fields; free_memory is refreshed when asked */
    const gpuarr__backend *backend;
    int view;                /* registry index of gpuarr's own view of the device: its own, or for an
                                adopted device the device gpuarr found that it is (the layers count,
                                model and lease through it) */
    uint32_t removed;        /* atomic: gpuarr_device_remove took it away */
    void *native;            /* backend's per-device state, made by device_open */
    pthread_mutex_t lock;    /* guards the lazy open */
    bool opened;
    uint32_t failed;         /* atomic: 0 healthy, 1 being marked, 2 failed (see FAILURES) */
    char failure[256];       /* the first error, written before failed becomes 2 */
    uint32_t resets;         /* atomic: gpuarr_device_reset calls (threads' cached default streams) */
    uint32_t live_streams, live_events; /* atomic: stream and event objects, with a handle or held inside */
    gpuarr__stream *thread_streams; /* each thread's default stream here; gpuarr__g.defaults_lock */
    gpuarr__pool pool;   /* the device's memory */
    gpuarr__pool pinned; /* pinned host memory for its staging pipelines (if the backend has it) */
};

typedef struct gpuarr__deferred {
    struct gpuarr__deferred *next;
    uint64_t seq; /* order on its stream */
    void *event;  /* native event that marks the point the work must pass */
    void (*fn)(void *ctx);
    void *ctx;
} gpuarr__deferred;

struct gpuarr__stream {
    gpuarr__obj obj;
    gpuarr__dev *dev;
    uint64_t serial; /* unique for the process; names the stream in freed blocks */
    void *native;
    uint32_t id;          /* public handle id; 0 for a thread's default stream */
    uint64_t owner_thread;              /* for a thread's default stream: the thread's serial */
    struct gpuarr__stream *next_default; /* the device's list of per-thread default streams */
    pthread_mutex_t lock; /* guards the deferred list */
    gpuarr__deferred *deferred_head, *deferred_tail;
    uint64_t deferred_seq; /* the seq of the newest entry */
    uint32_t destroyed;    /* atomic: gpuarr_stream_destroy waited for it; its native stream is never
                              touched again (a wrapped one may be gone: its owner destroyed it) */
};

struct gpuarr__event {
    gpuarr__obj obj;
    gpuarr__dev *dev;
    void *native;
    bool timing;
    uint32_t recorded;      /* atomic flag */
    uint64_t stream_serial; /* atomic: the stream of its latest record (a stream need not wait for
                               its own earlier work: it runs in order) */
};

struct gpuarr__array { /* a new field is reset in gpuarr__array_from_tcache too */
    gpuarr__obj obj;
    gpuarr__dev *dev;
    gpuarr_dtype dtype;
    int ndim;
    int64_t shape[GPUARR_MAX_DIMS];
    int64_t count;
    size_t nbytes;
    void *mem;     /* backend memory handle (NULL for an empty array) */
    size_t offset; /* bytes into mem */
    bool wrapped;  /* mem belongs to the caller */
    bool host_fallback; /* placed on the host: the device asked for was out of memory */
    gpuarr__block *block; /* its pool block (NULL when wrapped, empty or a view) */
    gpuarr__pool *pool;   /* the pool block came from: its device's, the host's, or a pinned one */
    gpuarr__dev *pinned_for; /* a pinned host array: the device whose pinned pool holds it */
    gpuarr__array *base;  /* a view: the array that owns the memory (never a view itself), held;
                             its ready event and use list stand for the view's too */
    size_t base_offset;   /* a view: bytes from base's first element */
    bool batch_member;    /* an output of gpuarr_convert_many sharing its batch's block: not a view */
    gpuarr__stream *uses[GPUARR__POOL_EVENTS]; /* async streams its memory was used on (held) */
    uint32_t nuses;
    gpuarr_release_fn release_fn;
    void *release_user;
    gpuarr__event *ready; /* contents valid once this completes; NULL = valid now */
    bool read_only;       /* writes refused (imported with DLPACK_FLAG_BITMASK_READ_ONLY); views inherit it */
    void (*owner_release)(void *ctx); /* called once when the record goes (a DLPack producer's deleter) */
    void *owner_ctx;
};

/* ---------------------------------------------------------------------------------------------
 * Handle tables. An id is [generation:16][slot index:16], XORed with its table's tweak, put
 * through a keyed permutation of the 32-bit values (gpuarr__handle_encode); the key and the
 * tweaks are drawn at every gpuarr_init. Ids look random, so the ids near a live one (id + 1,
 * id ^ bit) name nothing, and a forged id, or one kept from an earlier init cycle, names a live
 * object only by chance (live handles / 2^32). A freed slot is reused only when 1024 others are
 * free too, and its generation then moves on, so a released id names a live object of its kind
 * again only after its slot has been reused 65536 times (over 67 million releases in between).
 * The three tables share the key, so one decode gives an id's slot and generation in each of
 * them (its value XOR that table's tweak): an id is never live in two tables at once (a new id
 * live in another table moves its slot's generation on), and one of another kind (a stream id
 * given as an array) is refused and found in its own table for the message. The tweaks differ
 * in their top two generation bits, so an id whose generation is below 16384 in one table has
 * one of 16384 or more in the others: a released id of another kind names nothing until slots
 * have been reused 16384 times, and then only by chance. At most 65536 handles of each kind are
 * alive at once.
 * ------------------------------------------------------------------------------------------- */
#define GPUARR__INDEX_BITS 16u
#define GPUARR__INDEX_MASK ((1u << GPUARR__INDEX_BITS) - 1u)
#define GPUARR__GEN_MASK 0xffffu
#define GPUARR__MIN_FREE_SLOTS 1024u
#define GPUARR__NO_SLOT 0xffffffffu

/* obj and gen are read without the lock by lookups (gpuarr__table_lookup), so they are written
   with atomic stores (under the lock); pins counts the lookups between reading obj and retaining
   it, which a release waits out before it drops the handle's reference. */
typedef struct gpuarr__slot {
    gpuarr__obj *obj; /* NULL when free */
    uint32_t gen;     /* generations used so far this init cycle; the current one is its low 16 bits */
    uint32_t public_refs;
    uint32_t next_free;
    uint32_t pins;
} gpuarr__slot;

/* Slots come in chunks that never move or go until shutdown, so a lookup needs no lock. */
#define GPUARR__CHUNK_BITS 10u
#define GPUARR__CHUNK_SLOTS (1u << GPUARR__CHUNK_BITS)
#define GPUARR__TABLE_CHUNKS ((GPUARR__INDEX_MASK + 1u) / GPUARR__CHUNK_SLOTS)

typedef struct gpuarr__table {
    const char *kind_name; /* "array", "stream", "event" */
    uint32_t kind;         /* 1, 2, 3 */
    uint32_t tweak;        /* XORed into [generation][slot] before the shared permutation */
    gpuarr__slot *chunks[GPUARR__TABLE_CHUNKS];
    uint32_t capacity, live, free_count;
    uint32_t used; /* slots handed out so far; atomic (read by lookups) */
    uint32_t free_head, free_tail; /* FIFO */
} gpuarr__table;

/* ---------------------------------------------------------------------------------------------
 * Host worker pool (backends/gpuarr_host.h runs it; its state is gpuarr__g.workers): a few threads
 * that split large casts and copies. The caller works too and returns when every chunk is done,
 * so no job outlives the call that made it.
 * ------------------------------------------------------------------------------------------- */
typedef void (*gpuarr__chunk_fn)(void *ctx, size_t begin, size_t end);

typedef struct gpuarr__job {
    gpuarr__chunk_fn fn;
    void *ctx;
    size_t count, chunk, next, done;
    struct gpuarr__job *next_job;
} gpuarr__job;

typedef struct gpuarr__workers {
    pthread_mutex_t lock;
    pthread_cond_t wake, finished;
    pthread_t *threads;
    int wanted, started;
    bool tried, stop;
    gpuarr__job *queue;
} gpuarr__workers;

/* ---------------------------------------------------------------------------------------------
 * The one global state
 * ------------------------------------------------------------------------------------------- */
typedef struct gpuarr__filter_item {
    gpuarr_backend backend;
    int index; /* -1 = every device of the backend */
} gpuarr__filter_item;

/* Whether a privileged process (setuid, setgid, file capabilities: the kernel's AT_SECURE)
   honours an environment variable. Its environment comes from a user with less privilege, who
   must not choose what it opens, loads, writes or compiles (see CONFIGURATION). */
typedef enum gpuarr__env_trust {
    GPUARR__ENV_KEPT,   /* a keyword, switch or number that changes speed or which devices run */
    GPUARR__ENV_IGNORED /* names a file, folder or library, hands text to a compiler, or is a test
                           hook or a claim about another library that is unsafe when false */
} gpuarr__env_trust;

/* Every GPUARR_* environment variable: X(NAME, check, trust). gpuarr_init reads each one once
   (unless a desc field takes its place), checks it with `check` and keeps a copy and the parsed
   value in gpuarr__g.config; the rest of the library, backends included, reads only those.
   `trust`: KEPT or IGNORED in a privileged process (gpuarr__env_trust). `check` NULL: the layer
   that owns the variable registers its check (gpuarr__layer.settings). */
#define GPUARR__SETTING_LIST(X)                                                                \
    X(DEVICES, gpuarr__check_text, KEPT)                                                       \
    X(LOG, gpuarr__check_log, KEPT)                                                            \
    X(THREADS, gpuarr__check_threads, KEPT)                                                    \
    X(HOST_ISA, gpuarr__check_host_isa, KEPT)                                                  \
    X(CACHE_DIR, gpuarr__check_cache_dir, IGNORED)                                             \
    X(OPENCL_LIBRARY, gpuarr__check_text, IGNORED)                                             \
    X(OPENCL_BUILD_OPTIONS, gpuarr__check_text, IGNORED)                                       \
    X(OPENCL_FP64, gpuarr__check_flag, KEPT)                                                   \
    X(OPENCL_UNIFIED, gpuarr__check_flag, KEPT)                                                \
    X(CUDA_LIBRARY, gpuarr__check_text, IGNORED)                                               \
    X(CUDA_KERNELS, gpuarr__check_cuda_kernels, KEPT)                                          \
    X(NVRTC_LIBRARY, gpuarr__check_text, IGNORED)                                              \
    X(NVML_LIBRARY, gpuarr__check_text, IGNORED)                                               \
    X(PEER_COPIES, gpuarr__check_flag, KEPT)                                                   \
    X(ALLOC_CONF, gpuarr__check_text, KEPT)                                                    \
    X(FAULTS, gpuarr__check_text, IGNORED)                                                     \
    X(TRACE, gpuarr__check_text, IGNORED)                                                      \
    X(TRACE_EVENTS, NULL, KEPT)                                                                \
    X(SLOTS, NULL, KEPT)                                                                       \
    X(LEASE_DIR, NULL, IGNORED)                                                                \
    X(CALIBRATE, gpuarr__check_flag, KEPT)                                                     \
    X(OFFLOAD, NULL, KEPT)

typedef gpuarr_result (*gpuarr__setting_check)(const char *name, const char *value, int *out);

typedef enum gpuarr__setting_id {
#define GPUARR__SETTING_ENUM(NAME, check, trust) GPUARR__SET_##NAME,
    GPUARR__SETTING_LIST(GPUARR__SETTING_ENUM)
#undef GPUARR__SETTING_ENUM
    GPUARR__SETTING_COUNT
} gpuarr__setting_id;
/* The parsed values of the keyword settings (GPUARR_LOG's are gpuarr_log_level, flags 0 or 1). */
enum { GPUARR__ISA_AUTO, GPUARR__ISA_BASELINE, GPUARR__ISA_AVX2 };
enum { GPUARR__KERNELS_AUTO, GPUARR__KERNELS_PTX, GPUARR__KERNELS_NVRTC };

/* A layer built on the core (layers/): what the core runs for it. Each layer's header fills one
   (gpuarr__<layer>_layer); gpuarr__layer_list, at the end of the implementation, lists them in
   start order. The core knows no layer by name: it calls these. Every member but name may be NULL. */
typedef struct gpuarr__layer {
    const char *name; /* for messages: "leases", "trace", ... */
    void (*id)(struct gpuarr__layer *l); /* the fill function that made this row: the layer's identity
                                            (gpuarr__layer_state) */
    /* At gpuarr_init, once the registry is built, in list order. A failure fails gpuarr_init, and
       every layer's stop runs. */
    gpuarr_result (*start)(void);
    /* In the teardown of the last gpuarr_shutdown (or of a failed gpuarr_init), before the devices
       close, in reverse list order. Runs also when start did not (nothing to stop). */
    void (*stop)(void);
    /* First thing in the last gpuarr_shutdown, while every handle still works; reverse list order. */
    void (*before_teardown)(void);
    /* Last thing in the last gpuarr_shutdown, once the core is torn down. */
    void (*after_teardown)(void);
    /* A device spec the core does not know itself: true when the layer claims it, with *r the
       result and *out the device when *r is GPUARR_OK ("local" and "local:R"). */
    bool (*find_device)(const char *spec, struct gpuarr__dev **out, gpuarr_result *r);
    /* A scope ends (gpuarr_scope_leave): what the layer tied to it goes (GPUARR_WITH_LEASE's lease). */
    void (*scope_leave)(gpuarr_scope *scope);
    /* The checks of the GPUARR_* variables it owns (rows of GPUARR__SETTING_LIST whose check is
       NULL), run by gpuarr_init as the core's own are; check NULL: an unused entry. */
    struct {
        gpuarr__setting_id id;
        gpuarr__setting_check check;
    } settings[2];
} gpuarr__layer;
#define GPUARR__LAYER_MAX 8
/* Adopted devices per gpuarr_init cycle: a removed one keeps its row (and its handle stays refused). */
#define GPUARR__ADOPT_MAX 64

typedef struct gpuarr__state {
    /* Process-wide locks, statically initialized: they exist before gpuarr_init and outlive
       every shutdown (teardown clears only what follows them). */
    pthread_mutex_t init_lock; /* the one lock that must exist before gpuarr_init runs */
    /* Guards every device's thread_streams list. Taken only the first time a thread uses a
       device, when a thread exits, and by whole-device syncs. */
    pthread_mutex_t defaults_lock;
    /* The backend tables, each filled by its backend's fill function the first time anything
       asks for one (gpuarr__backend_get: gpuarr_backend_compiled may come before gpuarr_init),
       and kept until the process ends. A backend left out keeps a zeroed slot (id 0). */
    pthread_once_t backends_once;
    gpuarr__backend backends[GPUARR_BACKEND_COUNT];
    /* The three handle tables share one lock: a new id is checked against all of them (no id
       is live in two tables), and one lock costs a third of three in every create. Creates,
       retains and releases take it; lookups do not (gpuarr__table_lookup). A spin lock
       (gpuarr__handles_lock): every hold is short. */
    uint32_t handles_lock;
    uint32_t handle_key[4]; /* the handle permutation's round keys, one set for all three tables */
    bool lease_atfork;    /* the leases' fork handler is registered (once per process, under init_lock) */
    gpuarr__layer layers[GPUARR__LAYER_MAX]; /* the layers on the core, filled once per process by
                                                the first gpuarr_init (gpuarr__layer_list) */
    int layer_count;
    int refs;             /* gpuarr_init references, under init_lock */
    uint32_t valid;       /* atomic: 1 while initialized */
    uint32_t epoch;       /* counts init cycles; part of device ids */
    gpuarr_allocator allocator;
    gpuarr_logger logger;
    gpuarr_log_level log_level;
    char *devices_filter; /* resolved copy of desc.devices / GPUARR_DEVICES, or NULL */
    gpuarr__filter_item *filter;
    int filter_count;
    int host_threads;
    struct { /* GPUARR_ALLOC_CONF and the desc, resolved */
        uint64_t limit_bytes[2];   /* [0] every device but the host, [1] the host; 0 = none */
        uint32_t limit_percent[2]; /* the same as a percentage of the device's memory; 0 = none */
        uint64_t release_threshold, max_split;
        bool caching, host_fallback;
    } alloc_conf;
    struct {
        gpuarr_oom_fn fn;
        void *user;
    } oom_handlers[16];
    int oom_handler_count;
    pthread_mutex_t oom_lock;
    pthread_mutex_t kernel_logs_lock;          /* kernel_logs */
    struct gpuarr__kernel_log *kernel_logs;    /* each (kernel, device)'s last build log (KERNELS) */
    pthread_mutex_t use_locks[64]; /* guard arrays' use lists, striped by address */
    struct {                       /* the host's telemetry (gpuarr_host.h) */
        pthread_mutex_t lock;      /* guards the previous /proc/stat sample */
        bool sampled;              /* busy and total hold a sample */
        uint64_t busy, total;      /* CPU time in USER_HZ ticks: not idle, and all */
        int last_pct;              /* the utilization last reported */
        char fs_root[256];         /* prefix of /proc and /sys ("" = the real ones); white-box tests
                                      point it at fixture files */
    } host_telemetry;
    bool locks_ready;
    uint64_t event_seq;            /* atomic: numbers block events */
    uint64_t stream_serial;        /* atomic: numbers streams (kept across init cycles) */
    uint64_t thread_serials;       /* atomic: names threads that own default streams (kept too) */
    pthread_key_t thread_key;      /* its destructor drops an exiting thread's default streams */
    bool thread_key_ok;            /* made at init, deleted at the last shutdown */
    uint64_t host_fns_done;        /* atomic: host functions run (gpuarr__host_fn_done) */
    uint64_t host_fns_queued;      /* atomic: host functions handed to a driver (gpuarr__host_fn_queued) */
    struct {                       /* the environment, read once by gpuarr_init */
        char *text[GPUARR__SETTING_COUNT]; /* a copy of each one set (ALLOC_CONF: or the desc's) */
        int value[GPUARR__SETTING_COUNT];  /* what its check parsed (a keyword's index, 0/1) */
        char cache_dir[512];               /* resolved kernel cache folder; "" = no cache */
        bool cache_refused;                /* atomic: the folder was refused (and said so) */
    } config;
    struct { /* CPU work between host pointers, on the worker pool: the host backend's, set by its
                load; the core and the device backends call it through gpuarr__cpu_cast & co */
        void (*cast)(void *dst, gpuarr_dtype dt, const void *src, gpuarr_dtype st, size_t n);
        void (*copy)(void *dst, const void *src, size_t bytes);
        void (*fill)(void *dst, const void *pattern, size_t pattern_size, size_t bytes);
    } cpu;
    gpuarr__cast_fn host_casts[GPUARR_DTYPE_COUNT][GPUARR_DTYPE_COUNT]; /* for this CPU (the host backend's) */
    const char *host_isa; /* "baseline", "avx2" or "avx2+f16c" */
    bool streaming_copies; /* the CPU has AVX2 and the ISA was not forced to baseline */
    bool no_peer_copies;   /* GPUARR_PEER_COPIES=off: device to device always through the host */
    gpuarr__dev *devices; /* those gpuarr_init found, then room for GPUARR__ADOPT_MAX adopted ones */
    int device_count;     /* found by gpuarr_init: the layers' per-device tables have this many rows */
    int adopted_count;    /* atomic: adopted devices after them (gpuarr__devices_total); registry_lock */
    pthread_mutex_t registry_lock; /* adoption and removal */
    int best_gpu; /* index or -1 */
    gpuarr__table arrays, streams, events;
    gpuarr__workers workers;
    bool backend_loaded[GPUARR_BACKEND_COUNT];
    char backend_error[GPUARR_BACKEND_COUNT][256]; /* why a backend is not available */
    void *backend_state[GPUARR_BACKEND_COUNT];
    void *layer_state[GPUARR__LAYER_MAX]; /* each layer's own, by its row in layers[]; never read here */
    struct gpuarr__hold *let_go; /* atomic stack: holds whose holder let go where gpuarr may not run
                                    (gpuarr__hold_let_go), released by the next gpuarr call that may */
} gpuarr__state;

/* Zero but for the locks and the backends' once flag; the rest is left to zero initialization (designated initializers
   would say so without a warning, but C++17 lacks them). */
#if defined(__GNUC__) || defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#endif
static gpuarr__state gpuarr__g = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_ONCE_INIT};
#if defined(__GNUC__) || defined(__clang__)
#pragma GCC diagnostic pop
#endif

typedef struct gpuarr__thread_state {
    /* The last failure: its code, the public function it happened in and the reason, kept apart
       so that internal code reads the reason alone; gpuarr_last_error joins them. */
    gpuarr_result error_code;
    const char *error_api; /* NULL: no failure yet on this thread */
    char error_detail[1024];
    char error_message[64 + 2 + 1024]; /* "<error_api>: <error_detail>", once asked for */
    bool error_formatted;
    const char *api;       /* the public function running on this thread, for messages */
    uint32_t device_id;    /* current device; 0 = not set ("any") */
    uint32_t stream_id;    /* current stream; 0 = none */
    gpuarr_result scope_failure; /* inside a held scope that failed: its result, else 0 */
    char scope_why[512];   /* that scope's error message */
    bool registering_host_fn; /* a backend is handing a host function to its driver, which may call
                                 it at once on this thread (OpenCL's clSetEventCallback) */
    uint64_t serial;       /* names the thread as the owner of its default streams; 0 = none yet */
    uint32_t key_epoch;    /* the init cycle whose thread key holds this thread's value */
    struct {               /* what gpuarr_set_current_device made current natively (CUDA) */
        uint32_t epoch;    /* its init cycle; 0 = nothing */
        struct gpuarr__dev *dev;
        void *previous;    /* the thread's native context before, put back when it ends */
    } activation;
    struct {               /* the thread's default streams, by device index mod 8 */
        uint32_t epoch;    /* the init cycle they belong to */
        uint32_t resets;   /* the device's gpuarr_device_reset count then */
        struct gpuarr__dev *dev;
        struct gpuarr__stream *stream; /* borrowed: the device's list holds the reference */
    } defaults[8];
    struct {               /* the last id made on this thread and what it decodes to (gpuarr__table_plain) */
        uint32_t epoch, id, value; /* value: the permutation's input, before a table's tweak */
    } handle_memo;
    struct {               /* the thread's array caches, by device index mod 8 */
        uint32_t epoch;
        struct gpuarr__pool *pool;
        struct gpuarr__tcache *tc; /* owned by pool's list; the thread's exit drops it */
    } tcaches[8];
} gpuarr__thread_state;
static GPUARR__THREAD_LOCAL gpuarr__thread_state gpuarr__tls;

/* ---------------------------------------------------------------------------------------------
 * The environment: one reader for the whole library
 * ------------------------------------------------------------------------------------------- */
/* Whether this process runs with more privilege than the user who started it (setuid, setgid,
   file capabilities): the kernel's AT_SECURE, as glibc's secure_getenv checks. getauxval
   is used rather than secure_getenv, which needs _GNU_SOURCE before the first C library header:
   a user's unit with the implementation may have included <stdlib.h> without it. */
static bool gpuarr__privileged(void) {
#if defined(__linux__)
    return getauxval(AT_SECURE) != 0;
#elif defined(__APPLE__) || defined(__FreeBSD__) || defined(__OpenBSD__) || defined(__NetBSD__) || defined(__DragonFly__)
    return issetugid() != 0;
#else
    return geteuid() != getuid() || getegid() != getgid();
#endif
}

/* Every environment read in gpuarr goes through here: the variable's value, or NULL when it is
   unset, or set in a privileged process where `trust` says it is not honoured. */
static const char *gpuarr__env(const char *name, gpuarr__env_trust trust) {
    const char *v = getenv(name);
    if (v && trust == GPUARR__ENV_IGNORED && gpuarr__privileged()) return NULL;
    return v;
}

/* ---------------------------------------------------------------------------------------------
 * Errors and logging
 * ------------------------------------------------------------------------------------------- */
static void gpuarr__log(gpuarr_log_level level, const char *fmt, ...) GPUARR__PRINTF(2, 3);

static void gpuarr__log(gpuarr_log_level level, const char *fmt, ...) {
    gpuarr_log_level threshold = gpuarr__g.log_level ? gpuarr__g.log_level : GPUARR_LOG_WARN;
    if (level > threshold || threshold == GPUARR_LOG_OFF) return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (gpuarr__g.logger.fn) {
        gpuarr__g.logger.fn(level, msg, gpuarr__g.logger.user_data);
        return;
    }
    static const char *const names[] = {"", "", "error", "warning", "info", "debug"};
    fprintf(stderr, "gpuarr %s: %s\n", names[level], msg);
}

/* Records r and the reason in the public function running on this thread, and returns r. */
static gpuarr_result gpuarr__fail(gpuarr_result r, const char *fmt, ...) GPUARR__PRINTF(2, 3);

static gpuarr_result gpuarr__fail(gpuarr_result r, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(gpuarr__tls.error_detail, sizeof gpuarr__tls.error_detail, fmt, ap);
    va_end(ap);
    gpuarr__tls.error_code = r;
    gpuarr__tls.error_api = gpuarr__tls.api ? gpuarr__tls.api : "gpuarr";
    gpuarr__tls.error_formatted = false;
    return r;
}
/* The same, with the result visible to the caller's optimizer: gcc cannot see through the
   varargs call that r comes back, so at -O3 it thought out-parameters of functions that fail
   through here could be read unset (-Wmaybe-uninitialized). r must have no side effects. */
static inline gpuarr_result gpuarr__second(gpuarr_result first, gpuarr_result second) {
    GPUARR__UNUSED(first);
    return second;
}
#define gpuarr__fail(r, ...) gpuarr__second(gpuarr__fail((r), __VA_ARGS__), (gpuarr_result)(r))

/* Cleanup after a failure may call the driver again, and fail again (a lost CUDA context fails
   every call): that second failure must not replace the first in gpuarr_last_error. */
typedef struct gpuarr__error_saved {
    gpuarr_result code;
    const char *api;
    char detail[sizeof gpuarr__tls.error_detail];
} gpuarr__error_saved;
/* Only the message's bytes up to its end are copied: the frees and cleanups that save and
   restore the error run in every release, and the whole buffer is 1 KiB. */
static void gpuarr__error_save(gpuarr__error_saved *sv) {
    sv->code = gpuarr__tls.error_code;
    sv->api = gpuarr__tls.error_api;
    const char *end = (const char *)memchr(gpuarr__tls.error_detail, 0, sizeof sv->detail - 1);
    size_t n = end ? (size_t)(end - gpuarr__tls.error_detail) : sizeof sv->detail - 1;
    memcpy(sv->detail, gpuarr__tls.error_detail, n);
    sv->detail[n] = '\0';
}
static void gpuarr__error_restore(const gpuarr__error_saved *sv) {
    gpuarr__tls.error_code = sv->code;
    gpuarr__tls.error_api = sv->api;
    memcpy(gpuarr__tls.error_detail, sv->detail, strlen(sv->detail) + 1);
    gpuarr__tls.error_formatted = false;
}

static bool gpuarr__initialized(void) { return GPUARR__ATOMIC_LOAD(&gpuarr__g.valid) != 0; }

/* Every public function that needs the library starts with this (_AS: under another name). */
#define GPUARR__BEGIN() GPUARR__BEGIN_AS(__func__)
#define GPUARR__BEGIN_AS(name)                                                                 \
    do {                                                                                       \
        gpuarr__tls.api = (name);                                                              \
        if (!gpuarr__initialized())                                                            \
            return gpuarr__fail(GPUARR_ERROR_NOT_INITIALIZED,                                  \
                                "gpuarr is not initialized (call gpuarr_init first)");         \
    } while (0)
#define GPUARR__CHECK(expr)                                                                    \
    do {                                                                                       \
        gpuarr_result gpuarr__r = (expr);                                                      \
        if (gpuarr__r != GPUARR_OK) return gpuarr__r;                                          \
    } while (0)
#define GPUARR__REQUIRE_PTR(p)                                                                 \
    do {                                                                                       \
        if (!(p)) return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "%s is NULL", #p);        \
    } while (0)

/* ---------------------------------------------------------------------------------------------
 * Tracing: the hooks (the recorder is a layer: layers/gpuarr_trace.h). A hook is one
 * line at a call site. Off, it costs a relaxed load of gpuarr__trace_on and a branch predicted
 * not taken (plus, for a scope, a store of a local flag and its test when the scope ends).
 * ------------------------------------------------------------------------------------------- */
#define GPUARR__UNLIKELY(x) __builtin_expect(!!(x), 0)
#if defined(__GNUC__) || defined(__clang__)
#define GPUARR__FOR_BACKENDS __attribute__((unused)) /* a build may leave out every device backend, or a layer */
#else
#define GPUARR__FOR_BACKENDS
#endif
static uint32_t gpuarr__trace_on; /* atomic (relaxed): 1 while a trace records */
#ifdef GPUARR_NO_TRACE /* compiled out: every hook is dead code, removed by the compiler */
#define GPUARR__TRACE_ON() 0
#else
#define GPUARR__TRACE_ON() GPUARR__UNLIKELY(__atomic_load_n(&gpuarr__trace_on, __ATOMIC_RELAXED))
#endif

typedef enum gpuarr__trace_kind {
    GPUARR__TRACE_NONE,
    GPUARR__TRACE_CALL,     /* a conversion on the calling thread */
    GPUARR__TRACE_TRANSFER, /* on the stream that runs it */
    GPUARR__TRACE_CAST,
    GPUARR__TRACE_FILL,
    GPUARR__TRACE_KERNEL,   /* a kernel build, on the thread */
    GPUARR__TRACE_ALLOC,
    GPUARR__TRACE_FREE,
    GPUARR__TRACE_OOM,      /* one step of the out-of-memory ladder */
    GPUARR__TRACE_WAIT,     /* a stream made to wait for another's work, on the waiting stream */
    GPUARR__TRACE_LEASE     /* a lease acquired (or not), waiting included, on the thread */
} gpuarr__trace_kind;

/* A backend whose commands have timing events (OpenCL's profiling): how to keep one, let it go,
   and read a completed one's queued, start and end times on the device's clock (ns; false: not
   complete, or no times). */
typedef struct gpuarr__trace_clock {
    gpuarr_backend backend;
    void (*retain)(void *command);
    void (*release)(void *command);
    bool (*times)(void *command, uint64_t *queued, uint64_t *start, uint64_t *end);
} gpuarr__trace_clock;

/* One recorded event. Strings are static (names, dtype names, public function names): a trace
   outlives devices and init cycles, so devices are kept as backend and index. */
typedef struct gpuarr__trace_event {
    uint64_t ts, dur;     /* CLOCK_MONOTONIC nanoseconds */
    const char *name, *s1, *s2;
    uint64_t a, b;        /* the kind's numbers */
    uint64_t track;       /* 0: the thread's track; else the serial of the stream it ran on */
    uint8_t kind, backend;
    int16_t index;        /* the device: backend and index */
    uint32_t device_timed; /* ts and dur also cover its commands' run on the device */
    void *first, *last;   /* its first and last device commands (retained), until resolved */
    uint64_t first_host, last_host; /* when each was enqueued, host clock */
    const gpuarr__trace_clock *clock;
} gpuarr__trace_event;

/* An event open on this thread, recorded when its scope ends (GPUARR__TRACE_SCOPE). Those on a
   stream's track form a stack: a device command enqueued goes to the innermost one, and a scope
   that ends hands its commands to the one around it (on the same device). */
typedef struct gpuarr__trace_scope {
    gpuarr__trace_event ev;
    bool on, stacked;
    struct gpuarr__trace_scope *outer;
} gpuarr__trace_scope;
static void gpuarr__trace_finish(gpuarr__trace_scope *sc);
static inline void gpuarr__trace_scope_close(gpuarr__trace_scope *sc) {
    if (GPUARR__UNLIKELY(sc->on)) gpuarr__trace_finish(sc);
}
/* Opens an event lasting to the end of the enclosing block: begin(&scope, args...) fills it in
   when a trace records. At most one per block; GPUARR__TRACE_SET changes a field later. */
#define GPUARR__TRACE_SCOPE(begin, ...)                                                        \
    gpuarr__trace_scope gpuarr__trace_sc __attribute__((cleanup(gpuarr__trace_scope_close)));  \
    gpuarr__trace_sc.on = false;                                                               \
    if (GPUARR__TRACE_ON()) begin(&gpuarr__trace_sc, __VA_ARGS__)
#define GPUARR__TRACE_SET(field, value)                                                        \
    do {                                                                                       \
        if (GPUARR__UNLIKELY(gpuarr__trace_sc.on)) gpuarr__trace_sc.ev.field = (value);       \
    } while (0)
#define GPUARR__TRACE_DROP() (gpuarr__trace_sc.on = false) /* not an event after all */
/* A step without a block of its own (the out-of-memory ladder): its start, 0 when off. */
static uint64_t gpuarr__trace_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec + 1u; /* never 0: 0 means off */
}
#define GPUARR__TRACE_T0() (GPUARR__TRACE_ON() ? gpuarr__trace_now() : 0)

/* What a hook does while a trace records: the recorder's (layers/gpuarr_trace.h), which installs
   its table in gpuarr__trace_recorder before it first sets gpuarr__trace_on. Each begin fills in
   the scope's event; finish records it. */
struct gpuarr__view;
typedef struct gpuarr__trace_hooks {
    void (*finish)(gpuarr__trace_scope *sc);
    void (*call)(gpuarr__trace_scope *sc, gpuarr__dev *dst, gpuarr__dev *src, size_t count, bool async);
    void (*transfer)(gpuarr__trace_scope *sc, gpuarr__stream *ss, gpuarr__stream *ds, const struct gpuarr__view *dst,
                     const struct gpuarr__view *src, size_t n, bool async);
    void (*cast)(gpuarr__trace_scope *sc, gpuarr__stream *s, gpuarr_dtype to, gpuarr_dtype from, size_t count);
    void (*fill)(gpuarr__trace_scope *sc, gpuarr__stream *s, size_t bytes, size_t pattern_size);
    void (*kernel)(gpuarr__trace_scope *sc, gpuarr__dev *d, int from, int to);
    void (*alloc)(gpuarr__trace_scope *sc, gpuarr__dev *d, bool pinned, size_t bytes, const char *cache);
    void (*free)(gpuarr__trace_scope *sc, gpuarr__dev *d, bool pinned, size_t bytes, const char *to);
    void (*wait)(gpuarr__trace_scope *sc, gpuarr__stream *s, gpuarr__stream *after, gpuarr__event *e);
    void (*oom)(uint64_t t0, gpuarr__dev *d, const char *step, size_t requested, gpuarr_result r);
    void (*lease)(gpuarr__trace_scope *sc, int slots);
    void (*lease_end)(gpuarr__trace_scope *sc, gpuarr__dev *d, gpuarr_result r, bool waited);
    /* a backend enqueued `command` (a timing event of `clock`) on behalf of the innermost open scope */
    void (*command)(void *command, const gpuarr__trace_clock *clock);
} gpuarr__trace_hooks;
/* Set once, before the first trace records, and never cleared: a trace may run across init cycles. */
static const gpuarr__trace_hooks *gpuarr__trace_recorder;
/* A function, not an expression macro: nvcc's front end (cudafe++ 13.0) crashes on a member of
   __atomic_load_n's result. */
static const gpuarr__trace_hooks *gpuarr__trace_hooks_now(void) {
    return (const gpuarr__trace_hooks *)__atomic_load_n(&gpuarr__trace_recorder, __ATOMIC_ACQUIRE);
}
#define GPUARR__TRACE_HOOK(name) gpuarr__trace_hooks_now()->name

static void gpuarr__trace_finish(gpuarr__trace_scope *sc) { GPUARR__TRACE_HOOK(finish)(sc); }
static void gpuarr__trace_call(gpuarr__trace_scope *sc, gpuarr__dev *dst, gpuarr__dev *src, size_t count, bool async) {
    GPUARR__TRACE_HOOK(call)(sc, dst, src, count, async);
}
static void gpuarr__trace_transfer(gpuarr__trace_scope *sc, gpuarr__stream *ss, gpuarr__stream *ds, const struct gpuarr__view *dst,
                                   const struct gpuarr__view *src, size_t n, bool async) {
    GPUARR__TRACE_HOOK(transfer)(sc, ss, ds, dst, src, n, async);
}
GPUARR__FOR_BACKENDS static void gpuarr__trace_cast(gpuarr__trace_scope *sc, gpuarr__stream *s, gpuarr_dtype to, gpuarr_dtype from, size_t count) {
    GPUARR__TRACE_HOOK(cast)(sc, s, to, from, count);
}
GPUARR__FOR_BACKENDS static void gpuarr__trace_fill(gpuarr__trace_scope *sc, gpuarr__stream *s, size_t bytes, size_t pattern_size) {
    GPUARR__TRACE_HOOK(fill)(sc, s, bytes, pattern_size);
}
GPUARR__FOR_BACKENDS static void gpuarr__trace_kernel(gpuarr__trace_scope *sc, gpuarr__dev *d, int from, int to) {
    GPUARR__TRACE_HOOK(kernel)(sc, d, from, to);
}
static void gpuarr__trace_alloc(gpuarr__trace_scope *sc, gpuarr__dev *d, bool pinned, size_t bytes, const char *cache) {
    GPUARR__TRACE_HOOK(alloc)(sc, d, pinned, bytes, cache);
}
static void gpuarr__trace_free(gpuarr__trace_scope *sc, gpuarr__dev *d, bool pinned, size_t bytes, const char *to) {
    GPUARR__TRACE_HOOK(free)(sc, d, pinned, bytes, to);
}
static void gpuarr__trace_wait(gpuarr__trace_scope *sc, gpuarr__stream *s, gpuarr__stream *after, gpuarr__event *e) {
    GPUARR__TRACE_HOOK(wait)(sc, s, after, e);
}
static void gpuarr__trace_oom(uint64_t t0, gpuarr__dev *d, const char *step, size_t requested, gpuarr_result r) {
    GPUARR__TRACE_HOOK(oom)(t0, d, step, requested, r);
}
static void gpuarr__trace_lease(gpuarr__trace_scope *sc, int slots) { GPUARR__TRACE_HOOK(lease)(sc, slots); }
/* Called whether or not a trace records: the scope says. */
static void gpuarr__trace_lease_end(gpuarr__trace_scope *sc, gpuarr__dev *d, gpuarr_result r, bool waited) {
    if (GPUARR__UNLIKELY(sc->on)) GPUARR__TRACE_HOOK(lease_end)(sc, d, r, waited);
}
GPUARR__FOR_BACKENDS static void gpuarr__trace_command(void *command, const gpuarr__trace_clock *clock) {
    GPUARR__TRACE_HOOK(command)(command, clock);
}
#define GPUARR__TRACE_COMMAND(command, clock)                                                  \
    do {                                                                                       \
        if (GPUARR__TRACE_ON() && (command)) gpuarr__trace_command((command), (clock));        \
    } while (0)
#define GPUARR__TRACE_OOM(t0, d, step, requested, r)                                           \
    do {                                                                                       \
        if (GPUARR__UNLIKELY(t0)) gpuarr__trace_oom(t0, d, step, requested, r);                \
    } while (0)

/* ---------------------------------------------------------------------------------------------
 * Host memory for the library itself: the desc allocator, GPUARR_MALLOC, or malloc.
 * ------------------------------------------------------------------------------------------- */
static void *gpuarr__malloc(size_t size) {
    if (size == 0) size = 1;
    if (gpuarr__g.allocator.alloc_fn) return gpuarr__g.allocator.alloc_fn(size, gpuarr__g.allocator.user_data);
#ifdef GPUARR_MALLOC
    return GPUARR_MALLOC(size);
#else
    return malloc(size);
#endif
}

static void gpuarr__free(void *ptr) {
    if (!ptr) return;
    if (gpuarr__g.allocator.free_fn) {
        gpuarr__g.allocator.free_fn(ptr, gpuarr__g.allocator.user_data);
        return;
    }
#ifdef GPUARR_FREE
    GPUARR_FREE(ptr);
#else
    free(ptr);
#endif
}

static void *gpuarr__calloc(size_t size) {
    void *p = gpuarr__malloc(size);
    if (p) memset(p, 0, size);
    return p;
}

/* Aligned blocks through the same allocator: the original pointer sits just below the block. */
static void *gpuarr__aligned_malloc(size_t size, size_t align) {
    size_t extra = align + sizeof(void *);
    if (size > SIZE_MAX - extra) return NULL;
    unsigned char *raw = (unsigned char *)gpuarr__malloc(size + extra);
    if (!raw) return NULL;
    uintptr_t start = (uintptr_t)(raw + sizeof(void *));
    uintptr_t aligned = (start + (align - 1)) & ~(uintptr_t)(align - 1);
    memcpy((void *)(aligned - sizeof(void *)), &raw, sizeof raw);
    return (void *)aligned;
}

/* Large host blocks ask for transparent huge pages: first touch of 128 MiB took 67 ms with 4 KiB
   pages and 16 ms with 2 MiB ones on the development machine. A no-op where the system has no
   MADV_HUGEPAGE (on Linux its absence is an #error above). */
static void gpuarr__advise_huge_pages(void *ptr, size_t size) {
#if defined(MADV_HUGEPAGE)
    const uintptr_t page = 4096;
    if (size < ((size_t)4 << 20)) return;
    uintptr_t start = ((uintptr_t)ptr + page - 1) & ~(page - 1), end = ((uintptr_t)ptr + size) & ~(page - 1);
    if (end > start) madvise((void *)start, (size_t)(end - start), MADV_HUGEPAGE);
#else
    GPUARR__UNUSED(ptr);
    GPUARR__UNUSED(size);
#endif
}

static void gpuarr__aligned_free(void *ptr) {
    if (!ptr) return;
    void *raw;
    memcpy(&raw, (unsigned char *)ptr - sizeof(void *), sizeof raw);
    gpuarr__free(raw);
}

static char *gpuarr__strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = (char *)gpuarr__malloc(n);
    if (p) memcpy(p, s, n);
    return p;
}

static void gpuarr__copy_string(char *dst, size_t cap, const char *src) {
    if (!cap) return;
    size_t n = strlen(src);
    if (n >= cap) n = cap - 1;
    memcpy(dst, src, n);
    dst[n] = '\0';
}

/* Monotonic milliseconds. */
static double gpuarr__now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* Overflow-checked size arithmetic. */
static bool gpuarr__mul_overflows(size_t a, size_t b, size_t *out) {
    if (a != 0 && b > SIZE_MAX / a) return true;
    *out = a * b;
    return false;
}

/* ---------------------------------------------------------------------------------------------
 * Dtype tables
 * ------------------------------------------------------------------------------------------- */
static const size_t gpuarr__dtype_sizes[GPUARR_DTYPE_COUNT] = {
    0,
#define GPUARR__SIZE_ENTRY(NAME, str, store, size, ...) size,
    GPUARR_DTYPE_LIST(GPUARR__SIZE_ENTRY)
#undef GPUARR__SIZE_ENTRY
};
static const char *const gpuarr__dtype_names[GPUARR_DTYPE_COUNT] = {
    "invalid",
#define GPUARR__NAME_ENTRY(NAME, str, ...) str,
    GPUARR_DTYPE_LIST(GPUARR__NAME_ENTRY)
#undef GPUARR__NAME_ENTRY
};
#define GPUARR__SIZE_CHECK(NAME, str, store, size, ...)                                        \
    GPUARR__STATIC_ASSERT(sizeof(store) == size, "dtype " str ": storage size mismatch");
GPUARR_DTYPE_LIST(GPUARR__SIZE_CHECK)
#undef GPUARR__SIZE_CHECK

static bool gpuarr__dtype_valid(gpuarr_dtype t) { return t > 0 && t < GPUARR_DTYPE_COUNT; }

/* ---------------------------------------------------------------------------------------------
 * The conversion rules: kernels/gpuarr_kernels.h, shared with the device kernels, compiled
 * here as C (the host dialect below): the f16/bf16 helpers use them, the host backend's cast
 * kernels are made from them.
 * ------------------------------------------------------------------------------------------- */
static inline uint32_t gpuarr__f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float gpuarr__bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint64_t gpuarr__f64_bits(double d) { uint64_t u; memcpy(&u, &d, 8); return u; }
static inline double gpuarr__bits_f64(uint64_t u) { double d; memcpy(&d, &u, 8); return d; }
#define GPUARR_K_FN static inline
#define GPUARR_K_F32_BITS(x) gpuarr__f32_bits(x)
#define GPUARR_K_BITS_F32(u) gpuarr__bits_f32(u)
#define GPUARR_K_F64_BITS(x) gpuarr__f64_bits(x)
#define GPUARR_K_BITS_F64(u) gpuarr__bits_f64(u)
#define GPUARR_K_CLZ64(x) __builtin_clzll(x)
#define GPUARR_K_U64(c) UINT64_C(c)
#define GPUARR_K_HAVE_F64 1
#include "kernels/gpuarr_kernels.h"

/* Casts run in the default floating-point environment (round to nearest even, no flush to zero,
   exceptions masked), whatever the calling thread set: fesetround, or flush-to-zero switched on
   for the whole process by another object built with -ffast-math. */
static uint64_t gpuarr__fp_default_enter(void) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    uint32_t csr = 0, want = 0x1f80u;
    __asm__ volatile("stmxcsr %0" : "=m"(csr));
    if (csr != want) __asm__ volatile("ldmxcsr %0" : : "m"(want));
    return csr;
#elif defined(__aarch64__) && (defined(__GNUC__) || defined(__clang__))
    uint64_t fpcr = 0;
    __asm__ volatile("mrs %0, fpcr" : "=r"(fpcr));
    if (fpcr != 0) __asm__ volatile("msr fpcr, %0" : : "r"((uint64_t)0));
    return fpcr;
#else
    return 0;
#endif
}

static void gpuarr__fp_leave(uint64_t saved) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    uint32_t csr = (uint32_t)saved;
    if (csr != 0x1f80u) __asm__ volatile("ldmxcsr %0" : : "m"(csr));
#elif defined(__aarch64__) && (defined(__GNUC__) || defined(__clang__))
    if (saved != 0) __asm__ volatile("msr fpcr, %0" : : "r"(saved));
#else
    GPUARR__UNUSED(saved);
#endif
}

/* ---------------------------------------------------------------------------------------------
 * Reference-counted objects and handle tables
 * ------------------------------------------------------------------------------------------- */
/* The handle tables' lock. Every hold is a few dozen instructions (a chunk's allocation at
   most), and an uncontended pthread mutex costs two atomic read-modify-writes and two calls, a
   tenth of a cached create + release; this costs one exchange. A waiter yields after a few
   spins, so a holder that lost its core gets it back. */
static void gpuarr__handles_lock(void) {
    for (int spins = 0; __atomic_exchange_n(&gpuarr__g.handles_lock, 1u, __ATOMIC_ACQUIRE);)
        while (__atomic_load_n(&gpuarr__g.handles_lock, __ATOMIC_RELAXED))
            if (spins < 64) spins++;
            else sched_yield();
}
static void gpuarr__handles_unlock(void) { __atomic_store_n(&gpuarr__g.handles_lock, 0u, __ATOMIC_RELEASE); }

static void gpuarr__obj_retain(gpuarr__obj *o) { GPUARR__ATOMIC_INC(&o->refs); }
static void gpuarr__obj_release(gpuarr__obj *o) {
    if (o && GPUARR__ATOMIC_DEC(&o->refs) == 0) o->destroy(o);
}

/* One round of the handle permutation: mixes a 16-bit half with a round key. The high half of
   one odd multiply depends on every bit of the 16-bit input (and the key's high half adds a
   constant). One multiply a round: the rounds are a dependency chain in every create. Measured
   (random keys, 4096 live ids): the ids at id +- 1 and id ^ bit name live objects as often as
   random ids do. */
static uint32_t gpuarr__handle_round(uint32_t half, uint32_t key) { return ((half ^ key) * 0x9e3779b1u) >> 16; }

/* A keyed permutation of the 32-bit values: a 4-round Feistel network on 16-bit halves. Not
   cryptography: it keeps forged and stale ids from naming live objects by accident. */
static uint32_t gpuarr__handle_encode(const uint32_t key[4], uint32_t plain) {
    uint32_t l = plain >> 16, r = plain & 0xffffu;
    for (int i = 0; i < 4; i++) {
        uint32_t next = l ^ gpuarr__handle_round(r, key[i]);
        l = r;
        r = next;
    }
    return (l << 16) | r;
}

static uint32_t gpuarr__handle_decode(const uint32_t key[4], uint32_t id) {
    uint32_t l = id >> 16, r = id & 0xffffu;
    for (int i = 3; i >= 0; i--) {
        uint32_t prev = r ^ gpuarr__handle_round(l, key[i]);
        r = l;
        l = prev;
    }
    return (l << 16) | r;
}

/* Fresh random words for one init cycle, from the clock and addresses (ASLR): the shared
   permutation key (key[0..3]) and the three tables' tweaks (key[4..6]). */
static void gpuarr__handle_key(uint32_t key[7]) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t x = (uint64_t)ts.tv_sec * 1000003u ^ (uint64_t)ts.tv_nsec ^ (uint64_t)(uintptr_t)&ts << 16 ^
                 (uint64_t)(uintptr_t)&gpuarr__g ^ (uint64_t)gpuarr__g.epoch << 48;
    for (int i = 0; i < 7; i++) { /* splitmix64 */
        uint64_t z = (x += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        key[i] = (uint32_t)((z ^ (z >> 31)) >> 32);
    }
}

/* random: a word from gpuarr__handle_key. The tweak's top two bits are the kind (1, 2, 3), so
   two tables' tweaks differ in the top of the generation: the same permuted value never names
   nearby generations in two tables. */
static void gpuarr__table_init(gpuarr__table *t, const char *kind_name, uint32_t kind, uint32_t random) {
    memset(t, 0, sizeof *t);
    t->kind_name = kind_name;
    t->kind = kind;
    t->tweak = (random & 0x3fffffffu) | kind << 30;
    t->free_head = t->free_tail = GPUARR__NO_SLOT;
}

/* One init cycle's handle key and tables: ids unrelated to those of earlier cycles. */
static void gpuarr__tables_init(void) {
    uint32_t random[7];
    gpuarr__handle_key(random);
    memcpy(gpuarr__g.handle_key, random, sizeof gpuarr__g.handle_key);
    gpuarr__table_init(&gpuarr__g.arrays, "array", 1u, random[4]);
    gpuarr__table_init(&gpuarr__g.streams, "stream", 2u, random[5]);
    gpuarr__table_init(&gpuarr__g.events, "event", 3u, random[6]);
}

static gpuarr__slot *gpuarr__table_at(gpuarr__table *t, uint32_t index) {
    return &t->chunks[index >> GPUARR__CHUNK_BITS][index & (GPUARR__CHUNK_SLOTS - 1u)];
}

/* Under the lock: one more chunk, published to lookups by the store of used that hands out its
   first slot. */
static gpuarr_result gpuarr__table_grow(gpuarr__table *t) {
    if (t->capacity == GPUARR__INDEX_MASK + 1u)
        return gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY, "more than %u live %s handles", t->capacity, t->kind_name);
    gpuarr__slot *chunk = (gpuarr__slot *)gpuarr__calloc(sizeof(gpuarr__slot) * GPUARR__CHUNK_SLOTS);
    if (!chunk) return gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY, "no host memory for the %s handle table", t->kind_name);
    t->chunks[t->capacity >> GPUARR__CHUNK_BITS] = chunk;
    t->capacity += GPUARR__CHUNK_SLOTS;
    return GPUARR_OK;
}

/* Under the lock: a slot for a new object: a fresh one while the free list is short, so that
   freed slots wait before they are reused. */
static gpuarr_result gpuarr__table_take_slot(gpuarr__table *t, uint32_t *index) {
    bool table_full = t->used == GPUARR__INDEX_MASK + 1u;
    if (t->free_head != GPUARR__NO_SLOT && (t->free_count >= GPUARR__MIN_FREE_SLOTS || table_full)) {
        *index = t->free_head;
        t->free_head = gpuarr__table_at(t, *index)->next_free;
        if (t->free_head == GPUARR__NO_SLOT) t->free_tail = GPUARR__NO_SLOT;
        t->free_count--;
        return GPUARR_OK;
    }
    if (t->used == t->capacity) GPUARR__CHECK(gpuarr__table_grow(t));
    *index = t->used;
    __atomic_store_n(&gpuarr__table_at(t, *index)->gen, 0u, __ATOMIC_RELAXED);
    __atomic_store_n(&t->used, t->used + 1u, __ATOMIC_RELEASE);
    return GPUARR_OK;
}

/* id decoded with the shared key: its [generation][slot] in any table is this XOR the
   table's tweak. The permutation is a chain of multiplies that costs as much as the rest of a
   release: the id this thread made last (an array released soon after it was made) is
   remembered instead. The key changes only with the init cycle. */
static uint32_t gpuarr__handle_value(uint32_t id) {
    if (id == gpuarr__tls.handle_memo.id && gpuarr__tls.handle_memo.epoch == gpuarr__g.epoch)
        return gpuarr__tls.handle_memo.value;
    return gpuarr__handle_decode(gpuarr__g.handle_key, id);
}

/* id's [generation:16][slot index:16] in t. */
static uint32_t gpuarr__table_plain(const gpuarr__table *t, uint32_t id) { return gpuarr__handle_value(id) ^ t->tweak; }

/* Under the lock: the live slot of t with this [generation][slot] (plain), or NULL. */
static gpuarr__slot *gpuarr__table_live(gpuarr__table *t, uint32_t plain) {
    uint32_t index = plain & GPUARR__INDEX_MASK;
    if (index >= t->used) return NULL;
    gpuarr__slot *slot = gpuarr__table_at(t, index);
    return slot->obj && (slot->gen & GPUARR__GEN_MASK) == plain >> GPUARR__INDEX_BITS ? slot : NULL;
}

/* Under the lock: the live slot for id, or NULL. Records nothing. */
static gpuarr__slot *gpuarr__table_slot(gpuarr__table *t, uint32_t id) {
    return id == 0 ? NULL : gpuarr__table_live(t, gpuarr__table_plain(t, id));
}

/* The three tables by kind. */
static gpuarr__table *gpuarr__table_of_kind(uint32_t kind) {
    return kind == 1 ? &gpuarr__g.arrays : kind == 2 ? &gpuarr__g.streams : &gpuarr__g.events;
}

/* Under the handles lock: the id of slot index of t, moving the slot's generation past an id
   of 0 and past ids live in another table (found without a decode: the key is shared). Sets
   *value to the id's permutation input. */
static uint32_t gpuarr__table_new_id(gpuarr__table *t, uint32_t index, uint32_t *value) {
    gpuarr__slot *slot = gpuarr__table_at(t, index);
    for (;; __atomic_store_n(&slot->gen, slot->gen + 1u, __ATOMIC_RELEASE)) {
        *value = ((slot->gen & GPUARR__GEN_MASK) << GPUARR__INDEX_BITS | index) ^ t->tweak;
        uint32_t id = gpuarr__handle_encode(gpuarr__g.handle_key, *value);
        bool taken = id == 0;
        for (uint32_t k = 1; k <= 3 && !taken; k++) {
            gpuarr__table *o = gpuarr__table_of_kind(k);
            taken = o != t && o->live && gpuarr__table_live(o, *value ^ o->tweak) != NULL;
        }
        if (!taken) return id;
    }
}

/* Stores obj (whose one reference the handle now holds) and returns its id, under the lock the
   three tables share, so that no id is live in two tables at once. */
static gpuarr_result gpuarr__table_insert(gpuarr__table *t, gpuarr__obj *obj, uint32_t *id) {
    gpuarr__handles_lock();
    uint32_t index = 0;
    gpuarr_result r = gpuarr__table_take_slot(t, &index);
    if (r == GPUARR_OK) {
        gpuarr__slot *slot = gpuarr__table_at(t, index);
        uint32_t value = 0;
        *id = gpuarr__table_new_id(t, index, &value);
        gpuarr__tls.handle_memo.epoch = gpuarr__g.epoch;
        gpuarr__tls.handle_memo.id = *id;
        gpuarr__tls.handle_memo.value = value;
        __atomic_store_n(&slot->obj, obj, __ATOMIC_RELEASE); /* after its generation */
        slot->public_refs = 1;
        t->live++;
    }
    gpuarr__handles_unlock();
    return r;
}

/* Under the lock: whether id's generation was handed out at its slot (a released id). */
static bool gpuarr__table_issued(gpuarr__table *t, uint32_t id) {
    uint32_t plain = gpuarr__table_plain(t, id), index = plain & GPUARR__INDEX_MASK;
    if (index >= t->used) return false;
    uint32_t gen = gpuarr__table_at(t, index)->gen;
    return gen > GPUARR__GEN_MASK || plain >> GPUARR__INDEX_BITS <= gen;
}

/* Records why id names no live object of t, and returns INVALID_HANDLE. Called with no table
   lock held: it looks in the other tables for an id of another kind. */
static gpuarr_result gpuarr__table_reject(gpuarr__table *t, uint32_t id, const char *arg) {
    const char *an = t->kind == 1 ? "an" : "a";
    if (id == 0) return gpuarr__fail(GPUARR_ERROR_INVALID_HANDLE, "%s is a zero %s handle (never created)", arg, t->kind_name);
    for (uint32_t k = 1; k <= 3; k++) {
        gpuarr__table *o = gpuarr__table_of_kind(k);
        if (o == t) continue;
        gpuarr__handles_lock();
        bool theirs = gpuarr__table_slot(o, id) != NULL;
        gpuarr__handles_unlock();
        if (theirs)
            return gpuarr__fail(GPUARR_ERROR_INVALID_HANDLE, "%s (id 0x%08x) is %s %s handle, not %s %s handle", arg, id,
                                k == 1 ? "an" : "a", o->kind_name, an, t->kind_name);
    }
    gpuarr__handles_lock();
    bool released = gpuarr__table_issued(t, id);
    gpuarr__handles_unlock();
    if (released)
        return gpuarr__fail(GPUARR_ERROR_INVALID_HANDLE, "%s (id 0x%08x): this %s was released (stale handle)", arg, id, t->kind_name);
    return gpuarr__fail(GPUARR_ERROR_INVALID_HANDLE, "%s (id 0x%08x) is not %s %s handle", arg, id, an, t->kind_name);
}

/* The live object id names, with an internal reference the caller must drop, or NULL. Records
   nothing: for lookups whose failure is not the caller's error. No lock: the slot stays where it
   is, and while the lookup holds a pin on it a release that cleared obj after the lookup read it
   waits before it drops the handle's reference (gpuarr__table_unpinned), so obj is alive when
   retained. The pin and the clearing are sequentially consistent: one of the two sees the other. */
static gpuarr__obj *gpuarr__table_lookup(gpuarr__table *t, uint32_t id) {
    uint32_t plain = gpuarr__table_plain(t, id), index = plain & GPUARR__INDEX_MASK;
    if (id == 0 || index >= __atomic_load_n(&t->used, __ATOMIC_ACQUIRE)) return NULL;
    gpuarr__slot *slot = gpuarr__table_at(t, index);
    __atomic_add_fetch(&slot->pins, 1u, __ATOMIC_SEQ_CST);
    gpuarr__obj *obj = __atomic_load_n(&slot->obj, __ATOMIC_SEQ_CST);
    if (obj && (__atomic_load_n(&slot->gen, __ATOMIC_ACQUIRE) & GPUARR__GEN_MASK) == plain >> GPUARR__INDEX_BITS)
        gpuarr__obj_retain(obj);
    else
        obj = NULL; /* free, or reused by a later generation */
    __atomic_sub_fetch(&slot->pins, 1u, __ATOMIC_RELEASE);
    return obj;
}

/* Waits out the lookups that may have read slot's object before a release cleared it. */
static void gpuarr__table_unpinned(gpuarr__slot *slot) {
    while (__atomic_load_n(&slot->pins, __ATOMIC_SEQ_CST)) sched_yield();
}

/* Looks id up and returns its object with an internal reference the caller must drop. */
static gpuarr_result gpuarr__table_get(gpuarr__table *t, uint32_t id, const char *arg, gpuarr__obj **out) {
    *out = gpuarr__table_lookup(t, id);
    if (*out) return GPUARR_OK;
    gpuarr__table_reject(t, id, arg); /* always INVALID_HANDLE; said here so the optimizer knows */
    return GPUARR_ERROR_INVALID_HANDLE;
}

static gpuarr_result gpuarr__table_retain(gpuarr__table *t, uint32_t id, const char *arg) {
    gpuarr__handles_lock();
    gpuarr__slot *slot = gpuarr__table_slot(t, id);
    bool at_max = slot && slot->public_refs == UINT32_MAX;
    if (slot && !at_max) slot->public_refs++;
    gpuarr__handles_unlock();
    if (!slot) return gpuarr__table_reject(t, id, arg);
    if (at_max) return gpuarr__fail(GPUARR_ERROR_OVERFLOW, "%s: reference count at its maximum", arg);
    return GPUARR_OK;
}

/* Drops one handle reference; with the last, frees the slot (moving its generation on) and
   hands the handle's object reference to *dropped, to be released outside the lock. */
static gpuarr_result gpuarr__table_release(gpuarr__table *t, uint32_t id, const char *arg, gpuarr__obj **dropped) {
    *dropped = NULL;
    gpuarr__handles_lock();
    gpuarr__slot *slot = gpuarr__table_slot(t, id);
    if (slot && --slot->public_refs == 0) {
        uint32_t index = gpuarr__table_plain(t, id) & GPUARR__INDEX_MASK;
        *dropped = slot->obj;
        __atomic_store_n(&slot->obj, (gpuarr__obj *)NULL, __ATOMIC_SEQ_CST);
        __atomic_store_n(&slot->gen, slot->gen + 1u, __ATOMIC_RELEASE);
        slot->next_free = GPUARR__NO_SLOT;
        if (t->free_tail == GPUARR__NO_SLOT) t->free_head = index;
        else gpuarr__table_at(t, t->free_tail)->next_free = index;
        t->free_tail = index;
        t->free_count++;
        t->live--;
    }
    gpuarr__handles_unlock();
    if (*dropped) gpuarr__table_unpinned(slot); /* the slot itself stays: its chunk never goes */
    return slot ? GPUARR_OK : gpuarr__table_reject(t, id, arg);
}

static uint32_t gpuarr__table_public_refs(gpuarr__table *t, uint32_t id) {
    gpuarr__handles_lock();
    gpuarr__slot *slot = gpuarr__table_slot(t, id);
    uint32_t refs = slot ? slot->public_refs : 0;
    gpuarr__handles_unlock();
    return refs;
}

/* Shutdown: releases every live handle's object and frees the table. Returns how many lived. */
static uint32_t gpuarr__table_destroy(gpuarr__table *t) {
    uint32_t live = t->live;
    for (uint32_t i = 0; i < t->used; i++)
        if (gpuarr__table_at(t, i)->obj) gpuarr__obj_release(gpuarr__table_at(t, i)->obj);
    for (uint32_t c = 0; c < t->capacity >> GPUARR__CHUNK_BITS; c++) gpuarr__free(t->chunks[c]);
    memset(t, 0, sizeof *t);
    return live;
}

/* ---------------------------------------------------------------------------------------------
 * Backends compiled into this build
 * ------------------------------------------------------------------------------------------- */
/* Configuration the backends read, parsed by gpuarr_init (defined with the rest of it). */
static const char *gpuarr__setting(gpuarr__setting_id id);
static int gpuarr__setting_value(gpuarr__setting_id id, int unset);
static bool gpuarr__filter_allows(gpuarr_backend b, int index);
/* Frees what a host function handed to a backend holds, for one its driver will never run (CUDA
   does not call host functions after a context error). */
static void gpuarr__host_fn_discard(gpuarr__host_fn fn, void *ctx);

/* ---- for the device backends: kernel text, hashes, the on-disk kernel cache ---- */
typedef struct gpuarr__dtype_text {
    const char *name, *store, *kind, *cat, *lo, *hi;
} gpuarr__dtype_text;
static const gpuarr__dtype_text gpuarr__dtype_texts[GPUARR_DTYPE_COUNT] = {
    {NULL, NULL, NULL, NULL, NULL, NULL},
#define GPUARR__TEXT_ENTRY(NAME, str, store, size, kind, cat, lo, hi) {#NAME, #store, #kind, #cat, #lo, #hi},
    GPUARR_DTYPE_LIST(GPUARR__TEXT_ENTRY)
#undef GPUARR__TEXT_ENTRY
};

/* The line that instantiates the cast kernel for one pair in gpuarr_kernels.h, and its name. */
GPUARR__FOR_BACKENDS static void gpuarr__kernel_instantiation(int s, int t, char *out, size_t cap) {
    const gpuarr__dtype_text *a = &gpuarr__dtype_texts[s], *b = &gpuarr__dtype_texts[t];
    snprintf(out, cap, "GPUARR_K_CAST_KERNEL(%s, %s, %s, %s, %s, %s, %s, %s, %s)\n", a->name, a->store, a->kind, a->cat, b->name,
             b->store, b->kind, b->lo, b->hi);
}
GPUARR__FOR_BACKENDS static void gpuarr__kernel_name(int s, int t, char *out, size_t cap) {
    snprintf(out, cap, "gpuarr_k_cast_%s_%s", gpuarr__dtype_texts[s].name, gpuarr__dtype_texts[t].name);
}

/* FNV-1a over NUL-terminated pieces (cache keys; not for security). */
#define GPUARR__HASH_SEED 1469598103934665603ull
GPUARR__FOR_BACKENDS static uint64_t gpuarr__hash_pieces(uint64_t h, const char *const *pieces, size_t count) {
    for (size_t i = 0; i < count; i++)
        for (const unsigned char *c = (const unsigned char *)(pieces[i] ? pieces[i] : ""); *c; c++) h = (h ^ *c) * 1099511628211ull;
    return h;
}

/* ---- files kept on disk (kernel cache, models, lease slots): what another local user cannot plant ---- */
/* Folders are made 0700 and used only when they are real folders (not symlinks) of this user that
   nobody else can write; files are opened relative to their folder's descriptor, never through a
   symlink or into a FIFO's wait, and used only when they are regular files of this user; writes go
   to a new file of an unpredictable name, synced, then renamed over the old one. */
#define GPUARR__DIR_MAKE 1u    /* make it (mode 0700) when it is missing */
#define GPUARR__DIR_PARENTS 2u /* and its missing parents (0700 too) */
#define GPUARR__DIR_SHARED 4u  /* a sticky folder of this user or root may be writable by others */

/* What is wrong with the folder st, written into why (false), else true (*shared: it is a sticky
   folder others may write, accepted under GPUARR__DIR_SHARED). */
static bool gpuarr__dir_judge(const struct stat *st, unsigned flags, bool *shared, char *why, size_t cap) {
    unsigned long me = (unsigned long)geteuid(), owner = (unsigned long)st->st_uid;
    unsigned mode = (unsigned)st->st_mode & 07777u;
    *shared = (flags & GPUARR__DIR_SHARED) && (mode & S_ISVTX) && (mode & (S_IWGRP | S_IWOTH));
    if (!S_ISDIR(st->st_mode)) snprintf(why, cap, "is not a folder");
    else if (owner != me && !(*shared && owner == 0)) snprintf(why, cap, "is owned by uid %lu, not by this user (uid %lu)", owner, me);
    else if (!*shared && (mode & (S_IWGRP | S_IWOTH)))
        snprintf(why, cap, "is writable by %s (mode %04o)", (mode & S_IWOTH) ? "others" : "its group", mode);
    else return true;
    return false;
}

/* Makes the missing parents of path, each 0700 (a failure shows when path itself is made). */
static void gpuarr__dir_make_parents(const char *path) {
    char p[600];
    if (snprintf(p, sizeof p, "%s", path) >= (int)sizeof p) return;
    for (char *c = p + 1; *c; c++)
        if (*c == '/') *c = '\0', (void)mkdir(p, 0700), *c = '/';
}

/* The checked folder fd (made first under GPUARR__DIR_MAKE) from openat(at, name): its descriptor,
   or -1 with why saying what is wrong ("is a symlink", "is owned by uid N ...", "cannot be made: ..."). */
static int gpuarr__dir_open_at(int at, const char *name, unsigned flags, bool *shared, char *why, size_t cap) {
    if ((flags & GPUARR__DIR_MAKE) && mkdirat(at, name, 0700) != 0 && errno != EEXIST) {
        int e = errno;
        snprintf(why, cap, "cannot be made: %s", strerror(e));
        errno = e;
        return -1;
    }
    int fd = openat(at, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    if (fd < 0) {
        int e = errno;
        if (fstatat(at, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode)) snprintf(why, cap, "is a symlink (not followed)");
        else if (e == ENOTDIR) snprintf(why, cap, "is not a folder");
        else snprintf(why, cap, "cannot be opened: %s", strerror(e));
        errno = e;
        return -1;
    }
    if (fstat(fd, &st) != 0) {
        snprintf(why, cap, "cannot be examined: %s", strerror(errno));
        close(fd);
        return -1;
    }
    if (!gpuarr__dir_judge(&st, flags, shared, why, cap)) {
        close(fd);
        errno = EPERM;
        return -1;
    }
    return fd;
}

/* The same for an absolute path (its parents are followed as they are). */
static int gpuarr__dir_open(const char *path, unsigned flags, bool *shared, char *why, size_t cap) {
    if (flags & GPUARR__DIR_PARENTS) gpuarr__dir_make_parents(path);
    return gpuarr__dir_open_at(AT_FDCWD, path, flags, shared, why, cap);
}

/* Opens name in the folder dir (flags: O_RDONLY or O_RDWR, O_CREAT to make it 0600 when missing)
   without following a symlink or waiting on a FIFO: its descriptor when it is a regular file of
   this user (any_owner: of anyone), else -1 with errno (ENOENT: there is none) and why. */
static int gpuarr__file_open_at(int dir, const char *name, int flags, bool any_owner, char *why, size_t cap) {
    int base = (flags & ~O_CREAT) | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, fd = -1;
    for (int tries = 0; fd < 0 && tries < 3; tries++) { /* not O_CREAT on a file that exists: some kernels refuse
                                                           it on others' files in sticky folders */
        fd = openat(dir, name, base);
        if (fd < 0 && errno == ENOENT && (flags & O_CREAT)) fd = openat(dir, name, base | O_CREAT | O_EXCL, 0600);
        if (fd < 0 && errno != EEXIST) break;
    }
    struct stat st;
    if (fd < 0) {
        int e = errno;
        if (e == ELOOP) snprintf(why, cap, "is a symlink (not followed)");
        else snprintf(why, cap, "cannot be opened: %s", strerror(e));
        errno = e;
        return -1;
    }
    if (fstat(fd, &st) != 0) snprintf(why, cap, "cannot be examined: %s", strerror(errno));
    else if (!S_ISREG(st.st_mode)) snprintf(why, cap, "is not a regular file (mode %06o)", (unsigned)st.st_mode);
    else if (!any_owner && st.st_uid != geteuid())
        snprintf(why, cap, "is owned by uid %lu, not by this user (uid %lu)", (unsigned long)st.st_uid, (unsigned long)geteuid());
    else return fd;
    close(fd);
    errno = EPERM;
    return -1;
}

/* The whole of name in dir, NUL-terminated (*size without the NUL), when it is a regular file of
   this user of at most max bytes; else NULL with why ("" when there is no such file). A larger
   file is refused without reading it. */
static unsigned char *gpuarr__file_read_at(int dir, const char *name, size_t max, size_t *size, char *why, size_t cap) {
    *size = 0;
    why[0] = '\0';
    int fd = gpuarr__file_open_at(dir, name, O_RDONLY, false, why, cap);
    if (fd < 0) {
        if (errno == ENOENT) why[0] = '\0';
        return NULL;
    }
    struct stat st;
    unsigned char *data = NULL;
    size_t n = 0, want = 0;
    if (fstat(fd, &st) != 0 || st.st_size < 0) snprintf(why, cap, "cannot be examined: %s", strerror(errno));
    else if ((uint64_t)st.st_size > (uint64_t)max)
        snprintf(why, cap, "is %llu bytes, more than the %zu such a file may have", (unsigned long long)st.st_size, max);
    else if (!(data = (unsigned char *)gpuarr__malloc((want = (size_t)st.st_size) + 1))) snprintf(why, cap, "no host memory to read it");
    while (data && n < want) { /* a file that shrinks meanwhile is read as far as it goes */
        ssize_t got = read(fd, data + n, want - n);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) {
            snprintf(why, cap, "cannot be read: %s", strerror(errno));
            gpuarr__free(data);
            data = NULL;
        }
        if (got <= 0) break;
        n += (size_t)got;
    }
    close(fd);
    if (data) data[n] = '\0', *size = n;
    return data;
}

/* A name no one can guess: 16 hex digits from getentropy (else the clock, pid and a counter). */
static void gpuarr__random_suffix(char *out, size_t cap) {
    static uint64_t counter; /* atomic */
    uint64_t r;
    if (getentropy(&r, sizeof r) != 0) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        r = ((uint64_t)ts.tv_nsec << 20) ^ (uint64_t)ts.tv_sec ^ ((uint64_t)getpid() << 40) ^
            __atomic_add_fetch(&counter, 0x9e3779b97f4a7c15ull, __ATOMIC_RELAXED);
    }
    snprintf(out, cap, "%016llx", (unsigned long long)r);
}

static bool gpuarr__write_all(int fd, const void *data, size_t size) {
    const unsigned char *p = (const unsigned char *)data;
    while (size) {
        ssize_t n = write(fd, p, size);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return false;
        p += n, size -= (size_t)n;
    }
    return true;
}

/* Writes head then data as name in dir: into a new file of an unpredictable name (O_EXCL, so a
   planted link is never followed), synced, then renamed over name, so a reader never sees half a
   file. false: why says what failed. */
static bool gpuarr__file_write_at(int dir, const char *name, const void *head, size_t head_size, const void *data, size_t size,
                                  char *why, size_t cap) {
    char tmp[300], suffix[20];
    int fd = -1;
    for (int tries = 0; fd < 0 && tries < 8; tries++) {
        gpuarr__random_suffix(suffix, sizeof suffix);
        if (snprintf(tmp, sizeof tmp, ".%.200s.%s.tmp", name, suffix) >= (int)sizeof tmp) break;
        fd = openat(dir, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (fd < 0 && errno != EEXIST) break;
    }
    if (fd < 0) {
        snprintf(why, cap, "cannot be written: %s", strerror(errno));
        return false;
    }
    bool ok = gpuarr__write_all(fd, head, head_size) && gpuarr__write_all(fd, data, size) && fsync(fd) == 0;
    int e = errno;
    ok = close(fd) == 0 && ok;
    if (ok && renameat(dir, tmp, dir, name) == 0) return true;
    snprintf(why, cap, "cannot be written: %s", strerror(ok ? errno : e));
    (void)unlinkat(dir, tmp, 0);
    return false;
}

/* ---- the cache folder (GPUARR_CACHE_DIR) and its files ---- */
/* Each cache file starts with this header, checked before a byte of its payload is used. */
#define GPUARR__CACHE_MAGIC "gpuarr-cache\n\0\0"
#define GPUARR__CACHE_VERSION 1u
#define GPUARR__CACHE_KERNEL_MAX ((size_t)64 << 20) /* bytes: a larger kernel binary is refused unread */
typedef struct gpuarr__cache_header {
    char magic[16];
    uint32_t version, header_size;
    uint64_t payload_size, payload_hash, key; /* key: the hash the file's name is made of */
} gpuarr__cache_header;

/* FNV-1a over bytes: finds a damaged payload (the folder's owner check keeps others out). */
GPUARR__FOR_BACKENDS static uint64_t gpuarr__hash_bytes(const void *data, size_t size) {
    uint64_t h = GPUARR__HASH_SEED;
    for (const unsigned char *c = (const unsigned char *)data, *end = c + size; c < end; c++) h = (h ^ *c) * 1099511628211ull;
    return h;
}

/* The cache folder, made (with its parents) and checked: its descriptor, or -1 when there is no
   cache or the folder is refused (said once per gpuarr_init, as a warning; one that cannot be made
   at info level): kernels are then built from source every time. */
static int gpuarr__cache_dir_open(void) {
    const char *base = gpuarr__g.config.cache_dir;
    if (!base[0]) return -1;
    char why[160];
    bool shared;
    int fd = gpuarr__dir_open(base, GPUARR__DIR_MAKE | GPUARR__DIR_PARENTS, &shared, why, sizeof why);
    bool refused = fd < 0 && (errno == EPERM || errno == ELOOP || errno == ENOTDIR); /* else it cannot be made (no HOME, a read-only disk): an info line, no cache */
    if (fd < 0 && !__atomic_exchange_n(&gpuarr__g.config.cache_refused, true, __ATOMIC_RELAXED))
        gpuarr__log(refused ? GPUARR_LOG_WARN : GPUARR_LOG_INFO,
                    "the cache folder %s %s: not used, nothing is cached (GPUARR_CACHE_DIR sets another, off none)", base, why);
    return fd;
}

/* The payload of the cache file `file` (NUL-terminated; *size without the NUL) when its header
   checks out for key; NULL when there is none, or it is refused or damaged (said at info level:
   it is rebuilt and replaced). */
GPUARR__FOR_BACKENDS static unsigned char *gpuarr__cache_load(const char *file, uint64_t key, size_t max, size_t *size) {
    int dir = gpuarr__cache_dir_open();
    if (dir < 0) return NULL;
    char why[160];
    gpuarr__cache_header h;
    size_t n = 0;
    unsigned char *data = gpuarr__file_read_at(dir, file, max + sizeof h, &n, why, sizeof why);
    close(dir);
    *size = 0;
    if (!data) {
        if (why[0]) gpuarr__log(GPUARR_LOG_INFO, "the cache file %s/%s %s: rebuilt", gpuarr__g.config.cache_dir, file, why);
        return NULL;
    }
    if (n >= sizeof h) memcpy(&h, data, sizeof h);
    const char *bad = n < sizeof h || memcmp(h.magic, GPUARR__CACHE_MAGIC, sizeof h.magic) != 0 ? "has no gpuarr cache header"
                      : h.version != GPUARR__CACHE_VERSION || h.header_size != sizeof h ? "is of another format version"
                      : h.key != key                                                    ? "is for another key"
                      : h.payload_size != n - sizeof h                                  ? "is cut short or too long"
                      : h.payload_hash != gpuarr__hash_bytes(data + sizeof h, n - sizeof h) ? "is damaged (its hash differs)"
                                                                                        : NULL;
    if (bad) {
        gpuarr__log(GPUARR_LOG_INFO, "the cache file %s/%s %s: rebuilt", gpuarr__g.config.cache_dir, file, bad);
        gpuarr__free(data);
        return NULL;
    }
    memmove(data, data + sizeof h, n - sizeof h + 1);
    *size = n - sizeof h;
    return data;
}

/* Stores data as the cache file `file` for key, replacing what is there (best effort: a failure
   is said at info level; the cache is optional). */
GPUARR__FOR_BACKENDS static void gpuarr__cache_store(const char *file, uint64_t key, const void *data, size_t size) {
    int dir = gpuarr__cache_dir_open();
    if (dir < 0) return;
    gpuarr__cache_header h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, GPUARR__CACHE_MAGIC, sizeof h.magic);
    h.version = GPUARR__CACHE_VERSION;
    h.header_size = (uint32_t)sizeof h;
    h.payload_size = size;
    h.payload_hash = gpuarr__hash_bytes(data, size);
    h.key = key;
    char why[160];
    if (!gpuarr__file_write_at(dir, file, &h, sizeof h, data, size, why, sizeof why))
        gpuarr__log(GPUARR_LOG_INFO, "the cache file %s/%s %s", gpuarr__g.config.cache_dir, file, why);
    close(dir);
}

/* Host functions run on driver threads, which signal completion through the driver in ways
   neither the compiler nor a race detector sees. So each ends with a release of one counter, and
   a backend's wait that saw work complete acquires it: what the host function wrote is then
   visible to the waiting thread. */
static void gpuarr__host_fn_done(void) { __atomic_add_fetch(&gpuarr__g.host_fns_done, 1, __ATOMIC_RELEASE); }
static inline void gpuarr__host_fn_seen(void) { /* inline: unused without a device backend */
    (void)__atomic_load_n(&gpuarr__g.host_fns_done, __ATOMIC_ACQUIRE);
}
/* The same at the start: the thread that queues a host function releases a second counter, and
   the driver's thread acquires it before running fn, so fn sees what was written before. */
static inline void gpuarr__host_fn_queued(void) { __atomic_add_fetch(&gpuarr__g.host_fns_queued, 1, __ATOMIC_RELEASE); }
static inline void gpuarr__host_fn_starts(void) { (void)__atomic_load_n(&gpuarr__g.host_fns_queued, __ATOMIC_ACQUIRE); }

/* ---- CPU work between host pointers: a cast (a copy when the dtypes match), a copy, a fill,
   split across the host backend's worker pool (gpuarr__g.cpu) ---- */
static void gpuarr__cpu_cast(void *dst, gpuarr_dtype dt, const void *src, gpuarr_dtype st, size_t n) {
    gpuarr__g.cpu.cast(dst, dt, src, st, n);
}
GPUARR__FOR_BACKENDS static void gpuarr__cpu_memcpy(void *dst, const void *src, size_t bytes) { gpuarr__g.cpu.copy(dst, src, bytes); }
GPUARR__FOR_BACKENDS static void gpuarr__cpu_fill(void *dst, const void *pattern, size_t pattern_size, size_t bytes) {
    gpuarr__g.cpu.fill(dst, pattern, pattern_size, bytes);
}

/* ---- for the backends' interop functions: core services (defined further down) ---- */
static gpuarr_result gpuarr__get_dev(gpuarr_device d, const char *arg, gpuarr__dev **out);
static gpuarr_result gpuarr__dev_open(gpuarr__dev *d);
static gpuarr_result gpuarr__get_array(gpuarr_array a, const char *arg, gpuarr__array **out);
static gpuarr_result gpuarr__array_alloc_struct(gpuarr__dev *d, gpuarr_dtype t, int ndim, const int64_t *shape, gpuarr__array **out);
static void gpuarr__tcache_thread_exit(void);
static gpuarr_result gpuarr__stream_adopt(gpuarr__dev *d, void *native, gpuarr__stream **out);
static int gpuarr__devices_total(void);
static gpuarr_result gpuarr__registry_adopt(gpuarr_backend id, void *context, void *device, void *queue, gpuarr_device *out);
typedef struct gpuarr__hold gpuarr__hold;
GPUARR__FOR_BACKENDS static gpuarr_result gpuarr__hold_array(gpuarr_array a, gpuarr_backend backend, gpuarr__hold **out, gpuarr__array **arr);
GPUARR__FOR_BACKENDS static void gpuarr__hold_let_go(gpuarr__hold *h);
static void gpuarr__hold_cancel(gpuarr__hold *h);
static void gpuarr__holds_release(void);
static gpuarr_result gpuarr__stream_publish(gpuarr__stream *s, gpuarr_stream *out);
static gpuarr_result gpuarr__resolve_stream_of(gpuarr_stream s, gpuarr_backend backend, const char *what, gpuarr__stream **out);

/* The interop dispatch table: X(BACKEND, name after "gpuarr_", (parameters), (arguments)), one
   row per public interop function declared above, one list GPUARR__INTEROP_<NAME> per backend
   (empty for the host). From it come each backend's interop table, gpuarr__interop_<NAME>, which
   the backend fills with {GPUARR_BACKEND_<NAME>, GPUARR__INTEROP_<NAME>(GPUARR__INTEROP_IMPL)}
   from its functions gpuarr__<name> (the public name with two underscores), and the public
   functions' definitions (at the end of the implementation): a call through that table, or
   GPUARR_ERROR_UNSUPPORTED in a build without the backend. A row must match its declaration:
   the compiler checks the definitions against them. */
#define GPUARR__INTEROP_HOST(X)
#define GPUARR__INTEROP_CUDA(X)                                                                \
    X(CUDA, cuda_context, (gpuarr_device d, struct CUctx_st **out), (d, out))                  \
    X(CUDA, cuda_device_ordinal, (gpuarr_device d, int *out), (d, out))                        \
    X(CUDA, cuda_stream, (gpuarr_stream s, struct CUstream_st **out), (s, out))                \
    X(CUDA, cuda_ptr, (gpuarr_array a, void **out), (a, out))                                  \
    X(CUDA, cuda_wrap_ptr,                                                                     \
      (gpuarr_device d, void *ptr, gpuarr_dtype t, int ndim, const int64_t *shape, gpuarr_release_fn release, \
       void *user_data, gpuarr_array *out),                                                    \
      (d, ptr, t, ndim, shape, release, user_data, out))                                       \
    X(CUDA, cuda_wrap_stream, (gpuarr_device d, struct CUstream_st *stream, gpuarr_stream *out), (d, stream, out)) \
    X(CUDA, cuda_adopt, (struct CUctx_st *ctx, gpuarr_device *out), (ctx, out))
#define GPUARR__INTEROP_OPENCL(X)                                                              \
    X(OPENCL, opencl_context_raw, (gpuarr_device d, void **cl_context_out), (d, cl_context_out)) \
    X(OPENCL, opencl_device_id_raw, (gpuarr_device d, void **cl_device_id_out), (d, cl_device_id_out)) \
    X(OPENCL, opencl_queue_raw, (gpuarr_stream s, void **cl_command_queue_out), (s, cl_command_queue_out)) \
    X(OPENCL, opencl_mem_raw, (gpuarr_array a, void **cl_mem_out, size_t *offset), (a, cl_mem_out, offset)) \
    X(OPENCL, opencl_wrap_mem_raw,                                                             \
      (gpuarr_device d, void *cl_mem, size_t offset, gpuarr_dtype t, int ndim, const int64_t *shape, gpuarr_array *out), \
      (d, cl_mem, offset, t, ndim, shape, out))                                                \
    X(OPENCL, opencl_wrap_queue_raw, (gpuarr_device d, void *cl_command_queue, gpuarr_stream *out), \
      (d, cl_command_queue, out))                                                              \
    X(OPENCL, opencl_adopt_raw, (void *cl_context, void *cl_device_id, void *cl_command_queue, gpuarr_device *out), \
      (cl_context, cl_device_id, cl_command_queue, out))                                       \
    X(OPENCL, opencl_export_mem_raw, (gpuarr_array a, void **cl_mem_out), (a, cl_mem_out))
#define GPUARR__INTEROP_MEMBER(B, name, params, args) gpuarr_result(*name) params;
#define GPUARR__INTEROP_TABLE(NAME, str)                                                       \
    typedef struct gpuarr__interop_##NAME {                                                    \
        gpuarr_backend backend;                                                                \
        GPUARR__INTEROP_##NAME(GPUARR__INTEROP_MEMBER)                                         \
    } gpuarr__interop_##NAME;
GPUARR_BACKEND_LIST(GPUARR__INTEROP_TABLE)
#undef GPUARR__INTEROP_TABLE
#undef GPUARR__INTEROP_MEMBER
#define GPUARR__INTEROP_IMPL(B, name, params, args) gpuarr__##name,

/* ---------------------------------------------------------------------------------------------
 * Failed devices (see FAILURES). A backend that meets an error after which its context is
 * unusable (a sticky error) marks the device failed once, with that first error; from then on
 * every call on the device, its arrays, streams and events fails with GPUARR_ERROR_DEVICE_LOST
 * before reaching the driver, and releases drop their objects without asking it, until
 * gpuarr_device_reset.
 * ------------------------------------------------------------------------------------------- */
static bool gpuarr__dev_failed(gpuarr__dev *d) { return __atomic_load_n(&d->failed, __ATOMIC_ACQUIRE) == 2u; }

/* The first caller records its error; later ones (other threads meeting the same failure) keep it. */
GPUARR__FOR_BACKENDS static void gpuarr__dev_mark_failed(gpuarr__dev *d, const char *error, const char *call) {
    uint32_t healthy = 0;
    if (!__atomic_compare_exchange_n(&d->failed, &healthy, 1u, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) return;
    snprintf(d->failure, sizeof d->failure, "%s in %s", error, call);
    __atomic_store_n(&d->failed, 2u, __ATOMIC_RELEASE);
    gpuarr__log(GPUARR_LOG_ERROR, "%s failed: %s; its arrays, streams and events are lost until gpuarr_device_reset", d->info.spec,
                d->failure);
}

/* The device named by spec (a backend's messages name devices by it), or NULL. */
GPUARR__FOR_BACKENDS static gpuarr__dev *gpuarr__dev_by_spec(const char *spec) {
    for (int i = 0; spec && i < gpuarr__devices_total(); i++)
        if (strcmp(gpuarr__g.devices[i].info.spec, spec) == 0) return &gpuarr__g.devices[i];
    return NULL;
}

/* GPUARR_OK, or GPUARR_ERROR_DEVICE_LOST naming the first error when d has failed. */
static gpuarr_result gpuarr__dev_alive(gpuarr__dev *d) {
    if (!gpuarr__dev_failed(d)) return GPUARR_OK;
    return gpuarr__fail(GPUARR_ERROR_DEVICE_LOST, "%s failed earlier: %s (gpuarr_device_reset brings it back once its arrays, "
                        "streams and events are released)", d->info.spec, d->failure);
}

/* ---------------------------------------------------------------------------------------------
 * Portable kernels, what the backends share: the launch a backend gets (checked), the device
 * source made from a kernel's description in a backend's dialect, and the build logs.
 * ------------------------------------------------------------------------------------------- */
/* One launch, checked by gpuarr_kernel_launch: every array on s's device, of its parameter's
   dtype, writable where written; the index space not empty. */
struct gpuarr__kernel_call {
    const gpuarr_kernel *kernel;
    int ndim;                                     /* 1..3 */
    int64_t global[3];                            /* each >= 1; 1 past ndim */
    void *mem[GPUARR_KERNEL_MAX_PARAMS];          /* an array parameter's memory handle */
    size_t offset[GPUARR_KERNEL_MAX_PARAMS];      /* its first element, in bytes into mem (a
                                                     multiple of its element size) */
    const void *scalar[GPUARR_KERNEL_MAX_PARAMS]; /* a scalar parameter's value */
};

/* How a device language spells a kernel: gpuarr__kernel_source writes
       <prelude>
       <entry> gpuarr_kernel_<name>(<per array: <space><const> T *gpuarr__pN[, uint64_t gpuarr__oN]>,
                                    <per scalar: const T name>, int64_t gpuarr__g0, g1, g2) {
           const int64_t gpuarr__i0 = <id[0]>, ...;  (return past the index space)
           <space><const> T *const name = gpuarr__pN[ + gpuarr__oN];
           <body> }
   The prelude defines the fixed-width types, gpuarr_index and gpuarr_size (as the host's),
   gpuarr_f16/gpuarr_bf16 and their load/store helpers, and the math list. */
typedef struct gpuarr__kernel_dialect {
    const char *prelude;
    const char *entry; /* "__kernel void", "extern \"C\" __global__ void" */
    const char *space; /* the arrays' address space: "__global ", "" */
    bool offsets;      /* arrays come as a buffer and an element offset (OpenCL: a cl_mem) */
    const char *id[3]; /* the global index along each dimension, an int64_t expression */
} gpuarr__kernel_dialect;

/* What every device dialect's prelude ends with, after its fixed-width types and the conversion
   rules (kernels/gpuarr_kernels.h): the body's names, spelled as the host's (see KERNELS). */
GPUARR__FOR_BACKENDS static const char gpuarr__kernel_prelude_common[] =
    "#define gpuarr_index(d) ((d) == 0 ? gpuarr__i0 : (d) == 1 ? gpuarr__i1 : gpuarr__i2)\n"
    "#define gpuarr_size(d) ((d) == 0 ? gpuarr__g0 : (d) == 1 ? gpuarr__g1 : gpuarr__g2)\n"
    "typedef struct gpuarr_f16 { uint16_t bits; } gpuarr_f16;\n"
    "typedef struct gpuarr_bf16 { uint16_t bits; } gpuarr_bf16;\n"
    "#define gpuarr_load_f16(p, i) gpuarr_k_f16_to_f32((p)[i].bits)\n"
    "#define gpuarr_store_f16(p, i, v) ((p)[i].bits = gpuarr_k_f32_to_f16(v))\n"
    "#define gpuarr_load_bf16(p, i) gpuarr_k_bf16_to_f32((p)[i].bits)\n"
    "#define gpuarr_store_bf16(p, i, v) ((p)[i].bits = gpuarr_k_f32_to_bf16(v))\n";

/* Appends printf-formatted text to a growing buffer; false when out of memory (buffer freed). */
GPUARR__FOR_BACKENDS static bool gpuarr__text_add(char **buf, size_t *len, size_t *cap, const char *fmt, ...) GPUARR__PRINTF(4, 5);
GPUARR__FOR_BACKENDS static bool gpuarr__text_add(char **buf, size_t *len, size_t *cap, const char *fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = *buf ? vsnprintf(*buf + *len, *cap - *len, fmt, ap) : -2;
        va_end(ap);
        if (n >= 0 && (size_t)n < *cap - *len) {
            *len += (size_t)n;
            return true;
        }
        if (n == -1) break;
        size_t want = GPUARR__MAX(*cap * 2, *len + (n > 0 ? (size_t)n : 0) + 256);
        char *grown = (char *)gpuarr__malloc(want); /* gpuarr's allocator has no realloc */
        if (!grown) break;
        if (*buf) memcpy(grown, *buf, *len + 1);
        gpuarr__free(*buf);
        *buf = grown;
        *cap = want;
    }
    gpuarr__free(*buf);
    *buf = NULL;
    return false;
}

/* The device source of k in dialect d (gpuarr__malloc'ed; NULL: out of memory). */
GPUARR__FOR_BACKENDS static char *gpuarr__kernel_source(const gpuarr_kernel *k, const gpuarr__kernel_dialect *d) {
    char *b = NULL;
    size_t len = 0, cap = 0;
    bool ok = gpuarr__text_add(&b, &len, &cap, "%s\n%s gpuarr_kernel_%s(", d->prelude, d->entry, k->name);
    for (int i = 0; ok && i < k->nparams; i++) {
        const gpuarr_kernel_param *p = &k->params[i];
        bool in = p->kind == GPUARR_PARAM_IN;
        if (p->kind == GPUARR_PARAM_SCALAR) ok = gpuarr__text_add(&b, &len, &cap, "const %s %s, ", p->type, p->name);
        else ok = gpuarr__text_add(&b, &len, &cap, "%s%s%s *gpuarr__p%d, ", d->space, in ? "const " : "", p->type, i) &&
                  (!d->offsets || gpuarr__text_add(&b, &len, &cap, "uint64_t gpuarr__o%d, ", i));
    }
    ok = ok && gpuarr__text_add(&b, &len, &cap,
                                "int64_t gpuarr__g0, int64_t gpuarr__g1, int64_t gpuarr__g2) {\n"
                                "const int64_t gpuarr__i0 = %s, gpuarr__i1 = %s, gpuarr__i2 = %s;\n"
                                "if (gpuarr__i0 >= gpuarr__g0 || gpuarr__i1 >= gpuarr__g1 || gpuarr__i2 >= gpuarr__g2) return;\n",
                                d->id[0], d->id[1], d->id[2]);
    for (int i = 0; ok && i < k->nparams; i++) {
        const gpuarr_kernel_param *p = &k->params[i];
        if (p->kind == GPUARR_PARAM_SCALAR) continue;
        bool in = p->kind == GPUARR_PARAM_IN;
        ok = gpuarr__text_add(&b, &len, &cap, "%s%s%s *const %s = gpuarr__p%d", d->space, in ? "const " : "", p->type, p->name, i) &&
             (!d->offsets || gpuarr__text_add(&b, &len, &cap, " + gpuarr__o%d", i)) && gpuarr__text_add(&b, &len, &cap, ";\n");
    }
    /* the body, as the host compiled it; errors point at its lines */
    ok = ok && gpuarr__text_add(&b, &len, &cap, "#line 1 \"%s\"\n%s\n}\n", k->name, k->body);
    return ok ? b : NULL;
}

/* The first lines of a compiler log, for a message (at most `lines` lines, cap bytes). */
GPUARR__FOR_BACKENDS static void gpuarr__log_head(const char *log, int lines, char *out, size_t cap) {
    size_t n = 0;
    const char *p = log;
    while (*p == '\n' || *p == ' ') p++;
    for (int line = 0; p[n] && line < lines; n++)
        if (p[n] == '\n') line++;
    while (n && (p[n - 1] == '\n' || p[n - 1] == ' ')) n--;
    if (n >= cap) n = cap - 1;
    memcpy(out, p, n);
    out[n] = '\0';
    for (size_t i = 0; i < n; i++)
        if (out[i] == '\n') out[i] = '|'; /* one line of message */
}

/* The build logs: the whole compiler output of each (kernel, device)'s last build, for
   gpuarr_kernel_build_log. A list in gpuarr__g under its lock; freed at the last shutdown. */
typedef struct gpuarr__kernel_log {
    struct gpuarr__kernel_log *next;
    const gpuarr_kernel *kernel;
    const gpuarr__dev *dev;
    char *text;
} gpuarr__kernel_log;

/* Keeps log (copied; NULL or "" clears) as the last build log of k on d. */
GPUARR__FOR_BACKENDS static void gpuarr__kernel_log_set(const gpuarr__dev *d, const gpuarr_kernel *k, const char *log) {
    char *copy = log && *log ? gpuarr__strdup(log) : NULL;
    pthread_mutex_lock(&gpuarr__g.kernel_logs_lock);
    gpuarr__kernel_log *e = gpuarr__g.kernel_logs;
    while (e && (e->kernel != k || e->dev != d)) e = e->next;
    if (!e && copy && (e = (gpuarr__kernel_log *)gpuarr__calloc(sizeof *e)) != NULL) {
        e->kernel = k;
        e->dev = d;
        e->next = gpuarr__g.kernel_logs;
        gpuarr__g.kernel_logs = e;
    }
    if (e) {
        gpuarr__free(e->text);
        e->text = copy;
        copy = NULL;
    }
    pthread_mutex_unlock(&gpuarr__g.kernel_logs_lock);
    gpuarr__free(copy);
}

static void gpuarr__kernel_logs_free(void) {
    pthread_mutex_lock(&gpuarr__g.kernel_logs_lock);
    while (gpuarr__g.kernel_logs) {
        gpuarr__kernel_log *e = gpuarr__g.kernel_logs;
        gpuarr__g.kernel_logs = e->next;
        gpuarr__free(e->text);
        gpuarr__free(e);
    }
    pthread_mutex_unlock(&gpuarr__g.kernel_logs_lock);
}

/* A failed build: GPUARR_ERROR_BUILD naming the kernel, the device and the log's first lines;
   the whole log kept for gpuarr_kernel_build_log. */
GPUARR__FOR_BACKENDS static gpuarr_result gpuarr__kernel_build_failed(const gpuarr__dev *d, const gpuarr_kernel *k, const char *how,
                                                                      const char *log) {
    char head[600];
    gpuarr__log_head(log ? log : "", 6, head, sizeof head);
    gpuarr__kernel_log_set(d, k, log);
    return gpuarr__fail(GPUARR_ERROR_BUILD, "kernel %s did not compile for %s (%s): %s (the whole log: gpuarr_kernel_build_log)", k->name,
                        d->info.spec, how, head[0] ? head : "the compiler gave no log");
}

/* For a simulating CUDA driver such as tests/fake_cuda, which runs no device code: the host form
   of the portable kernels it is asked to launch. The CUDA backend, right after loading the driver
   library, calls the library's exported
       void gpuarr_sim_kernel_hooks_set(const gpuarr__sim_kernel_hooks *hooks, int on)
   where it has one (on = 1; on = 0 when the backend unloads). The driver calls the hooks from
   cuLaunchKernel (capture, addresses) and when its stream runs the launch (run), under its own
   lock: they take no lock of gpuarr's and call no driver entry point. Here, not in the CUDA
   backend, because the fake driver includes gpuarr without it. */
#define GPUARR__SIM_KERNEL_HOOKS_VERSION 1
struct CUfunc_st; /* CUfunction's tag */
typedef struct gpuarr__sim_kernel_hooks {
    int version; /* GPUARR__SIM_KERNEL_HOOKS_VERSION; a driver ignores hooks of another version */
    /* A copy of one launch of f (CUfunction) with cuLaunchKernel's kernelParams, over threads[d]
       threads (grid x block) along each dimension: malloc'ed, for run and release. NULL with why
       set (a sentence) when f is no portable kernel this gpuarr built or the threads do not
       cover the kernel's index space; NULL with why "" when out of memory. */
    void *(*capture)(struct CUfunc_st *f, void *const *params, const unsigned long long threads[3], char *why, size_t why_cap);
    /* The device addresses (CUdeviceptr) the launch's array parameters start at: their number,
       the first cap of them written to out. */
    int (*addresses)(const void *launch, unsigned long long *out, int cap);
    /* Runs the launch on the calling thread: translate(ctx, address) is the host memory behind a
       device address, NULL when there is none (then nothing runs and run returns -1); 0 when
       done. */
    int (*run)(void *launch, void *(*translate)(void *ctx, unsigned long long address), void *ctx);
    void (*release)(void *launch); /* frees a captured launch, run or not */
} gpuarr__sim_kernel_hooks;

/* The backends. Each header defines its fill function, gpuarr__<name>_backend_fill, which fills
   its gpuarr__backend by assignment, and GPUARR__BACKEND_FILL_<NAME> naming it; a backend left
   out has NULL there. */
#include "backends/gpuarr_host.h"
#ifndef GPUARR_NO_CUDA
#include "backends/gpuarr_cuda.h"
#else
#define GPUARR__BACKEND_FILL_CUDA NULL
#endif
#ifndef GPUARR_NO_OPENCL
#include "backends/gpuarr_opencl.h"
#else
#define GPUARR__BACKEND_FILL_OPENCL NULL
#endif

typedef void (*gpuarr__backend_fill_fn)(gpuarr__backend *b);

/* Fills gpuarr__g.backends, once per process (through gpuarr__g.backends_once). */
static void gpuarr__backends_fill(void) {
    const gpuarr__backend_fill_fn fill[GPUARR_BACKEND_COUNT] = {
        NULL,
#define GPUARR__BACKEND_FILL_ENTRY(NAME, str) GPUARR__BACKEND_FILL_##NAME,
        GPUARR_BACKEND_LIST(GPUARR__BACKEND_FILL_ENTRY)
#undef GPUARR__BACKEND_FILL_ENTRY
    };
    for (int b = 1; b < GPUARR_BACKEND_COUNT; b++)
        if (fill[b]) fill[b](&gpuarr__g.backends[b]);
}

/* The table of backend b, or NULL for a backend this build left out. Any thread, at any time
   (before gpuarr_init too): the first call fills the tables. */
static const gpuarr__backend *gpuarr__backend_get(gpuarr_backend b) {
    pthread_once(&gpuarr__g.backends_once, gpuarr__backends_fill);
    return gpuarr__g.backends[b].id != GPUARR_BACKEND_INVALID ? &gpuarr__g.backends[b] : NULL;
}

/* Whether backend b is compiled in and the builtin one (GPUARR__BACKEND_BUILTIN). */
static bool gpuarr__backend_builtin(gpuarr_backend b) {
    const gpuarr__backend *t = gpuarr__backend_get(b);
    return t && gpuarr__backend_has(t, GPUARR__BACKEND_BUILTIN);
}

GPUARR__STATIC_ASSERT(GPUARR_BACKEND_COUNT <= GPUARR_TASK_MAX_BACKENDS, "gpuarr_task_desc.impl has no room for every backend");
static const char *const gpuarr__backend_names[GPUARR_BACKEND_COUNT] = {
    "invalid",
#define GPUARR__BACKEND_NAME(NAME, str) str,
    GPUARR_BACKEND_LIST(GPUARR__BACKEND_NAME)
#undef GPUARR__BACKEND_NAME
};

/* ---- the optional procedures: each helper calls the backend's, or does what NULL means there
   (gpuarr__backend says what) ---- */
static gpuarr_result gpuarr__backend_load(const gpuarr__backend *b) { return b->load ? b->load() : GPUARR_OK; }
static void gpuarr__backend_unload(const gpuarr__backend *b) {
    if (b->unload) b->unload();
}
static gpuarr_result gpuarr__backend_device_open(gpuarr__dev *d) {
    return d->backend->device_open ? d->backend->device_open(d) : GPUARR_OK;
}
static void gpuarr__backend_device_close(gpuarr__dev *d) {
    if (d->backend->device_close) d->backend->device_close(d);
}
static gpuarr_result gpuarr__backend_device_reset(gpuarr__dev *d) {
    return d->backend->device_reset ? d->backend->device_reset(d) : GPUARR_OK;
}
static gpuarr_result gpuarr__backend_mem_view(gpuarr__dev *d, void *segment, size_t offset, size_t bytes, void **mem, size_t *mem_offset) {
    if (d->backend->mem_view) return d->backend->mem_view(d, segment, offset, bytes, mem, mem_offset);
    *mem = segment;
    *mem_offset = offset;
    return GPUARR_OK;
}
static void gpuarr__backend_mem_view_release(gpuarr__dev *d, void *mem) {
    if (d->backend->mem_view_release) d->backend->mem_view_release(d, mem);
}
static gpuarr_result gpuarr__backend_pinned_alloc(gpuarr__dev *d, size_t bytes, void **handle, void **host_ptr) {
    if (d->backend->pinned_alloc) return d->backend->pinned_alloc(d, bytes, handle, host_ptr);
    return gpuarr__fail(GPUARR_ERROR_UNSUPPORTED, "the %s has no pinned memory to stage through", d->backend->name);
}
static void gpuarr__backend_pinned_free(gpuarr__dev *d, void *handle) {
    if (d->backend->pinned_free) d->backend->pinned_free(d, handle);
}
static bool gpuarr__backend_host_ptr_pinned(gpuarr__dev *d, const void *p) {
    return d->backend->host_ptr_pinned && d->backend->host_ptr_pinned(d, p);
}
static bool gpuarr__backend_can_copy_peer(gpuarr__dev *dst, gpuarr__dev *src) {
    return dst->backend->can_copy_peer && dst->backend->can_copy_peer(dst, src);
}
static gpuarr_result gpuarr__backend_cast_supported(gpuarr__dev *d, gpuarr_dtype dst_t, gpuarr_dtype src_t) {
    return d->backend->cast_supported ? d->backend->cast_supported(d, dst_t, src_t) : GPUARR_OK;
}
static gpuarr_result gpuarr__backend_launch_host_fn(gpuarr__stream *s, gpuarr__host_fn fn, void *ctx) {
    if (s->dev->backend->launch_host_fn) return s->dev->backend->launch_host_fn(s, fn, ctx);
    fn(ctx);
    return GPUARR_OK;
}
static gpuarr_result gpuarr__backend_stream_create(gpuarr__dev *d, void **native) {
    if (d->backend->stream_create) return d->backend->stream_create(d, native);
    *native = d;
    return GPUARR_OK;
}
static void gpuarr__backend_stream_destroy(gpuarr__dev *d, void *native) {
    if (d->backend->stream_destroy) d->backend->stream_destroy(d, native);
}
static gpuarr_result gpuarr__backend_stream_sync(gpuarr__dev *d, void *native) {
    return d->backend->stream_sync ? d->backend->stream_sync(d, native) : GPUARR_OK;
}
static gpuarr_result gpuarr__backend_stream_query(gpuarr__dev *d, void *native, bool *done) {
    if (d->backend->stream_query) return d->backend->stream_query(d, native, done);
    *done = true;
    return GPUARR_OK;
}
static gpuarr_result gpuarr__backend_stream_wait_event(gpuarr__dev *d, void *stream, void *event) {
    return d->backend->stream_wait_event ? d->backend->stream_wait_event(d, stream, event) : GPUARR_OK;
}
static gpuarr_result gpuarr__backend_event_sync(gpuarr__dev *d, void *event) {
    return d->backend->event_sync ? d->backend->event_sync(d, event) : GPUARR_OK;
}
static gpuarr_result gpuarr__backend_event_query(gpuarr__dev *d, void *event, bool *done) {
    if (d->backend->event_query) return d->backend->event_query(d, event, done);
    *done = true;
    return GPUARR_OK;
}
static gpuarr_result gpuarr__backend_activate(gpuarr__dev *d, void **previous) {
    if (d->backend->activate) return d->backend->activate(d, previous);
    *previous = NULL;
    return GPUARR_OK;
}
static void gpuarr__backend_deactivate(gpuarr__dev *d, void *previous) {
    if (d->backend->deactivate) d->backend->deactivate(d, previous);
}
static void gpuarr__backend_telemetry(gpuarr__dev *d, gpuarr_telemetry *out) {
    if (d->backend->telemetry) d->backend->telemetry(d, out);
}

/* ---------------------------------------------------------------------------------------------
 * Devices. A device id is (init epoch << 16) | (registry index + 1), so an id from an earlier
 * gpuarr_init cycle is caught.
 * ------------------------------------------------------------------------------------------- */
static uint32_t gpuarr__epoch16(void) { return (gpuarr__g.epoch % 0xffffu) + 1u; }

static gpuarr_device gpuarr__device_handle(int index) {
    gpuarr_device d;
    d.id = (gpuarr__epoch16() << 16) | (uint32_t)(index + 1);
    return d;
}

static gpuarr__dev *gpuarr__host_dev(void) { return &gpuarr__g.devices[0]; }

/* Every row of the registry: the devices gpuarr_init found (0 .. device_count - 1), then the
   adopted ones (removed ones included: their rows stay). */
GPUARR__FOR_BACKENDS static int gpuarr__devices_total(void) {
    return gpuarr__g.device_count + __atomic_load_n(&gpuarr__g.adopted_count, __ATOMIC_ACQUIRE);
}

/* gpuarr's own view of d: d itself, or for an adopted device the one gpuarr found that it is.
   The layers' per-device tables have rows for found devices only: they go through this. */
GPUARR__FOR_BACKENDS static gpuarr__dev *gpuarr__dev_view(gpuarr__dev *d) { return &gpuarr__g.devices[d->view]; }

/* A live device handle, failed or not (gpuarr_device_get_info, gpuarr_device_reset). */
static gpuarr_result gpuarr__get_dev_any(gpuarr_device d, const char *arg, gpuarr__dev **out) {
    uint32_t index = (d.id & 0xffffu), epoch = d.id >> 16;
    if (d.id == 0) return gpuarr__fail(GPUARR_ERROR_INVALID_HANDLE, "%s is a zero device handle", arg);
    if (epoch != gpuarr__epoch16())
        return gpuarr__fail(GPUARR_ERROR_INVALID_HANDLE,
                            "%s (id 0x%08x) is not a device of this gpuarr_init (stale or forged)", arg, d.id);
    if (index == 0 || (int)index > gpuarr__devices_total())
        return gpuarr__fail(GPUARR_ERROR_INVALID_HANDLE, "%s (id 0x%08x): there is no device %u (%d devices)", arg,
                            d.id, index - 1u, gpuarr__devices_total());
    gpuarr__dev *dev = &gpuarr__g.devices[index - 1];
    if (__atomic_load_n(&dev->removed, __ATOMIC_ACQUIRE))
        return gpuarr__fail(GPUARR_ERROR_INVALID_HANDLE, "%s (%s) was removed by gpuarr_device_remove", arg, dev->info.spec);
    *out = dev;
    return GPUARR_OK;
}

/* A live device handle whose device has not failed. */
static gpuarr_result gpuarr__get_dev(gpuarr_device d, const char *arg, gpuarr__dev **out) {
    gpuarr__dev *dev;
    GPUARR__CHECK(gpuarr__get_dev_any(d, arg, &dev));
    GPUARR__CHECK(gpuarr__dev_alive(dev));
    *out = dev;
    return GPUARR_OK;
}

static gpuarr_result gpuarr__dev_open(gpuarr__dev *d) {
    if (__atomic_load_n(&d->opened, __ATOMIC_ACQUIRE)) return GPUARR_OK; /* open until shutdown: no lock */
    pthread_mutex_lock(&d->lock);
    gpuarr_result r = GPUARR_OK;
    if (!d->opened) {
        r = gpuarr__backend_device_open(d);
        __atomic_store_n(&d->opened, r == GPUARR_OK, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&d->lock);
    return r;
}

/* ---------------------------------------------------------------------------------------------
 * Streams and deferred work. Work that must wait for a stream's queued commands (freeing a
 * temporary, dropping an array the work reads) is queued behind an event and run when the
 * event completes: at the next defer, query or sync on that stream, or at its destruction.
 * ------------------------------------------------------------------------------------------- */
typedef void (*gpuarr__deferred_fn)(void *ctx);

static void gpuarr__deferred_run(gpuarr__stream *s, gpuarr__deferred *list) {
    while (list) {
        gpuarr__deferred *next = list->next;
        if (list->event) s->dev->backend->event_destroy(s->dev, list->event);
        list->fn(list->ctx);
        gpuarr__free(list);
        list = next;
    }
}

/* Runs the deferred entries whose work has completed, in order: those up to `done_through`
   (entries queued before a synchronization that has since returned), then those whose events
   report completion. Entries queued by other threads after the synchronization began are left
   to their events. They run outside the lock: they may release objects. */
static void gpuarr__stream_collect(gpuarr__stream *s, uint64_t done_through) {
    pthread_mutex_lock(&s->lock);
    gpuarr__deferred *ready = s->deferred_head, *last = NULL;
    for (gpuarr__deferred *e = s->deferred_head; e; e = e->next) {
        bool done = e->seq <= done_through;
        if (!done && gpuarr__backend_event_query(s->dev, e->event, &done) != GPUARR_OK) done = false;
        if (!done) break;
        last = e;
    }
    if (last) {
        s->deferred_head = last->next;
        if (!s->deferred_head) s->deferred_tail = NULL;
        last->next = NULL;
    } else {
        ready = NULL;
    }
    pthread_mutex_unlock(&s->lock);
    gpuarr__deferred_run(s, ready);
}

static uint64_t gpuarr__stream_seq(gpuarr__stream *s) {
    pthread_mutex_lock(&s->lock);
    uint64_t seq = s->deferred_seq;
    pthread_mutex_unlock(&s->lock);
    return seq;
}

static void gpuarr__pool_apply_threshold(gpuarr__pool *p);

static gpuarr_result gpuarr__stream_sync_raw(gpuarr__stream *s) {
    if (GPUARR__ATOMIC_LOAD(&s->destroyed)) return GPUARR_OK; /* waited for at its destroy */
    uint64_t seq = gpuarr__stream_seq(s);
    gpuarr_result r = gpuarr__backend_stream_sync(s->dev, s->native);
    if (r == GPUARR_OK) gpuarr__stream_collect(s, seq);
    if (r == GPUARR_OK && !gpuarr__backend_has(s->dev->backend, GPUARR__BACKEND_SYNCHRONOUS)) gpuarr__pool_apply_threshold(&s->dev->pool);
    return r;
}

/* The wait after a step of a call: r, the step's result, stands if it is a failure (then the
   wait's own failure, such as a lost context's, does not replace its message). */
static gpuarr_result gpuarr__stream_sync_keep(gpuarr__stream *s, gpuarr_result r) {
    if (r == GPUARR_OK) return gpuarr__stream_sync_raw(s);
    gpuarr__error_saved saved;
    gpuarr__error_save(&saved);
    (void)gpuarr__stream_sync_raw(s);
    gpuarr__error_restore(&saved);
    return r;
}

/* Runs fn(ctx) once the work queued on s so far has completed. Never fails: if the bookkeeping
   cannot be allocated, it waits for the stream instead. */
static void gpuarr__stream_defer(gpuarr__stream *s, gpuarr__deferred_fn fn, void *ctx) {
    const gpuarr__backend *b = s->dev->backend;
    if (gpuarr__backend_has(b, GPUARR__BACKEND_SYNCHRONOUS)) {
        fn(ctx);
        return;
    }
    gpuarr__deferred *e = (gpuarr__deferred *)gpuarr__calloc(sizeof *e);
    void *event = NULL;
    gpuarr__error_saved saved;
    gpuarr__error_save(&saved);
    if (!e || b->event_create(s->dev, false, &event) != GPUARR_OK || b->event_record(s->dev, event, s->native) != GPUARR_OK) {
        if (event) b->event_destroy(s->dev, event);
        gpuarr__free(e);
        gpuarr__backend_stream_sync(s->dev, s->native);
        gpuarr__error_restore(&saved); /* never fails: the caller's error, if any, stands */
        fn(ctx);
        return;
    }
    e->event = event;
    e->fn = fn;
    e->ctx = ctx;
    pthread_mutex_lock(&s->lock);
    e->seq = ++s->deferred_seq;
    if (s->deferred_tail) s->deferred_tail->next = e;
    else s->deferred_head = e;
    s->deferred_tail = e;
    pthread_mutex_unlock(&s->lock);
    gpuarr__stream_collect(s, 0);
}

static void gpuarr__stream_destroy_obj(gpuarr__obj *o) {
    gpuarr__stream *s = (gpuarr__stream *)o;
    gpuarr__error_saved saved; /* a destructor: it may run in the cleanup of a failed call */
    gpuarr__error_save(&saved);
    if (!GPUARR__ATOMIC_LOAD(&s->destroyed)) gpuarr__backend_stream_sync(s->dev, s->native);
    gpuarr__error_restore(&saved);
    gpuarr__stream_collect(s, UINT64_MAX); /* the last reference: nobody can add entries */
    gpuarr__backend_stream_destroy(s->dev, s->native);
    pthread_mutex_destroy(&s->lock);
    __atomic_sub_fetch(&s->dev->live_streams, 1u, __ATOMIC_ACQ_REL);
    gpuarr__free(s);
}

/* A stream object around a native stream, which it now owns (stream_destroy drops it). On
   failure the native stream is destroyed. */
static gpuarr_result gpuarr__stream_adopt(gpuarr__dev *d, void *native, gpuarr__stream **out) {
    gpuarr__stream *s = (gpuarr__stream *)gpuarr__calloc(sizeof *s);
    if (!s) {
        gpuarr__backend_stream_destroy(d, native);
        return gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY, "no host memory for a stream");
    }
    s->obj.refs = 1;
    s->obj.destroy = gpuarr__stream_destroy_obj;
    s->dev = d;
    s->serial = __atomic_add_fetch(&gpuarr__g.stream_serial, 1, __ATOMIC_RELAXED);
    s->native = native;
    pthread_mutex_init(&s->lock, NULL);
    __atomic_add_fetch(&d->live_streams, 1u, __ATOMIC_ACQ_REL);
    *out = s;
    return GPUARR_OK;
}

static gpuarr_result gpuarr__stream_new(gpuarr__dev *d, gpuarr__stream **out) {
    GPUARR__CHECK(gpuarr__dev_open(d));
    void *native;
    GPUARR__CHECK(gpuarr__backend_stream_create(d, &native));
    return gpuarr__stream_adopt(d, native, out);
}

/* A thread's default stream: on the caller's queue where an adopted device has one. */
static gpuarr_result gpuarr__stream_new_default(gpuarr__dev *d, gpuarr__stream **out) {
    if (!d->backend->stream_create_default) return gpuarr__stream_new(d, out);
    GPUARR__CHECK(gpuarr__dev_open(d));
    void *native;
    GPUARR__CHECK(d->backend->stream_create_default(d, &native));
    return gpuarr__stream_adopt(d, native, out);
}

/* Puts a new stream behind a handle (releasing it on failure). */
static gpuarr_result gpuarr__stream_publish(gpuarr__stream *s, gpuarr_stream *out) {
    uint32_t id;
    gpuarr_result r = gpuarr__table_insert(&gpuarr__g.streams, &s->obj, &id);
    if (r != GPUARR_OK) {
        gpuarr__obj_release(&s->obj);
        return r;
    }
    s->id = id;
    out->id = id;
    return GPUARR_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Per-thread default streams. Each thread that works on a device without naming a stream gets a
 * stream of its own there, so threads sharing a GPU do not serialize behind one queue (what CUDA
 * calls the per-thread default stream). The device keeps the list; a thread-specific-data
 * destructor syncs and drops the thread's streams when it exits, and teardown drops the rest.
 * ------------------------------------------------------------------------------------------- */

/* Unlinks the streams owned by `owner` (all of them when 0) from every device; returned as a list. */
static gpuarr__stream *gpuarr__detach_thread_streams(uint64_t owner) {
    gpuarr__stream *out = NULL;
    for (int i = 0; i < gpuarr__devices_total(); i++) {
        gpuarr__stream **link = &gpuarr__g.devices[i].thread_streams;
        while (*link) {
            gpuarr__stream *s = *link;
            if (owner && s->owner_thread != owner) {
                link = &s->next_default;
                continue;
            }
            *link = s->next_default;
            s->next_default = out;
            out = s;
        }
    }
    return out;
}

static void gpuarr__release_stream_list(gpuarr__stream *list) {
    while (list) {
        gpuarr__stream *next = list->next_default;
        gpuarr__obj_release(&list->obj); /* waits for the stream's work */
        list = next;
    }
}

static void gpuarr__thread_exit(void *unused) {
    (void)unused;
    memset(gpuarr__tls.defaults, 0, sizeof gpuarr__tls.defaults);
    /* Hold the library while the streams go: another thread may be running the last shutdown. */
    pthread_mutex_lock(&gpuarr__g.init_lock);
    bool alive = gpuarr__g.refs > 0;
    if (alive) gpuarr__g.refs++;
    pthread_mutex_unlock(&gpuarr__g.init_lock);
    if (!alive) return;
    gpuarr__tcache_thread_exit();
    pthread_mutex_lock(&gpuarr__g.defaults_lock);
    gpuarr__stream *mine = gpuarr__detach_thread_streams(gpuarr__tls.serial);
    pthread_mutex_unlock(&gpuarr__g.defaults_lock);
    gpuarr__release_stream_list(mine);
    gpuarr_shutdown();
}

/* The key lives from init to the last shutdown only: a key left behind would run its destructor,
   code of a library that may be unloaded by then (dlclose), when any thread that used it exits.
   Both run under gpuarr__g.init_lock; a thread exiting meanwhile takes that lock too, and a deleted
   key's destructor is never called. */
static void gpuarr__thread_key_make(void) {
    gpuarr__g.thread_key_ok = pthread_key_create(&gpuarr__g.thread_key, gpuarr__thread_exit) == 0;
}

static void gpuarr__thread_key_delete(void) {
    if (gpuarr__g.thread_key_ok) pthread_key_delete(gpuarr__g.thread_key);
    gpuarr__g.thread_key_ok = false;
}

/* The thread's default stream on d, made at first use; returned with a reference. */
static gpuarr_result gpuarr__default_stream(gpuarr__dev *d, gpuarr__stream **out) {
    GPUARR__CHECK(gpuarr__dev_alive(d));
    size_t slot = (size_t)(d - gpuarr__g.devices) & 7u;
    if (gpuarr__tls.defaults[slot].dev == d && gpuarr__tls.defaults[slot].epoch == gpuarr__g.epoch &&
        gpuarr__tls.defaults[slot].resets == __atomic_load_n(&d->resets, __ATOMIC_ACQUIRE)) {
        gpuarr__obj_retain(&gpuarr__tls.defaults[slot].stream->obj);
        *out = gpuarr__tls.defaults[slot].stream;
        return GPUARR_OK;
    }
    if (!gpuarr__tls.serial) gpuarr__tls.serial = __atomic_add_fetch(&gpuarr__g.thread_serials, 1, __ATOMIC_RELAXED);
    if (gpuarr__tls.key_epoch != gpuarr__g.epoch) { /* each init cycle has a key of its own */
        /* Without the key the thread's streams live until gpuarr_shutdown instead. */
        if (gpuarr__g.thread_key_ok) pthread_setspecific(gpuarr__g.thread_key, &gpuarr__g);
        gpuarr__tls.key_epoch = gpuarr__g.epoch;
    }
    pthread_mutex_lock(&gpuarr__g.defaults_lock);
    gpuarr__stream *s = d->thread_streams;
    while (s && s->owner_thread != gpuarr__tls.serial) s = s->next_default;
    pthread_mutex_unlock(&gpuarr__g.defaults_lock);
    if (!s) { /* only this thread adds its own, so nobody can race us to it */
        GPUARR__CHECK(gpuarr__stream_new_default(d, &s));
        s->owner_thread = gpuarr__tls.serial;
        pthread_mutex_lock(&gpuarr__g.defaults_lock);
        s->next_default = d->thread_streams;
        d->thread_streams = s;
        pthread_mutex_unlock(&gpuarr__g.defaults_lock);
    }
    gpuarr__tls.defaults[slot].dev = d;
    gpuarr__tls.defaults[slot].epoch = gpuarr__g.epoch;
    gpuarr__tls.defaults[slot].resets = __atomic_load_n(&d->resets, __ATOMIC_ACQUIRE);
    gpuarr__tls.defaults[slot].stream = s;
    gpuarr__obj_retain(&s->obj);
    *out = s;
    return GPUARR_OK;
}

/* Every thread's default stream on d, each with a reference, in a new array (NULL when none). */
static gpuarr_result gpuarr__thread_streams_of(gpuarr__dev *d, gpuarr__stream ***out, size_t *count) {
    *out = NULL;
    *count = 0;
    pthread_mutex_lock(&gpuarr__g.defaults_lock);
    size_t n = 0;
    for (gpuarr__stream *s = d->thread_streams; s; s = s->next_default) n++;
    gpuarr__stream **list = n ? (gpuarr__stream **)gpuarr__calloc(n * sizeof *list) : NULL;
    if (n && !list) {
        pthread_mutex_unlock(&gpuarr__g.defaults_lock);
        return gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY, "no host memory to list %zu streams", n);
    }
    n = 0;
    for (gpuarr__stream *s = d->thread_streams; s; s = s->next_default) {
        gpuarr__obj_retain(&s->obj);
        list[n++] = s;
    }
    pthread_mutex_unlock(&gpuarr__g.defaults_lock);
    *out = list;
    *count = n;
    return GPUARR_OK;
}

/* Syncs (or, with sync false, collects the finished work of) every thread's default stream on d. */
static gpuarr_result gpuarr__visit_thread_streams(gpuarr__dev *d, bool sync) {
    gpuarr__stream **list;
    size_t n;
    GPUARR__CHECK(gpuarr__thread_streams_of(d, &list, &n));
    gpuarr_result r = GPUARR_OK;
    for (size_t i = 0; i < n; i++) {
        if (sync) {
            gpuarr_result sr = gpuarr__stream_sync_raw(list[i]);
            if (r == GPUARR_OK) r = sr;
        } else {
            gpuarr__stream_collect(list[i], 0);
        }
        gpuarr__obj_release(&list[i]->obj);
    }
    gpuarr__free(list);
    return r;
}

/* With a reference; GPUARR_ERROR_DEVICE_LOST (and none) when its device has failed. */
static gpuarr_result gpuarr__get_stream(gpuarr_stream s, const char *arg, gpuarr__stream **out) {
    gpuarr__obj *o;
    GPUARR__CHECK(gpuarr__table_get(&gpuarr__g.streams, s.id, arg, &o));
    gpuarr_result r = gpuarr__dev_alive(((gpuarr__stream *)o)->dev);
    if (r != GPUARR_OK) {
        gpuarr__obj_release(o);
        return r;
    }
    *out = (gpuarr__stream *)o;
    return GPUARR_OK;
}

/* Runs the finished deferred work (frees, releases) of every stream of d, without waiting:
   called when the caller has just waited for something on d. */
static void gpuarr__collect_device(gpuarr__dev *d) {
    (void)gpuarr__visit_thread_streams(d, false); /* short of memory: collected later */
    gpuarr__table *t = &gpuarr__g.streams;
    for (uint32_t i = 0;; i++) {
        gpuarr__handles_lock();
        if (i >= t->used) {
            gpuarr__handles_unlock();
            break;
        }
        gpuarr__stream *s = (gpuarr__stream *)gpuarr__table_at(t, i)->obj;
        if (s && s->dev == d) gpuarr__obj_retain(&s->obj);
        else s = NULL;
        gpuarr__handles_unlock();
        if (!s) continue;
        gpuarr__stream_collect(s, 0);
        gpuarr__obj_release(&s->obj);
    }
}

/* Inside a GPUARR_SCOPED_* block whose scope failed the thread has no current device or stream:
   falling back to the one the scope was to replace would run the block where it did not ask. */
static gpuarr_result gpuarr__check_scope(void) {
    if (!gpuarr__tls.scope_failure) return GPUARR_OK;
    return gpuarr__fail(gpuarr__tls.scope_failure, "no current device or stream: the enclosing scoped device or stream did not start (%s)",
                        gpuarr__tls.scope_why);
}

/* The thread's current stream with a reference, or NULL. One destroyed since it was made current
   counts as none (and is forgotten), so it cannot break later calls on this thread. */
static gpuarr__stream *gpuarr__current_stream_obj(void) {
    if (!gpuarr__tls.stream_id) return NULL;
    gpuarr__obj *o = gpuarr__table_lookup(&gpuarr__g.streams, gpuarr__tls.stream_id);
    if (!o) gpuarr__tls.stream_id = 0; /* destroyed: not this call's error */
    return (gpuarr__stream *)o;
}

/* Where work on device d goes: an explicit stream on d, else the thread's current stream when
   it is on d, else d's default stream. Returned with a reference. */
static gpuarr_result gpuarr__stream_for(gpuarr__dev *d, gpuarr__stream *explicit_stream, gpuarr__stream **out) {
    if (explicit_stream && explicit_stream->dev == d) {
        gpuarr__obj_retain(&explicit_stream->obj);
        *out = explicit_stream;
        return GPUARR_OK;
    }
    GPUARR__CHECK(gpuarr__check_scope());
    gpuarr__stream *cur = gpuarr__current_stream_obj();
    if (cur && cur->dev == d) {
        *out = cur;
        return GPUARR_OK;
    }
    if (cur) gpuarr__obj_release(&cur->obj);
    return gpuarr__default_stream(d, out);
}

/* ---------------------------------------------------------------------------------------------
 * Events
 * ------------------------------------------------------------------------------------------- */
static void gpuarr__event_destroy_obj(gpuarr__obj *o) {
    gpuarr__event *e = (gpuarr__event *)o;
    e->dev->backend->event_destroy(e->dev, e->native);
    __atomic_sub_fetch(&e->dev->live_events, 1u, __ATOMIC_ACQ_REL);
    gpuarr__free(e);
}

static gpuarr_result gpuarr__event_new(gpuarr__dev *d, bool timing, gpuarr__event **out) {
    GPUARR__CHECK(gpuarr__dev_open(d));
    gpuarr__event *e = (gpuarr__event *)gpuarr__calloc(sizeof *e);
    if (!e) return gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY, "no host memory for an event");
    gpuarr_result r = d->backend->event_create(d, timing, &e->native);
    if (r != GPUARR_OK) {
        gpuarr__free(e);
        return r;
    }
    e->obj.refs = 1;
    e->obj.destroy = gpuarr__event_destroy_obj;
    e->dev = d;
    e->timing = timing;
    __atomic_add_fetch(&d->live_events, 1u, __ATOMIC_ACQ_REL);
    *out = e;
    return GPUARR_OK;
}

/* On a destroyed stream nothing is recorded: all its work was waited for, and an unrecorded event
   orders nothing (gpuarr__stream_wait_raw) */
static gpuarr_result gpuarr__event_record_raw(gpuarr__event *e, gpuarr__stream *s) {
    if (GPUARR__ATOMIC_LOAD(&s->destroyed)) return GPUARR_OK;
    GPUARR__CHECK(e->dev->backend->event_record(e->dev, e->native, s->native));
    GPUARR__ATOMIC_STORE(&e->stream_serial, s->serial);
    GPUARR__ATOMIC_STORE(&e->recorded, 1u);
    return GPUARR_OK;
}

/* gpuarr__event_record_raw right after gpuarr's own work on s (see event_record_after_own). */
static gpuarr_result gpuarr__event_record_own(gpuarr__event *e, gpuarr__stream *s) {
    if (!e->dev->backend->event_record_after_own || GPUARR__ATOMIC_LOAD(&s->destroyed)) return gpuarr__event_record_raw(e, s);
    GPUARR__CHECK(e->dev->backend->event_record_after_own(e->dev, e->native, s->native));
    GPUARR__ATOMIC_STORE(&e->stream_serial, s->serial);
    GPUARR__ATOMIC_STORE(&e->recorded, 1u);
    return GPUARR_OK;
}

/* A host function that waits for an event of another backend (so it may call that backend). */
static void gpuarr__event_wait_job(void *ctx) {
    gpuarr__event *e = (gpuarr__event *)ctx;
    gpuarr__backend_event_sync(e->dev, e->native);
    gpuarr__obj_release(&e->obj);
    gpuarr__host_fn_done();
}

/* Orders later work on s after e without the caller waiting: on the device when both share a
   backend, else by a host function on s that waits for e. */
static gpuarr_result gpuarr__stream_wait_raw(gpuarr__stream *s, gpuarr__event *e) {
    if (!GPUARR__ATOMIC_LOAD(&e->recorded) || gpuarr__backend_has(e->dev->backend, GPUARR__BACKEND_SYNCHRONOUS)) return GPUARR_OK;
    if (GPUARR__ATOMIC_LOAD(&e->stream_serial) == s->serial) return GPUARR_OK; /* recorded on s: s runs after it already */
    GPUARR__TRACE_SCOPE(gpuarr__trace_wait, s, NULL, e);
    if (e->dev->backend == s->dev->backend) return gpuarr__backend_stream_wait_event(s->dev, s->native, e->native);
    gpuarr__obj_retain(&e->obj);
    gpuarr_result r = gpuarr__backend_launch_host_fn(s, gpuarr__event_wait_job, e);
    if (r != GPUARR_OK) gpuarr__obj_release(&e->obj);
    return r;
}

/* Orders later work on `later` after everything queued on `earlier` so far. */
static gpuarr_result gpuarr__stream_order(gpuarr__stream *later, gpuarr__stream *earlier) {
    if (later == earlier || gpuarr__backend_has(earlier->dev->backend, GPUARR__BACKEND_SYNCHRONOUS) || GPUARR__ATOMIC_LOAD(&earlier->destroyed)) return GPUARR_OK;
    GPUARR__TRACE_SCOPE(gpuarr__trace_wait, later, earlier, NULL);
    gpuarr__event *e;
    GPUARR__CHECK(gpuarr__event_new(earlier->dev, false, &e));
    gpuarr_result r = gpuarr__event_record_raw(e, earlier);
    if (r == GPUARR_OK) r = gpuarr__stream_wait_raw(later, e);
    gpuarr__obj_release(&e->obj);
    return r;
}

/* ---------------------------------------------------------------------------------------------
 * Memory pools. Each device caches what its arrays free: blocks carved from segments (requests
 * up to 1 MiB share 2 MiB segments, larger ones get segments rounded up to 2 MiB), found by a
 * TLSF index in O(1), split on allocation and merged with free neighbours when freed. A block is
 * freed in stream order: it records an event on each stream its memory was used on; the stream
 * that freed it reuses it at once, another stream first makes the device wait on those events.
 * Running out of device memory walks a ladder before failing (gpuarr__pool_grow).
 * ------------------------------------------------------------------------------------------- */
#define GPUARR__POOL_SMALL_MAX ((size_t)1 << 20)
#define GPUARR__POOL_SMALL_SEGMENT ((size_t)2 << 20)
#define GPUARR__POOL_LARGE_ROUND ((size_t)2 << 20)
#define GPUARR__POOL_MIN_SPLIT_LARGE ((size_t)1 << 20)
#define GPUARR__POOL_PROBE 8 /* free blocks looked at for one that needs no cross-stream wait */

static void gpuarr__pool_free(gpuarr__pool *p, gpuarr__block *b, gpuarr__stream *const *uses, uint32_t nuses);

static size_t gpuarr__round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

static void gpuarr__tlsf_mapping(size_t size, uint32_t *fl, uint32_t *sl) {
    uint32_t f = 63u - (uint32_t)__builtin_clzll((unsigned long long)size);
    *fl = f;
    *sl = (uint32_t)(size >> (f - GPUARR__TLSF_SL_BITS)) & (GPUARR__TLSF_SL - 1u);
}

static void gpuarr__tlsf_insert(gpuarr__tlsf *t, gpuarr__block *b) {
    uint32_t fl, sl;
    gpuarr__tlsf_mapping(b->size, &fl, &sl);
    b->free_prev = NULL;
    b->free_next = t->heads[fl][sl];
    if (b->free_next) b->free_next->free_prev = b;
    t->heads[fl][sl] = b;
    t->sl_map[fl] |= 1u << sl;
    t->fl_map |= (uint64_t)1 << fl;
}

static void gpuarr__tlsf_remove(gpuarr__tlsf *t, gpuarr__block *b) {
    uint32_t fl, sl;
    gpuarr__tlsf_mapping(b->size, &fl, &sl);
    if (b->free_prev) b->free_prev->free_next = b->free_next;
    else t->heads[fl][sl] = b->free_next;
    if (b->free_next) b->free_next->free_prev = b->free_prev;
    if (!t->heads[fl][sl]) {
        t->sl_map[fl] &= ~(1u << sl);
        if (!t->sl_map[fl]) t->fl_map &= ~((uint64_t)1 << fl);
    }
    b->free_prev = b->free_next = NULL;
}

/* A free block of at least size: from the smallest class whose every block fits, preferring,
   among its first few, one that stream `serial` can use without waiting. NULL if none. */
static gpuarr__block *gpuarr__tlsf_find(gpuarr__tlsf *t, size_t size, uint64_t serial) {
    uint32_t fl, sl;
    gpuarr__tlsf_mapping(size, &fl, &sl);
    size_t up = size + ((size_t)1 << (fl - GPUARR__TLSF_SL_BITS)) - 1;
    gpuarr__tlsf_mapping(up, &fl, &sl);
    if (fl >= GPUARR__TLSF_FL) return NULL;
    uint32_t sl_bits = t->sl_map[fl] & (~0u << sl);
    if (!sl_bits) {
        uint64_t fl_bits = fl + 1 < 64 ? t->fl_map & (~(uint64_t)0 << (fl + 1)) : 0;
        if (!fl_bits) return NULL;
        fl = (uint32_t)__builtin_ctzll(fl_bits);
        sl_bits = t->sl_map[fl];
    }
    sl = (uint32_t)__builtin_ctz(sl_bits);
    gpuarr__block *first = t->heads[fl][sl], *b = first;
    for (int i = 0; b && i < GPUARR__POOL_PROBE; i++, b = b->free_next)
        if (b->nevents == 0 || (serial != 0 && b->owner == serial)) return b;
    return first;
}

static gpuarr__tlsf *gpuarr__pool_index(gpuarr__pool *p, bool small) { return small ? &p->free_small : &p->free_large; }

static void gpuarr__stat_add(uint64_t *cur, uint64_t *peak, uint64_t *total, uint64_t n) {
    *cur += n;
    if (*cur > *peak) *peak = *cur;
    if (total) *total += n;
}

static void gpuarr__block_drop_events(gpuarr__block *b) {
    for (uint32_t i = 0; i < b->nevents; i++) gpuarr__obj_release(&b->events[i].event->obj);
    b->nevents = 0;
}

/* Adds an event to b, one per stream: of two on one stream the later one is kept (it covers the
   earlier). False when b has no room for another stream. */
static bool gpuarr__block_add_event(gpuarr__block *b, gpuarr__block_event ev) {
    for (uint32_t i = 0; i < b->nevents; i++) {
        if (b->events[i].stream_serial != ev.stream_serial) continue;
        gpuarr__block_event drop = b->events[i].seq < ev.seq ? b->events[i] : ev;
        if (b->events[i].seq < ev.seq) b->events[i] = ev;
        gpuarr__obj_release(&drop.event->obj);
        return true;
    }
    if (b->nevents == GPUARR__POOL_EVENTS) return false;
    b->events[b->nevents++] = ev;
    return true;
}

/* Two free neighbours merge when the union of their events fits and, if both carry events, the
   same stream freed them (so the merged block still has one owner). */
static bool gpuarr__blocks_mergeable(const gpuarr__block *a, const gpuarr__block *b) {
    if (a->nevents && b->nevents && a->owner != b->owner) return false;
    uint32_t n = a->nevents;
    for (uint32_t i = 0; i < b->nevents; i++) {
        bool same_stream = false;
        for (uint32_t k = 0; k < a->nevents; k++) same_stream = same_stream || a->events[k].stream_serial == b->events[i].stream_serial;
        n += !same_stream;
    }
    return n <= GPUARR__POOL_EVENTS;
}

/* Folds free block `right` (the next by address) into `left`; both out of the index. */
static void gpuarr__blocks_merge(gpuarr__block *left, gpuarr__block *right) {
    if (right->nevents) left->owner = right->owner;
    for (uint32_t i = 0; i < right->nevents; i++) gpuarr__block_add_event(left, right->events[i]);
    right->nevents = 0;
    left->size += right->size;
    left->next = right->next;
    if (right->next) right->next->prev = left;
    gpuarr__free(right);
}

static uint64_t gpuarr__pool_cached(const gpuarr__pool *p) { return p->stats.reserved_bytes - p->stats.allocated_bytes; }

/* ---- segments ---- */

/* A raw allocation from the backend, within the pool's limit and the injected faults. Called
   without the pool lock. */
static gpuarr_result gpuarr__pool_raw_alloc(gpuarr__pool *p, size_t bytes, void **mem, void **host_base) {
    gpuarr__dev *d = p->dev;
    pthread_mutex_lock(&p->lock);
    bool over_limit = p->stats.limit_bytes && p->stats.reserved_bytes + bytes > p->stats.limit_bytes;
    bool fault = (p->fault_above && bytes > p->fault_above) || (p->fault_countdown && --p->fault_countdown == 0);
    uint64_t reserved = p->stats.reserved_bytes, limit = p->stats.limit_bytes;
    pthread_mutex_unlock(&p->lock);
    if (fault) return gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY, "%s: injected allocation failure (%zu bytes)", d->info.spec, bytes);
    if (over_limit)
        return gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY, "%s: %zu bytes more would pass the pool limit (%llu of %llu reserved)",
                            d->info.spec, bytes, (unsigned long long)reserved, (unsigned long long)limit);
    return p->pinned ? gpuarr__backend_pinned_alloc(d, bytes, mem, host_base) : d->backend->mem_alloc(d, bytes, mem);
}

/* Links a new segment with one free block covering it (pool lock held). */
static gpuarr__block *gpuarr__segment_add(gpuarr__pool *p, void *mem, void *host_base, size_t size, bool small, gpuarr__block *b,
                                          gpuarr__segment *seg) {
    memset(seg, 0, sizeof *seg);
    memset(b, 0, sizeof *b);
    seg->mem = mem;
    seg->host_base = host_base;
    seg->size = size;
    seg->small = small;
    seg->first = b;
    seg->next = p->segments;
    if (p->segments) p->segments->prev = seg;
    p->segments = seg;
    b->seg = seg;
    b->size = size;
    gpuarr__stat_add(&p->stats.reserved_bytes, &p->stats.peak_reserved_bytes, &p->stats.total_reserved_bytes, size);
    gpuarr__stat_add(&p->stats.segments, &p->stats.peak_segments, &p->stats.total_segments, 1);
    p->stats.backend_allocs++;
    return b;
}

static bool gpuarr__segment_free(const gpuarr__segment *seg) {
    for (const gpuarr__block *b = seg->first; b; b = b->next)
        if (b->allocated) return false;
    return true;
}

/* Unlinks a segment whose blocks are all free (and in the index) and returns it to the backend
   after the work its memory was last used by. Called with the pool lock held; gives it up
   around the waits. */
static void gpuarr__segment_release(gpuarr__pool *p, gpuarr__segment *seg) {
    gpuarr__dev *d = p->dev;
    for (gpuarr__block *b = seg->first; b; b = b->next) gpuarr__tlsf_remove(gpuarr__pool_index(p, seg->small), b);
    if (seg->prev) seg->prev->next = seg->next;
    else p->segments = seg->next;
    if (seg->next) seg->next->prev = seg->prev;
    p->stats.reserved_bytes -= seg->size;
    p->stats.segments--;
    p->stats.backend_frees++;
    pthread_mutex_unlock(&p->lock);
    for (gpuarr__block *b = seg->first, *next; b; b = next) {
        next = b->next;
        for (uint32_t i = 0; i < b->nevents; i++) {
            gpuarr__event *e = b->events[i].event;
            gpuarr__backend_event_sync(e->dev, e->native);
        }
        gpuarr__block_drop_events(b);
        gpuarr__free(b);
    }
    if (p->pinned) gpuarr__backend_pinned_free(d, seg->mem);
    else d->backend->mem_free(d, seg->mem);
    gpuarr__free(seg);
    pthread_mutex_lock(&p->lock);
}

/* A free block into the index, merged with free neighbours there (pool lock held); a segment
   of a non-caching pool goes back once all of it is free. */
static void gpuarr__pool_index_free(gpuarr__pool *p, gpuarr__block *b) {
    gpuarr__tlsf *index = gpuarr__pool_index(p, b->seg->small);
    if (b->prev && !b->prev->allocated && !b->prev->quick && gpuarr__blocks_mergeable(b->prev, b)) {
        gpuarr__block *left = b->prev;
        gpuarr__tlsf_remove(index, left);
        gpuarr__blocks_merge(left, b);
        b = left;
    }
    if (b->next && !b->next->allocated && !b->next->quick && gpuarr__blocks_mergeable(b, b->next)) {
        gpuarr__tlsf_remove(index, b->next);
        gpuarr__blocks_merge(b, b->next);
    }
    gpuarr__tlsf_insert(index, b);
    if (!p->caching && gpuarr__segment_free(b->seg)) gpuarr__segment_release(p, b->seg);
}

/* ---- thread caches (gpuarr__tcache) ---- */

/* A cached array's block back to the pool as a free block (pool lock held); the record goes. */
static void gpuarr__tcache_return(gpuarr__pool *p, gpuarr__array *a) {
    gpuarr__block *b = a->block;
    if (b->view && !p->pinned) gpuarr__backend_mem_view_release(p->dev, b->view);
    b->view = NULL;
    p->stats.allocated_bytes -= b->size;
    p->stats.requested_bytes -= b->requested;
    p->stats.allocations--;
    b->allocated = false;
    b->requested = 0;
    b->owner = 0;
    gpuarr__pool_index_free(p, b);
    gpuarr__free(a);
}

/* Every block in tc's slots back to the pool (pool lock held; from any thread). */
static void gpuarr__tcache_drain(gpuarr__pool *p, gpuarr__tcache *tc) {
    for (int i = 0; i < GPUARR__TCACHE_SLOTS; i++) {
        gpuarr__array *a = __atomic_exchange_n(&tc->slot[i], NULL, __ATOMIC_ACQUIRE);
        if (a) gpuarr__tcache_return(p, a);
    }
}

/* Adds what tc served to st (its hits are the pool's hits and allocations). */
static void gpuarr__tcache_count(gpuarr_pool_stats *st, gpuarr__tcache *tc) {
    uint64_t hits = __atomic_load_n(&tc->hits, __ATOMIC_RELAXED);
    st->cache_hits += hits;
    st->total_allocations += hits;
    st->total_allocated_bytes += __atomic_load_n(&tc->hit_bytes, __ATOMIC_RELAXED);
    st->total_requested_bytes += __atomic_load_n(&tc->hit_requested, __ATOMIC_RELAXED);
    st->requested_bytes += __atomic_load_n(&tc->requested_adjust, __ATOMIC_RELAXED);
}

/* p's stats as the caller sees them (pool lock held): blocks in thread caches are free. Peaks
   are the pool's own: they move only when the pool lock is taken. */
static gpuarr_pool_stats gpuarr__pool_stats_now(gpuarr__pool *p) {
    gpuarr_pool_stats st = p->stats;
    for (gpuarr__tcache *tc = p->tcaches; tc; tc = tc->next) {
        gpuarr__tcache_count(&st, tc);
        for (int i = 0; i < GPUARR__TCACHE_SLOTS; i++) {
            if (!__atomic_load_n(&tc->slot[i], __ATOMIC_ACQUIRE)) continue;
            st.allocated_bytes -= __atomic_load_n(&tc->size[i], __ATOMIC_RELAXED);
            st.requested_bytes -= __atomic_load_n(&tc->requested[i], __ATOMIC_RELAXED);
            st.allocations--;
        }
    }
    return st;
}

/* Takes tc out of p (pool lock held), its blocks and counts into the pool. The caller frees it. */
static void gpuarr__tcache_unlink(gpuarr__pool *p, gpuarr__tcache *tc) {
    gpuarr__tcache_drain(p, tc);
    gpuarr__tcache_count(&p->stats, tc);
    if (tc->prev) tc->prev->next = tc->next;
    else p->tcaches = tc->next;
    if (tc->next) tc->next->prev = tc->prev;
}

/* This thread's cache for p (a device's array pool), or NULL. */
static gpuarr__tcache *gpuarr__tcache_mine(gpuarr__pool *p) {
    size_t k = (size_t)(p->dev - gpuarr__g.devices) & 7u;
    if (gpuarr__tls.tcaches[k].pool != p || gpuarr__tls.tcaches[k].epoch != gpuarr__g.epoch) return NULL;
    return gpuarr__tls.tcaches[k].tc;
}

/* Gives back this thread's cache at index k of its table (its exit, or another device taking
   the index). One of an earlier init cycle went with that cycle's pools. */
static void gpuarr__tcache_drop(size_t k) {
    gpuarr__pool *p = gpuarr__tls.tcaches[k].pool;
    gpuarr__tcache *tc = gpuarr__tls.tcaches[k].tc;
    bool current = tc && gpuarr__tls.tcaches[k].epoch == gpuarr__g.epoch;
    gpuarr__tls.tcaches[k].pool = NULL;
    gpuarr__tls.tcaches[k].tc = NULL;
    if (!current) return;
    pthread_mutex_lock(&p->lock);
    gpuarr__tcache_unlink(p, tc);
    pthread_mutex_unlock(&p->lock);
    gpuarr__free(tc);
}

/* A new cache for p on this thread, or NULL: only a thread whose exit is hooked (the thread key
   is set, with its default stream) gets one, so that no cache outlives its thread. */
static gpuarr__tcache *gpuarr__tcache_make(gpuarr__pool *p) {
    if (!gpuarr__g.thread_key_ok || gpuarr__tls.key_epoch != gpuarr__g.epoch) return NULL;
    size_t k = (size_t)(p->dev - gpuarr__g.devices) & 7u;
    gpuarr__tcache_drop(k);
    gpuarr__tcache *tc = (gpuarr__tcache *)gpuarr__calloc(sizeof *tc);
    if (!tc) return NULL;
    pthread_mutex_lock(&p->lock);
    tc->next = p->tcaches;
    if (p->tcaches) p->tcaches->prev = tc;
    p->tcaches = tc;
    pthread_mutex_unlock(&p->lock);
    gpuarr__tls.tcaches[k].epoch = gpuarr__g.epoch;
    gpuarr__tls.tcaches[k].pool = p;
    gpuarr__tls.tcaches[k].tc = tc;
    return tc;
}

/* At a thread's exit: its caches back to their pools. */
static void gpuarr__tcache_thread_exit(void) {
    for (size_t k = 0; k < 8; k++) gpuarr__tcache_drop(k);
}

/* Keeps a freed array whole in this thread's cache for its pool, if it qualifies: its device's
   own pool, a small block, no stream to wait for (no uses, no events). False: free it as usual. */
static bool gpuarr__tcache_put(gpuarr__array *a) {
    gpuarr__pool *p = a->pool;
    gpuarr__block *b = a->block;
    if (p != &p->dev->pool || !p->caching || a->nuses || b->nevents || b->size > GPUARR__POOL_QUICK_MAX) return false;
    GPUARR__TRACE_SCOPE(gpuarr__trace_free, p->dev, false, b->requested, "thread");
    gpuarr__tcache *tc = gpuarr__tcache_mine(p);
    if (!tc && !(tc = gpuarr__tcache_make(p))) return GPUARR__TRACE_DROP();
    for (int i = 0; i < GPUARR__TCACHE_SLOTS; i++) {
        if (__atomic_load_n(&tc->slot[i], __ATOMIC_RELAXED)) continue; /* only this thread fills one */
        if (a->ready) gpuarr__obj_release(&a->ready->obj);
        a->ready = NULL;
        __atomic_store_n(&tc->size[i], (uint64_t)b->size, __ATOMIC_RELAXED);
        __atomic_store_n(&tc->requested[i], (uint64_t)b->requested, __ATOMIC_RELAXED);
        __atomic_store_n(&tc->slot[i], a, __ATOMIC_RELEASE);
        return true;
    }
    return GPUARR__TRACE_DROP();
}

/* A cached array record of this thread whose block is exactly the size bytes round up to, with
   its block (and view) ready for reuse, counted; or NULL. */
static gpuarr__array *gpuarr__tcache_take(gpuarr__pool *p, size_t bytes) {
    gpuarr__tcache *tc = gpuarr__tcache_mine(p);
    if (!tc) return NULL;
    uint64_t size = (uint64_t)gpuarr__round_up(bytes, p->align);
    for (int i = 0; i < GPUARR__TCACHE_SLOTS; i++) {
        if (__atomic_load_n(&tc->size[i], __ATOMIC_RELAXED) != size || !__atomic_load_n(&tc->slot[i], __ATOMIC_RELAXED)) continue;
        gpuarr__array *a = __atomic_exchange_n(&tc->slot[i], NULL, __ATOMIC_ACQUIRE);
        if (!a) continue; /* another thread returned it to the pool meanwhile */
        gpuarr__block *b = a->block;
        __atomic_store_n(&tc->requested_adjust, tc->requested_adjust + bytes - b->requested, __ATOMIC_RELAXED);
        b->requested = bytes;
        __atomic_store_n(&tc->hits, tc->hits + 1, __ATOMIC_RELAXED);
        __atomic_store_n(&tc->hit_bytes, tc->hit_bytes + size, __ATOMIC_RELAXED);
        __atomic_store_n(&tc->hit_requested, tc->hit_requested + bytes, __ATOMIC_RELAXED);
        return a;
    }
    return NULL;
}

/* The quick blocks (and every thread's cached ones) into the index (pool lock held): before
   anything walks the free blocks or gives segments back, and when the index alone cannot serve
   a request. */
static void gpuarr__pool_quick_flush(gpuarr__pool *p) {
    for (gpuarr__tcache *tc = p->tcaches; tc; tc = tc->next) gpuarr__tcache_drain(p, tc);
    while (p->nquick) {
        gpuarr__block *b = p->quick[--p->nquick];
        b->quick = false;
        gpuarr__pool_index_free(p, b);
    }
}

/* A quick block of exactly size, taken as gpuarr__block_take would (pool lock held), or NULL. */
static gpuarr__block *gpuarr__pool_quick_take(gpuarr__pool *p, size_t size, size_t requested) {
    for (uint32_t i = p->nquick; i-- > 0;) {
        gpuarr__block *b = p->quick[i];
        if (b->size != size) continue;
        p->quick[i] = p->quick[--p->nquick];
        b->quick = false;
        b->allocated = true;
        b->requested = requested;
        gpuarr__stat_add(&p->stats.allocated_bytes, &p->stats.peak_allocated_bytes, &p->stats.total_allocated_bytes, b->size);
        gpuarr__stat_add(&p->stats.requested_bytes, &p->stats.peak_requested_bytes, &p->stats.total_requested_bytes, requested);
        gpuarr__stat_add(&p->stats.allocations, &p->stats.peak_allocations, &p->stats.total_allocations, 1);
        return b;
    }
    return NULL;
}

/* Gives back cached segments (all of whose blocks are free): all of them, or those at least
   min_size bytes, stopping once the cache is down to keep_cached. Pool lock held. Returns how
   many. */
static uint64_t gpuarr__pool_release_cached(gpuarr__pool *p, size_t min_size, uint64_t keep_cached) {
    uint64_t released = 0;
    for (bool again = true; again;) {
        again = false;
        gpuarr__pool_quick_flush(p); /* each pass: frees went on while a release dropped the lock */
        for (gpuarr__segment *seg = p->segments; seg; seg = seg->next) {
            if (seg->size < min_size || gpuarr__pool_cached(p) <= keep_cached || !gpuarr__segment_free(seg)) continue;
            gpuarr__segment_release(p, seg); /* drops the lock: start over */
            released++;
            again = true;
            break;
        }
    }
    return released;
}

/* ---- allocation ---- */

#define GPUARR__POOL_OVERSIZE_WASTE ((size_t)20 << 20) /* an unsplittable block may waste this much */

/* Hands out size bytes of the free block b (pool lock held): splits off the rest when it is
   worth keeping, marks it allocated, counts it. */
static void gpuarr__block_take(gpuarr__pool *p, gpuarr__block *b, size_t size, size_t requested) {
    gpuarr__tlsf *index = gpuarr__pool_index(p, b->seg->small);
    gpuarr__tlsf_remove(index, b);
    size_t min_split = b->seg->small ? p->align : GPUARR__POOL_MIN_SPLIT_LARGE;
    uint64_t max_split = gpuarr__g.alloc_conf.max_split;
    bool splittable = b->seg->small || !max_split || b->size <= max_split;
    gpuarr__block *rest = splittable && b->size - size >= min_split ? (gpuarr__block *)gpuarr__calloc(sizeof *rest) : NULL;
    if (rest) { /* without memory for the record the whole block goes out, which is still right */
        rest->seg = b->seg;
        rest->offset = b->offset + size;
        rest->size = b->size - size;
        rest->owner = b->owner;
        for (uint32_t i = 0; i < b->nevents; i++) {
            rest->events[i] = b->events[i];
            gpuarr__obj_retain(&rest->events[i].event->obj);
        }
        rest->nevents = b->nevents;
        rest->prev = b;
        rest->next = b->next;
        if (b->next) b->next->prev = rest;
        b->next = rest;
        b->size = size;
        gpuarr__tlsf_insert(index, rest);
    }
    b->allocated = true;
    b->requested = requested;
    gpuarr__stat_add(&p->stats.allocated_bytes, &p->stats.peak_allocated_bytes, &p->stats.total_allocated_bytes, b->size);
    gpuarr__stat_add(&p->stats.requested_bytes, &p->stats.peak_requested_bytes, &p->stats.total_requested_bytes, requested);
    gpuarr__stat_add(&p->stats.allocations, &p->stats.peak_allocations, &p->stats.total_allocations, 1);
}

/* Takes a cached block that fits, if any (pool lock held). */
static gpuarr__block *gpuarr__pool_take_cached(gpuarr__pool *p, size_t size, size_t requested, bool small, uint64_t serial) {
    if (!p->caching) return NULL; /* no reuse: every allocation is the backend's */
    gpuarr__block *b = p->nquick ? gpuarr__pool_quick_take(p, size, requested) : NULL;
    if (b) return b;
    b = gpuarr__tlsf_find(gpuarr__pool_index(p, small), size, serial);
    if (!b && (p->nquick || p->tcaches)) {
        gpuarr__pool_quick_flush(p);
        b = gpuarr__tlsf_find(gpuarr__pool_index(p, small), size, serial);
    }
    uint64_t max_split = gpuarr__g.alloc_conf.max_split;
    if (b && !small && max_split && b->size > max_split && b->size - size > GPUARR__POOL_OVERSIZE_WASTE) b = NULL;
    if (b) gpuarr__block_take(p, b, size, requested);
    return b;
}

/* A new segment for size bytes, carved (pool lock not held). */
static gpuarr_result gpuarr__pool_new_segment(gpuarr__pool *p, size_t size, size_t requested, bool small, gpuarr__block **out) {
    size_t seg_size = !p->caching ? size : small ? GPUARR__POOL_SMALL_SEGMENT : gpuarr__round_up(size, GPUARR__POOL_LARGE_ROUND);
    gpuarr__block *b = (gpuarr__block *)gpuarr__malloc(sizeof *b);
    gpuarr__segment *seg = (gpuarr__segment *)gpuarr__malloc(sizeof *seg);
    void *mem = NULL, *host_base = NULL;
    gpuarr_result r = b && seg ? gpuarr__pool_raw_alloc(p, seg_size, &mem, &host_base)
                               : gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY, "no host memory for the pool's records");
    if (r != GPUARR_OK) {
        gpuarr__free(b);
        gpuarr__free(seg);
        return r;
    }
    pthread_mutex_lock(&p->lock);
    gpuarr__segment_add(p, mem, host_base, seg_size, small, b, seg);
    gpuarr__tlsf_insert(gpuarr__pool_index(p, small), b);
    gpuarr__block_take(p, b, size, requested);
    pthread_mutex_unlock(&p->lock);
    *out = b;
    return GPUARR_OK;
}

/* One rung of the ladder: try the cache, then the backend. */
static gpuarr_result gpuarr__pool_try(gpuarr__pool *p, size_t size, size_t requested, bool small, uint64_t serial, gpuarr__block **out) {
    pthread_mutex_lock(&p->lock);
    *out = gpuarr__pool_take_cached(p, size, requested, small, serial);
    pthread_mutex_unlock(&p->lock);
    return *out ? GPUARR_OK : gpuarr__pool_new_segment(p, size, requested, small, out);
}

/* The out-of-memory message: what was asked and what was there. */
static gpuarr_result gpuarr__pool_oom(gpuarr__pool *p, size_t requested, const char *cause) {
    gpuarr__dev *d = p->dev;
    uint64_t free_bytes = 0, total = 0;
    d->backend->mem_info(d, &free_bytes, &total);
    pthread_mutex_lock(&p->lock);
    p->stats.oom_failures++;
    gpuarr_pool_stats st = gpuarr__pool_stats_now(p);
    uint64_t limit = st.limit_bytes, allocated = st.allocated_bytes, cached = st.reserved_bytes - st.allocated_bytes;
    pthread_mutex_unlock(&p->lock);
    return gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY,
                        "%s: out of memory: %zu bytes requested; device total %llu, free %llu; pool limit %llu, allocated %llu, "
                        "cached %llu bytes (%s)",
                        d->info.spec, requested, (unsigned long long)total, (unsigned long long)free_bytes,
                        (unsigned long long)limit, (unsigned long long)allocated, (unsigned long long)cached, cause);
}

/* Allocation with the out-of-memory ladder, each step counted: the cache, then the backend; on
   failure: the user's handlers (each may ask for a retry), then cached segments at least as big
   as the request go back, then the work whose frees are pending is waited for and the cache
   searched again, then every cached segment goes back and the backend is tried once more. */
static gpuarr_result gpuarr__pool_grow(gpuarr__pool *p, size_t size, size_t requested, bool small, uint64_t serial, gpuarr__block **out) {
    gpuarr__dev *d = p->dev;
    gpuarr_result r = gpuarr__pool_try(p, size, requested, small, serial, out);
    if (r != GPUARR_ERROR_OUT_OF_MEMORY) return r;
    uint64_t step = GPUARR__TRACE_T0(); /* each rung below is one trace event */
    if (p->pinned) { /* staging memory: shed the cache once; the caller copies directly without it */
        pthread_mutex_lock(&p->lock);
        p->stats.oom_trims++;
        uint64_t released = gpuarr__pool_release_cached(p, 0, 0);
        pthread_mutex_unlock(&p->lock);
        if (released) r = gpuarr__pool_try(p, size, requested, small, serial, out);
        GPUARR__TRACE_OOM(step, d, "oom: shed staging cache", requested, r);
        return r;
    }
    char cause[300];
    gpuarr__copy_string(cause, sizeof cause, gpuarr__tls.error_detail);
    pthread_mutex_lock(&gpuarr__g.oom_lock);
    int handlers = gpuarr__g.oom_handler_count;
    pthread_mutex_unlock(&gpuarr__g.oom_lock);
    for (int i = 0; i < handlers; i++) {
        step = GPUARR__TRACE_T0();
        pthread_mutex_lock(&gpuarr__g.oom_lock);
        gpuarr_oom_fn fn = i < gpuarr__g.oom_handler_count ? gpuarr__g.oom_handlers[i].fn : NULL;
        void *user = i < gpuarr__g.oom_handler_count ? gpuarr__g.oom_handlers[i].user : NULL;
        pthread_mutex_unlock(&gpuarr__g.oom_lock);
        if (!fn) break;
        pthread_mutex_lock(&p->lock);
        p->stats.oom_handler_calls++;
        pthread_mutex_unlock(&p->lock);
        if (!fn(d->info.device, (uint64_t)requested, user)) {
            GPUARR__TRACE_OOM(step, d, "oom: handler declined", requested, r);
            continue;
        }
        pthread_mutex_lock(&p->lock);
        p->stats.oom_retries++;
        pthread_mutex_unlock(&p->lock);
        r = gpuarr__pool_try(p, size, requested, small, serial, out);
        GPUARR__TRACE_OOM(step, d, "oom: handler, retry", requested, r);
        if (r != GPUARR_ERROR_OUT_OF_MEMORY) return r;
    }
    step = GPUARR__TRACE_T0();
    pthread_mutex_lock(&p->lock);
    uint64_t released = gpuarr__pool_release_cached(p, size, 0);
    p->stats.oom_oversize_releases += released;
    if (released) p->stats.oom_retries++;
    pthread_mutex_unlock(&p->lock);
    if (released) r = gpuarr__pool_try(p, size, requested, small, serial, out);
    GPUARR__TRACE_OOM(step, d, "oom: release oversize cached", requested, r);
    if (r != GPUARR_ERROR_OUT_OF_MEMORY) return r;
    step = GPUARR__TRACE_T0();
    pthread_mutex_lock(&p->lock);
    p->stats.oom_waits++;
    p->stats.oom_retries++;
    pthread_mutex_unlock(&p->lock);
    gpuarr__collect_device(d); /* arrays released with work queued come back once it is done */
    r = gpuarr__pool_try(p, size, requested, small, serial, out);
    GPUARR__TRACE_OOM(step, d, "oom: wait for pending frees", requested, r);
    if (r != GPUARR_ERROR_OUT_OF_MEMORY) return r;
    step = GPUARR__TRACE_T0();
    pthread_mutex_lock(&p->lock);
    p->stats.oom_trims++;
    p->stats.oom_retries++;
    gpuarr__pool_release_cached(p, 0, 0);
    pthread_mutex_unlock(&p->lock);
    r = gpuarr__pool_try(p, size, requested, small, serial, out);
    GPUARR__TRACE_OOM(step, d, "oom: trim cache", requested, r);
    if (r != GPUARR_ERROR_OUT_OF_MEMORY) return r;
    return gpuarr__pool_oom(p, requested, cause);
}

/* A block of at least `bytes` on d for work on stream s (NULL: the host will touch it, or the
   device is synchronous). If its memory was last used on other streams, s is made to wait for
   that work (or, without s, the host waits). *waits (if not NULL) says whether the block came
   with earlier work, on other streams or on s itself: s's order is then the only record of it,
   so whoever frees the block must free it in s's order (an event on s), and other streams must
   order after s before they touch it. */
static gpuarr_result gpuarr__pool_alloc_ex(gpuarr__pool *p, size_t bytes, gpuarr__stream *s, gpuarr__block **out, bool *waits) {
    if (waits) *waits = false;
    gpuarr__dev *d = p->dev;
    if (bytes > d->info.max_alloc_bytes && d->info.max_alloc_bytes)
        return gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY, "%s: %zu bytes requested, above the device's largest allocation (%llu bytes%s%s)",
                            d->info.spec, bytes, (unsigned long long)d->info.max_alloc_bytes,
                            d->backend->max_alloc_name ? ", " : "", d->backend->max_alloc_name ? d->backend->max_alloc_name : "");
    GPUARR__CHECK(gpuarr__dev_open(d));
    size_t size = gpuarr__round_up(bytes ? bytes : 1, p->align);
    bool small = size <= GPUARR__POOL_SMALL_MAX && p->caching;
    uint64_t serial = s ? s->serial : 0;
    gpuarr__block *b = NULL;
    GPUARR__TRACE_SCOPE(gpuarr__trace_alloc, d, p->pinned, bytes, "miss");
    pthread_mutex_lock(&p->lock);
    b = gpuarr__pool_take_cached(p, size, bytes, small, serial);
    GPUARR__TRACE_SET(s2, b ? "hit" : "miss");
    if (b) p->stats.cache_hits++;
    else p->stats.cache_misses++;
    pthread_mutex_unlock(&p->lock);
    gpuarr_result r = b ? GPUARR_OK : gpuarr__pool_grow(p, size, bytes, small, serial, &b);
    if (r != GPUARR_OK) return r;
    /* the memory's last users, on other streams, must be done before s writes it */
    for (uint32_t i = 0; i < b->nevents && r == GPUARR_OK; i++) {
        if (s && waits) *waits = true; /* s's own earlier work too: it is ordered only on s */
        if (s && b->events[i].stream_serial == s->serial) continue;
        gpuarr__event *e = b->events[i].event;
        r = s ? gpuarr__stream_wait_raw(s, e) : gpuarr__backend_event_sync(e->dev, e->native);
        if (s) {
            pthread_mutex_lock(&p->lock);
            p->stats.cross_stream_waits++;
            pthread_mutex_unlock(&p->lock);
        }
    }
    if (r == GPUARR_OK && p->pinned) {
        b->view = (unsigned char *)b->seg->host_base + b->offset;
        b->view_offset = 0;
    } else if (r == GPUARR_OK) {
        r = gpuarr__backend_mem_view(d, b->seg->mem, b->offset, b->size, &b->view, &b->view_offset);
    }
    if (r != GPUARR_OK) { /* back with its events: its earlier users' work may still be pending */
        gpuarr__pool_free(p, b, NULL, 0);
        return r;
    }
    gpuarr__block_drop_events(b);
    *out = b;
    return GPUARR_OK;
}

static gpuarr_result gpuarr__pool_alloc(gpuarr__pool *p, size_t bytes, gpuarr__stream *s, gpuarr__block **out) {
    return gpuarr__pool_alloc_ex(p, bytes, s, out, NULL);
}

/* An event recorded on each of the streams a freed block was used on, into evs; a stream that
   cannot record one is waited for instead. Returns how many. Never fails: it may run in the
   cleanup of a failed call, whose error stands. */
static uint32_t gpuarr__pool_free_events(gpuarr__stream *const *uses, uint32_t nuses, gpuarr__block_event *evs) {
    uint32_t nevs = 0;
    gpuarr__error_saved saved;
    gpuarr__error_save(&saved);
    for (uint32_t i = 0; i < nuses && i < GPUARR__POOL_EVENTS; i++) {
        gpuarr__event *e = NULL;
        if (GPUARR__ATOMIC_LOAD(&uses[i]->destroyed)) continue; /* its work was waited for */
        if (gpuarr__event_new(uses[i]->dev, false, &e) != GPUARR_OK || gpuarr__event_record_raw(e, uses[i]) != GPUARR_OK) {
            if (e) gpuarr__obj_release(&e->obj);
            gpuarr__stream_sync_raw(uses[i]); /* cannot record: wait instead */
            continue;
        }
        evs[nevs].stream_serial = uses[i]->serial;
        evs[nevs].seq = __atomic_add_fetch(&gpuarr__g.event_seq, 1, __ATOMIC_RELAXED);
        evs[nevs].event = e;
        nevs++;
    }
    gpuarr__error_restore(&saved);
    return nevs;
}

/* Returns b to d's pool. `uses` are the async streams its memory was used on: an event is
   recorded on each, and until they pass only the freeing stream may reuse it. */
static void gpuarr__pool_free(gpuarr__pool *p, gpuarr__block *b, gpuarr__stream *const *uses, uint32_t nuses) {
    gpuarr__dev *d = p->dev;
    GPUARR__TRACE_SCOPE(gpuarr__trace_free, d, p->pinned, b->requested, "pool");
    if (b->view && !p->pinned) gpuarr__backend_mem_view_release(d, b->view);
    b->view = NULL;
    gpuarr__block_event evs[GPUARR__POOL_EVENTS];
    uint32_t nevs = nuses ? gpuarr__pool_free_events(uses, nuses, evs) : 0;
    pthread_mutex_lock(&p->lock);
    p->stats.allocated_bytes -= b->size;
    p->stats.requested_bytes -= b->requested;
    p->stats.allocations--;
    b->allocated = false;
    b->requested = 0;
    b->owner = nuses == 1 ? uses[0]->serial : 0;
    for (uint32_t i = 0; i < nevs; i++) gpuarr__block_add_event(b, evs[i]);
    if (p->caching && !b->nevents && b->size <= GPUARR__POOL_QUICK_MAX && p->nquick < GPUARR__POOL_QUICK) {
        b->quick = true;
        p->quick[p->nquick++] = b;
        pthread_mutex_unlock(&p->lock);
        return;
    }
    gpuarr__pool_index_free(p, b);
    pthread_mutex_unlock(&p->lock);
}

/* Cached bytes above the release threshold go back (at sync points: the events are done). */
static void gpuarr__pool_apply_threshold(gpuarr__pool *p) {
    if (p->stats.release_threshold_bytes == UINT64_MAX) return;
    pthread_mutex_lock(&p->lock);
    gpuarr_pool_stats st = gpuarr__pool_stats_now(p); /* the threads' cached arrays count as cached */
    if (st.reserved_bytes - st.allocated_bytes > st.release_threshold_bytes) gpuarr__pool_release_cached(p, 0, st.release_threshold_bytes);
    pthread_mutex_unlock(&p->lock);
}

static void gpuarr__pool_init(gpuarr__pool *p, gpuarr__dev *d, bool pinned) {
    memset(p, 0, sizeof *p);
    pthread_mutex_init(&p->lock, NULL);
    p->dev = d;
    p->pinned = pinned;
    p->align = pinned ? (size_t)4096 : GPUARR__MAX((size_t)512, d->backend->mem_alignment(d));
    p->caching = gpuarr__g.alloc_conf.caching;
    if (pinned) { /* a few staging chunks of host memory: the device's limit and threshold are not about it */
        p->stats.release_threshold_bytes = UINT64_MAX;
        return;
    }
    int host = gpuarr__backend_has(d->backend, GPUARR__BACKEND_BUILTIN) ? 1 : 0; /* limit: device pools, host_limit: the host's (the builtin one) */
    uint64_t limit = gpuarr__g.alloc_conf.limit_bytes[host];
    if (gpuarr__g.alloc_conf.limit_percent[host]) limit = d->info.total_memory / 100u * gpuarr__g.alloc_conf.limit_percent[host];
    p->stats.limit_bytes = limit;
    p->stats.release_threshold_bytes = gpuarr__g.alloc_conf.release_threshold;
}

/* Shutdown: every array is gone; the segments go back. */
static void gpuarr__pool_destroy(gpuarr__pool *p) {
    gpuarr__dev *d = p->dev;
    pthread_mutex_lock(&p->lock);
    while (p->tcaches) { /* threads still running keep pointers of this cycle, never used again */
        gpuarr__tcache *tc = p->tcaches;
        gpuarr__tcache_unlink(p, tc);
        gpuarr__free(tc);
    }
    while (p->segments) {
        gpuarr__pool_quick_flush(p);
        gpuarr__segment *seg = p->segments;
        if (!gpuarr__segment_free(seg)) { /* still in use (memory an MPI transfer left to MPI): kept for good */
            gpuarr__log(GPUARR_LOG_WARN, "%s: a pool segment is still in use at shutdown", d->info.spec);
            p->segments = seg->next;
            if (seg->next) seg->next->prev = NULL; /* the next one's release must not unlink it from seg */
            seg->next = NULL;
            continue;
        }
        gpuarr__segment_release(p, seg);
    }
    pthread_mutex_unlock(&p->lock);
    pthread_mutex_destroy(&p->lock);
}

/* ---------------------------------------------------------------------------------------------
 * Arrays
 * ------------------------------------------------------------------------------------------- */
static void gpuarr__array_destroy_obj(gpuarr__obj *o) {
    gpuarr__array *a = (gpuarr__array *)o;
    if (a->base) {
        gpuarr__obj_release(&a->base->obj); /* a view: the base owns the memory */
    } else if (a->wrapped) {
        if (a->release_fn) a->release_fn(a->mem, a->release_user);
    } else if (a->block && gpuarr__tcache_put(a)) {
        return; /* kept whole for this thread's next array of its size */
    } else if (a->block) { /* in stream order: the streams it was used on record their point */
        gpuarr__pool_free(a->pool, a->block, a->uses, a->nuses);
    }
    for (uint32_t i = 0; i < a->nuses; i++) gpuarr__obj_release(&a->uses[i]->obj);
    if (a->ready) gpuarr__obj_release(&a->ready->obj);
    if (a->owner_release) a->owner_release(a->owner_ctx); /* after the memory's own release */
    gpuarr__free(a);
}

/* Writes into a read-only array (gpuarr_from_dlpack of a READ_ONLY tensor) are refused. */
static gpuarr_result gpuarr__check_writable(const gpuarr__array *a, const char *arg) {
    if (!a->read_only) return GPUARR_OK;
    return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "%s is read-only (imported from a DLPack tensor flagged "
                                                       "DLPACK_FLAG_BITMASK_READ_ONLY)", arg);
}

/* The array that owns a's memory (a itself unless a is a view): it keeps the ready event and
   the use list for every view of it. */
static gpuarr__array *gpuarr__root(gpuarr__array *a) { return a->base ? a->base : a; }

static pthread_mutex_t *gpuarr__use_lock(gpuarr__array *root) { return &gpuarr__g.use_locks[((uintptr_t)root >> 6) % 64u]; }

/* The event after which the contents of a's memory are valid, retained (NULL: valid now). */
static gpuarr__event *gpuarr__ready_get(gpuarr__array *a) {
    gpuarr__array *root = gpuarr__root(a);
    pthread_mutex_t *lock = gpuarr__use_lock(root);
    pthread_mutex_lock(lock);
    gpuarr__event *e = root->ready;
    if (e) gpuarr__obj_retain(&e->obj);
    pthread_mutex_unlock(lock);
    return e;
}

/* Makes e (whose reference it takes) the point after which a's memory is valid. e's stream was
   ordered after the previous one, so e covers it. */
static void gpuarr__ready_set(gpuarr__array *a, gpuarr__event *e) {
    gpuarr__array *root = gpuarr__root(a);
    pthread_mutex_t *lock = gpuarr__use_lock(root);
    pthread_mutex_lock(lock);
    gpuarr__event *old = root->ready;
    root->ready = e;
    pthread_mutex_unlock(lock);
    if (old) gpuarr__obj_release(&old->obj);
}

/* Notes that a's memory is used by work queued on s (an async stream): its block must not be
   reused by another stream before s passes this point, and a later write waits for s. A full
   list waits for its oldest. */
static void gpuarr__array_note_use(gpuarr__array *a, gpuarr__stream *s) {
    a = gpuarr__root(a);
    if (!s || gpuarr__backend_has(s->dev->backend, GPUARR__BACKEND_SYNCHRONOUS) || !a->mem) return;
    pthread_mutex_t *lock = gpuarr__use_lock(a);
    pthread_mutex_lock(lock);
    bool known = false;
    for (uint32_t i = 0; i < a->nuses; i++) known = known || a->uses[i] == s;
    gpuarr__stream *evicted = NULL;
    if (!known) {
        if (a->nuses == GPUARR__POOL_EVENTS) {
            evicted = a->uses[0];
            memmove(a->uses, a->uses + 1, sizeof a->uses[0] * (GPUARR__POOL_EVENTS - 1));
            a->nuses--;
        }
        gpuarr__obj_retain(&s->obj);
        a->uses[a->nuses++] = s;
    }
    pthread_mutex_unlock(lock);
    if (evicted) {
        gpuarr__stream_sync_raw(evicted);
        gpuarr__obj_release(&evicted->obj);
    }
}

static void gpuarr__release_obj_deferred(void *ctx) { gpuarr__obj_release((gpuarr__obj *)ctx); }

/* Validates a dtype and shape and computes the element count and byte size. */
static gpuarr_result gpuarr__check_shape(gpuarr_dtype t, int ndim, const int64_t *shape, int64_t *count, size_t *nbytes) {
    if (!gpuarr__dtype_valid(t)) return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "dtype %d is not a gpuarr_dtype", (int)t);
    if (ndim < 0 || ndim > GPUARR_MAX_DIMS)
        return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "ndim = %d: must be 0..%d", ndim, GPUARR_MAX_DIMS);
    if (ndim > 0 && !shape) return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "shape is NULL with ndim = %d", ndim);
    bool empty = false;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "shape[%d] = %lld: dimensions must be >= 0", i, (long long)shape[i]);
        if (shape[i] == 0) empty = true;
    }
    int64_t n = 1;
    for (int i = 0; i < ndim && !empty; i++) {
        if (n > INT64_MAX / shape[i])
            return gpuarr__fail(GPUARR_ERROR_OVERFLOW, "shape[%d] = %lld: the element count overflows int64", i, (long long)shape[i]);
        n *= shape[i];
    }
    if (empty) n = 0;
    size_t bytes;
    if ((uint64_t)n > SIZE_MAX || gpuarr__mul_overflows((size_t)n, gpuarr__dtype_sizes[t], &bytes) || bytes > (size_t)PTRDIFF_MAX)
        return gpuarr__fail(GPUARR_ERROR_OVERFLOW, "%lld elements of %s (%zu bytes each) overflow the address space",
                            (long long)n, gpuarr__dtype_names[t], gpuarr__dtype_sizes[t]);
    *count = n;
    *nbytes = bytes;
    return GPUARR_OK;
}

/* A zeroed record made an array of d, t and shape (count elements, nbytes). */
static void gpuarr__array_init(gpuarr__array *a, gpuarr__dev *d, gpuarr_dtype t, int ndim, const int64_t *shape, int64_t count,
                               size_t nbytes) {
    a->obj.refs = 1;
    a->obj.destroy = gpuarr__array_destroy_obj;
    a->dev = d;
    a->dtype = t;
    a->ndim = ndim;
    for (int i = 0; i < ndim; i++) a->shape[i] = shape[i];
    a->count = count;
    a->nbytes = nbytes;
}

static gpuarr_result gpuarr__array_alloc_struct(gpuarr__dev *d, gpuarr_dtype t, int ndim, const int64_t *shape, gpuarr__array **out) {
    int64_t count;
    size_t nbytes;
    GPUARR__CHECK(gpuarr__check_shape(t, ndim, shape, &count, &nbytes));
    gpuarr__array *a = (gpuarr__array *)gpuarr__calloc(sizeof *a);
    if (!a) return gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY, "no host memory for an array");
    gpuarr__array_init(a, d, t, ndim, shape, count, nbytes);
    *out = a;
    return GPUARR_OK;
}

/* An array from this thread's cache for d (record and block reused whole), or NULL. Its block
   had no pending work when cached, so nothing orders the new array after anyone. */
static gpuarr__array *gpuarr__array_from_tcache(gpuarr__dev *d, gpuarr_dtype t, int ndim, const int64_t *shape, int64_t count,
                                                size_t nbytes) {
    GPUARR__TRACE_SCOPE(gpuarr__trace_alloc, d, false, nbytes, "thread");
    gpuarr__array *a = nbytes ? gpuarr__tcache_take(&d->pool, nbytes) : NULL;
    if (!a) return GPUARR__TRACE_DROP(), (gpuarr__array *)NULL;
    /* field by field: a memset of the record costs as much as the rest of the call */
    gpuarr__array_init(a, d, t, ndim, shape, count, nbytes);
    for (int i = ndim; i < GPUARR_MAX_DIMS; i++) a->shape[i] = 0;
    a->mem = a->block->view;
    a->offset = a->block->view_offset;
    a->wrapped = false;
    a->host_fallback = false;
    a->pool = &d->pool;
    a->pinned_for = NULL;
    a->base = NULL;
    a->base_offset = 0;
    a->batch_member = false;
    a->nuses = 0;
    a->release_fn = NULL;
    a->read_only = false;
    a->owner_release = NULL;
    a->release_user = NULL;
    a->ready = NULL;
    return a;
}

/* A new array with memory from d's pool (none for an empty array), not yet behind a handle. s:
   the stream that will write it (NULL when the host will). With the host fallback on, an array
   d has no memory for is placed on the host (a->dev and a->host_fallback say so). */
static gpuarr_result gpuarr__array_new(gpuarr__dev *d, gpuarr_dtype t, int ndim, const int64_t *shape, gpuarr__stream *s,
                                       gpuarr__array **out) {
    int64_t count;
    size_t nbytes;
    GPUARR__CHECK(gpuarr__check_shape(t, ndim, shape, &count, &nbytes));
    gpuarr__array *a = gpuarr__array_from_tcache(d, t, ndim, shape, count, nbytes);
    if (a) {
        *out = a;
        return GPUARR_OK;
    }
    a = (gpuarr__array *)gpuarr__calloc(sizeof *a);
    if (!a) return gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY, "no host memory for an array");
    gpuarr__array_init(a, d, t, ndim, shape, count, nbytes);
    a->pool = &d->pool;
    bool waits = false;
    gpuarr_result r = a->nbytes ? gpuarr__pool_alloc_ex(&d->pool, a->nbytes, s, &a->block, &waits) : GPUARR_OK;
    if (r == GPUARR_ERROR_OUT_OF_MEMORY && gpuarr__g.alloc_conf.host_fallback && d != gpuarr__host_dev()) {
        char why[sizeof gpuarr__tls.error_message];
        gpuarr__copy_string(why, sizeof why, gpuarr_last_error());
        r = gpuarr__pool_alloc(&gpuarr__host_dev()->pool, a->nbytes, NULL, &a->block);
        if (r == GPUARR_OK) {
            a->pool = &gpuarr__host_dev()->pool;
            pthread_mutex_lock(&d->pool.lock);
            d->pool.stats.host_fallbacks++;
            pthread_mutex_unlock(&d->pool.lock);
            a->dev = gpuarr__host_dev();
            a->host_fallback = true;
            gpuarr__log(GPUARR_LOG_WARN, "%s; the array was placed on the host instead", why);
        }
    }
    if (r != GPUARR_OK) {
        gpuarr__free(a);
        return r;
    }
    if (a->block) {
        a->mem = a->block->view;
        a->offset = a->block->view_offset;
    }
    /* s is ordered after the block's earlier users (their work, perhaps another thread's, may
       still write it): the array is used on s from here. Its release then frees the block in
       s's order, after those waits -- also when s never touches it (gpuarr_empty) -- and a write
       on another stream orders after s first (gpuarr__order_after_uses). */
    if (waits && !a->host_fallback) gpuarr__array_note_use(a, s);
    *out = a;
    return r;
}

static gpuarr_result gpuarr__array_publish(gpuarr__array *a, uint32_t *id) {
    gpuarr_result r = gpuarr__table_insert(&gpuarr__g.arrays, &a->obj, id);
    if (r != GPUARR_OK) gpuarr__obj_release(&a->obj);
    return r;
}

/* With a reference; GPUARR_ERROR_DEVICE_LOST (and none) when its device has failed. */
static gpuarr_result gpuarr__get_array(gpuarr_array a, const char *arg, gpuarr__array **out) {
    gpuarr__obj *o;
    GPUARR__CHECK(gpuarr__table_get(&gpuarr__g.arrays, a.id, arg, &o));
    gpuarr_result r = gpuarr__dev_alive(((gpuarr__array *)o)->dev);
    if (r != GPUARR_OK) {
        gpuarr__obj_release(o);
        return r;
    }
    *out = (gpuarr__array *)o;
    return GPUARR_OK;
}

/* ---------------------------------------------------------------------------------------------
 * The transfer engine: moves n elements between any two views, casting on the side that makes
 * the transfer narrower. ss runs work on the source's device, ds on the destination's.
 * ------------------------------------------------------------------------------------------- */
typedef struct gpuarr__view {
    gpuarr__dev *dev;
    void *mem;
    size_t offset;
    gpuarr_dtype dtype;
} gpuarr__view;

static gpuarr__view gpuarr__make_view(gpuarr__dev *d, void *mem, size_t offset, gpuarr_dtype t) {
    gpuarr__view v;
    v.dev = d;
    v.mem = mem;
    v.offset = offset;
    v.dtype = t;
    return v;
}

static unsigned char *gpuarr__view_host_ptr(gpuarr__view v) { return (unsigned char *)v.mem + v.offset; }

/* A temporary on s's device from its pool, and its return in s's order (s may reuse it at once). */
typedef gpuarr__block gpuarr__device_mem;

static gpuarr_result gpuarr__temp_alloc(gpuarr__stream *s, size_t bytes, gpuarr__device_mem **out) {
    return gpuarr__pool_alloc(&s->dev->pool, bytes, s, out);
}

static void gpuarr__temp_free(gpuarr__stream *s, gpuarr__device_mem *tmp) {
    gpuarr__stream *uses[1] = {s};
    gpuarr__pool_free(&s->dev->pool, tmp, uses, gpuarr__backend_has(s->dev->backend, GPUARR__BACKEND_SYNCHRONOUS) ? 0u : 1u);
}

/* A temporary written on one stream and read on another of its device (peer copies). */
static void gpuarr__temp_free2(gpuarr__stream *a, gpuarr__stream *b, gpuarr__device_mem *tmp) {
    gpuarr__stream *uses[2] = {a, b};
    gpuarr__pool_free(&b->dev->pool, tmp, uses, gpuarr__backend_has(b->dev->backend, GPUARR__BACKEND_SYNCHRONOUS) ? 0u : a == b ? 1u : 2u);
}

static void gpuarr__free_host_deferred(void *ctx) { gpuarr__aligned_free(ctx); }

static gpuarr_result gpuarr__host_temp(size_t bytes, void **out) {
    *out = gpuarr__aligned_malloc(bytes, 64);
    if (!*out) return gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY, "no host memory for a %zu-byte staging buffer", bytes);
    gpuarr__advise_huge_pages(*out, bytes);
    return GPUARR_OK;
}

/* Host-side cast through the host backend's table entry. */
static gpuarr_result gpuarr__host_step(void *dst, gpuarr_dtype dt, const void *src, gpuarr_dtype st, size_t n) {
    gpuarr__dev *h = gpuarr__host_dev();
    gpuarr__stream *hs;
    GPUARR__CHECK(gpuarr__default_stream(h, &hs));
    gpuarr_result r = h->backend->cast(hs, dst, 0, dt, src, 0, st, n);
    gpuarr__obj_release(&hs->obj);
    return r;
}

/* Both views on s's device. */
static gpuarr_result gpuarr__move_local(gpuarr__stream *s, gpuarr__view dst, gpuarr__view src, size_t n) {
    const gpuarr__backend *b = s->dev->backend;
    if (dst.dtype == src.dtype)
        return b->copy_d2d(s, dst.mem, dst.offset, src.mem, src.offset, n * gpuarr__dtype_sizes[src.dtype]);
    return b->cast(s, dst.mem, dst.offset, dst.dtype, src.mem, src.offset, src.dtype, n);
}

/* ---- where a cast runs ---- */
typedef enum gpuarr__cast_at {
    GPUARR__CAST_NONE,      /* same dtype: a copy */
    GPUARR__CAST_AT_SOURCE, /* narrowing or same width: before the data leaves the source */
    GPUARR__CAST_AT_DEST    /* widening: after the data arrives */
} gpuarr__cast_at;

/* The one rule for every direction: the cast runs on the side that makes the transfer narrower,
   and at equal widths on the source (the bytes then travel in the dtype they are wanted in). */
static gpuarr__cast_at gpuarr__cast_side(gpuarr_dtype src, gpuarr_dtype dst) {
    if (src == dst) return GPUARR__CAST_NONE;
    return gpuarr__dtype_sizes[dst] <= gpuarr__dtype_sizes[src] ? GPUARR__CAST_AT_SOURCE : GPUARR__CAST_AT_DEST;
}

/* Whether the device the rule picks can run the cast: asked before anything is allocated or
   moved, so a device's limit (no fp64) fails the call with nothing done. */
static gpuarr_result gpuarr__route_check(gpuarr__dev *sd, gpuarr__dev *dd, gpuarr_dtype st, gpuarr_dtype dt) {
    gpuarr__cast_at at = gpuarr__cast_side(st, dt);
    if (at == GPUARR__CAST_NONE) return GPUARR_OK;
    gpuarr__dev *d = at == GPUARR__CAST_AT_SOURCE ? sd : dd;
    return gpuarr__backend_cast_supported(d, dt, st);
}

/* ---- how bytes cross between pageable host memory and a device ---- */
typedef enum gpuarr__path {
    GPUARR__PATH_DIRECT,    /* one backend copy from or to the host memory as it is */
    GPUARR__PATH_STAGED,    /* through the ring of pinned chunks (synchronous calls) */
    GPUARR__PATH_HOST_TEMP, /* the caller's thread casts through a temporary (synchronous calls) */
    GPUARR__PATH_QUEUED     /* through one host buffer that a host function on the stream fills or
                               drains: async calls, which never wait for the device */
} gpuarr__path;

/* ---- staging through pinned memory ----
   Between pageable host memory and a device that does not share it, large synchronous transfers
   go through a ring of pinned chunks: the host copies (or casts) chunk i while the device copies
   chunk i-1, and a chunk is refilled only after its copy has completed. */
#define GPUARR__STAGE_MIN ((size_t)1 << 20)   /* below this the driver's own path is as good */
#define GPUARR__STAGE_CHUNK ((size_t)8 << 20)
#define GPUARR__STAGE_RING 3

/* Whether p lies in memory of pool p (its segments; pool lock taken). */
static bool gpuarr__pool_owns(gpuarr__pool *p, const void *ptr) {
    uintptr_t x = (uintptr_t)ptr;
    bool found = false;
    pthread_mutex_lock(&p->lock);
    for (gpuarr__segment *seg = p->segments; seg && !found; seg = seg->next)
        found = seg->host_base && x >= (uintptr_t)seg->host_base && x < (uintptr_t)seg->host_base + seg->size;
    pthread_mutex_unlock(&p->lock);
    return found;
}

/* Host memory d copies from and to at full speed as it is: page-locked by the caller, or a
   pinned host array of d (gpuarr_empty_pinned). */
static bool gpuarr__host_pinned(gpuarr__dev *d, const void *host) {
    return gpuarr__pool_owns(&d->pinned, host) || gpuarr__backend_host_ptr_pinned(d, host);
}

static bool gpuarr__stages(gpuarr__dev *d, const void *host, size_t bytes) {
    return !d->info.host_unified && !gpuarr__backend_has(d->backend, GPUARR__BACKEND_HOST_MEMORY) && bytes >= GPUARR__STAGE_MIN && !gpuarr__host_pinned(d, host);
}

static gpuarr__path gpuarr__host_path(gpuarr__dev *d, const void *host, size_t bytes, bool host_work, bool async) {
    if (async) return host_work || (!gpuarr__backend_has(d->backend, GPUARR__BACKEND_PAGEABLE_ASYNC) && !gpuarr__host_pinned(d, host)) ? GPUARR__PATH_QUEUED : GPUARR__PATH_DIRECT;
    if (gpuarr__stages(d, host, bytes)) return GPUARR__PATH_STAGED;
    return host_work ? GPUARR__PATH_HOST_TEMP : GPUARR__PATH_DIRECT;
}

typedef struct gpuarr__ring {
    gpuarr__block *chunk[GPUARR__STAGE_RING];
    gpuarr__event *done[GPUARR__STAGE_RING]; /* the copy that last used each chunk */
    int count;
} gpuarr__ring;

/* The chunks go back to the pinned pool in s's order: a later user waits for s's copies. */
static void gpuarr__ring_close(gpuarr__dev *d, gpuarr__ring *r, gpuarr__stream *s) {
    gpuarr__stream *uses[1] = {s};
    for (int j = 0; j < r->count; j++) {
        if (r->done[j]) gpuarr__obj_release(&r->done[j]->obj);
        gpuarr__pool_free(&d->pinned, r->chunk[j], uses, 1);
    }
    r->count = 0;
}

/* A ring for `total` bytes moved in chunks of at most GPUARR__STAGE_CHUNK: false, with nothing
   held, when d has no pinned memory for it (none left, or the backend has none); the caller then
   takes another path. The host waits for the chunks' previous users. */
static bool gpuarr__ring_open(gpuarr__dev *d, size_t chunk, size_t chunks, gpuarr__ring *r) {
    memset(r, 0, sizeof *r);
    int want = (int)GPUARR__MIN(chunks, (size_t)GPUARR__STAGE_RING);
    for (int i = 0; i < want; i++) {
        if (gpuarr__pool_alloc(&d->pinned, chunk, NULL, &r->chunk[i]) != GPUARR_OK) {
            gpuarr__log(GPUARR_LOG_INFO, "%s: no pinned memory to stage through (%s); copying directly", d->info.spec, gpuarr_last_error());
            for (int j = 0; j < r->count; j++) gpuarr__pool_free(&d->pinned, r->chunk[j], NULL, 0);
            r->count = 0;
            return false;
        }
        r->count++;
    }
    return true;
}

/* Waits until chunk j's last copy is done (before the host touches it again). */
static gpuarr_result gpuarr__ring_wait(gpuarr__ring *r, int j) {
    gpuarr__event *e = r->done[j];
    if (!e) return GPUARR_OK;
    gpuarr_result res = gpuarr__backend_event_sync(e->dev, e->native);
    gpuarr__obj_release(&e->obj);
    r->done[j] = NULL;
    return res;
}

static gpuarr_result gpuarr__ring_mark(gpuarr__ring *r, int j, gpuarr__stream *s) {
    gpuarr_result res = gpuarr__event_new(s->dev, false, &r->done[j]);
    if (res == GPUARR_OK) res = gpuarr__event_record_raw(r->done[j], s);
    return res;
}

/* Host memory (dtype st) -> device memory at (mem, off) in dtype t, where t is st or narrower:
   the host casts into the ring's chunks of `per` elements. Closes the ring. */
static gpuarr_result gpuarr__staged_upload(gpuarr__stream *s, gpuarr__ring *ring, size_t per, void *mem, size_t off, gpuarr_dtype t,
                                           const unsigned char *src, gpuarr_dtype st, size_t n) {
    gpuarr__dev *d = s->dev;
    size_t tsz = gpuarr__dtype_sizes[t], ssz = gpuarr__dtype_sizes[st], chunks = (n + per - 1) / per;
    gpuarr_result r = GPUARR_OK;
    for (size_t i = 0; r == GPUARR_OK && i < chunks; i++) {
        int j = (int)(i % (size_t)ring->count);
        size_t first = i * per, count = GPUARR__MIN(per, n - first);
        r = gpuarr__ring_wait(ring, j);
        if (r == GPUARR_OK) r = gpuarr__host_step(ring->chunk[j]->view, t, src + first * ssz, st, count);
        if (r == GPUARR_OK) r = d->backend->copy_h2d(s, mem, off + first * tsz, ring->chunk[j]->view, count * tsz, false);
        if (r == GPUARR_OK) r = gpuarr__ring_mark(ring, j, s);
    }
    gpuarr__ring_close(d, ring, s);
    return r;
}

/* Device memory (mem, off) in dtype t -> host memory in dtype ht, where ht is t or wider: the
   host casts out of the ring's chunks of `per` elements. Blocks until the data is in place;
   closes the ring. */
static gpuarr_result gpuarr__staged_download(gpuarr__stream *s, gpuarr__ring *ring, size_t per, unsigned char *dst, gpuarr_dtype ht,
                                             const void *mem, size_t off, gpuarr_dtype t, size_t n) {
    gpuarr__dev *d = s->dev;
    size_t tsz = gpuarr__dtype_sizes[t], hsz = gpuarr__dtype_sizes[ht], chunks = (n + per - 1) / per;
    gpuarr_result r = GPUARR_OK;
    for (size_t i = 0; r == GPUARR_OK && i < (size_t)ring->count; i++) { /* the first copies in flight */
        size_t count = GPUARR__MIN(per, n - i * per);
        r = d->backend->copy_d2h(s, ring->chunk[i]->view, mem, off + i * per * tsz, count * tsz, false);
        if (r == GPUARR_OK) r = gpuarr__ring_mark(ring, (int)i, s);
    }
    for (size_t i = 0; r == GPUARR_OK && i < chunks; i++) {
        int j = (int)(i % (size_t)ring->count);
        size_t first = i * per, count = GPUARR__MIN(per, n - first);
        r = gpuarr__ring_wait(ring, j);
        if (r == GPUARR_OK) r = gpuarr__host_step(dst + first * hsz, ht, ring->chunk[j]->view, t, count);
        size_t next = i + (size_t)ring->count;
        if (r == GPUARR_OK && next < chunks) {
            size_t ncount = GPUARR__MIN(per, n - next * per);
            r = d->backend->copy_d2h(s, ring->chunk[j]->view, mem, off + next * per * tsz, ncount * tsz, false);
            if (r == GPUARR_OK) r = gpuarr__ring_mark(ring, j, s);
        }
    }
    if (r != GPUARR_OK) gpuarr__stream_sync_keep(s, r);
    gpuarr__ring_close(d, ring, s);
    return r;
}

/* Device memory to device memory of another device, bytes in chunks through the ring (of pd's
   pinned memory): chunk k is copied out on ss into slot k % R, then (once the host has seen that
   copy finish) in on ds; a slot is copied into again only after its copy in has finished. With
   R = 3 two copies out run ahead of the copies in. Closes the ring. */
static gpuarr_result gpuarr__staged_bounce(gpuarr__stream *ss, gpuarr__stream *ds, gpuarr__dev *pd, gpuarr__ring *out, void *dmem,
                                           size_t doff, const void *smem, size_t soff, size_t bytes) {
    size_t chunk = GPUARR__MIN(GPUARR__STAGE_CHUNK, bytes), chunks = (bytes + chunk - 1) / chunk;
    int want = out->count;
    gpuarr__ring in; /* out: the ring's chunks and their copies out; in: their copies in */
    memset(&in, 0, sizeof in);
    gpuarr_result r = GPUARR_OK;
    for (size_t k = 0; r == GPUARR_OK && k < chunks + (size_t)want - 1; k++) {
        if (k < chunks) { /* copy chunk k out into its slot, after the slot's last copy in */
            int j = (int)(k % (size_t)want);
            r = gpuarr__ring_wait(&in, j);
            if (r == GPUARR_OK) r = ss->dev->backend->copy_d2h(ss, out->chunk[j]->view, smem, soff + k * chunk, GPUARR__MIN(chunk, bytes - k * chunk), false);
            if (r == GPUARR_OK) r = gpuarr__ring_mark(out, j, ss);
        }
        if (r == GPUARR_OK && k + 1 >= (size_t)want) { /* copy chunk c in, want - 1 behind */
            size_t c = k + 1 - (size_t)want;
            int j = (int)(c % (size_t)want);
            r = gpuarr__ring_wait(out, j);
            if (r == GPUARR_OK) r = ds->dev->backend->copy_h2d(ds, dmem, doff + c * chunk, out->chunk[j]->view, GPUARR__MIN(chunk, bytes - c * chunk), false);
            if (r == GPUARR_OK) r = gpuarr__ring_mark(&in, j, ds);
        }
    }
    if (r != GPUARR_OK) gpuarr__stream_sync_keep(ss, r);
    for (int j = 0; j < want; j++)
        if (in.done[j]) gpuarr__obj_release(&in.done[j]->obj);
    gpuarr__ring_close(pd, out, ds); /* reused after ds's copies in */
    return r;
}

/* ---- host work queued on a stream (async calls) ---- */
typedef struct gpuarr__host_cast_job {
    void *dst;
    const void *src;
    gpuarr_dtype dt, st;
    size_t n;
} gpuarr__host_cast_job;

/* Runs as a host function: on the worker pool's host reference, never the stream's driver. */
static void gpuarr__host_cast_job_run(void *ctx) {
    gpuarr__host_cast_job *j = (gpuarr__host_cast_job *)ctx;
    gpuarr__cpu_cast(j->dst, j->dt, j->src, j->st, j->n);
    gpuarr__free(j);
    gpuarr__host_fn_done();
}

static GPUARR__FOR_BACKENDS void gpuarr__host_fn_discard(gpuarr__host_fn fn, void *ctx) {
    if (fn == gpuarr__host_cast_job_run) gpuarr__free(ctx);
    else if (fn == gpuarr__event_wait_job) gpuarr__obj_release(&((gpuarr__event *)ctx)->obj);
}

/* The host casts (or copies) n elements once s's work so far is done; s's later work waits. */
static gpuarr_result gpuarr__queue_host_cast(gpuarr__stream *s, void *dst, gpuarr_dtype dt, const void *src, gpuarr_dtype st, size_t n) {
    gpuarr__host_cast_job *j = (gpuarr__host_cast_job *)gpuarr__calloc(sizeof *j);
    if (!j) return gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY, "no host memory for a queued host cast");
    j->dst = dst;
    j->src = src;
    j->dt = dt;
    j->st = st;
    j->n = n;
    gpuarr_result r = gpuarr__backend_launch_host_fn(s, gpuarr__host_cast_job_run, j);
    if (r != GPUARR_OK) gpuarr__free(j);
    return r;
}

/* A ring for async transfers: up to GPUARR__STAGE_RING pinned chunks of s's device, taken for s.
   Host functions and copies on s run in order, so a chunk is reused with no one waiting. false
   when s's device has no pinned memory at all. */
static bool gpuarr__queued_ring_open(gpuarr__stream *s, size_t chunk, size_t chunks, gpuarr__ring *r) {
    memset(r, 0, sizeof *r);
    int want = (int)GPUARR__MIN(chunks, (size_t)GPUARR__STAGE_RING);
    while (r->count < want && gpuarr__pool_alloc(&s->dev->pinned, chunk, s, &r->chunk[r->count]) == GPUARR_OK) r->count++;
    return r->count > 0;
}

/* Host memory (dtype st) -> device memory (mem, off) in dtype t, chunk by chunk: a host function
   on s casts or copies each chunk into a slot of the ring, then s copies it in. Closes the ring. */
static gpuarr_result gpuarr__queued_upload(gpuarr__stream *s, gpuarr__ring *ring, size_t per, void *mem, size_t off, gpuarr_dtype t,
                                           const unsigned char *src, gpuarr_dtype st, size_t n) {
    size_t tsz = gpuarr__dtype_sizes[t], ssz = gpuarr__dtype_sizes[st];
    gpuarr_result r = GPUARR_OK;
    for (size_t i = 0, first = 0; r == GPUARR_OK && first < n; i++, first += per) {
        void *slot = ring->chunk[i % (size_t)ring->count]->view;
        size_t count = GPUARR__MIN(per, n - first);
        r = gpuarr__queue_host_cast(s, slot, t, src + first * ssz, st, count);
        if (r == GPUARR_OK) r = s->dev->backend->copy_h2d(s, mem, off + first * tsz, slot, count * tsz, true);
    }
    gpuarr__ring_close(s->dev, ring, s);
    return r;
}

/* Device memory (mem, off) in dtype t -> host memory in dtype ht, chunk by chunk: s copies each
   chunk out into a slot, then a host function on s casts or copies it into place. Closes the ring. */
static gpuarr_result gpuarr__queued_download(gpuarr__stream *s, gpuarr__ring *ring, size_t per, unsigned char *dst, gpuarr_dtype ht,
                                             const void *mem, size_t off, gpuarr_dtype t, size_t n) {
    size_t tsz = gpuarr__dtype_sizes[t], hsz = gpuarr__dtype_sizes[ht];
    gpuarr_result r = GPUARR_OK;
    for (size_t i = 0, first = 0; r == GPUARR_OK && first < n; i++, first += per) {
        void *slot = ring->chunk[i % (size_t)ring->count]->view;
        size_t count = GPUARR__MIN(per, n - first);
        r = s->dev->backend->copy_d2h(s, slot, mem, off + first * tsz, count * tsz, true);
        if (r == GPUARR_OK) r = gpuarr__queue_host_cast(s, dst + first * hsz, ht, slot, t, count);
    }
    gpuarr__ring_close(s->dev, ring, s);
    return r;
}

/* A host buffer that queued work fills or drains: pinned memory of pd (for pd's stream s, or for
   the host when s is NULL), else, where pageable_ok, ordinary memory. false: neither. */
typedef struct gpuarr__hostbuf {
    gpuarr__dev *pd;
    gpuarr__block *pinned;
    void *ptr;
} gpuarr__hostbuf;

static bool gpuarr__hostbuf_get(gpuarr__dev *pd, gpuarr__stream *s, size_t bytes, bool pageable_ok, gpuarr__hostbuf *b) {
    memset(b, 0, sizeof *b);
    b->pd = pd;
    if (gpuarr__pool_alloc(&pd->pinned, bytes, s, &b->pinned) == GPUARR_OK) {
        b->ptr = b->pinned->view;
        return true;
    }
    return pageable_ok && gpuarr__host_temp(bytes, &b->ptr) == GPUARR_OK;
}

typedef struct gpuarr__pinned_return {
    gpuarr__pool *pool;
    gpuarr__block *block;
} gpuarr__pinned_return;

static void gpuarr__pinned_return_deferred(void *ctx) {
    gpuarr__pinned_return *p = (gpuarr__pinned_return *)ctx;
    gpuarr__pool_free(p->pool, p->block, NULL, 0);
    gpuarr__free(p);
}

/* Gives the buffer back once s, its last user, has passed this point. */
static void gpuarr__hostbuf_release(gpuarr__hostbuf *b, gpuarr__stream *s) {
    if (!b->pinned) {
        gpuarr__stream_defer(s, gpuarr__free_host_deferred, b->ptr);
        return;
    }
    gpuarr__stream *uses[1] = {s};
    if (s->dev == b->pd) {
        gpuarr__pool_free(&b->pd->pinned, b->pinned, uses, 1);
        return;
    }
    gpuarr__pinned_return *p = (gpuarr__pinned_return *)gpuarr__malloc(sizeof *p);
    if (!p) { /* cannot defer: wait instead */
        gpuarr__stream_sync_raw(s);
        gpuarr__pool_free(&b->pd->pinned, b->pinned, NULL, 0);
        return;
    }
    p->pool = &b->pd->pinned;
    p->block = b->pinned;
    gpuarr__stream_defer(s, gpuarr__pinned_return_deferred, p);
}

/* An async call that found no buffer for its host work: it does that work now, after waiting. */
static gpuarr__path gpuarr__queued_fallback(gpuarr__stream *s, bool host_work) {
    gpuarr__log(GPUARR_LOG_INFO, "%s: no pinned memory for an async transfer (%s); the calling thread does the host's part", s->dev->info.spec,
                gpuarr_last_error());
    return host_work ? GPUARR__PATH_HOST_TEMP : GPUARR__PATH_DIRECT;
}

/* ---- the directions ---- */
/* One crossing between host memory and device memory on s's device, in either direction. The
   bytes travel in dev's dtype; where host's differs (it is as wide or wider), the host casts:
   before the copy going to the device, after the copy coming back. */
typedef struct gpuarr__crossing {
    gpuarr__stream *s;
    bool to_device;    /* host -> dev; false: dev -> host */
    gpuarr__view dev;  /* device memory on s's device */
    gpuarr__view host; /* the caller's host memory */
    size_t n;          /* elements */
    bool async;
} gpuarr__crossing;

/* The backend's copy between dev and host buffer p, which holds the elements in dev's dtype. */
static gpuarr_result gpuarr__crossing_copy(const gpuarr__crossing *c, void *p) {
    gpuarr__stream *s = c->s;
    size_t bytes = c->n * gpuarr__dtype_sizes[c->dev.dtype];
    if (c->to_device) return s->dev->backend->copy_h2d(s, c->dev.mem, c->dev.offset, p, bytes, c->async);
    return s->dev->backend->copy_d2h(s, p, c->dev.mem, c->dev.offset, bytes, c->async);
}

/* The host's cast between the caller's memory and buffer p (dev's dtype): by the calling thread
   now, or queued as a host function on s. */
static gpuarr_result gpuarr__crossing_cast(const gpuarr__crossing *c, void *p, bool queued) {
    unsigned char *h = gpuarr__view_host_ptr(c->host);
    gpuarr_dtype ht = c->host.dtype, w = c->dev.dtype;
    if (queued)
        return c->to_device ? gpuarr__queue_host_cast(c->s, p, w, h, ht, c->n) : gpuarr__queue_host_cast(c->s, h, ht, p, w, c->n);
    return c->to_device ? gpuarr__host_step(p, w, h, ht, c->n) : gpuarr__host_step(h, ht, p, w, c->n);
}

/* Through one ordinary host buffer tmp, freed in s's order: the cast before the copy going to the
   device, after it coming back (by the calling thread once the copy has landed, or queued). */
static gpuarr_result gpuarr__crossing_through(const gpuarr__crossing *c, void *tmp, bool queued) {
    gpuarr_result r = c->to_device ? gpuarr__crossing_cast(c, tmp, queued) : GPUARR_OK;
    if (r == GPUARR_OK) r = gpuarr__crossing_copy(c, tmp);
    if (r == GPUARR_OK && !c->to_device && !queued) r = gpuarr__stream_sync_raw(c->s);
    if (r == GPUARR_OK && !c->to_device) r = gpuarr__crossing_cast(c, tmp, queued);
    gpuarr__stream_defer(c->s, gpuarr__free_host_deferred, tmp);
    return r;
}

/* Through a ring of pinned chunks of `per` elements, filled and drained by the calling thread
   (synchronous) or by host functions on s (queued). Closes the ring. */
static gpuarr_result gpuarr__crossing_ring(const gpuarr__crossing *c, gpuarr__ring *ring, size_t per, bool queued) {
    gpuarr__stream *s = c->s;
    unsigned char *h = gpuarr__view_host_ptr(c->host);
    void *mem = c->dev.mem;
    size_t off = c->dev.offset, n = c->n;
    gpuarr_dtype ht = c->host.dtype, w = c->dev.dtype;
    if (c->to_device && queued) return gpuarr__queued_upload(s, ring, per, mem, off, w, h, ht, n);
    if (c->to_device) return gpuarr__staged_upload(s, ring, per, mem, off, w, h, ht, n);
    if (queued) return gpuarr__queued_download(s, ring, per, h, ht, mem, off, w, n);
    return gpuarr__staged_download(s, ring, per, h, ht, mem, off, w, n);
}

/* Moves c's elements, for both directions: the path gpuarr__host_path picks, falling back to the
   next when pinned or host memory runs out. */
static gpuarr_result gpuarr__cross(const gpuarr__crossing *c) {
    gpuarr__stream *s = c->s;
    gpuarr__dev *d = s->dev;
    size_t wsz = gpuarr__dtype_sizes[c->dev.dtype], bytes = c->n * wsz, per = GPUARR__STAGE_CHUNK / wsz;
    size_t chunk = GPUARR__MIN(per, c->n) * wsz, chunks = (c->n + per - 1) / per;
    bool host_work = c->dev.dtype != c->host.dtype;
    gpuarr__path path = gpuarr__host_path(d, gpuarr__view_host_ptr(c->host), bytes, host_work, c->async);
    gpuarr__ring ring;
    void *tmp = NULL;
    if (path == GPUARR__PATH_STAGED) {
        if (gpuarr__ring_open(d, chunk, chunks, &ring)) return gpuarr__crossing_ring(c, &ring, per, false);
        path = host_work ? GPUARR__PATH_HOST_TEMP : GPUARR__PATH_DIRECT;
    }
    if (path == GPUARR__PATH_QUEUED) {
        if (gpuarr__queued_ring_open(s, chunk, chunks, &ring)) return gpuarr__crossing_ring(c, &ring, per, true);
        if (gpuarr__backend_has(d->backend, GPUARR__BACKEND_PAGEABLE_ASYNC) && gpuarr__host_temp(bytes, &tmp) == GPUARR_OK) /* one ordinary buffer */
            return gpuarr__crossing_through(c, tmp, true);
        path = gpuarr__queued_fallback(s, host_work);
        if (c->to_device) GPUARR__CHECK(gpuarr__stream_sync_raw(s)); /* the source may be pending on s */
    }
    if (path == GPUARR__PATH_DIRECT) return gpuarr__crossing_copy(c, gpuarr__view_host_ptr(c->host));
    GPUARR__CHECK(gpuarr__host_temp(bytes, &tmp));
    return gpuarr__crossing_through(c, tmp, false);
}

/* Host -> device on s: casts the rule puts on the source run on the host, the others on the
   device after arrival. */
static gpuarr_result gpuarr__upload(gpuarr__stream *s, gpuarr__view dst, gpuarr__view src, size_t n, bool async) {
    gpuarr__crossing up = {s, true, dst, src, n, async};
    if (gpuarr__cast_side(src.dtype, dst.dtype) != GPUARR__CAST_AT_DEST) return gpuarr__cross(&up);
    gpuarr__device_mem *tmp;
    GPUARR__CHECK(gpuarr__temp_alloc(s, n * gpuarr__dtype_sizes[src.dtype], &tmp));
    up.dev = gpuarr__make_view(s->dev, tmp->view, tmp->view_offset, src.dtype);
    gpuarr_result r = gpuarr__cross(&up);
    if (r == GPUARR_OK) r = s->dev->backend->cast(s, dst.mem, dst.offset, dst.dtype, tmp->view, tmp->view_offset, src.dtype, n);
    gpuarr__temp_free(s, tmp);
    return r;
}

/* Device -> host on s: casts the rule puts on the source run on the device before the bytes
   leave it, the others (widening) on the host after they arrive. */
static gpuarr_result gpuarr__download(gpuarr__stream *s, gpuarr__view dst, gpuarr__view src, size_t n, bool async) {
    gpuarr__crossing down = {s, false, src, dst, n, async};
    if (gpuarr__cast_side(src.dtype, dst.dtype) != GPUARR__CAST_AT_SOURCE) return gpuarr__cross(&down);
    gpuarr__device_mem *tmp;
    GPUARR__CHECK(gpuarr__temp_alloc(s, n * gpuarr__dtype_sizes[dst.dtype], &tmp));
    down.dev = gpuarr__make_view(s->dev, tmp->view, tmp->view_offset, dst.dtype);
    gpuarr_result r = s->dev->backend->cast(s, tmp->view, tmp->view_offset, dst.dtype, src.mem, src.offset, src.dtype, n);
    if (r == GPUARR_OK) r = gpuarr__cross(&down);
    gpuarr__temp_free(s, tmp);
    return r;
}

/* Between two devices of one backend that can copy directly. *last = the stream of the last step. */
static gpuarr_result gpuarr__move_peer(gpuarr__stream *ss, gpuarr__stream *ds, gpuarr__view dst, gpuarr__view src,
                                       size_t n, gpuarr__stream **last) {
    const gpuarr__backend *b = ss->dev->backend;
    size_t ssz = gpuarr__dtype_sizes[src.dtype], dsz = gpuarr__dtype_sizes[dst.dtype];
    gpuarr__device_mem *tmp = NULL;
    gpuarr_result r;
    if (gpuarr__cast_side(src.dtype, dst.dtype) != GPUARR__CAST_AT_DEST) { /* cast (if any) on the source, copy the narrow bytes */
        gpuarr__view from = src;
        *last = ss;
        if (src.dtype != dst.dtype) {
            GPUARR__CHECK(gpuarr__temp_alloc(ss, n * dsz, &tmp));
            from = gpuarr__make_view(ss->dev, tmp->view, tmp->view_offset, dst.dtype);
            r = b->cast(ss, tmp->view, tmp->view_offset, dst.dtype, src.mem, src.offset, src.dtype, n);
            if (r != GPUARR_OK) {
                gpuarr__temp_free(ss, tmp);
                return r;
            }
        }
        /* dst was allocated for ds: ss writes it only after what ds was told to wait for */
        r = gpuarr__stream_order(ss, ds);
        if (r == GPUARR_OK) r = b->copy_peer(ss, dst.dev, dst.mem, dst.offset, ss->dev, from.mem, from.offset, n * dsz);
        if (tmp) gpuarr__temp_free(ss, tmp);
        return r;
    }
    *last = ds; /* copy the narrow bytes, widen on the destination */
    GPUARR__CHECK(gpuarr__temp_alloc(ds, n * ssz, &tmp));
    /* tmp was allocated for ds, as dst above: ss writes it only after what ds was told to wait for */
    r = gpuarr__stream_order(ss, ds);
    if (r == GPUARR_OK) r = b->copy_peer(ss, ds->dev, tmp->view, tmp->view_offset, ss->dev, src.mem, src.offset, n * ssz);
    if (r == GPUARR_OK) r = gpuarr__stream_order(ds, ss);
    if (r == GPUARR_OK) r = b->cast(ds, dst.mem, dst.offset, dst.dtype, tmp->view, tmp->view_offset, src.dtype, n);
    gpuarr__temp_free2(ss, ds, tmp); /* written on ss, read on ds */
    return r;
}

/* Whose pinned memory carries bytes between two devices through the host: the side whose driver
   consumes pageable memory at the call needs its own (OpenCL takes any host memory). */
static gpuarr__dev *gpuarr__bounce_pinned_dev(gpuarr__stream *ss, gpuarr__stream *ds) {
    return gpuarr__backend_has(ds->dev->backend, GPUARR__BACKEND_PAGEABLE_ASYNC) ? ss->dev : ds->dev;
}

/* `bytes` from device memory on ss's device to device memory on ds's, through one host buffer.
   Async: no host wait -- ds is ordered after ss's copy out on the device or by a host function.
   Synchronous (or without a buffer that async copies can use): the host waits in between. */
static gpuarr_result gpuarr__bounce_once(gpuarr__stream *ss, gpuarr__stream *ds, void *dmem, size_t doff, const void *smem, size_t soff,
                                         size_t bytes, bool async) {
    gpuarr__dev *pd = gpuarr__bounce_pinned_dev(ss, ds);
    bool pageable_ok = gpuarr__backend_has(ss->dev->backend, GPUARR__BACKEND_PAGEABLE_ASYNC) && gpuarr__backend_has(ds->dev->backend, GPUARR__BACKEND_PAGEABLE_ASYNC);
    gpuarr__hostbuf b;
    gpuarr_result r;
    /* ss writes the buffer first. From ss's device's pool it is taken for ss; from ds's, for no
       stream: taken for ds it could be a block ds's queued work still uses (a stream reuses its
       own frees at once), and ordering ss after ds across backends would put a host function on
       ss waiting for ds; instead the calling thread waits for that work, if the block has any. */
    if (async && gpuarr__hostbuf_get(pd, pd == ds->dev ? NULL : ss, bytes, pageable_ok, &b)) {
        r = ss->dev->backend->copy_d2h(ss, b.ptr, smem, soff, bytes, async);
        if (r == GPUARR_OK) r = gpuarr__stream_order(ds, ss);
        if (r == GPUARR_OK) r = ds->dev->backend->copy_h2d(ds, dmem, doff, b.ptr, bytes, async);
        gpuarr__hostbuf_release(&b, ds);
        return r;
    }
    if (async) gpuarr__queued_fallback(ds, false);
    void *tmp;
    GPUARR__CHECK(gpuarr__host_temp(bytes, &tmp));
    r = ss->dev->backend->copy_d2h(ss, tmp, smem, soff, bytes, async);
    if (r == GPUARR_OK) r = gpuarr__stream_sync_raw(ss);
    if (r == GPUARR_OK) r = ds->dev->backend->copy_h2d(ds, dmem, doff, tmp, bytes, async);
    gpuarr__stream_defer(ds, gpuarr__free_host_deferred, tmp);
    return r;
}

/* src on one device -> dst on another through the host, cast (by the rule) to mid, the narrower
   dtype, on the source or from it on the destination. Synchronous calls moving enough bytes
   pipeline them through the ring of pinned chunks. */
static gpuarr_result gpuarr__move_bounce(gpuarr__stream *ss, gpuarr__stream *ds, gpuarr__view dst, gpuarr__view src, size_t n, bool async) {
    gpuarr_dtype mid = gpuarr__cast_side(src.dtype, dst.dtype) == GPUARR__CAST_AT_DEST ? src.dtype : dst.dtype;
    size_t msz = gpuarr__dtype_sizes[mid], bytes = n * msz;
    gpuarr__device_mem *stmp = NULL, *dtmp = NULL;
    gpuarr__view from = src, to = dst;
    gpuarr_result r = GPUARR_OK;
    if (src.dtype != mid && (r = gpuarr__temp_alloc(ss, bytes, &stmp)) == GPUARR_OK) {
        from = gpuarr__make_view(ss->dev, stmp->view, stmp->view_offset, mid);
        r = ss->dev->backend->cast(ss, stmp->view, stmp->view_offset, mid, src.mem, src.offset, src.dtype, n);
    }
    if (r == GPUARR_OK && dst.dtype != mid && (r = gpuarr__temp_alloc(ds, bytes, &dtmp)) == GPUARR_OK)
        to = gpuarr__make_view(ds->dev, dtmp->view, dtmp->view_offset, mid);
    gpuarr__dev *pd = gpuarr__bounce_pinned_dev(ss, ds);
    size_t chunk = GPUARR__MIN(GPUARR__STAGE_CHUNK, bytes);
    gpuarr__ring ring;
    if (r == GPUARR_OK && !async && bytes >= GPUARR__STAGE_MIN && gpuarr__ring_open(pd, chunk, (bytes + chunk - 1) / chunk, &ring))
        r = gpuarr__staged_bounce(ss, ds, pd, &ring, to.mem, to.offset, from.mem, from.offset, bytes);
    else if (r == GPUARR_OK)
        r = gpuarr__bounce_once(ss, ds, to.mem, to.offset, from.mem, from.offset, bytes, async);
    if (r == GPUARR_OK && dtmp) r = ds->dev->backend->cast(ds, dst.mem, dst.offset, dst.dtype, dtmp->view, dtmp->view_offset, mid, n);
    if (stmp) gpuarr__temp_free(ss, stmp);
    if (dtmp) gpuarr__temp_free(ds, dtmp);
    return r;
}

/* Any two views. On return every step has been enqueued (async: host steps are queued as host
   functions; synchronous: they are done), and *last is the stream that ran the final one: the
   data is in dst when *last has passed this point. */
static gpuarr_result gpuarr__move(gpuarr__stream *ss, gpuarr__stream *ds, gpuarr__view dst, gpuarr__view src, size_t n, bool async,
                                  gpuarr__stream **last) {
    gpuarr__dev *sd = src.dev, *dd = dst.dev;
    *last = ss;
    if (n == 0) return GPUARR_OK;
    GPUARR__TRACE_SCOPE(gpuarr__trace_transfer, ss, ds, &dst, &src, n, async);
    if (sd == dd) return gpuarr__move_local(ss, dst, src, n);
    if (gpuarr__backend_has(sd->backend, GPUARR__BACKEND_HOST_MEMORY)) {
        *last = ds;
        return gpuarr__upload(ds, dst, src, n, async);
    }
    if (gpuarr__backend_has(dd->backend, GPUARR__BACKEND_HOST_MEMORY)) return gpuarr__download(ss, dst, src, n, async);
    if (sd->backend == dd->backend && !gpuarr__g.no_peer_copies && gpuarr__backend_can_copy_peer(dd, sd))
        return gpuarr__move_peer(ss, ds, dst, src, n, last);
    *last = ds;
    return gpuarr__move_bounce(ss, ds, dst, src, n, async);
}

/* ---------------------------------------------------------------------------------------------
 * Running one conversion
 * ------------------------------------------------------------------------------------------- */
typedef struct gpuarr__transfer {
    gpuarr__view dst, src;
    size_t count;
    gpuarr__array *src_array;        /* waited for and kept alive while read; NULL = caller memory */
    gpuarr__array *dst_array;        /* kept alive while written; gets the ready event when async */
    bool dst_existing;               /* dst_array is published: wait for its readers and writers */
    gpuarr__stream *explicit_stream; /* the caller's stream, or NULL */
    bool async;
} gpuarr__transfer;

/* The one constructor: count elements from src to dst, each view's array (or NULL) beside it, on
   the caller's stream es (or NULL), synchronous or async. dst_existing starts false: a site
   writing into a published array sets it. */
static gpuarr__transfer gpuarr__transfer_make(gpuarr__view dst, gpuarr__array *dst_array, gpuarr__view src, gpuarr__array *src_array,
                                              size_t count, gpuarr__stream *es, bool async) {
    gpuarr__transfer t;
    memset(&t, 0, sizeof t);
    t.dst = dst;
    t.src = src;
    t.count = count;
    t.dst_array = dst_array;
    t.src_array = src_array;
    t.explicit_stream = es;
    t.async = async;
    return t;
}

/* Async: the result is valid once the last stream passes this point. Record that on the result,
   note the streams the arrays' memory is used on (so a release frees it in their order), keep
   caller memory (wrapped arrays) alive until then, and make the caller's stream wait for it
   too, so that "ready when the stream is" holds. */
static gpuarr_result gpuarr__transfer_finish_async(gpuarr__transfer *t, gpuarr__stream *ss, gpuarr__stream *ds, gpuarr__stream *last) {
    gpuarr__array *arrays[2] = {t->src_array, t->dst_array};
    for (int i = 0; i < 2; i++) {
        if (!arrays[i]) continue;
        gpuarr__array_note_use(arrays[i], ss);
        gpuarr__array_note_use(arrays[i], ds);
    }
    if (gpuarr__backend_has(last->dev->backend, GPUARR__BACKEND_SYNCHRONOUS)) return GPUARR_OK;
    gpuarr__event *ready;
    GPUARR__CHECK(gpuarr__event_new(last->dev, false, &ready));
    gpuarr_result r = gpuarr__event_record_raw(ready, last);
    if (r != GPUARR_OK) {
        gpuarr__obj_release(&ready->obj);
        return r;
    }
    if (t->dst_array) gpuarr__ready_set(t->dst_array, ready);
    else gpuarr__obj_release(&ready->obj);
    for (int i = 0; i < 2; i++) {
        if (!arrays[i] || !gpuarr__root(arrays[i])->wrapped) continue;
        gpuarr__obj_retain(&arrays[i]->obj);
        gpuarr__stream_defer(last, gpuarr__release_obj_deferred, &arrays[i]->obj);
    }
    if (t->explicit_stream && t->explicit_stream != last) r = gpuarr__stream_order(t->explicit_stream, last);
    return r;
}

/* The streams a was used on asynchronously, retained (at most GPUARR__POOL_EVENTS). */
static uint32_t gpuarr__array_uses(gpuarr__array *a, gpuarr__stream **uses) {
    gpuarr__array *root = gpuarr__root(a);
    pthread_mutex_t *lock = gpuarr__use_lock(root);
    pthread_mutex_lock(lock);
    uint32_t n = root->nuses;
    for (uint32_t i = 0; i < n; i++) {
        uses[i] = root->uses[i];
        gpuarr__obj_retain(&uses[i]->obj);
    }
    pthread_mutex_unlock(lock);
    return n;
}

/* Orders s after everything gpuarr queued that may still read or write a's memory: the work
   producing it and what is queued so far on the streams it was used on. */
static gpuarr_result gpuarr__order_after_uses(gpuarr__stream *s, gpuarr__array *a) {
    gpuarr__stream *uses[GPUARR__POOL_EVENTS];
    uint32_t n = gpuarr__array_uses(a, uses);
    gpuarr__event *ready = gpuarr__ready_get(a);
    gpuarr_result r = ready ? gpuarr__stream_wait_raw(s, ready) : GPUARR_OK;
    for (uint32_t i = 0; i < n; i++) {
        if (r == GPUARR_OK) r = gpuarr__stream_order(s, uses[i]);
        gpuarr__obj_release(&uses[i]->obj);
    }
    if (ready) gpuarr__obj_release(&ready->obj);
    return r;
}

/* Before writing into an existing array: the streams that may write it (those of a device; the
   host's only when both are the host's) wait for its earlier readers and writers. */
static gpuarr_result gpuarr__order_writers(gpuarr__stream *ss, gpuarr__stream *ds, gpuarr__array *dst) {
    bool ss_device = !gpuarr__backend_has(ss->dev->backend, GPUARR__BACKEND_SYNCHRONOUS), ds_device = !gpuarr__backend_has(ds->dev->backend, GPUARR__BACKEND_SYNCHRONOUS);
    gpuarr_result r = GPUARR_OK;
    if (ss_device || !ds_device) r = gpuarr__order_after_uses(ss, dst);
    if (r == GPUARR_OK && ds != ss && (ds_device || !ss_device)) r = gpuarr__order_after_uses(ds, dst);
    return r;
}

static gpuarr_result gpuarr__transfer_run(gpuarr__transfer *t) {
    GPUARR__TRACE_SCOPE(gpuarr__trace_call, t->dst.dev, t->src.dev, t->count, t->async);
    gpuarr__stream *ss = NULL, *ds = NULL, *last = NULL;
    gpuarr_result r = gpuarr__stream_for(t->src.dev, t->explicit_stream, &ss);
    if (r == GPUARR_OK) r = gpuarr__stream_for(t->dst.dev, t->explicit_stream, &ds);
    /* the source's producer: an async upload's stream waits for it (a pending host array), never the caller */
    gpuarr__stream *reader = t->async && gpuarr__backend_has(t->src.dev->backend, GPUARR__BACKEND_HOST_MEMORY) ? ds : ss;
    gpuarr__event *src_ready = r == GPUARR_OK && t->src_array ? gpuarr__ready_get(t->src_array) : NULL;
    if (src_ready) {
        r = gpuarr__stream_wait_raw(reader, src_ready);
        gpuarr__obj_release(&src_ready->obj);
    }
    if (r == GPUARR_OK && t->dst_existing) r = gpuarr__order_writers(ss, ds, t->dst_array);
    if (r == GPUARR_OK) r = gpuarr__move(ss, ds, t->dst, t->src, t->count, t->async, &last);
    if (r == GPUARR_OK && !t->async) r = gpuarr__stream_sync_raw(last);
    if (r == GPUARR_OK && t->async) r = gpuarr__transfer_finish_async(t, ss, ds, last);
    if (r != GPUARR_OK) { /* nothing may still be reading or writing once we report failure */
        if (ss) gpuarr__stream_sync_keep(ss, r);
        if (ds && ds != ss) gpuarr__stream_sync_keep(ds, r);
    }
    if (ss) gpuarr__obj_release(&ss->obj);
    if (ds) gpuarr__obj_release(&ds->obj);
    return r;
}

static gpuarr__view gpuarr__array_view(gpuarr__array *a) { return gpuarr__make_view(a->dev, a->mem, a->offset, a->dtype); }

/* An identity conversion returns the source itself; if the source is still being produced, the
   same promise holds as for a copy: synchronous calls wait for it, async ones order the stream
   after it. */
static gpuarr_result gpuarr__identity_ready(gpuarr__array *a, gpuarr__stream *explicit_stream, bool async) {
    gpuarr__event *ready = gpuarr__ready_get(a);
    if (!ready) return GPUARR_OK;
    gpuarr__stream *s = NULL;
    gpuarr_result r;
    if (!async) r = gpuarr__backend_event_sync(ready->dev, ready->native);
    else if ((r = gpuarr__stream_for(a->dev, explicit_stream, &s)) == GPUARR_OK) r = gpuarr__stream_wait_raw(s, ready);
    if (s) gpuarr__obj_release(&s->obj);
    gpuarr__obj_release(&ready->obj);
    return r;
}

/* A conversion of a to d in dt into a new array, not yet behind a handle: *out, or NULL on
   failure. Written on es (NULL: this thread's stream of d), synchronously or async. */
static gpuarr_result gpuarr__convert_private(gpuarr__array *a, gpuarr__dev *d, gpuarr_dtype dt, gpuarr__stream *es, bool async,
                                             gpuarr__array **out) {
    gpuarr__stream *writer;
    *out = NULL;
    GPUARR__CHECK(gpuarr__stream_for(d, es, &writer));
    gpuarr_result r = gpuarr__array_new(d, dt, a->ndim, a->shape, writer, out);
    gpuarr__obj_release(&writer->obj);
    if (r != GPUARR_OK) return r;
    gpuarr__transfer tr = gpuarr__transfer_make(gpuarr__array_view(*out), *out, gpuarr__array_view(a), a, (size_t)a->count, es, async);
    r = gpuarr__transfer_run(&tr);
    if (r != GPUARR_OK) {
        gpuarr__obj_release(&(*out)->obj);
        *out = NULL;
    }
    return r;
}

/* gpuarr_convert's arguments beside src (a): dst, the dtype (0 = a's) and the caller's stream,
   which must be on a's device or on dst. */
static gpuarr_result gpuarr__convert_args(gpuarr__array *a, gpuarr_device dst, gpuarr_dtype t, gpuarr_stream stream, gpuarr__dev **d,
                                          gpuarr__stream **es) {
    GPUARR__CHECK(gpuarr__get_dev(dst, "dst", d));
    if (!gpuarr__dtype_valid(t ? t : a->dtype)) return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "t = %d is not a gpuarr_dtype", (int)t);
    if (!stream.id) return GPUARR_OK;
    GPUARR__CHECK(gpuarr__get_stream(stream, "s", es));
    if ((*es)->dev == a->dev || (*es)->dev == *d) return GPUARR_OK;
    return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "s belongs to %s, which is neither src's device (%s) nor dst (%s)",
                        (*es)->dev->info.spec, a->dev->info.spec, (*d)->info.spec);
}

/* A conversion put behind a new handle: gpuarr__convert_private, then published. An identity
   conversion returns src itself, retained. */
static gpuarr_result gpuarr__convert(gpuarr_array src, gpuarr_device dst, gpuarr_dtype t, gpuarr_stream stream,
                                     bool async, gpuarr_array *out) {
    GPUARR__REQUIRE_PTR(out);
    gpuarr__array *a = NULL, *b = NULL;
    gpuarr__stream *es = NULL;
    gpuarr__dev *d = NULL;
    GPUARR__CHECK(gpuarr__get_array(src, "src", &a));
    gpuarr_dtype dt = t ? t : a->dtype;
    gpuarr_result r = gpuarr__convert_args(a, dst, t, stream, &d, &es);
    uint32_t id = 0;
    if (r == GPUARR_OK && d == a->dev && dt == a->dtype) { /* identity: the same array, retained */
        r = gpuarr__identity_ready(a, es, async);
        if (r == GPUARR_OK) r = gpuarr__table_retain(&gpuarr__g.arrays, src.id, "src");
        id = src.id;
    } else if (r == GPUARR_OK) {
        r = gpuarr__route_check(a->dev, d, a->dtype, dt);
        if (r == GPUARR_OK) r = gpuarr__convert_private(a, d, dt, es, async, &b);
        if (r == GPUARR_OK) r = gpuarr__array_publish(b, &id); /* on failure b is dropped */
    }
    if (es) gpuarr__obj_release(&es->obj);
    gpuarr__obj_release(&a->obj);
    if (r == GPUARR_OK) out->id = id;
    return r;
}

/* ---------------------------------------------------------------------------------------------
 * Configuration: desc fields, then the environment
 * ------------------------------------------------------------------------------------------- */
static bool gpuarr__streq_nocase(const char *a, const char *b) {
    for (; *a && *b; a++, b++) {
        int ca = *a >= 'A' && *a <= 'Z' ? *a + 32 : *a, cb = *b >= 'A' && *b <= 'Z' ? *b + 32 : *b;
        if (ca != cb) return false;
    }
    return *a == *b;
}

/* A decimal number 0..max with nothing after it. */
static bool gpuarr__parse_uint(const char *s, size_t len, long max, long *out) {
    if (len == 0 || len > 9) return false;
    long v = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9') return false;
        v = v * 10 + (s[i] - '0');
    }
    if (v > max) return false;
    *out = v;
    return true;
}

/* ---- the GPUARR_* variables (GPUARR__SETTING_LIST): one check each, one case rule ---- */
#define GPUARR__SETTING_MAX_TEXT 480 /* longer values would be cut short (build options, paths) */

/* words[i] gives values[i]. The one case rule: keywords compare case-insensitively. */
static gpuarr_result gpuarr__check_keyword(const char *name, const char *value, const char *const *words, const int *values,
                                           int n, const char *expected, int *out) {
    for (int i = 0; i < n; i++)
        if (gpuarr__streq_nocase(value, words[i])) {
            *out = values[i];
            return GPUARR_OK;
        }
    return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "%s=\"%s\": expected %s", name, value, expected);
}

/* Free text (paths, filters, options), taken as written. */
static gpuarr_result gpuarr__check_text(const char *name, const char *value, int *out) {
    *out = 1;
    size_t len = strlen(value);
    if (len > GPUARR__SETTING_MAX_TEXT)
        return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "%s: the value is %zu characters long; at most %d are accepted", name, len,
                            GPUARR__SETTING_MAX_TEXT);
    return GPUARR_OK;
}

static gpuarr_result gpuarr__check_flag(const char *name, const char *value, int *out) {
    static const char *const words[] = {"on", "off", "1", "0", "true", "false", "yes", "no"};
    static const int values[] = {1, 0, 1, 0, 1, 0, 1, 0};
    return gpuarr__check_keyword(name, value, words, values, 8, "on or off (also 1/0, true/false, yes/no)", out);
}

static gpuarr_result gpuarr__check_log(const char *name, const char *value, int *out) {
    static const char *const words[] = {"off", "error", "warn", "warning", "info", "debug"};
    static const int values[] = {GPUARR_LOG_OFF, GPUARR_LOG_ERROR, GPUARR_LOG_WARN, GPUARR_LOG_WARN, GPUARR_LOG_INFO, GPUARR_LOG_DEBUG};
    return gpuarr__check_keyword(name, value, words, values, 6, "off, error, warn, info or debug", out);
}

static gpuarr_result gpuarr__check_threads(const char *name, const char *value, int *out) {
    long v;
    if (!gpuarr__parse_uint(value, strlen(value), 256, &v) || v < 1)
        return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "%s=\"%s\": expected a number from 1 to 256", name, value);
    *out = (int)v;
    return GPUARR_OK;
}

static gpuarr_result gpuarr__check_host_isa(const char *name, const char *value, int *out) {
    static const char *const words[] = {"auto", "baseline", "avx2"};
    static const int values[] = {GPUARR__ISA_AUTO, GPUARR__ISA_BASELINE, GPUARR__ISA_AVX2};
    return gpuarr__check_keyword(name, value, words, values, 3, "auto, baseline or avx2", out);
}

static gpuarr_result gpuarr__check_cuda_kernels(const char *name, const char *value, int *out) {
    static const char *const words[] = {"auto", "ptx", "nvrtc"};
    static const int values[] = {GPUARR__KERNELS_AUTO, GPUARR__KERNELS_PTX, GPUARR__KERNELS_NVRTC};
    return gpuarr__check_keyword(name, value, words, values, 3, "auto, ptx or nvrtc", out);
}

/* "off" (value 0) or an absolute path (value 1): a relative one would move with the working
   directory. */
static gpuarr_result gpuarr__check_cache_dir(const char *name, const char *value, int *out) {
    if (gpuarr__streq_nocase(value, "off")) {
        *out = 0;
        return GPUARR_OK;
    }
    if (value[0] != '/')
        return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "%s=\"%s\": expected off or an absolute path", name, value);
    return gpuarr__check_text(name, value, out);
}

static const char *gpuarr__setting(gpuarr__setting_id id) { return gpuarr__g.config.text[id]; }

/* The parsed value of a variable that is set, else `unset`. */
static int gpuarr__setting_value(gpuarr__setting_id id, int unset) {
    return gpuarr__g.config.text[id] ? gpuarr__g.config.value[id] : unset;
}

/* A desc field that is set takes the place of its variable, which is then not read at all. */
static bool gpuarr__desc_replaces(const gpuarr_desc *d, gpuarr__setting_id id) {
    return (id == GPUARR__SET_DEVICES && d->devices) || (id == GPUARR__SET_LOG && d->log_level) ||
           (id == GPUARR__SET_THREADS && d->host_threads) || (id == GPUARR__SET_ALLOC_CONF && d->alloc_conf) || (id == GPUARR__SET_SLOTS && d->slots);
}

/* The rows of GPUARR__SETTING_LIST, by gpuarr__setting_id. */
static const struct {
    const char *name;
    gpuarr__setting_check check;
    gpuarr__env_trust trust;
} gpuarr__settings[GPUARR__SETTING_COUNT] = {
#define GPUARR__SETTING_ROW(NAME, check, trust) {"GPUARR_" #NAME, check, GPUARR__ENV_##trust},
    GPUARR__SETTING_LIST(GPUARR__SETTING_ROW)
#undef GPUARR__SETTING_ROW
};

/* The check of setting id: the core's, or the one a layer registered (none: kept as text). */
static gpuarr__setting_check gpuarr__setting_checker(gpuarr__setting_id id) {
    if (gpuarr__settings[id].check) return gpuarr__settings[id].check;
    for (int i = 0; i < gpuarr__g.layer_count; i++)
        for (size_t k = 0; k < sizeof gpuarr__g.layers[i].settings / sizeof gpuarr__g.layers[i].settings[0]; k++)
            if (gpuarr__g.layers[i].settings[k].check && gpuarr__g.layers[i].settings[k].id == id) return gpuarr__g.layers[i].settings[k].check;
    return gpuarr__check_text;
}

/* Reads, checks and keeps every GPUARR_* variable (an empty one counts as unset). */
static gpuarr_result gpuarr__read_settings(const gpuarr_desc *d) {
    for (int i = 0; i < GPUARR__SETTING_COUNT; i++) {
        const char *v = gpuarr__env(gpuarr__settings[i].name, gpuarr__settings[i].trust);
        if (!v || !*v || gpuarr__desc_replaces(d, (gpuarr__setting_id)i)) continue;
        GPUARR__CHECK(gpuarr__setting_checker((gpuarr__setting_id)i)(gpuarr__settings[i].name, v, &gpuarr__g.config.value[i]));
        if (!(gpuarr__g.config.text[i] = gpuarr__strdup(v)))
            return gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY, "no host memory for a copy of %s", gpuarr__settings[i].name);
    }
    return GPUARR_OK;
}

/* In a privileged process, each variable set there that gpuarr does not honour, once per
   gpuarr_init. A GPUARR_* one was set for gpuarr, so its loss is a warning; the others are in
   most environments whoever starts the program, so a note at info level. */
static void gpuarr__log_ignored_env(void) {
    static const char *const why = "this process is privileged (setuid, setgid or file capabilities), and gpuarr takes no path, "
                                   "library, compiler option or test hook from its environment (see CONFIGURATION)";
    static const struct {
        const char *name, *effect;
        gpuarr_log_level level;
    } others[] = {{"GPUARR_MPI_CUDA_AWARE", "MPI's own answer is used", GPUARR_LOG_WARN},
                  {"HOME", "no kernel cache", GPUARR_LOG_INFO},
                  {"XDG_CACHE_HOME", "no kernel cache", GPUARR_LOG_INFO},
                  {"XDG_RUNTIME_DIR", "lease files under /tmp", GPUARR_LOG_INFO},
                  {"CUDA_HOME", "NVRTC only from the loader's paths and /usr/local/cuda", GPUARR_LOG_INFO}};
    if (!gpuarr__privileged()) return;
    for (int i = 0; i < GPUARR__SETTING_COUNT; i++) /* KEPT: only whether it is set */
        if (gpuarr__settings[i].trust == GPUARR__ENV_IGNORED && gpuarr__env(gpuarr__settings[i].name, GPUARR__ENV_KEPT))
            gpuarr__log(GPUARR_LOG_WARN, "gpuarr_init: %s is ignored: %s", gpuarr__settings[i].name, why);
    for (size_t i = 0; i < sizeof others / sizeof *others; i++)
        if (gpuarr__env(others[i].name, GPUARR__ENV_KEPT))
            gpuarr__log(others[i].level, "gpuarr_init: %s is ignored (%s): %s", others[i].name, others[i].effect, why);
}

/* GPUARR_CACHE_DIR, else $XDG_CACHE_HOME/gpuarr, else $HOME/.cache/gpuarr; "off": none. */
static void gpuarr__resolve_cache_dir(void) {
    char *out = gpuarr__g.config.cache_dir;
    size_t cap = sizeof gpuarr__g.config.cache_dir;
    const char *dir = gpuarr__setting(GPUARR__SET_CACHE_DIR), *xdg = gpuarr__env("XDG_CACHE_HOME", GPUARR__ENV_IGNORED),
               *home = gpuarr__env("HOME", GPUARR__ENV_IGNORED);
    out[0] = '\0';
    if (dir) {
        if (gpuarr__setting_value(GPUARR__SET_CACHE_DIR, 1)) gpuarr__copy_string(out, cap, dir);
    } else if (xdg && *xdg) {
        snprintf(out, cap, "%s/gpuarr", xdg);
    } else if (home && *home) {
        snprintf(out, cap, "%s/.cache/gpuarr", home);
    }
}

/* "<backend>", "<backend>:N" or (allow_star) "<backend>:*". index -1 = unspecified / every. */
static bool gpuarr__parse_backend_spec(const char *s, size_t len, bool allow_star, gpuarr_backend *backend, int *index) {
    for (int b = 1; b < GPUARR_BACKEND_COUNT; b++) {
        const char *name = gpuarr__backend_names[b];
        size_t n = strlen(name);
        if (len < n || strncmp(s, name, n) != 0) continue;
        *backend = (gpuarr_backend)b;
        *index = -1;
        if (len == n) return true;
        if (s[n] != ':') continue;
        if (allow_star && len == n + 2 && s[n + 1] == '*') return true;
        long v;
        if (!gpuarr__parse_uint(s + n + 1, len - n - 1, 1000000, &v)) return false;
        *index = (int)v;
        return true;
    }
    return false;
}

static gpuarr_result gpuarr__parse_filter(const char *text) {
    int items = 1;
    for (const char *p = text; *p; p++) items += *p == ',';
    gpuarr__filter_item *f = (gpuarr__filter_item *)gpuarr__calloc(sizeof *f * (size_t)items);
    char *copy = gpuarr__strdup(text);
    if (!f || !copy) {
        gpuarr__free(f);
        gpuarr__free(copy);
        return gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY, "no host memory for the device filter");
    }
    int n = 0;
    for (const char *p = text;;) {
        size_t len = strcspn(p, ",");
        while (len && p[0] == ' ') p++, len--;
        while (len && p[len - 1] == ' ') len--;
        if (!gpuarr__parse_backend_spec(p, len, true, &f[n].backend, &f[n].index)) {
            gpuarr__free(f);
            gpuarr__free(copy);
            return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT,
                                "GPUARR_DEVICES=\"%s\": item \"%.*s\" is not host, cuda, cuda:N, cuda:*, opencl, opencl:N or opencl:*",
                                text, (int)len, p);
        }
        n++;
        p += strcspn(p, ",");
        if (!*p) break;
        p++;
    }
    gpuarr__g.filter = f;
    gpuarr__g.filter_count = n;
    gpuarr__g.devices_filter = copy;
    return GPUARR_OK;
}

static bool gpuarr__filter_allows(gpuarr_backend b, int index) {
    if (gpuarr__backend_builtin(b) || !gpuarr__g.filter) return true;
    for (int i = 0; i < gpuarr__g.filter_count; i++)
        if (gpuarr__g.filter[i].backend == b && (gpuarr__g.filter[i].index < 0 || gpuarr__g.filter[i].index == index)) return true;
    return false;
}

static bool gpuarr__filter_mentions(gpuarr_backend b) {
    if (gpuarr__backend_builtin(b) || !gpuarr__g.filter) return true;
    for (int i = 0; i < gpuarr__g.filter_count; i++)
        if (gpuarr__g.filter[i].backend == b) return true;
    return false;
}


/* "123", "64K", "512MiB", "2G": bytes (K/M/G/T = powers of 1024). */
static bool gpuarr__parse_bytes(const char *s, size_t len, uint64_t *out) {
    size_t i = 0;
    uint64_t v = 0;
    for (; i < len && s[i] >= '0' && s[i] <= '9'; i++) {
        if (v > (UINT64_MAX - 9) / 10) return false;
        v = v * 10 + (uint64_t)(s[i] - '0');
    }
    if (i == 0) return false;
    unsigned shift = 0;
    if (i < len) {
        char u = s[i] >= 'a' ? (char)(s[i] - 32) : s[i];
        shift = u == 'K' ? 10u : u == 'M' ? 20u : u == 'G' ? 30u : u == 'T' ? 40u : 99u;
        if (shift == 99u) return false;
        i++;
        if (i < len && (s[i] == 'i' || s[i] == 'I')) i++;
        if (i < len && (s[i] == 'b' || s[i] == 'B')) i++;
    }
    if (i != len || (shift && v > (UINT64_MAX >> shift))) return false;
    *out = v << shift;
    return true;
}

/* GPUARR_ALLOC_CONF / desc.alloc_conf: "key:value,..." with keys limit and host_limit (bytes or
   N%), release_threshold (bytes; "none" = never), max_split_size (bytes; 0 = split any block),
   caching (0/1), host_fallback (0/1, overriding desc.oom_host_fallback). An unknown key or a bad
   value fails gpuarr_init. */
static gpuarr_result gpuarr__parse_alloc_conf(const char *text) {
    for (const char *p = text; *p;) {
        size_t len = strcspn(p, ",");
        const char *colon = (const char *)memchr(p, ':', len);
        if (!colon)
            return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "GPUARR_ALLOC_CONF: \"%.*s\" is not key:value", (int)len, p);
        size_t klen = (size_t)(colon - p), vlen = len - klen - 1;
        const char *v = colon + 1;
        uint64_t n = 0;
        bool ok = true;
#define GPUARR__KEY(name) (klen == sizeof(name) - 1 && strncmp(p, name, klen) == 0)
        if (GPUARR__KEY("limit") || GPUARR__KEY("host_limit")) {
            int host = GPUARR__KEY("host_limit");
            if (vlen > 1 && v[vlen - 1] == '%') {
                long pct = 0;
                ok = gpuarr__parse_uint(v, vlen - 1, 100, &pct) && pct > 0;
                gpuarr__g.alloc_conf.limit_percent[host] = (uint32_t)pct;
            } else {
                ok = gpuarr__parse_bytes(v, vlen, &n);
                gpuarr__g.alloc_conf.limit_bytes[host] = n;
            }
        } else if (GPUARR__KEY("release_threshold")) {
            if (vlen == 4 && strncmp(v, "none", 4) == 0) n = UINT64_MAX;
            else ok = gpuarr__parse_bytes(v, vlen, &n);
            gpuarr__g.alloc_conf.release_threshold = n;
        } else if (GPUARR__KEY("max_split_size")) {
            ok = gpuarr__parse_bytes(v, vlen, &n);
            gpuarr__g.alloc_conf.max_split = n;
        } else if (GPUARR__KEY("caching") || GPUARR__KEY("host_fallback")) {
            ok = vlen == 1 && (v[0] == '0' || v[0] == '1');
            if (GPUARR__KEY("caching")) gpuarr__g.alloc_conf.caching = v[0] == '1';
            else gpuarr__g.alloc_conf.host_fallback = v[0] == '1';
        } else {
            return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT,
                                "GPUARR_ALLOC_CONF: unknown key \"%.*s\" (known: limit, host_limit, release_threshold, max_split_size, "
                                "caching, host_fallback)",
                                (int)klen, p);
        }
#undef GPUARR__KEY
        if (!ok) return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "GPUARR_ALLOC_CONF: bad value in \"%.*s\"", (int)len, p);
        p += len;
        if (*p) p++;
    }
    return GPUARR_OK;
}

static gpuarr_result gpuarr__resolve_config(const gpuarr_desc *d) {
    if (!d->allocator.alloc_fn != !d->allocator.free_fn)
        return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "desc->allocator: set both alloc_fn and free_fn, or neither");
    if ((int)d->log_level < 0 || d->log_level >= GPUARR_LOG_LEVEL_COUNT)
        return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "desc->log_level = %d is not a gpuarr_log_level", (int)d->log_level);
    if (d->host_threads < 0 || d->host_threads > 256)
        return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "desc->host_threads = %d: must be 0 (default) or 1..256", d->host_threads);
    gpuarr__g.allocator = d->allocator;
    gpuarr__g.logger = d->logger;
    GPUARR__CHECK(gpuarr__read_settings(d));
    gpuarr__g.log_level = d->log_level ? d->log_level : (gpuarr_log_level)gpuarr__setting_value(GPUARR__SET_LOG, GPUARR_LOG_WARN);
    gpuarr__log_ignored_env();
    gpuarr__g.host_threads = d->host_threads ? d->host_threads : gpuarr__setting_value(GPUARR__SET_THREADS, 0);
    if (!gpuarr__g.host_threads) {
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        gpuarr__g.host_threads = cpus < 1 ? 1 : cpus > 64 ? 64 : (int)cpus;
    }
    gpuarr__g.no_peer_copies = !gpuarr__setting_value(GPUARR__SET_PEER_COPIES, 1);
    gpuarr__resolve_cache_dir();
    const char *filter = d->devices ? d->devices : gpuarr__setting(GPUARR__SET_DEVICES);
    if (filter) GPUARR__CHECK(gpuarr__parse_filter(filter));
    gpuarr__g.alloc_conf.caching = true;
    gpuarr__g.alloc_conf.release_threshold = UINT64_MAX;
    gpuarr__g.alloc_conf.host_fallback = d->oom_host_fallback;
    if (d->alloc_conf && !(gpuarr__g.config.text[GPUARR__SET_ALLOC_CONF] = gpuarr__strdup(d->alloc_conf)))
        return gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY, "no host memory for a copy of desc->alloc_conf");
    const char *conf = gpuarr__setting(GPUARR__SET_ALLOC_CONF); /* the desc's, else the variable's */
    if (conf) GPUARR__CHECK(gpuarr__parse_alloc_conf(conf));
    if (d->slots) {
        GPUARR__CHECK(gpuarr__setting_checker(GPUARR__SET_SLOTS)("desc->slots", d->slots, &gpuarr__g.config.value[GPUARR__SET_SLOTS]));
        if (!(gpuarr__g.config.text[GPUARR__SET_SLOTS] = gpuarr__strdup(d->slots)))
            return gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY, "no host memory for a copy of desc->slots");
    }
    return GPUARR_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Registry
 * ------------------------------------------------------------------------------------------- */
static bool gpuarr__same_physical(const gpuarr_device_info *a, const gpuarr_device_info *b) {
    if (a->has_uuid && b->has_uuid) return memcmp(a->uuid, b->uuid, sizeof a->uuid) == 0;
    return a->has_pci && b->has_pci && a->pci_domain == b->pci_domain && a->pci_bus == b->pci_bus &&
           a->pci_device == b->pci_device && a->pci_function == b->pci_function;
}

/* A GPU reached through two backends counts once: the earlier backend in the list (CUDA before
   OpenCL) represents it. */
static bool gpuarr__is_duplicate(const gpuarr__dev *d) {
    if (!d->info.same_as.id) return false;
    const gpuarr__dev *other = &gpuarr__g.devices[(d->info.same_as.id & 0xffffu) - 1u];
    return other->info.backend < d->info.backend;
}

static bool gpuarr__better_gpu(const gpuarr_device_info *a, const gpuarr_device_info *b) {
    double sa = (double)a->compute_units * (a->clock_mhz > 0 ? a->clock_mhz : 1);
    double sb = (double)b->compute_units * (b->clock_mhz > 0 ? b->clock_mhz : 1);
    if (sa != sb) return sa > sb;
    return a->total_memory > b->total_memory;
}

static void gpuarr__registry_link(void) {
    gpuarr__g.best_gpu = -1;
    for (int i = 0; i < gpuarr__g.device_count; i++)
        for (int j = i + 1; j < gpuarr__g.device_count; j++) {
            gpuarr_device_info *a = &gpuarr__g.devices[i].info, *b = &gpuarr__g.devices[j].info;
            if (a->backend != b->backend && gpuarr__same_physical(a, b)) {
                a->same_as = b->device;
                b->same_as = a->device;
            }
        }
    for (int i = 0; i < gpuarr__g.device_count; i++) {
        const gpuarr__dev *d = &gpuarr__g.devices[i];
        if (d->info.type != GPUARR_DEVICE_TYPE_GPU || gpuarr__is_duplicate(d)) continue;
        if (gpuarr__g.best_gpu < 0 || gpuarr__better_gpu(&d->info, &gpuarr__g.devices[gpuarr__g.best_gpu].info))
            gpuarr__g.best_gpu = i;
    }
}

/* Fills row `row` of the registry with device `index` of b (not yet counted). */
static gpuarr_result gpuarr__registry_fill(int row, const gpuarr__backend *b, int index) {
    gpuarr__dev *d = &gpuarr__g.devices[row];
    memset(d, 0, sizeof *d);
    gpuarr_result r = b->device_info(index, &d->info);
    if (r != GPUARR_OK) return r;
    d->backend = b;
    d->view = row;
    d->info.backend = b->id;
    d->info.index = index;
    d->info.device = gpuarr__device_handle(row);
    if (gpuarr__backend_has(b, GPUARR__BACKEND_BUILTIN)) snprintf(d->info.spec, sizeof d->info.spec, "%s", b->name);
    else snprintf(d->info.spec, sizeof d->info.spec, "%s:%d", b->name, index);
    pthread_mutex_init(&d->lock, NULL);
    gpuarr__pool_init(&d->pool, d, false);
    gpuarr__pool_init(&d->pinned, d, true);
    return GPUARR_OK;
}

static gpuarr_result gpuarr__registry_add(const gpuarr__backend *b, int index) {
    GPUARR__CHECK(gpuarr__registry_fill(gpuarr__g.device_count, b, index));
    gpuarr__g.device_count++;
    return GPUARR_OK;
}

/* A device filter item naming a device this machine does not have is a likely typo: say so. */
static void gpuarr__warn_absent_filter_items(const int *counts) {
    for (int i = 0; i < gpuarr__g.filter_count; i++) {
        const gpuarr__filter_item *f = &gpuarr__g.filter[i];
        if (gpuarr__backend_builtin(f->backend) || (f->index < 0 ? counts[f->backend] > 0 : f->index < counts[f->backend])) continue;
        char item[32];
        if (f->index < 0) snprintf(item, sizeof item, "%s", gpuarr__backend_names[f->backend]);
        else snprintf(item, sizeof item, "%s:%d", gpuarr__backend_names[f->backend], f->index);
        gpuarr__log(GPUARR_LOG_WARN, "the device filter \"%s\" names %s, but this machine has %d %s devices%s%s", gpuarr__g.devices_filter,
                    item, counts[f->backend], gpuarr__backend_names[f->backend], gpuarr__g.backend_error[f->backend][0] ? ": " : "",
                    gpuarr__g.backend_error[f->backend]);
    }
}

static gpuarr_result gpuarr__registry_build(void) {
    int capacity = 0, counts[GPUARR_BACKEND_COUNT] = {0};
    for (int i = 1; i < GPUARR_BACKEND_COUNT; i++) {
        const gpuarr__backend *b = gpuarr__backend_get((gpuarr_backend)i);
        if (!b || !gpuarr__filter_mentions(b->id)) continue;
        gpuarr_result r = gpuarr__backend_load(b);
        if (r == GPUARR_ERROR_OUT_OF_MEMORY || (r != GPUARR_OK && gpuarr__backend_has(b, GPUARR__BACKEND_BUILTIN))) return r; /* the host must load */
        if (r != GPUARR_OK) { /* its library is missing (UNSUPPORTED) or broken: zero devices */
            gpuarr__copy_string(gpuarr__g.backend_error[i], sizeof gpuarr__g.backend_error[i], gpuarr__tls.error_detail);
            gpuarr__log(r == GPUARR_ERROR_UNSUPPORTED ? GPUARR_LOG_INFO : GPUARR_LOG_WARN, "the %s backend is unavailable: %s",
                        b->name, gpuarr__g.backend_error[i]);
            continue;
        }
        gpuarr__g.backend_loaded[i] = true;
        counts[i] = b->device_count();
        capacity += counts[i];
    }
    gpuarr__g.devices = (gpuarr__dev *)gpuarr__calloc(sizeof(gpuarr__dev) * (size_t)(GPUARR__MAX(capacity, 1) + GPUARR__ADOPT_MAX));
    if (!gpuarr__g.devices) return gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY, "no host memory for the device registry");
    for (int i = 1; i < GPUARR_BACKEND_COUNT; i++) {
        if (!gpuarr__g.backend_loaded[i]) continue;
        const gpuarr__backend *b = gpuarr__backend_get((gpuarr_backend)i);
        for (int k = 0; k < counts[i]; k++) {
            if (!gpuarr__filter_allows(b->id, k)) continue;
            gpuarr_result r = gpuarr__registry_add(b, k);
            if (r == GPUARR_ERROR_OUT_OF_MEMORY) return r;
            if (r != GPUARR_OK) gpuarr__log(GPUARR_LOG_WARN, "skipping %s device %d: %s", b->name, k, gpuarr_last_error());
        }
    }
    gpuarr__warn_absent_filter_items(counts);
    gpuarr__registry_link();
    return GPUARR_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Lifecycle
 * ------------------------------------------------------------------------------------------- */
/* The registration list (at the end of the implementation, after the layers). */
static void gpuarr__layer_list(void (*add)(void (*fill)(gpuarr__layer *)));

static void gpuarr__layer_add(void (*fill)(gpuarr__layer *)) {
    if (gpuarr__g.layer_count == GPUARR__LAYER_MAX) return; /* GPUARR__LAYER_MAX is checked where the list is */
    gpuarr__layer *l = &gpuarr__g.layers[gpuarr__g.layer_count++];
    l->id = fill;
    fill(l);
}

/* The state a layer keeps from its start to its stop, found by its fill function. The core keeps
   it (zeroed at teardown) and never reads it. NULL before the layer starts. */
static void **gpuarr__layer_state_slot(void (*id)(gpuarr__layer *)) {
    for (int i = 0; i < gpuarr__g.layer_count; i++)
        if (gpuarr__g.layers[i].id == id) return &gpuarr__g.layer_state[i];
    return NULL;
}
GPUARR__FOR_BACKENDS static void *gpuarr__layer_state(void (*id)(gpuarr__layer *)) {
    void **slot = gpuarr__layer_state_slot(id);
    return slot ? *slot : NULL;
}
GPUARR__FOR_BACKENDS static void gpuarr__layer_state_set(void (*id)(gpuarr__layer *), void *state) {
    void **slot = gpuarr__layer_state_slot(id);
    if (slot) *slot = state;
}

/* Once per process, under init_lock: the layers' table outlives every shutdown. */
static void gpuarr__layers_register(void) {
    if (!gpuarr__g.layer_count) gpuarr__layer_list(gpuarr__layer_add);
}

static gpuarr_result gpuarr__layers_start(void) {
    for (int i = 0; i < gpuarr__g.layer_count; i++)
        if (gpuarr__g.layers[i].start) GPUARR__CHECK(gpuarr__g.layers[i].start());
    return GPUARR_OK;
}

static void gpuarr__layers_stop(void) {
    for (int i = gpuarr__g.layer_count - 1; i >= 0; i--)
        if (gpuarr__g.layers[i].stop) gpuarr__g.layers[i].stop();
}

static bool gpuarr__layers_find_device(const char *spec, gpuarr__dev **out, gpuarr_result *r) {
    for (int i = 0; i < gpuarr__g.layer_count; i++)
        if (gpuarr__g.layers[i].find_device && gpuarr__g.layers[i].find_device(spec, out, r)) return true;
    return false;
}

static void gpuarr__teardown(void) {
    gpuarr__holds_release();
    uint32_t arrays = gpuarr__g.arrays.capacity ? gpuarr__table_destroy(&gpuarr__g.arrays) : 0;
    uint32_t events = gpuarr__g.events.capacity ? gpuarr__table_destroy(&gpuarr__g.events) : 0;
    uint32_t streams = gpuarr__g.streams.capacity ? gpuarr__table_destroy(&gpuarr__g.streams) : 0;
    if (arrays || events || streams)
        gpuarr__log(GPUARR_LOG_WARN, "gpuarr_shutdown freed %u arrays, %u streams and %u events that were never released",
                    arrays, streams, events);
    pthread_mutex_lock(&gpuarr__g.defaults_lock);
    gpuarr__stream *defaults = gpuarr__detach_thread_streams(0);
    pthread_mutex_unlock(&gpuarr__g.defaults_lock);
    gpuarr__release_stream_list(defaults);
    gpuarr__layers_stop();
    for (int i = 0; i < gpuarr__devices_total(); i++) {
        gpuarr__dev *d = &gpuarr__g.devices[i];
        gpuarr__pool_destroy(&d->pinned);
        gpuarr__pool_destroy(&d->pool);
        if (d->opened) gpuarr__backend_device_close(d);
        if (d->info.adopted && !d->removed) d->backend->device_forget(d); /* the caller's context goes back */
        pthread_mutex_destroy(&d->lock);
    }
    for (int i = GPUARR_BACKEND_COUNT - 1; i > 0; i--)
        if (gpuarr__g.backend_loaded[i]) gpuarr__backend_unload(gpuarr__backend_get((gpuarr_backend)i));
    gpuarr__thread_key_delete();
    if (gpuarr__g.locks_ready) gpuarr__kernel_logs_free(); /* they name devices, gone now */
    if (gpuarr__g.locks_ready) {
        pthread_mutex_destroy(&gpuarr__g.oom_lock);
        pthread_mutex_destroy(&gpuarr__g.kernel_logs_lock);
        pthread_mutex_destroy(&gpuarr__g.registry_lock);
        pthread_mutex_destroy(&gpuarr__g.host_telemetry.lock);
        for (int i = 0; i < 64; i++) pthread_mutex_destroy(&gpuarr__g.use_locks[i]);
    }
    for (int i = 0; i < GPUARR__SETTING_COUNT; i++) gpuarr__free(gpuarr__g.config.text[i]);
    gpuarr__free(gpuarr__g.devices);
    gpuarr__free(gpuarr__g.filter);
    gpuarr__free(gpuarr__g.devices_filter);
    uint32_t epoch = gpuarr__g.epoch;
    uint64_t serials = gpuarr__g.stream_serial, seq = gpuarr__g.event_seq, threads = gpuarr__g.thread_serials;
    size_t kept = offsetof(gpuarr__state, refs); /* the process-wide locks, init_lock held now */
    memset((char *)&gpuarr__g + kept, 0, sizeof gpuarr__g - kept);
    gpuarr__g.epoch = epoch;
    gpuarr__g.stream_serial = serials;
    gpuarr__g.thread_serials = threads;
    gpuarr__g.event_seq = seq;
}

static gpuarr_result gpuarr__apply_faults(const char *text);

static gpuarr_result gpuarr__startup(const gpuarr_desc *desc) {
    gpuarr_desc d;
    memset(&d, 0, sizeof d);
    if (desc) d = *desc;
    gpuarr__layers_register();
    gpuarr__g.epoch++;
    pthread_mutex_init(&gpuarr__g.oom_lock, NULL);
    pthread_mutex_init(&gpuarr__g.kernel_logs_lock, NULL);
    pthread_mutex_init(&gpuarr__g.registry_lock, NULL);
    pthread_mutex_init(&gpuarr__g.host_telemetry.lock, NULL);
    for (int i = 0; i < 64; i++) pthread_mutex_init(&gpuarr__g.use_locks[i], NULL);
    gpuarr__g.locks_ready = true;
    gpuarr__thread_key_make();
    gpuarr_result r = gpuarr__resolve_config(&d);
    if (r == GPUARR_OK) {
        gpuarr__tables_init();
        r = gpuarr__registry_build();
    }
    if (r == GPUARR_OK) r = gpuarr__layers_start();
    const char *faults = gpuarr__setting(GPUARR__SET_FAULTS);
    if (r == GPUARR_OK && faults) r = gpuarr__apply_faults(faults);
    if (r != GPUARR_OK) {
        gpuarr__teardown();
        return r;
    }
    GPUARR__ATOMIC_STORE(&gpuarr__g.valid, 1u);
    gpuarr__log(GPUARR_LOG_INFO, "initialized with %d devices", gpuarr__g.device_count);
    return GPUARR_OK;
}

static bool gpuarr__same_text(const char *a, const char *b) { return a && b && strcmp(a, b) == 0; }

/* A later gpuarr_init's desc must agree with the running configuration in every field it sets;
   the first difference is named. */
static gpuarr_result gpuarr__desc_agrees(const gpuarr_desc *d) {
    const gpuarr__state *g = &gpuarr__g;
    const char *field = NULL;
    if ((d->allocator.alloc_fn || d->allocator.free_fn || d->allocator.user_data) &&
        (d->allocator.alloc_fn != g->allocator.alloc_fn || d->allocator.free_fn != g->allocator.free_fn ||
         d->allocator.user_data != g->allocator.user_data))
        field = "allocator";
    else if ((d->logger.fn || d->logger.user_data) && (d->logger.fn != g->logger.fn || d->logger.user_data != g->logger.user_data))
        field = "logger";
    else if (d->log_level && d->log_level != g->log_level) field = "log_level";
    else if (d->devices && !gpuarr__same_text(d->devices, g->devices_filter)) field = "devices";
    else if (d->host_threads && d->host_threads != g->host_threads) field = "host_threads";
    else if (d->alloc_conf && !gpuarr__same_text(d->alloc_conf, g->config.text[GPUARR__SET_ALLOC_CONF])) field = "alloc_conf";
    else if (d->oom_host_fallback && !g->alloc_conf.host_fallback) field = "oom_host_fallback";
    else if (d->slots && !gpuarr__same_text(d->slots, g->config.text[GPUARR__SET_SLOTS])) field = "slots";
    if (!field) return GPUARR_OK;
    return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT,
                        "desc->%s differs from the running configuration (gpuarr is already initialized; pass NULL, or the "
                        "same values: gpuarr_query_desc shows them)",
                        field);
}

GPUARR_API gpuarr_result gpuarr_init(const gpuarr_desc *desc) {
    gpuarr__tls.api = __func__;
    pthread_mutex_lock(&gpuarr__g.init_lock);
    gpuarr_result r = GPUARR_OK;
    if (gpuarr__g.refs == INT_MAX) {
        r = gpuarr__fail(GPUARR_ERROR_OVERFLOW, "too many gpuarr_init references");
    } else if (gpuarr__g.refs > 0) {
        r = desc ? gpuarr__desc_agrees(desc) : GPUARR_OK;
        if (r == GPUARR_OK) gpuarr__g.refs++;
    } else {
        r = gpuarr__startup(desc);
        if (r == GPUARR_OK) gpuarr__g.refs = 1;
    }
    pthread_mutex_unlock(&gpuarr__g.init_lock);
    return r;
}

static void gpuarr__activation_end(void);

GPUARR_API void gpuarr_shutdown(void) {
    pthread_mutex_lock(&gpuarr__g.init_lock);
    if (gpuarr__g.refs > 0 && --gpuarr__g.refs == 0) {
        for (int i = gpuarr__g.layer_count - 1; i >= 0; i--)
            if (gpuarr__g.layers[i].before_teardown) gpuarr__g.layers[i].before_teardown();
        gpuarr__activation_end(); /* the calling thread's context, as it was before gpuarr */
        GPUARR__ATOMIC_STORE(&gpuarr__g.valid, 0u);
        gpuarr__teardown();
        for (int i = 0; i < gpuarr__g.layer_count; i++)
            if (gpuarr__g.layers[i].after_teardown) gpuarr__g.layers[i].after_teardown();
    }
    pthread_mutex_unlock(&gpuarr__g.init_lock);
}

GPUARR_API bool gpuarr_is_initialized(void) { return gpuarr__initialized(); }

GPUARR_API gpuarr_result gpuarr_query_desc(gpuarr_desc *out) {
    GPUARR__BEGIN();
    GPUARR__REQUIRE_PTR(out);
    memset(out, 0, sizeof *out);
    out->allocator = gpuarr__g.allocator;
    out->logger = gpuarr__g.logger;
    out->log_level = gpuarr__g.log_level;
    out->devices = gpuarr__g.devices_filter;
    out->host_threads = gpuarr__g.host_threads;
    out->alloc_conf = gpuarr__g.config.text[GPUARR__SET_ALLOC_CONF];
    out->oom_host_fallback = gpuarr__g.alloc_conf.host_fallback;
    out->slots = gpuarr__g.config.text[GPUARR__SET_SLOTS];
    return GPUARR_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Names and errors
 * ------------------------------------------------------------------------------------------- */
GPUARR_API const char *gpuarr_result_string(gpuarr_result r) {
    switch (r) {
#define GPUARR__RESULT_TEXT(name, value, text) case GPUARR_##name: return text;
        GPUARR_RESULT_LIST(GPUARR__RESULT_TEXT)
#undef GPUARR__RESULT_TEXT
    default: return "unknown result code";
    }
}

GPUARR_API const char *gpuarr_result_name(gpuarr_result r) {
    switch (r) {
#define GPUARR__RESULT_NAME(name, value, text) case GPUARR_##name: return "GPUARR_" #name;
        GPUARR_RESULT_LIST(GPUARR__RESULT_NAME)
#undef GPUARR__RESULT_NAME
    default: return "GPUARR_UNKNOWN_RESULT";
    }
}

GPUARR_API const char *gpuarr_last_error(void) {
    gpuarr__thread_state *ts = &gpuarr__tls;
    if (!ts->error_api) return "";
    if (!ts->error_api[0]) return ts->error_detail; /* gpuarr_set_error's: the caller's words alone */
    if (!ts->error_formatted) {
        size_t n = GPUARR__MIN(strlen(ts->error_api), (size_t)63);
        memcpy(ts->error_message, ts->error_api, n);
        memcpy(ts->error_message + n, ": ", 2);
        gpuarr__copy_string(ts->error_message + n + 2, sizeof ts->error_message - n - 2, ts->error_detail);
        ts->error_formatted = true;
    }
    return ts->error_message;
}
GPUARR_API gpuarr_result gpuarr_set_error(gpuarr_result r, const char *fmt, ...) {
    const char *api = gpuarr__tls.api; /* the caller's call, if any, is still running */
    gpuarr__tls.api = "gpuarr_set_error";
    gpuarr_result bad = r == GPUARR_OK || strcmp(gpuarr_result_name(r), "GPUARR_UNKNOWN_RESULT") == 0
                            ? gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "r = %d is not an error result", (int)r)
                        : !fmt ? gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "fmt is NULL")
                               : GPUARR_OK;
    gpuarr__tls.api = api;
    if (bad != GPUARR_OK) return bad;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(gpuarr__tls.error_detail, sizeof gpuarr__tls.error_detail, fmt, ap);
    va_end(ap);
    gpuarr__tls.error_code = r;
    gpuarr__tls.error_api = ""; /* gpuarr_last_error: the message alone */
    gpuarr__tls.error_formatted = false;
    return r;
}
GPUARR_API size_t gpuarr_dtype_size(gpuarr_dtype t) { return gpuarr__dtype_valid(t) ? gpuarr__dtype_sizes[t] : 0; }
GPUARR_API const char *gpuarr_dtype_name(gpuarr_dtype t) { return gpuarr__dtype_valid(t) ? gpuarr__dtype_names[t] : "invalid"; }
GPUARR_API gpuarr_dtype gpuarr_dtype_from_name(const char *name) {
    for (int t = 1; name && t < GPUARR_DTYPE_COUNT; t++)
        if (strcmp(name, gpuarr__dtype_names[t]) == 0) return (gpuarr_dtype)t;
    return GPUARR_DTYPE_INVALID;
}
GPUARR_API const char *gpuarr_backend_name(gpuarr_backend b) {
    return b > 0 && b < GPUARR_BACKEND_COUNT ? gpuarr__backend_names[b] : "invalid";
}
GPUARR_API bool gpuarr_backend_compiled(gpuarr_backend b) { return b > 0 && b < GPUARR_BACKEND_COUNT && gpuarr__backend_get(b); }
GPUARR_API const char *gpuarr_version_string(void) { return GPUARR_VERSION_STRING; }

/* The narrowing helpers let the FPU round subnormal results, so they run in the default FP
   environment, like the array casts. The volatile copies keep the compiler from moving the
   arithmetic out from between the environment switches. */
GPUARR_API gpuarr_f16 gpuarr_f16_from_float(float x) {
    volatile float in = x;
    volatile uint16_t bits;
    uint64_t fp = gpuarr__fp_default_enter();
    bits = gpuarr_k_f32_to_f16(in);
    gpuarr__fp_leave(fp);
    gpuarr_f16 h = {bits};
    return h;
}
GPUARR_API gpuarr_f16 gpuarr_f16_from_double(double x) {
    volatile double in = x;
    volatile uint16_t bits;
    uint64_t fp = gpuarr__fp_default_enter();
    bits = gpuarr_k_f64_to_f16(in);
    gpuarr__fp_leave(fp);
    gpuarr_f16 h = {bits};
    return h;
}
GPUARR_API float gpuarr_f16_to_float(gpuarr_f16 h) { return gpuarr_k_f16_to_f32(h.bits); }
GPUARR_API gpuarr_bf16 gpuarr_bf16_from_float(float x) { gpuarr_bf16 h; h.bits = gpuarr_k_f32_to_bf16(x); return h; }
GPUARR_API gpuarr_bf16 gpuarr_bf16_from_double(double x) {
    volatile double in = x;
    volatile uint16_t bits;
    uint64_t fp = gpuarr__fp_default_enter();
    bits = gpuarr_k_f64_to_bf16(in);
    gpuarr__fp_leave(fp);
    gpuarr_bf16 h = {bits};
    return h;
}
GPUARR_API float gpuarr_bf16_to_float(gpuarr_bf16 h) { return gpuarr_k_bf16_to_f32(h.bits); }

/* ---------------------------------------------------------------------------------------------
 * Devices
 * ------------------------------------------------------------------------------------------- */
GPUARR_API int gpuarr_device_count(void) {
    gpuarr__tls.api = __func__;
    if (!gpuarr__initialized()) {
        gpuarr__fail(GPUARR_ERROR_NOT_INITIALIZED, "gpuarr is not initialized (call gpuarr_init first)");
        return 0;
    }
    return gpuarr__devices_total();
}

GPUARR_API gpuarr_device gpuarr_device_at(int index) {
    gpuarr_device none = {0};
    gpuarr__tls.api = __func__;
    if (!gpuarr__initialized()) {
        gpuarr__fail(GPUARR_ERROR_NOT_INITIALIZED, "gpuarr is not initialized (call gpuarr_init first)");
        return none;
    }
    if (index < 0 || index >= gpuarr__devices_total()) {
        gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "index = %d: there are %d devices", index, gpuarr__devices_total());
        return none;
    }
    return gpuarr__g.devices[index].info.device;
}

GPUARR_API gpuarr_device gpuarr_host(void) {
    gpuarr_device none = {0};
    gpuarr__tls.api = __func__;
    if (!gpuarr__initialized()) {
        gpuarr__fail(GPUARR_ERROR_NOT_INITIALIZED, "gpuarr is not initialized (call gpuarr_init first)");
        return none;
    }
    return gpuarr__host_dev()->info.device;
}

static gpuarr__dev *gpuarr__any_dev(void) {
    return gpuarr__g.best_gpu >= 0 ? &gpuarr__g.devices[gpuarr__g.best_gpu] : gpuarr__host_dev();
}

/* The best device of one backend (its GPUs first), or NULL. */
static gpuarr__dev *gpuarr__best_of_backend(gpuarr_backend b) {
    gpuarr__dev *best = NULL;
    for (int i = 0; i < gpuarr__g.device_count; i++) {
        gpuarr__dev *d = &gpuarr__g.devices[i];
        if (d->info.backend != b) continue;
        if (!best || (d->info.type == GPUARR_DEVICE_TYPE_GPU && best->info.type != GPUARR_DEVICE_TYPE_GPU) ||
            (d->info.type == best->info.type && gpuarr__better_gpu(&d->info, &best->info)))
            best = d;
    }
    return best;
}

static gpuarr_result gpuarr__find_device(const char *spec, gpuarr__dev **out);

GPUARR_API gpuarr_result gpuarr_device_find(const char *spec, gpuarr_device *out) {
    GPUARR__BEGIN();
    GPUARR__REQUIRE_PTR(spec);
    GPUARR__REQUIRE_PTR(out);
    gpuarr__dev *found;
    GPUARR__CHECK(gpuarr__find_device(spec, &found));
    *out = found->info.device;
    return GPUARR_OK;
}

/* The device a spec names (the registry must be built; used during init too). */
static gpuarr_result gpuarr__find_device(const char *spec, gpuarr__dev **out) {
    gpuarr__dev *found = NULL;
    gpuarr_result r;
    gpuarr_backend b;
    int index;
    if (strcmp(spec, "host") == 0 || strcmp(spec, "cpu") == 0) {
        found = gpuarr__host_dev();
    } else if (strcmp(spec, "any") == 0) {
        found = gpuarr__any_dev();
    } else if (strcmp(spec, "gpu") == 0) {
        if (gpuarr__g.best_gpu < 0)
            return gpuarr__fail(GPUARR_ERROR_NO_DEVICE, "spec \"gpu\": none of the %d devices is a GPU", gpuarr__g.device_count);
        found = &gpuarr__g.devices[gpuarr__g.best_gpu];
    } else if (gpuarr__layers_find_device(spec, out, &r)) {
        return r; /* a spec a layer knows ("local") */
    } else if (gpuarr__parse_backend_spec(spec, strlen(spec), false, &b, &index)) {
        if (gpuarr__backend_builtin(b) && index > 0)
            return gpuarr__fail(GPUARR_ERROR_NO_DEVICE, "spec \"%s\": there is one %s device, %s:0", spec, gpuarr__backend_names[b],
                                gpuarr__backend_names[b]);
        if (index < 0) found = gpuarr__best_of_backend(b);
        for (int i = 0; index >= 0 && i < gpuarr__devices_total(); i++)
            if (gpuarr__g.devices[i].info.backend == b && gpuarr__g.devices[i].info.index == index) found = &gpuarr__g.devices[i];
        if (found && __atomic_load_n(&found->removed, __ATOMIC_ACQUIRE))
            return gpuarr__fail(GPUARR_ERROR_NO_DEVICE, "spec \"%s\": that adopted device was removed (gpuarr_device_remove)", spec);
        if (!found && !gpuarr__backend_get(b))
            return gpuarr__fail(GPUARR_ERROR_NO_DEVICE, "spec \"%s\": no such device (the %s backend is not compiled in)", spec,
                                gpuarr__backend_names[b]);
        if (!found && !gpuarr__g.backend_loaded[b])
            return gpuarr__fail(GPUARR_ERROR_NO_DEVICE, "spec \"%s\": no such device (the %s backend is not available at run time: %s)", spec,
                                gpuarr__backend_names[b], gpuarr__g.backend_error[b][0] ? gpuarr__g.backend_error[b] : "not asked for by GPUARR_DEVICES");
        if (!found && index >= 0 && index < gpuarr__backend_get(b)->device_count() && !gpuarr__filter_allows(b, index))
            return gpuarr__fail(GPUARR_ERROR_NO_DEVICE, "spec \"%s\": the device exists but the device filter \"%s\" leaves it out", spec,
                                gpuarr__g.devices_filter);
        if (!found)
            return gpuarr__fail(GPUARR_ERROR_NO_DEVICE, "spec \"%s\": no such device (%d %s devices)", spec,
                                gpuarr__backend_get(b)->device_count(), gpuarr__backend_names[b]);
    } else {
        return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT,
                            "spec \"%s\" is not one of host, cpu, gpu, any, local, local:R, cuda, cuda:N, opencl, opencl:N", spec);
    }
    *out = found;
    return GPUARR_OK;
}

GPUARR_API gpuarr_result gpuarr_device_get_info(gpuarr_device d, gpuarr_device_info *out) {
    GPUARR__BEGIN();
    GPUARR__REQUIRE_PTR(out);
    gpuarr__dev *dev;
    GPUARR__CHECK(gpuarr__get_dev_any(d, "d", &dev)); /* a failed device too: its state says so */
    *out = dev->info;
    if (gpuarr__dev_failed(dev)) {
        out->state = GPUARR_DEVICE_FAILED;
        gpuarr__copy_string(out->failure, sizeof out->failure, dev->failure);
    }
    uint64_t free_bytes, total;
    if (dev->backend->mem_info(dev, &free_bytes, &total) == GPUARR_OK) {
        out->free_memory = free_bytes;
        if (total) out->total_memory = total;
    }
    return GPUARR_OK;
}

/* A device reached through two backends reports through the one that represents it (CUDA for an
   OpenCL device that is the same GPU): the same NVML record, the same fields. */
GPUARR_API gpuarr_result gpuarr_device_get_telemetry(gpuarr_device d, gpuarr_telemetry *out) {
    GPUARR__BEGIN();
    GPUARR__REQUIRE_PTR(out);
    gpuarr__dev *dev; /* a failed device too: what NVML says of it is what one wants to see then */
    GPUARR__CHECK(gpuarr__get_dev_any(d, "d", &dev));
    dev = gpuarr__dev_view(dev);
    if (gpuarr__is_duplicate(dev)) dev = &gpuarr__g.devices[(dev->info.same_as.id & 0xffffu) - 1u];
    gpuarr_telemetry t;
    memset(&t, 0, sizeof t);
    gpuarr__backend_telemetry(dev, &t);
    memcpy(out, &t, sizeof t); /* padding too: zero */
    return GPUARR_OK;
}

GPUARR_API const char *gpuarr_telemetry_name(uint32_t bit) {
    switch (bit) {
#define GPUARR__TELEMETRY_NAME(NAME, b, name, fields) case (uint32_t)GPUARR_TELEMETRY_##NAME: return name;
        GPUARR_TELEMETRY_LIST(GPUARR__TELEMETRY_NAME)
#undef GPUARR__TELEMETRY_NAME
    default: return "unknown";
    }
}

/* Visits every public stream on d (with a reference held during the call). */
static gpuarr_result gpuarr__sync_public_streams(gpuarr__dev *d) {
    gpuarr__table *t = &gpuarr__g.streams;
    gpuarr_result r = GPUARR_OK;
    for (uint32_t i = 0;; i++) {
        gpuarr__handles_lock();
        if (i >= t->used) {
            gpuarr__handles_unlock();
            break;
        }
        gpuarr__stream *s = (gpuarr__stream *)gpuarr__table_at(t, i)->obj;
        if (s && s->dev == d) gpuarr__obj_retain(&s->obj);
        else s = NULL;
        gpuarr__handles_unlock();
        if (!s) continue;
        r = gpuarr__stream_sync_keep(s, r);
        gpuarr__obj_release(&s->obj);
    }
    return r;
}

GPUARR_API gpuarr_result gpuarr_device_sync(gpuarr_device d) {
    GPUARR__BEGIN();
    gpuarr__dev *dev;
    GPUARR__CHECK(gpuarr__get_dev(d, "d", &dev));
    gpuarr__holds_release(); /* exports the caller let go: their memory goes back to the pools now */
    gpuarr_result r = gpuarr__visit_thread_streams(dev, true);
    gpuarr_result pr = gpuarr__sync_public_streams(dev);
    return r != GPUARR_OK ? r : pr;
}

/* The arrays (pinned ones from its pool included), public streams and events of d still alive. */
static void gpuarr__count_alive(gpuarr__dev *d, uint32_t *arrays, uint32_t *streams, uint32_t *events) {
    gpuarr__table *tables[3] = {&gpuarr__g.arrays, &gpuarr__g.streams, &gpuarr__g.events};
    uint32_t *counts[3] = {arrays, streams, events};
    gpuarr__handles_lock();
    for (int k = 0; k < 3; k++) {
        *counts[k] = 0;
        for (uint32_t i = 0; i < tables[k]->used; i++) {
            gpuarr__obj *o = gpuarr__table_at(tables[k], i)->obj;
            if (!o) continue;
            bool mine = k == 0   ? ((gpuarr__array *)o)->dev == d || ((gpuarr__array *)o)->pinned_for == d
                        : k == 1 ? ((gpuarr__stream *)o)->dev == d
                                 : ((gpuarr__event *)o)->dev == d;
            if (mine) (*counts[k])++;
        }
    }
    gpuarr__handles_unlock();
}

/* Every cached segment of p back (to the driver, or only dropped on a failed device); the number
   of segments still holding something. */
static uint32_t gpuarr__pool_empty(gpuarr__pool *p) {
    pthread_mutex_lock(&p->lock);
    gpuarr__pool_release_cached(p, 0, 0);
    uint32_t left = 0;
    for (gpuarr__segment *seg = p->segments; seg; seg = seg->next) left++;
    pthread_mutex_unlock(&p->lock);
    return left;
}

/* What gpuarr_device_reset and gpuarr_device_remove share: with nothing of dev alive, its
   default streams, pools and queued work go and it is closed. `call` names the caller. */
static gpuarr_result gpuarr__device_quiesce(gpuarr__dev *dev, const char *call, bool removing, bool *was_failed) {
    gpuarr__holds_release();
    uint32_t arrays, streams, events;
    gpuarr__count_alive(dev, &arrays, &streams, &events);
    if (arrays || streams || events)
        return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT,
                            "%s still has %u arrays, %u streams and %u events alive (exported DLPack tensors and OpenCL "
                            "buffers hold theirs): release them before %s",
                            dev->info.spec, arrays, streams, events, call);
    bool failed = gpuarr__dev_failed(dev);
    *was_failed = failed;
    /* The threads' default streams here go (their queued work first, where the device still runs
       it); a thread makes a new one at its next use (the reset count tells its cache). */
    if (!failed) (void)gpuarr__visit_thread_streams(dev, true);
    pthread_mutex_lock(&gpuarr__g.defaults_lock);
    gpuarr__stream *mine = NULL, **link = &dev->thread_streams;
    while (*link) {
        gpuarr__stream *s = *link;
        *link = s->next_default;
        s->next_default = mine;
        mine = s;
    }
    __atomic_add_fetch(&dev->resets, 1u, __ATOMIC_ACQ_REL);
    pthread_mutex_unlock(&gpuarr__g.defaults_lock);
    gpuarr__release_stream_list(mine);
    gpuarr__collect_device(dev);
    (void)gpuarr__pool_empty(&dev->pool); /* while the context is there to free through */
    (void)gpuarr__pool_empty(&dev->pinned);
    /* Streams and events of d held inside: by arrays of other devices that work on d ordered (or
       by their free memory), until that work is collected or the memory trimmed. */
    uint32_t held = __atomic_load_n(&dev->live_streams, __ATOMIC_ACQUIRE) + __atomic_load_n(&dev->live_events, __ATOMIC_ACQUIRE);
    for (int i = 0; held && i < gpuarr__devices_total(); i++) {
        gpuarr__collect_device(&gpuarr__g.devices[i]);
        (void)gpuarr__pool_empty(&gpuarr__g.devices[i].pool);
        (void)gpuarr__pool_empty(&gpuarr__g.devices[i].pinned);
        held = __atomic_load_n(&dev->live_streams, __ATOMIC_ACQUIRE) + __atomic_load_n(&dev->live_events, __ATOMIC_ACQUIRE);
    }
    if (held)
        return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT,
                            "%u streams and events of %s are still held by arrays of other devices that work on it ordered: "
                            "release those arrays before %s", held, dev->info.spec, call);
    /* A removed device's memory cannot outlive it (the context is the caller's): refused while
       an export still holds some. A reset frees it once the export lets go. */
    uint32_t held_segments = removing ? gpuarr__pool_empty(&dev->pool) + gpuarr__pool_empty(&dev->pinned) : 0;
    if (held_segments)
        return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "%s: %u pool segments are still in use (held by DLPack or OpenCL "
                            "exports): release those before %s", dev->info.spec, held_segments, call);
    pthread_mutex_lock(&dev->lock);
    if (dev->opened) gpuarr__backend_device_close(dev); /* what work was still holding goes here */
    __atomic_store_n(&dev->opened, false, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&dev->lock);
    uint32_t left = gpuarr__pool_empty(&dev->pool) + gpuarr__pool_empty(&dev->pinned);
    if (left) gpuarr__log(GPUARR_LOG_WARN, "%s: %u pool segments still in use at %s (held by DLPack exports?)",
                          dev->info.spec, left, call);
    return GPUARR_OK;
}

GPUARR_API gpuarr_result gpuarr_device_reset(gpuarr_device d) {
    GPUARR__BEGIN();
    gpuarr__dev *dev;
    GPUARR__CHECK(gpuarr__get_dev_any(d, "d", &dev));
    if (gpuarr__backend_has(dev->backend, GPUARR__BACKEND_BUILTIN)) return GPUARR_OK; /* the host never fails */
    bool failed = false;
    GPUARR__CHECK(gpuarr__device_quiesce(dev, "gpuarr_device_reset", false, &failed));
    gpuarr_result r = gpuarr__backend_device_reset(dev);
    if (r == GPUARR_OK) {
        dev->failure[0] = 0;
        __atomic_store_n(&dev->failed, 0u, __ATOMIC_RELEASE);
        r = gpuarr__dev_open(dev);
    }
    if (r == GPUARR_OK) gpuarr__log(GPUARR_LOG_INFO, "%s reset%s", dev->info.spec, failed ? " after its failure" : "");
    return r;
}

/* Adopted devices (ADOPTED DEVICES): a row after those gpuarr_init found, made of the caller's
   native objects by the backend (device_adopt), linked to gpuarr's own view of the same device. */
GPUARR__FOR_BACKENDS static gpuarr_result gpuarr__registry_adopt(gpuarr_backend id, void *context, void *device, void *queue,
                                                                 gpuarr_device *out) {
    const gpuarr__backend *b = gpuarr__backend_get(id);
    if (!b || !b->device_adopt) return gpuarr__fail(GPUARR_ERROR_UNSUPPORTED, "the %s backend adopts no contexts", gpuarr__backend_names[id]);
    if (!gpuarr__g.backend_loaded[id])
        return gpuarr__fail(GPUARR_ERROR_UNSUPPORTED, "the %s backend is not loaded: %s", b->name,
                            gpuarr__g.backend_error[id][0] ? gpuarr__g.backend_error[id] : "GPUARR_DEVICES leaves it out");
    pthread_mutex_lock(&gpuarr__g.registry_lock);
    int adopted = gpuarr__g.adopted_count, row = gpuarr__g.device_count + adopted, index = -1, same = -1;
    gpuarr_result r = GPUARR_OK;
    if (adopted >= GPUARR__ADOPT_MAX)
        r = gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY, "%d devices were adopted since gpuarr_init, the most one cycle holds "
                         "(removed ones included): gpuarr_shutdown and gpuarr_init start afresh", GPUARR__ADOPT_MAX);
    if (r == GPUARR_OK) r = b->device_adopt(context, device, queue, &index, &same);
    int twin = -1; /* gpuarr's own view: a device it found is needed for the layers' tables */
    for (int i = 0; r == GPUARR_OK && same >= 0 && i < gpuarr__g.device_count; i++)
        if (gpuarr__g.devices[i].info.backend == id && gpuarr__g.devices[i].info.index == same) twin = i;
    if (r == GPUARR_OK) r = gpuarr__registry_fill(row, b, index);
    gpuarr__dev *d = &gpuarr__g.devices[row];
    if (r == GPUARR_OK && twin < 0)
        r = gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "device: %s is not a device gpuarr_init found (%s)", d->info.name,
                         same < 0 ? "a sub-device, or one its platform did not list" : "GPUARR_DEVICES leaves it out");
    if (r != GPUARR_OK && index >= 0) { /* the backend took references: give them back */
        d->backend = b;
        d->info.index = index;
        b->device_forget(d);
        if (d->info.device.id) { /* registry_fill ran */
            gpuarr__pool_destroy(&d->pinned);
            gpuarr__pool_destroy(&d->pool);
            pthread_mutex_destroy(&d->lock);
        }
        memset(d, 0, sizeof *d);
    }
    if (r == GPUARR_OK) {
        d->view = twin;
        d->info.adopted = true;
        d->info.same_as = gpuarr__g.devices[twin].info.device;
        *out = d->info.device;
        __atomic_store_n(&gpuarr__g.adopted_count, adopted + 1, __ATOMIC_RELEASE); /* the row is complete */
        gpuarr__log(GPUARR_LOG_INFO, "adopted %s (%s), the same device as %s", d->info.spec, d->info.name, gpuarr__g.devices[twin].info.spec);
    }
    pthread_mutex_unlock(&gpuarr__g.registry_lock);
    return r;
}

GPUARR_API gpuarr_result gpuarr_device_remove(gpuarr_device d) {
    GPUARR__BEGIN();
    gpuarr__dev *dev;
    GPUARR__CHECK(gpuarr__get_dev_any(d, "d", &dev));
    if (!dev->info.adopted)
        return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "d is %s, which gpuarr_init found: only adopted devices are removed",
                            dev->info.spec);
    bool failed = false;
    GPUARR__CHECK(gpuarr__device_quiesce(dev, "gpuarr_device_remove", true, &failed));
    pthread_mutex_lock(&gpuarr__g.registry_lock);
    dev->backend->device_forget(dev);
    __atomic_store_n(&dev->removed, 1u, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&gpuarr__g.registry_lock);
    gpuarr__log(GPUARR_LOG_INFO, "removed %s", dev->info.spec);
    return GPUARR_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Arrays
 * ------------------------------------------------------------------------------------------- */
static gpuarr_result gpuarr__create(gpuarr_device d, gpuarr_dtype t, int ndim, const int64_t *shape, bool zero,
                                    gpuarr_array *out) {
    GPUARR__REQUIRE_PTR(out);
    gpuarr__dev *dev;
    gpuarr__array *a = NULL;
    gpuarr__stream *s = NULL;
    gpuarr__holds_release();
    GPUARR__CHECK(gpuarr__get_dev(d, "d", &dev));
    if (!zero) { /* an array from this thread's cache waits for nothing: no stream is needed */
        int64_t count;
        size_t nbytes;
        GPUARR__CHECK(gpuarr__check_scope());
        GPUARR__CHECK(gpuarr__check_shape(t, ndim, shape, &count, &nbytes));
        a = gpuarr__array_from_tcache(dev, t, ndim, shape, count, nbytes);
        uint32_t id = 0;
        gpuarr_result r = a ? gpuarr__array_publish(a, &id) : GPUARR_OK;
        if (a && r == GPUARR_OK) out->id = id;
        if (a) return r;
    }
    GPUARR__CHECK(gpuarr__stream_for(dev, NULL, &s));
    gpuarr_result r = gpuarr__array_new(dev, t, ndim, shape, s, &a);
    if (r == GPUARR_OK && zero && a->nbytes) {
        gpuarr__stream *fs = s;
        if (a->dev != dev) r = gpuarr__stream_for(a->dev, NULL, &fs); /* placed on the host */
        if (r == GPUARR_OK) {
            static const unsigned char zero = 0;
            r = a->dev->backend->fill(fs, a->mem, a->offset, &zero, 1, a->nbytes, false);
            r = gpuarr__stream_sync_keep(fs, r);
            if (fs != s) gpuarr__obj_release(&fs->obj);
        }
    }
    gpuarr__obj_release(&s->obj);
    uint32_t id = 0;
    if (r == GPUARR_OK) r = gpuarr__array_publish(a, &id);
    else if (a) gpuarr__obj_release(&a->obj);
    if (r == GPUARR_OK) out->id = id;
    return r;
}

GPUARR_API gpuarr_result gpuarr_empty(gpuarr_device d, gpuarr_dtype t, int ndim, const int64_t *shape, gpuarr_array *out) {
    GPUARR__BEGIN();
    return gpuarr__create(d, t, ndim, shape, false, out);
}

GPUARR_API gpuarr_result gpuarr_zeros(gpuarr_device d, gpuarr_dtype t, int ndim, const int64_t *shape, gpuarr_array *out) {
    GPUARR__BEGIN();
    return gpuarr__create(d, t, ndim, shape, true, out);
}

GPUARR_API gpuarr_result gpuarr_from_host_as(gpuarr_device d, gpuarr_dtype t, const void *data, int ndim,
                                             const int64_t *shape, gpuarr_array *out) {
    return gpuarr__from_host_named(__func__, d, t, data, ndim, shape, out);
}

GPUARR_API gpuarr_result gpuarr__from_host_named(const char *api, gpuarr_device d, gpuarr_dtype t, const void *data, int ndim,
                                                 const int64_t *shape, gpuarr_array *out) {
    GPUARR__BEGIN_AS(api ? api : "gpuarr_from_host_as");
    GPUARR__REQUIRE_PTR(out);
    gpuarr__dev *dev;
    gpuarr__array *a;
    GPUARR__CHECK(gpuarr__get_dev(d, "d", &dev));
    int64_t count;
    size_t nbytes;
    GPUARR__CHECK(gpuarr__check_shape(t, ndim, shape, &count, &nbytes));
    if (!data && count > 0)
        return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "data is NULL but the shape holds %lld elements", (long long)count);
    if ((uintptr_t)data % gpuarr__dtype_sizes[t] != 0)
        return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "data %p is not aligned to %zu bytes (the size of %s)", data,
                            gpuarr__dtype_sizes[t], gpuarr__dtype_names[t]);
    gpuarr__stream *writer;
    GPUARR__CHECK(gpuarr__stream_for(dev, NULL, &writer));
    gpuarr_result r = gpuarr__array_new(dev, t, ndim, shape, writer, &a);
    gpuarr__obj_release(&writer->obj);
    if (r != GPUARR_OK) return r;
    gpuarr__view from = gpuarr__make_view(gpuarr__host_dev(), (void *)(uintptr_t)data, 0, t);
    gpuarr__transfer tr = gpuarr__transfer_make(gpuarr__array_view(a), a, from, NULL, (size_t)count, NULL, false);
    r = gpuarr__transfer_run(&tr);
    uint32_t id = 0;
    if (r == GPUARR_OK) r = gpuarr__array_publish(a, &id);
    else gpuarr__obj_release(&a->obj);
    if (r == GPUARR_OK) out->id = id;
    return r;
}

GPUARR_API gpuarr_result gpuarr_to_host_as(gpuarr_array arr, gpuarr_dtype t, void *data, size_t count) {
    return gpuarr__to_host_named(__func__, arr, t, data, count);
}

GPUARR_API gpuarr_result gpuarr__to_host_named(const char *api, gpuarr_array arr, gpuarr_dtype t, void *data, size_t count) {
    GPUARR__BEGIN_AS(api ? api : "gpuarr_to_host_as");
    gpuarr__array *a;
    GPUARR__CHECK(gpuarr__get_array(arr, "a", &a));
    gpuarr_dtype dt = t ? t : a->dtype;
    gpuarr_result r = GPUARR_OK;
    if (!gpuarr__dtype_valid(dt))
        r = gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "t = %d is not a gpuarr_dtype", (int)t);
    else if (!data && a->count > 0)
        r = gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "data is NULL but the array holds %lld elements", (long long)a->count);
    else if ((uintptr_t)data % gpuarr__dtype_sizes[dt] != 0)
        r = gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "data %p is not aligned to %zu bytes (the size of %s)", data,
                         gpuarr__dtype_sizes[dt], gpuarr__dtype_names[dt]);
    else if (count < (uint64_t)a->count)
        r = gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "count = %zu is smaller than the array's %lld elements", count,
                         (long long)a->count);
    if (r == GPUARR_OK) r = gpuarr__route_check(a->dev, gpuarr__host_dev(), a->dtype, dt);
    if (r == GPUARR_OK) {
        gpuarr__view to = gpuarr__make_view(gpuarr__host_dev(), data, 0, dt);
        gpuarr__transfer tr = gpuarr__transfer_make(to, NULL, gpuarr__array_view(a), a, (size_t)a->count, NULL, false);
        r = gpuarr__transfer_run(&tr);
    }
    gpuarr__obj_release(&a->obj);
    return r;
}

GPUARR_API gpuarr_result gpuarr_wrap_host(void *data, gpuarr_dtype t, int ndim, const int64_t *shape,
                                          gpuarr_release_fn release, void *user_data, gpuarr_array *out) {
    GPUARR__BEGIN();
    GPUARR__REQUIRE_PTR(out);
    gpuarr__array *a;
    GPUARR__CHECK(gpuarr__array_alloc_struct(gpuarr__host_dev(), t, ndim, shape, &a));
    gpuarr_result r = GPUARR_OK;
    if (!data && a->count > 0)
        r = gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "data is NULL but the shape holds %lld elements", (long long)a->count);
    else if ((uintptr_t)data % gpuarr__dtype_sizes[t] != 0)
        r = gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "data %p is not aligned to %zu bytes (the size of %s)", data,
                         gpuarr__dtype_sizes[t], gpuarr__dtype_names[t]);
    uint32_t id = 0;
    if (r == GPUARR_OK) {
        a->mem = data;
        a->wrapped = true;
        r = gpuarr__table_insert(&gpuarr__g.arrays, &a->obj, &id);
    }
    if (r != GPUARR_OK) { /* the caller keeps ownership: no release callback */
        gpuarr__free(a);
        return r;
    }
    a->release_fn = release; /* safe: nobody else knows the new id yet */
    a->release_user = user_data;
    out->id = id;
    return GPUARR_OK;
}

GPUARR_API gpuarr_result gpuarr_convert(gpuarr_array src, gpuarr_device dst, gpuarr_dtype t, gpuarr_array *out) {
    GPUARR__BEGIN();
    gpuarr_stream none = {0};
    return gpuarr__convert(src, dst, t, none, false, out);
}

GPUARR_API gpuarr_result gpuarr_convert_async(gpuarr_array src, gpuarr_device dst, gpuarr_dtype t, gpuarr_stream s,
                                              gpuarr_array *out) {
    GPUARR__BEGIN();
    return gpuarr__convert(src, dst, t, s, true, out);
}

GPUARR_API gpuarr_result gpuarr_retain(gpuarr_array a) {
    GPUARR__BEGIN();
    return gpuarr__table_retain(&gpuarr__g.arrays, a.id, "a");
}

GPUARR_API gpuarr_result gpuarr_release(gpuarr_array a) {
    GPUARR__BEGIN();
    gpuarr__obj *dropped;
    GPUARR__CHECK(gpuarr__table_release(&gpuarr__g.arrays, a.id, "a", &dropped));
    gpuarr__obj_release(dropped);
    return GPUARR_OK;
}

GPUARR_API gpuarr_result gpuarr_array_get_info(gpuarr_array arr, gpuarr_array_info *out) {
    GPUARR__BEGIN();
    GPUARR__REQUIRE_PTR(out);
    gpuarr__array *a;
    GPUARR__CHECK(gpuarr__get_array(arr, "a", &a));
    memset(out, 0, sizeof *out);
    out->device = a->dev->info.device;
    out->dtype = a->dtype;
    out->ndim = a->ndim;
    for (int i = 0; i < a->ndim; i++) out->shape[i] = a->shape[i];
    out->count = a->count;
    out->itemsize = gpuarr__dtype_sizes[a->dtype];
    out->nbytes = a->nbytes;
    out->host_accessible = gpuarr__backend_has(a->dev->backend, GPUARR__BACKEND_HOST_MEMORY);
    out->wrapped = a->wrapped;
    out->host_fallback = a->host_fallback;
    out->pinned = a->pinned_for != NULL;
    out->is_view = a->base != NULL && !a->batch_member;
    out->offset = a->batch_member ? 0 : a->base_offset;
    out->refcount = gpuarr__table_public_refs(&gpuarr__g.arrays, arr.id);
    out->read_only = a->read_only;
    gpuarr__obj_release(&a->obj);
    return GPUARR_OK;
}

GPUARR_API gpuarr_result gpuarr_host_data(gpuarr_array arr, void **out) {
    GPUARR__BEGIN();
    GPUARR__REQUIRE_PTR(out);
    gpuarr__array *a;
    GPUARR__CHECK(gpuarr__get_array(arr, "a", &a));
    gpuarr_result r = GPUARR_OK;
    if (!gpuarr__backend_has(a->dev->backend, GPUARR__BACKEND_HOST_MEMORY))
        r = gpuarr__fail(GPUARR_ERROR_UNSUPPORTED, "a lives on %s, not on the host; convert it to gpuarr_host() first", a->dev->info.spec);
    else {
        gpuarr__event *ready = gpuarr__ready_get(a);
        if (ready) {
            r = gpuarr__backend_event_sync(ready->dev, ready->native);
            if (r == GPUARR_OK) gpuarr__collect_device(ready->dev);
            gpuarr__obj_release(&ready->obj);
        }
    }
    if (r == GPUARR_OK) *out = a->mem ? (unsigned char *)a->mem + a->offset : NULL;
    gpuarr__obj_release(&a->obj);
    return r;
}

/* ---------------------------------------------------------------------------------------------
 * Arrays you write into: copies into existing arrays, element ranges, fill, views, pinned host
 * arrays, readiness. A write waits (on the device) for every earlier reader and writer of the
 * memory; a view's readers and writers are its base's.
 * ------------------------------------------------------------------------------------------- */

/* Whether two arrays' memory overlaps; *same: they are the very same elements. */
static bool gpuarr__overlap(gpuarr__array *x, gpuarr__array *y, bool *same) {
    *same = false;
    if (x->dev != y->dev || !x->nbytes || !y->nbytes) return false;
    uintptr_t xs = x->offset, ys = y->offset;
    if (gpuarr__backend_has(x->dev->backend, GPUARR__BACKEND_HOST_MEMORY)) {
        xs += (uintptr_t)x->mem;
        ys += (uintptr_t)y->mem;
    } else if (x->mem != y->mem) {
        return false; /* distinct device allocations (or sub-buffers of distinct pool blocks) */
    }
    *same = xs == ys && x->nbytes == y->nbytes && x->dtype == y->dtype;
    return xs < ys + y->nbytes && ys < xs + x->nbytes;
}

/* The caller's stream for a call between devices a and b (NULL for {0}): it must be on one. */
static gpuarr_result gpuarr__stream_between(gpuarr_stream s, gpuarr__dev *a, gpuarr__dev *b, gpuarr__stream **out) {
    *out = NULL;
    if (!s.id) return GPUARR_OK;
    GPUARR__CHECK(gpuarr__get_stream(s, "s", out));
    if ((*out)->dev == a || (*out)->dev == b) return GPUARR_OK;
    gpuarr_result r = a == b ? gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "s belongs to %s, not to %s", (*out)->dev->info.spec, a->info.spec)
                             : gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "s belongs to %s, which is neither %s nor %s",
                                            (*out)->dev->info.spec, a->info.spec, b->info.spec);
    gpuarr__obj_release(&(*out)->obj);
    *out = NULL;
    return r;
}

static gpuarr_result gpuarr__copy(gpuarr_array dst, gpuarr_array src, gpuarr_stream stream, bool async) {
    gpuarr__array *d, *a = NULL;
    gpuarr__stream *es = NULL;
    GPUARR__CHECK(gpuarr__get_array(dst, "dst", &d));
    gpuarr_result r = gpuarr__get_array(src, "src", &a);
    bool same = false;
    if (r == GPUARR_OK) r = gpuarr__check_writable(d, "dst");
    if (r == GPUARR_OK && d->count != a->count)
        r = gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "dst holds %lld elements and src %lld: a copy needs the same count",
                         (long long)d->count, (long long)a->count);
    if (r == GPUARR_OK && gpuarr__overlap(d, a, &same) && !same)
        r = gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "dst and src share memory (views of one array) without being the same elements");
    if (r == GPUARR_OK) r = gpuarr__stream_between(stream, a->dev, d->dev, &es);
    if (r == GPUARR_OK && !same) r = gpuarr__route_check(a->dev, d->dev, a->dtype, d->dtype);
    if (r == GPUARR_OK && !same) {
        gpuarr__transfer tr = gpuarr__transfer_make(gpuarr__array_view(d), d, gpuarr__array_view(a), a, (size_t)a->count, es, async);
        tr.dst_existing = true;
        r = gpuarr__transfer_run(&tr);
    }
    if (es) gpuarr__obj_release(&es->obj);
    if (a) gpuarr__obj_release(&a->obj);
    gpuarr__obj_release(&d->obj);
    return r;
}

GPUARR_API gpuarr_result gpuarr_copy(gpuarr_array dst, gpuarr_array src) {
    GPUARR__BEGIN();
    gpuarr_stream none = {0};
    return gpuarr__copy(dst, src, none, false);
}

GPUARR_API gpuarr_result gpuarr_copy_async(gpuarr_array dst, gpuarr_array src, gpuarr_stream s) {
    GPUARR__BEGIN();
    return gpuarr__copy(dst, src, s, true);
}

/* Checks elements [first, first + count) of a against host memory p holding count elements of
   dtype t (0 = a's, written to *ht). */
static gpuarr_result gpuarr__check_range(gpuarr__array *a, int64_t first, int64_t count, gpuarr_dtype t, const void *p, gpuarr_dtype *ht) {
    gpuarr_dtype h = t ? t : a->dtype;
    if (!gpuarr__dtype_valid(h)) return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "t = %d is not a gpuarr_dtype", (int)t);
    if (first < 0) return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "first = %lld: must be >= 0", (long long)first);
    if (count < 0) return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "count = %lld: must be >= 0", (long long)count);
    if (count > INT64_MAX - first)
        return gpuarr__fail(GPUARR_ERROR_OVERFLOW, "first = %lld plus count = %lld overflows int64", (long long)first, (long long)count);
    if (first + count > a->count)
        return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "elements [%lld, %lld) pass the end of the array's %lld", (long long)first,
                            (long long)(first + count), (long long)a->count);
    size_t bytes;
    if ((uint64_t)count > SIZE_MAX || gpuarr__mul_overflows((size_t)count, gpuarr__dtype_sizes[h], &bytes) || bytes > (size_t)PTRDIFF_MAX)
        return gpuarr__fail(GPUARR_ERROR_OVERFLOW, "%lld elements of %s overflow the address space", (long long)count, gpuarr__dtype_names[h]);
    if (!p && count > 0) return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "the host pointer is NULL with count = %lld", (long long)count);
    if ((uintptr_t)p % gpuarr__dtype_sizes[h] != 0)
        return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "the host pointer %p is not aligned to %zu bytes (the size of %s)", p,
                            gpuarr__dtype_sizes[h], gpuarr__dtype_names[h]);
    *ht = h;
    return GPUARR_OK;
}

/* gpuarr_write and gpuarr_read, both forms: host memory <-> elements [first, first + count). */
static gpuarr_result gpuarr__range_io(gpuarr_array arr, int64_t first, int64_t count, gpuarr_dtype t, void *host, gpuarr_stream stream,
                                      bool async, bool writing) {
    gpuarr__array *a;
    gpuarr__stream *es = NULL;
    gpuarr_dtype ht = GPUARR_BOOL; /* set by gpuarr__check_range */
    GPUARR__CHECK(gpuarr__get_array(arr, "a", &a));
    gpuarr__dev *h = gpuarr__host_dev();
    gpuarr_result r = writing ? gpuarr__check_writable(a, "a") : GPUARR_OK;
    if (r == GPUARR_OK) r = gpuarr__check_range(a, first, count, t, host, &ht);
    if (r == GPUARR_OK) r = gpuarr__stream_between(stream, a->dev, h, &es);
    if (r == GPUARR_OK) r = writing ? gpuarr__route_check(h, a->dev, ht, a->dtype) : gpuarr__route_check(a->dev, h, a->dtype, ht);
    if (r == GPUARR_OK && count > 0) {
        gpuarr__view part = gpuarr__make_view(a->dev, a->mem, a->offset + (size_t)first * gpuarr__dtype_sizes[a->dtype], a->dtype);
        gpuarr__view mem = gpuarr__make_view(h, host, 0, ht);
        gpuarr__transfer tr = writing ? gpuarr__transfer_make(part, a, mem, NULL, (size_t)count, es, async)
                                      : gpuarr__transfer_make(mem, NULL, part, a, (size_t)count, es, async);
        tr.dst_existing = writing;
        r = gpuarr__transfer_run(&tr);
    }
    if (es) gpuarr__obj_release(&es->obj);
    gpuarr__obj_release(&a->obj);
    return r;
}

GPUARR_API gpuarr_result gpuarr_write(gpuarr_array a, int64_t first, int64_t count, gpuarr_dtype t, const void *src) {
    GPUARR__BEGIN();
    gpuarr_stream none = {0};
    return gpuarr__range_io(a, first, count, t, (void *)(uintptr_t)src, none, false, true);
}

GPUARR_API gpuarr_result gpuarr_write_async(gpuarr_array a, int64_t first, int64_t count, gpuarr_dtype t, const void *src,
                                            gpuarr_stream s) {
    GPUARR__BEGIN();
    return gpuarr__range_io(a, first, count, t, (void *)(uintptr_t)src, s, true, true);
}

GPUARR_API gpuarr_result gpuarr_read(gpuarr_array a, int64_t first, int64_t count, gpuarr_dtype t, void *dst) {
    GPUARR__BEGIN();
    gpuarr_stream none = {0};
    return gpuarr__range_io(a, first, count, t, dst, none, false, false);
}

GPUARR_API gpuarr_result gpuarr_read_async(gpuarr_array a, int64_t first, int64_t count, gpuarr_dtype t, void *dst, gpuarr_stream s) {
    GPUARR__BEGIN();
    return gpuarr__range_io(a, first, count, t, dst, s, true, false);
}

/* The element value as a's dtype, and the shortest pattern that repeats it (1 byte when all of
   its bytes are equal, as for zero). */
static size_t gpuarr__fill_pattern(gpuarr_dtype at, gpuarr_dtype t, const void *value, unsigned char pattern[8]) {
    memset(pattern, 0, 8);
    gpuarr__cpu_cast(pattern, at, value, t, 1);
    size_t size = gpuarr__dtype_sizes[at];
    bool uniform = true;
    for (size_t i = 1; i < size; i++) uniform = uniform && pattern[i] == pattern[0];
    return uniform ? 1 : size;
}

GPUARR_API gpuarr_result gpuarr_fill_as(gpuarr_array a, gpuarr_dtype t, const void *value) {
    return gpuarr__fill_named(__func__, a, t, value);
}

GPUARR_API gpuarr_result gpuarr__fill_named(const char *api, gpuarr_array arr, gpuarr_dtype t, const void *value) {
    GPUARR__BEGIN_AS(api ? api : "gpuarr_fill_as");
    gpuarr__array *a;
    GPUARR__CHECK(gpuarr__get_array(arr, "a", &a));
    gpuarr_dtype vt = t ? t : a->dtype;
    gpuarr_result r = gpuarr__check_writable(a, "a");
    if (r != GPUARR_OK) {
    } else if (!gpuarr__dtype_valid(vt)) r = gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "t = %d is not a gpuarr_dtype", (int)t);
    else if (!value) r = gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "value is NULL");
    else if ((uintptr_t)value % gpuarr__dtype_sizes[vt] != 0)
        r = gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "value %p is not aligned to %zu bytes (the size of %s)", value,
                         gpuarr__dtype_sizes[vt], gpuarr__dtype_names[vt]);
    if (r == GPUARR_OK && a->nbytes) {
        unsigned char pattern[8];
        size_t size = gpuarr__fill_pattern(a->dtype, vt, value, pattern);
        gpuarr__stream *s;
        r = gpuarr__stream_for(a->dev, NULL, &s);
        if (r == GPUARR_OK) {
            r = gpuarr__order_after_uses(s, a);
            if (r == GPUARR_OK) r = a->dev->backend->fill(s, a->mem, a->offset, pattern, size, a->nbytes, false);
            r = gpuarr__stream_sync_keep(s, r);
            gpuarr__obj_release(&s->obj);
        }
    }
    gpuarr__obj_release(&a->obj);
    return r;
}

/* A new handle on a's memory: ndim/shape, starting byte_offset bytes into a. */
static gpuarr_result gpuarr__view_publish(gpuarr__array *a, int ndim, const int64_t *shape, size_t byte_offset, gpuarr_array *out);

/* ---------------------------------------------------------------------------------------------
 * Holds: an array kept alive for a native object handed to the caller (an exported cl_mem),
 * until a driver callback says the caller let go. Such callbacks may run on driver threads where
 * gpuarr must not call the driver: the hold goes on a list, released at the next array creation,
 * gpuarr_device_sync, gpuarr_pool_get_stats, gpuarr_pool_trim, device removal or shutdown (so
 * that a sync or a trim after the caller's release sees the memory back in the pool). A callback after gpuarr_shutdown only frees the hold (the array
 * went with the shutdown); one during it is not allowed, as with DLPack deleters.
 * ------------------------------------------------------------------------------------------- */
struct gpuarr__hold {
    struct gpuarr__hold *next; /* on gpuarr__g.let_go */
    gpuarr_array view;         /* a view of the whole array, behind a handle of its own */
    uint32_t epoch;            /* the gpuarr_init cycle it belongs to */
};

/* A hold on a's elements once a's pending work is complete; *arr: a, with a reference. */
GPUARR__FOR_BACKENDS static gpuarr_result gpuarr__hold_array(gpuarr_array a, gpuarr_backend backend, gpuarr__hold **out, gpuarr__array **arr) {
    gpuarr__array *x;
    GPUARR__CHECK(gpuarr__get_array(a, "a", &x));
    gpuarr_result r = GPUARR_OK;
    if (x->dev->backend->id != backend)
        r = gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "a lives on %s, not on a %s device", x->dev->info.spec, gpuarr__backend_names[backend]);
    gpuarr__event *ready = r == GPUARR_OK ? gpuarr__ready_get(x) : NULL;
    if (ready) {
        r = gpuarr__backend_event_sync(ready->dev, ready->native);
        if (r == GPUARR_OK) gpuarr__collect_device(ready->dev);
        gpuarr__obj_release(&ready->obj);
    }
    gpuarr__hold *h = r == GPUARR_OK ? (gpuarr__hold *)gpuarr__calloc(sizeof *h) : NULL;
    if (r == GPUARR_OK && !h) r = gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY, "no host memory to hold a");
    if (r == GPUARR_OK) r = gpuarr__view_publish(x, x->ndim, x->shape, 0, &h->view);
    if (r != GPUARR_OK) {
        gpuarr__free(h);
        gpuarr__obj_release(&x->obj);
        return r;
    }
    h->epoch = gpuarr__g.epoch;
    *out = h;
    *arr = x;
    return GPUARR_OK;
}

/* The holder let go (any thread, a driver's callback included). */
GPUARR__FOR_BACKENDS static void gpuarr__hold_let_go(gpuarr__hold *h) {
    if (!gpuarr__initialized() || h->epoch != gpuarr__g.epoch) {
        gpuarr__free(h);
        return;
    }
    gpuarr__hold *head = __atomic_load_n(&gpuarr__g.let_go, __ATOMIC_ACQUIRE);
    do h->next = head;
    while (!__atomic_compare_exchange_n(&gpuarr__g.let_go, &head, h, true, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE));
}

/* The export failed after the hold was made: the view goes now. */
static void gpuarr__hold_cancel(gpuarr__hold *h) {
    gpuarr__obj *dropped = NULL;
    if (gpuarr__table_release(&gpuarr__g.arrays, h->view.id, "a held view", &dropped) == GPUARR_OK) gpuarr__obj_release(dropped);
    gpuarr__free(h);
}

/* Releases the holds let go so far (a thread where gpuarr may call the driver). */
static void gpuarr__holds_release(void) {
    if (!__atomic_load_n(&gpuarr__g.let_go, __ATOMIC_ACQUIRE)) return;
    gpuarr__hold *h = __atomic_exchange_n(&gpuarr__g.let_go, NULL, __ATOMIC_ACQ_REL);
    while (h) {
        gpuarr__hold *next = h->next;
        gpuarr__hold_cancel(h);
        h = next;
    }
}

static gpuarr_result gpuarr__view_publish(gpuarr__array *a, int ndim, const int64_t *shape, size_t byte_offset, gpuarr_array *out) {
    gpuarr__array *v;
    GPUARR__CHECK(gpuarr__array_alloc_struct(a->dev, a->dtype, ndim, shape, &v));
    gpuarr__array *root = gpuarr__root(a);
    gpuarr__obj_retain(&root->obj);
    v->base = root;
    v->base_offset = (a->base ? a->base_offset : 0) + byte_offset;
    v->mem = a->mem;
    v->offset = a->offset + byte_offset;
    v->wrapped = root->wrapped;
    v->host_fallback = root->host_fallback;
    v->pinned_for = root->pinned_for;
    v->read_only = a->read_only;
    uint32_t id;
    GPUARR__CHECK(gpuarr__array_publish(v, &id)); /* on failure v, and its hold on root, are dropped */
    out->id = id;
    return GPUARR_OK;
}

GPUARR_API gpuarr_result gpuarr_reshape(gpuarr_array arr, int ndim, const int64_t *shape, gpuarr_array *out) {
    GPUARR__BEGIN();
    GPUARR__REQUIRE_PTR(out);
    gpuarr__array *a;
    GPUARR__CHECK(gpuarr__get_array(arr, "a", &a));
    int64_t count = 0;
    size_t nbytes;
    gpuarr_result r = gpuarr__check_shape(a->dtype, ndim, shape, &count, &nbytes);
    if (r == GPUARR_OK && count != a->count)
        r = gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "the new shape holds %lld elements, a holds %lld", (long long)count,
                         (long long)a->count);
    if (r == GPUARR_OK) r = gpuarr__view_publish(a, ndim, shape, 0, out);
    gpuarr__obj_release(&a->obj);
    return r;
}

GPUARR_API gpuarr_result gpuarr_slice(gpuarr_array arr, int64_t begin, int64_t end, gpuarr_array *out) {
    GPUARR__BEGIN();
    GPUARR__REQUIRE_PTR(out);
    gpuarr__array *a;
    GPUARR__CHECK(gpuarr__get_array(arr, "a", &a));
    gpuarr_result r = GPUARR_OK;
    if (a->ndim == 0) r = gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "a is a scalar (ndim 0): it has no rows to slice");
    else if (begin < 0 || end < begin || end > a->shape[0])
        r = gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "rows [%lld, %lld) are not within a's %lld (0 <= begin <= end <= shape[0])",
                         (long long)begin, (long long)end, (long long)a->shape[0]);
    if (r == GPUARR_OK) {
        int64_t shape[GPUARR_MAX_DIMS];
        memcpy(shape, a->shape, sizeof shape);
        size_t row_bytes = a->shape[0] ? a->nbytes / (size_t)a->shape[0] : 0;
        shape[0] = end - begin;
        r = gpuarr__view_publish(a, a->ndim, shape, (size_t)begin * row_bytes, out);
    }
    gpuarr__obj_release(&a->obj);
    return r;
}

GPUARR_API gpuarr_result gpuarr_empty_pinned(gpuarr_device d, gpuarr_dtype t, int ndim, const int64_t *shape, gpuarr_array *out) {
    GPUARR__BEGIN();
    GPUARR__REQUIRE_PTR(out);
    gpuarr__dev *dev;
    gpuarr__array *a;
    GPUARR__CHECK(gpuarr__get_dev(d, "d", &dev));
    gpuarr__dev *h = gpuarr__host_dev();
    if (dev == h) GPUARR__CHECK(gpuarr__array_new(h, t, ndim, shape, NULL, &a));
    else {
        GPUARR__CHECK(gpuarr__array_alloc_struct(h, t, ndim, shape, &a));
        a->pool = &dev->pinned;
        a->pinned_for = dev;
        gpuarr_result r = a->nbytes ? gpuarr__pool_alloc(&dev->pinned, a->nbytes, NULL, &a->block) : GPUARR_OK;
        if (r != GPUARR_OK) {
            gpuarr__free(a);
            return r;
        }
        if (a->block) a->mem = a->block->view;
    }
    uint32_t id;
    GPUARR__CHECK(gpuarr__array_publish(a, &id));
    out->id = id;
    return GPUARR_OK;
}

/* Query (wait = false) or wait for the work writing a and the streams a was used on. */
static gpuarr_result gpuarr__array_settle(gpuarr_array arr, bool wait, bool *ready) {
    gpuarr__array *a;
    GPUARR__CHECK(gpuarr__get_array(arr, "a", &a));
    gpuarr__stream *uses[GPUARR__POOL_EVENTS];
    uint32_t n = gpuarr__array_uses(a, uses);
    gpuarr__event *e = gpuarr__ready_get(a);
    bool done = true;
    gpuarr_result r = GPUARR_OK;
    if (e) r = wait ? gpuarr__backend_event_sync(e->dev, e->native) : gpuarr__backend_event_query(e->dev, e->native, &done);
    for (uint32_t i = 0; i < n; i++) {
        gpuarr__stream *s = uses[i];
        bool finished = true;
        uint64_t seq = gpuarr__stream_seq(s);
        if (r == GPUARR_OK && done) r = wait ? gpuarr__backend_stream_sync(s->dev, s->native) : gpuarr__backend_stream_query(s->dev, s->native, &finished);
        if (r == GPUARR_OK && finished && done) gpuarr__stream_collect(s, seq);
        done = done && finished;
        gpuarr__obj_release(&s->obj);
    }
    if (e) gpuarr__obj_release(&e->obj);
    gpuarr__obj_release(&a->obj);
    if (r == GPUARR_OK && ready) *ready = done;
    return r;
}

GPUARR_API gpuarr_result gpuarr_array_query(gpuarr_array a, bool *ready) {
    GPUARR__BEGIN();
    GPUARR__REQUIRE_PTR(ready);
    return gpuarr__array_settle(a, false, ready);
}

GPUARR_API gpuarr_result gpuarr_array_sync(gpuarr_array a) {
    GPUARR__BEGIN();
    return gpuarr__array_settle(a, true, NULL);
}

/* ---------------------------------------------------------------------------------------------
 * Batches: gpuarr_stack and gpuarr_convert_many. The sources are grouped by device (and dtype);
 * each group is packed on its device (host memcpy into one buffer, pinned memory of the
 * destination where it has some; local copies into one temporary on a device) and crosses in
 * one transfer, cast on the way by the usual rule. Everything is built before any handle is
 * published, so an error leaves nothing allocated and no output written.
 * ------------------------------------------------------------------------------------------- */
#define GPUARR__BATCH_SMALL ((size_t)1 << 20) /* convert_many: arrays up to this share a block */
#define GPUARR__BATCH_ALIGN ((size_t)64)      /* each group's start in a batch block */

/* One group: m sources of one device and dtype, written in dtype dt into b's memory at byte
   offsets off[j] (from b's first element). Synchronous: done when it returns. */
static gpuarr_result gpuarr__batch_group(gpuarr__array *b, gpuarr__array *const *src, const size_t *off, int m, gpuarr_dtype dt) {
    gpuarr__dev *sd = src[0]->dev, *dd = b->dev;
    gpuarr_dtype st = src[0]->dtype;
    size_t dsz = gpuarr__dtype_sizes[dt], total = 0;
    bool contiguous = true;
    for (int j = 0; j < m; j++) {
        if (j > 0 && off[j] != off[j - 1] + (size_t)src[j - 1]->count * dsz) contiguous = false;
        total += (size_t)src[j]->count;
    }
    gpuarr_result r = GPUARR_OK;
    if (sd == dd) { /* local copies (or casts) straight into place */
        gpuarr__stream *s;
        GPUARR__CHECK(gpuarr__stream_for(dd, NULL, &s));
        for (int j = 0; j < m && r == GPUARR_OK; j++) {
            gpuarr__event *e = gpuarr__ready_get(src[j]);
            if (e) {
                r = gpuarr__stream_wait_raw(s, e);
                gpuarr__obj_release(&e->obj);
            }
            if (r == GPUARR_OK)
                r = gpuarr__move_local(s, gpuarr__make_view(dd, b->mem, b->offset + off[j], dt), gpuarr__array_view(src[j]),
                                       (size_t)src[j]->count);
        }
        r = gpuarr__stream_sync_keep(s, r);
        gpuarr__obj_release(&s->obj);
        return r;
    }
    /* where the group lands: its place in b, or a temporary on dd when its rows are scattered */
    gpuarr__stream *ds = NULL;
    gpuarr__device_mem *tmp = NULL;
    gpuarr__view to = gpuarr__make_view(dd, b->mem, b->offset + off[0], dt);
    if (!contiguous) {
        GPUARR__CHECK(gpuarr__stream_for(dd, NULL, &ds));
        r = gpuarr__temp_alloc(ds, total * dsz, &tmp);
        if (r != GPUARR_OK) {
            gpuarr__obj_release(&ds->obj);
            return r;
        }
        to = gpuarr__make_view(dd, tmp->view, tmp->view_offset, dt);
    }
    if (m == 1) { /* nothing to pack */
        gpuarr__transfer tr = gpuarr__transfer_make(to, NULL, gpuarr__array_view(src[0]), src[0], total, NULL, false);
        r = gpuarr__transfer_run(&tr);
    } else if (gpuarr__backend_has(sd->backend, GPUARR__BACKEND_HOST_MEMORY)) { /* the host packs, casting first where the rule says so */
        gpuarr_dtype pt = gpuarr__cast_side(st, dt) == GPUARR__CAST_AT_SOURCE ? dt : st;
        size_t psz = gpuarr__dtype_sizes[pt];
        gpuarr__hostbuf hb;
        if (!gpuarr__hostbuf_get(dd, NULL, total * psz, true, &hb))
            r = gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY, "no host memory for a %zu-byte batch buffer", total * psz);
        for (size_t j = 0, at = 0; r == GPUARR_OK && j < (size_t)m; at += (size_t)src[j]->count, j++) {
            gpuarr__event *e = gpuarr__ready_get(src[j]);
            if (e) {
                r = gpuarr__backend_event_sync(e->dev, e->native);
                gpuarr__obj_release(&e->obj);
            }
            const unsigned char *p = (const unsigned char *)src[j]->mem + src[j]->offset;
            if (r == GPUARR_OK && pt == st) memcpy((unsigned char *)hb.ptr + at * psz, p, src[j]->nbytes);
            else if (r == GPUARR_OK) r = gpuarr__host_step((unsigned char *)hb.ptr + at * psz, pt, p, st, (size_t)src[j]->count);
        }
        if (r == GPUARR_OK) {
            gpuarr__transfer tr = gpuarr__transfer_make(to, NULL, gpuarr__make_view(sd, hb.ptr, 0, pt), NULL, total, NULL, false);
            r = gpuarr__transfer_run(&tr);
        }
        if (hb.pinned) gpuarr__pool_free(&dd->pinned, hb.pinned, NULL, 0);
        else if (hb.ptr) gpuarr__aligned_free(hb.ptr);
    } else { /* a device packs into one temporary, in its stream's order */
        gpuarr__stream *ss;
        gpuarr__device_mem *pack = NULL;
        size_t ssz = gpuarr__dtype_sizes[st];
        r = gpuarr__stream_for(sd, NULL, &ss);
        if (r == GPUARR_OK) {
            r = gpuarr__temp_alloc(ss, total * ssz, &pack);
            for (size_t j = 0, at = 0; r == GPUARR_OK && j < (size_t)m; at += (size_t)src[j]->count, j++) {
                gpuarr__event *e = gpuarr__ready_get(src[j]);
                if (e) {
                    r = gpuarr__stream_wait_raw(ss, e);
                    gpuarr__obj_release(&e->obj);
                }
                if (r == GPUARR_OK)
                    r = gpuarr__move_local(ss, gpuarr__make_view(sd, pack->view, pack->view_offset + at * ssz, st),
                                           gpuarr__array_view(src[j]), (size_t)src[j]->count);
            }
            if (r == GPUARR_OK) { /* the transfer runs on ss too (the same thread's stream for sd) */
                gpuarr__view packed = gpuarr__make_view(sd, pack->view, pack->view_offset, st);
                gpuarr__transfer tr = gpuarr__transfer_make(to, NULL, packed, NULL, total, NULL, false);
                r = gpuarr__transfer_run(&tr);
            }
            if (r != GPUARR_OK) gpuarr__stream_sync_keep(ss, r);
            if (pack) gpuarr__temp_free(ss, pack);
            gpuarr__obj_release(&ss->obj);
        }
    }
    if (tmp) { /* scattered rows: local copies from the temporary into place */
        for (size_t j = 0, at = 0; r == GPUARR_OK && j < (size_t)m; at += (size_t)src[j]->count, j++)
            r = dd->backend->copy_d2d(ds, b->mem, b->offset + off[j], tmp->view, tmp->view_offset + at * dsz, (size_t)src[j]->count * dsz);
        r = gpuarr__stream_sync_keep(ds, r);
        gpuarr__temp_free(ds, tmp);
        gpuarr__obj_release(&ds->obj);
    }
    return r;
}

/* The sources of a batch, held, by index; "src[i]" in messages. The destination dtype of i is
   t, or its own when t is 0. Refuses handles, shapes (stack) and casts before anything is made. */
typedef struct gpuarr__batch {
    gpuarr__array **a;
    int n;
} gpuarr__batch;

static void gpuarr__batch_drop(gpuarr__batch *bt) {
    for (int i = 0; i < bt->n; i++)
        if (bt->a[i]) gpuarr__obj_release(&bt->a[i]->obj);
    gpuarr__free(bt->a);
    bt->a = NULL;
}

static gpuarr_result gpuarr__batch_open(const gpuarr_array *src, int n, gpuarr_device dst, gpuarr_dtype t, bool stack, gpuarr__dev **d,
                                        gpuarr__batch *bt) {
    memset(bt, 0, sizeof *bt);
    if (n < 0) return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "n = %d: must be >= 0", n);
    if (n == 0 && stack)
        return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "n = 0: gpuarr_stack needs at least one array (the result's shape is src[0]'s)");
    if (!src && n > 0) return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "src is NULL with n = %d", n);
    GPUARR__CHECK(gpuarr__get_dev(dst, "dst", d));
    if (t && !gpuarr__dtype_valid(t)) return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "t = %d is not a gpuarr_dtype", (int)t);
    if (n == 0) return GPUARR_OK;
    bt->a = (gpuarr__array **)gpuarr__calloc(sizeof *bt->a * (size_t)n);
    if (!bt->a) return gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY, "no host memory for a batch of %d arrays", n);
    bt->n = n;
    gpuarr_result r = GPUARR_OK;
    for (int i = 0; i < n && r == GPUARR_OK; i++) {
        char name[32];
        snprintf(name, sizeof name, "src[%d]", i);
        r = gpuarr__get_array(src[i], name, &bt->a[i]);
        if (r != GPUARR_OK) break;
        gpuarr__array *a = bt->a[i], *a0 = bt->a[0];
        if (stack && i == 0 && a->ndim >= GPUARR_MAX_DIMS)
            r = gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "src[0] has %d dimensions: a stack of it would have more than %d", a->ndim,
                             GPUARR_MAX_DIMS);
        if (r == GPUARR_OK && stack && a->dtype != a0->dtype)
            r = gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "src[%d] is %s and src[0] %s: stacked arrays share one dtype", i,
                             gpuarr__dtype_names[a->dtype], gpuarr__dtype_names[a0->dtype]);
        bool same_shape = a->ndim == a0->ndim;
        for (int k = 0; k < a->ndim && same_shape; k++) same_shape = a->shape[k] == a0->shape[k];
        if (r == GPUARR_OK && stack && !same_shape)
            r = gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "src[%d]'s shape differs from src[0]'s: stacked arrays share one shape", i);
        gpuarr_dtype dt = t ? t : a->dtype;
        if (r == GPUARR_OK && !(a->dev == *d && dt == a->dtype)) {
            r = gpuarr__route_check(a->dev, *d, a->dtype, dt);
            if (r != GPUARR_OK) {
                char why[sizeof gpuarr__tls.error_message];
                gpuarr__copy_string(why, sizeof why, gpuarr_last_error());
                r = gpuarr__fail(r, "src[%d] (%s on %s) to %s on %s: %s", i, gpuarr__dtype_names[a->dtype], a->dev->info.spec,
                                 gpuarr__dtype_names[dt], (*d)->info.spec, why);
            }
        }
    }
    if (r != GPUARR_OK) gpuarr__batch_drop(bt);
    return r;
}

/* The items of a batch that cross in groups, in one allocation: items[0..m) their indices in the
   batch, order[] the same indices group after group, starts[g] where group g begins in order
   (starts[groups] = m). */
typedef struct gpuarr__grouping {
    int *items;
    int *order;
    int *starts;
    int groups;
} gpuarr__grouping;

/* Room for up to n items; false when there is no host memory. */
static bool gpuarr__grouping_alloc(int n, gpuarr__grouping *gr) {
    int *all = (int *)gpuarr__malloc(sizeof(int) * (size_t)n * 3 + sizeof(int));
    gr->items = all;
    gr->order = all ? all + n : NULL;
    gr->starts = all ? all + 2 * n : NULL;
    gr->groups = 0;
    return all != NULL;
}

/* Groups the m items by source device and dtype, in first-seen order (fills order, starts and
   groups); false when there is no host memory. */
static bool gpuarr__batch_groups(gpuarr__array *const *a, int m, gpuarr__grouping *gr) {
    const int *item = gr->items;
    int placed = 0;
    unsigned char *done = (unsigned char *)gpuarr__calloc((size_t)m);
    if (!done) return false;
    for (int i = 0; i < m; i++) {
        if (done[i]) continue;
        gr->starts[gr->groups++] = placed;
        for (int j = i; j < m; j++)
            if (!done[j] && a[item[j]]->dev == a[item[i]]->dev && a[item[j]]->dtype == a[item[i]]->dtype) {
                done[j] = 1;
                gr->order[placed++] = item[j];
            }
    }
    gr->starts[gr->groups] = placed;
    gpuarr__free(done);
    return true;
}

/* Runs every group of gr into b, item i at byte offset off[i]. */
static gpuarr_result gpuarr__batch_run(gpuarr__array *b, gpuarr__array *const *a, const gpuarr__grouping *gr, const size_t *off,
                                       gpuarr_dtype t) {
    int n = gr->starts[gr->groups];
    gpuarr__array **gs = (gpuarr__array **)gpuarr__malloc(sizeof *gs * (size_t)n);
    size_t *go = (size_t *)gpuarr__malloc(sizeof *go * (size_t)n);
    gpuarr_result r = gs && go ? GPUARR_OK : gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY, "no host memory for a batch of %d arrays", n);
    for (int g = 0; g < gr->groups && r == GPUARR_OK; g++) {
        const int *item = gr->order + gr->starts[g];
        int m = gr->starts[g + 1] - gr->starts[g];
        for (int j = 0; j < m; j++) {
            gs[j] = a[item[j]];
            go[j] = off[item[j]];
        }
        r = gpuarr__batch_group(b, gs, go, m, t ? t : gs[0]->dtype);
    }
    gpuarr__free(gs);
    gpuarr__free(go);
    return r;
}

GPUARR_API gpuarr_result gpuarr_stack(const gpuarr_array *src, int n, gpuarr_device dst, gpuarr_dtype t, gpuarr_array *out) {
    GPUARR__BEGIN();
    GPUARR__REQUIRE_PTR(out);
    gpuarr__dev *d;
    gpuarr__batch bt;
    GPUARR__CHECK(gpuarr__batch_open(src, n, dst, t, true, &d, &bt));
    gpuarr__array *a0 = bt.a[0], *b = NULL;
    gpuarr_dtype dt = t ? t : a0->dtype;
    int64_t shape[GPUARR_MAX_DIMS];
    shape[0] = n;
    for (int k = 0; k < a0->ndim; k++) shape[k + 1] = a0->shape[k];
    gpuarr__grouping gr;
    bool grouping = gpuarr__grouping_alloc(n, &gr);
    size_t *off = (size_t *)gpuarr__malloc(sizeof(size_t) * (size_t)n);
    gpuarr_result r = grouping && off ? GPUARR_OK : gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY, "no host memory for a batch of %d arrays", n);
    gpuarr__stream *writer = NULL;
    if (r == GPUARR_OK) r = gpuarr__stream_for(d, NULL, &writer);
    if (r == GPUARR_OK) r = gpuarr__array_new(d, dt, a0->ndim + 1, shape, writer, &b);
    if (writer) gpuarr__obj_release(&writer->obj);
    if (r == GPUARR_OK && b->nbytes) {
        size_t row = b->nbytes / (size_t)n;
        for (int i = 0; i < n; i++) {
            gr.items[i] = i;
            off[i] = (size_t)i * row;
        }
        if (!gpuarr__batch_groups(bt.a, n, &gr)) r = gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY, "no host memory for a batch of %d arrays", n);
        else r = gpuarr__batch_run(b, bt.a, &gr, off, dt);
    }
    uint32_t id = 0;
    if (r == GPUARR_OK) r = gpuarr__array_publish(b, &id); /* on failure b is dropped */
    else if (b) gpuarr__obj_release(&b->obj);
    gpuarr__free(gr.items);
    gpuarr__free(off);
    gpuarr__batch_drop(&bt);
    if (r == GPUARR_OK) out->id = id;
    return r;
}

GPUARR_API gpuarr_result gpuarr_convert_many(const gpuarr_array *src, int n, gpuarr_device dst, gpuarr_dtype t, gpuarr_array *out) {
    GPUARR__BEGIN();
    GPUARR__REQUIRE_PTR(out);
    gpuarr__dev *d;
    gpuarr__batch bt;
    GPUARR__CHECK(gpuarr__batch_open(src, n, dst, t, false, &d, &bt));
    if (n == 0) return GPUARR_OK;
    /* res[i]: the private result (NULL for an identity: src[i] itself, retained at the end) */
    gpuarr__array **res = (gpuarr__array **)gpuarr__calloc(sizeof *res * (size_t)n);
    gpuarr__grouping gr;
    bool grouping = gpuarr__grouping_alloc(n, &gr);
    size_t *off = (size_t *)gpuarr__calloc(sizeof(size_t) * (size_t)n);
    uint32_t *ids = (uint32_t *)gpuarr__calloc(sizeof(uint32_t) * (size_t)n);
    gpuarr_result r = res && grouping && off && ids ? GPUARR_OK
                                                    : gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY, "no host memory for a batch of %d arrays", n);
    int m = 0; /* the small ones that move or cast: one block */
    for (int i = 0; i < n && r == GPUARR_OK; i++) {
        gpuarr__array *a = bt.a[i];
        gpuarr_dtype dt = t ? t : a->dtype;
        size_t dbytes = (size_t)a->count * gpuarr__dtype_sizes[dt];
        bool identity = a->dev == d && dt == a->dtype;
        if (!identity && a->count > 0 && a->nbytes <= GPUARR__BATCH_SMALL && dbytes <= GPUARR__BATCH_SMALL) gr.items[m++] = i;
    }
    gpuarr__array *blk = NULL;
    if (r == GPUARR_OK && m > 1) {
        if (!gpuarr__batch_groups(bt.a, m, &gr)) r = gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY, "no host memory for a batch of %d arrays", n);
        size_t total = 0;
        for (int g = 0; g < gr.groups; g++) { /* a group's items follow each other: it lands in one piece */
            total = (total + GPUARR__BATCH_ALIGN - 1) / GPUARR__BATCH_ALIGN * GPUARR__BATCH_ALIGN;
            for (int j = gr.starts[g]; j < gr.starts[g + 1]; j++) {
                gpuarr__array *a = bt.a[gr.order[j]];
                off[gr.order[j]] = total;
                total += (size_t)a->count * gpuarr__dtype_sizes[t ? t : a->dtype];
            }
        }
        int64_t shape[1] = {(int64_t)total};
        gpuarr__stream *writer = NULL;
        if (r == GPUARR_OK) r = gpuarr__stream_for(d, NULL, &writer);
        if (r == GPUARR_OK) r = gpuarr__array_new(d, GPUARR_U8, 1, shape, writer, &blk);
        if (writer) gpuarr__obj_release(&writer->obj);
        /* each output: a handle on its part of the block, holding the block */
        for (int j = 0; j < m && r == GPUARR_OK; j++) {
            int i = gr.order[j];
            gpuarr__array *a = bt.a[i], *v;
            r = gpuarr__array_alloc_struct(blk->dev, t ? t : a->dtype, a->ndim, a->shape, &v);
            if (r != GPUARR_OK) break;
            gpuarr__obj_retain(&blk->obj);
            v->base = blk;
            v->batch_member = true;
            v->base_offset = off[i];
            v->mem = blk->mem;
            v->offset = blk->offset + v->base_offset;
            v->host_fallback = blk->host_fallback;
            res[i] = v;
        }
        if (r == GPUARR_OK) r = gpuarr__batch_run(blk, bt.a, &gr, off, t);
    } else if (r == GPUARR_OK && m == 1) {
        m = 0; /* one alone goes the ordinary way */
    }
    for (int i = 0; i < n && r == GPUARR_OK; i++) { /* the rest, one by one */
        gpuarr__array *a = bt.a[i];
        gpuarr_dtype dt = t ? t : a->dtype;
        if (res[i]) continue;
        if (a->dev == d && dt == a->dtype) r = gpuarr__identity_ready(a, NULL, false);
        else r = gpuarr__convert_private(a, d, dt, NULL, false, &res[i]);
    }
    int published = 0;
    for (; published < n && r == GPUARR_OK; published++) {
        int i = published;
        if (res[i]) {
            r = gpuarr__array_publish(res[i], &ids[i]); /* on failure res[i] is dropped */
            res[i] = NULL;
        } else {
            char name[32];
            snprintf(name, sizeof name, "src[%d]", i);
            r = gpuarr__table_retain(&gpuarr__g.arrays, src[i].id, name);
            ids[i] = src[i].id;
        }
        if (r != GPUARR_OK) break;
    }
    if (r != GPUARR_OK && ids) /* take back what was published */
        for (int i = 0; i < published; i++) {
            gpuarr__obj *dropped = NULL;
            gpuarr__table_release(&gpuarr__g.arrays, ids[i], "out", &dropped);
            if (dropped) gpuarr__obj_release(dropped);
        }
    if (res)
        for (int i = 0; i < n; i++)
            if (res[i]) gpuarr__obj_release(&res[i]->obj);
    if (blk) gpuarr__obj_release(&blk->obj); /* the outputs hold it now */
    if (r == GPUARR_OK)
        for (int i = 0; i < n; i++) out[i].id = ids[i];
    gpuarr__free(res);
    gpuarr__free(gr.items);
    gpuarr__free(off);
    gpuarr__free(ids);
    gpuarr__batch_drop(&bt);
    return r;
}

/* ---------------------------------------------------------------------------------------------
 * Streams and events
 * ------------------------------------------------------------------------------------------- */
static gpuarr__dev *gpuarr__current_dev(void) {
    gpuarr_device d;
    d.id = gpuarr__tls.device_id;
    gpuarr__dev *dev;
    if (d.id && (d.id >> 16) == gpuarr__epoch16() && (d.id & 0xffffu) >= 1u && (int)(d.id & 0xffffu) <= gpuarr__devices_total() &&
        gpuarr__get_dev(d, "current device", &dev) == GPUARR_OK)
        return dev;
    return gpuarr__any_dev();
}

/* {0} = the thread's current stream, else the current device's default stream. */
static gpuarr_result gpuarr__resolve_stream(gpuarr_stream s, const char *arg, gpuarr__stream **out) {
    if (s.id) return gpuarr__get_stream(s, arg, out);
    GPUARR__CHECK(gpuarr__check_scope());
    gpuarr__stream *cur = gpuarr__current_stream_obj();
    if (cur) {
        gpuarr_result r = gpuarr__dev_alive(cur->dev);
        if (r != GPUARR_OK) {
            gpuarr__obj_release(&cur->obj);
            return r;
        }
        *out = cur;
        return GPUARR_OK;
    }
    return gpuarr__default_stream(gpuarr__current_dev(), out);
}

/* s resolved ({0} included) and checked to be on a device of `backend` (`what` names that in the
   message), with a reference, for the interop accessors. */
GPUARR__FOR_BACKENDS static gpuarr_result gpuarr__resolve_stream_of(gpuarr_stream s, gpuarr_backend backend, const char *what,
                                                                    gpuarr__stream **out) {
    GPUARR__CHECK(gpuarr__resolve_stream(s, "s", out));
    if ((*out)->dev->backend->id == backend) return GPUARR_OK;
    gpuarr_result r = s.id ? gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "s belongs to %s, not to %s", (*out)->dev->info.spec, what)
                           : gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "s = {0} is the thread's current stream, which belongs to %s, "
                                          "not to %s: create a stream of %s with gpuarr_stream_create (or make that device "
                                          "current with GPUARR_WITH_DEVICE or gpuarr_set_current_device)",
                                          (*out)->dev->info.spec, what, what);
    gpuarr__obj_release(&(*out)->obj);
    return r;
}

GPUARR_API gpuarr_result gpuarr_stream_create(gpuarr_device d, uint32_t flags, gpuarr_stream *out) {
    GPUARR__BEGIN();
    GPUARR__REQUIRE_PTR(out);
    if (flags != 0) return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "flags = 0x%x: no stream flags are defined (pass 0)", flags);
    gpuarr__dev *dev;
    gpuarr__stream *s;
    GPUARR__CHECK(gpuarr__get_dev(d, "d", &dev));
    GPUARR__CHECK(gpuarr__stream_new(dev, &s));
    return gpuarr__stream_publish(s, out);
}

GPUARR_API gpuarr_result gpuarr_stream_destroy(gpuarr_stream s) {
    GPUARR__BEGIN();
    gpuarr__obj *dropped;
    gpuarr__stream *st;
    /* Wait here: arrays that were used on s (their use lists, kept for later writers) hold
       references to it, so the wait in its destructor may come long after this returns. */
    gpuarr__obj *o;
    GPUARR__CHECK(gpuarr__table_get(&gpuarr__g.streams, s.id, "s", &o)); /* a failed device's too */
    st = (gpuarr__stream *)o;
    (void)gpuarr__stream_sync_raw(st); /* as the destructor: the stream goes either way */
    GPUARR__ATOMIC_STORE(&st->destroyed, 1u); /* arrays used on it never touch it again */
    gpuarr__obj_release(&st->obj);
    GPUARR__CHECK(gpuarr__table_release(&gpuarr__g.streams, s.id, "s", &dropped));
    gpuarr__obj_release(dropped);
    return GPUARR_OK;
}

GPUARR_API gpuarr_result gpuarr_stream_sync(gpuarr_stream s) {
    GPUARR__BEGIN();
    gpuarr__stream *st;
    GPUARR__CHECK(gpuarr__resolve_stream(s, "s", &st));
    gpuarr_result r = gpuarr__stream_sync_raw(st);
    gpuarr__obj_release(&st->obj);
    return r;
}

GPUARR_API gpuarr_result gpuarr_stream_query(gpuarr_stream s, bool *done) {
    GPUARR__BEGIN();
    GPUARR__REQUIRE_PTR(done);
    gpuarr__stream *st;
    GPUARR__CHECK(gpuarr__resolve_stream(s, "s", &st));
    bool finished = false;
    uint64_t seq = gpuarr__stream_seq(st);
    gpuarr_result r = gpuarr__backend_stream_query(st->dev, st->native, &finished);
    if (r == GPUARR_OK) gpuarr__stream_collect(st, finished ? seq : 0);
    if (r == GPUARR_OK) *done = finished;
    gpuarr__obj_release(&st->obj);
    return r;
}

GPUARR_API gpuarr_result gpuarr_stream_get_device(gpuarr_stream s, gpuarr_device *out) {
    GPUARR__BEGIN();
    GPUARR__REQUIRE_PTR(out);
    gpuarr__stream *st;
    GPUARR__CHECK(gpuarr__resolve_stream(s, "s", &st));
    *out = st->dev->info.device;
    gpuarr__obj_release(&st->obj);
    return GPUARR_OK;
}

/* With a reference; GPUARR_ERROR_DEVICE_LOST (and none) when its device has failed. */
static gpuarr_result gpuarr__get_event(gpuarr_event e, const char *arg, gpuarr__event **out) {
    gpuarr__obj *o;
    GPUARR__CHECK(gpuarr__table_get(&gpuarr__g.events, e.id, arg, &o));
    gpuarr_result r = gpuarr__dev_alive(((gpuarr__event *)o)->dev);
    if (r != GPUARR_OK) {
        gpuarr__obj_release(o);
        return r;
    }
    *out = (gpuarr__event *)o;
    return GPUARR_OK;
}

GPUARR_API gpuarr_result gpuarr_stream_wait(gpuarr_stream s, gpuarr_event e) {
    GPUARR__BEGIN();
    gpuarr__stream *st;
    gpuarr__event *ev;
    GPUARR__CHECK(gpuarr__get_event(e, "e", &ev));
    gpuarr_result r = gpuarr__resolve_stream(s, "s", &st);
    if (r == GPUARR_OK) {
        /* Across backends the calling thread waits (as the manual says): a host function on s
           would wait for e as recorded when it runs, and the caller may record e again before
           then, after work that waits for s (a deadlock). */
        if (ev->dev->backend != st->dev->backend && !gpuarr__backend_has(ev->dev->backend, GPUARR__BACKEND_SYNCHRONOUS))
            r = GPUARR__ATOMIC_LOAD(&ev->recorded) ? gpuarr__backend_event_sync(ev->dev, ev->native) : GPUARR_OK;
        else
            r = gpuarr__stream_wait_raw(st, ev);
        gpuarr__obj_release(&st->obj);
    }
    gpuarr__obj_release(&ev->obj);
    return r;
}

GPUARR_API gpuarr_result gpuarr_stream_wait_array(gpuarr_stream s, gpuarr_array a) {
    GPUARR__BEGIN();
    gpuarr__array *arr;
    gpuarr__stream *st;
    GPUARR__CHECK(gpuarr__get_array(a, "a", &arr));
    gpuarr_result r = gpuarr__resolve_stream(s, "s", &st);
    if (r == GPUARR_OK) {
        gpuarr__event *ready = gpuarr__ready_get(arr);
        if (ready) {
            r = gpuarr__stream_wait_raw(st, ready);
            gpuarr__obj_release(&ready->obj);
        }
        gpuarr__obj_release(&st->obj);
    }
    gpuarr__obj_release(&arr->obj);
    return r;
}

GPUARR_API gpuarr_result gpuarr_event_create(gpuarr_device d, uint32_t flags, gpuarr_event *out) {
    GPUARR__BEGIN();
    GPUARR__REQUIRE_PTR(out);
    if (flags & ~(uint32_t)GPUARR_EVENT_TIMING)
        return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "flags = 0x%x: only GPUARR_EVENT_TIMING is defined", flags);
    gpuarr__dev *dev;
    gpuarr__event *e;
    GPUARR__CHECK(gpuarr__get_dev(d, "d", &dev));
    GPUARR__CHECK(gpuarr__event_new(dev, (flags & GPUARR_EVENT_TIMING) != 0, &e));
    uint32_t id;
    gpuarr_result r = gpuarr__table_insert(&gpuarr__g.events, &e->obj, &id);
    if (r != GPUARR_OK) {
        gpuarr__obj_release(&e->obj);
        return r;
    }
    out->id = id;
    return GPUARR_OK;
}

GPUARR_API gpuarr_result gpuarr_event_destroy(gpuarr_event e) {
    GPUARR__BEGIN();
    gpuarr__obj *dropped;
    GPUARR__CHECK(gpuarr__table_release(&gpuarr__g.events, e.id, "e", &dropped));
    gpuarr__obj_release(dropped);
    return GPUARR_OK;
}

GPUARR_API gpuarr_result gpuarr_event_record(gpuarr_event e, gpuarr_stream s) {
    GPUARR__BEGIN();
    gpuarr__event *ev;
    gpuarr__stream *st = NULL;
    GPUARR__CHECK(gpuarr__get_event(e, "e", &ev));
    gpuarr_result r = s.id ? gpuarr__get_stream(s, "s", &st) : gpuarr__stream_for(ev->dev, NULL, &st);
    if (r == GPUARR_OK && st->dev != ev->dev)
        r = gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "s is on %s but e belongs to %s", st->dev->info.spec, ev->dev->info.spec);
    if (r == GPUARR_OK) r = gpuarr__event_record_raw(ev, st);
    if (st) gpuarr__obj_release(&st->obj);
    gpuarr__obj_release(&ev->obj);
    return r;
}

GPUARR_API gpuarr_result gpuarr_event_sync(gpuarr_event e) {
    GPUARR__BEGIN();
    gpuarr__event *ev;
    GPUARR__CHECK(gpuarr__get_event(e, "e", &ev));
    gpuarr_result r = GPUARR_OK;
    if (GPUARR__ATOMIC_LOAD(&ev->recorded)) r = gpuarr__backend_event_sync(ev->dev, ev->native);
    if (r == GPUARR_OK && !gpuarr__backend_has(ev->dev->backend, GPUARR__BACKEND_SYNCHRONOUS)) gpuarr__collect_device(ev->dev);
    gpuarr__obj_release(&ev->obj);
    return r;
}

GPUARR_API gpuarr_result gpuarr_event_query(gpuarr_event e, bool *done) {
    GPUARR__BEGIN();
    GPUARR__REQUIRE_PTR(done);
    gpuarr__event *ev;
    GPUARR__CHECK(gpuarr__get_event(e, "e", &ev));
    bool finished = true;
    gpuarr_result r = GPUARR_OK;
    if (GPUARR__ATOMIC_LOAD(&ev->recorded)) r = gpuarr__backend_event_query(ev->dev, ev->native, &finished);
    if (r == GPUARR_OK) *done = finished;
    gpuarr__obj_release(&ev->obj);
    return r;
}

static gpuarr_result gpuarr__check_timing_event(gpuarr__event *e, const char *arg) {
    if (!e->timing) return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "%s was created without GPUARR_EVENT_TIMING", arg);
    if (!GPUARR__ATOMIC_LOAD(&e->recorded)) return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "%s was never recorded", arg);
    return GPUARR_OK;
}

GPUARR_API gpuarr_result gpuarr_event_elapsed_ms(gpuarr_event start, gpuarr_event end, double *ms) {
    GPUARR__BEGIN();
    GPUARR__REQUIRE_PTR(ms);
    gpuarr__event *a, *b;
    GPUARR__CHECK(gpuarr__get_event(start, "start", &a));
    gpuarr_result r = gpuarr__get_event(end, "end", &b);
    if (r != GPUARR_OK) {
        gpuarr__obj_release(&a->obj);
        return r;
    }
    r = gpuarr__check_timing_event(a, "start");
    if (r == GPUARR_OK) r = gpuarr__check_timing_event(b, "end");
    if (r == GPUARR_OK && a->dev != b->dev)
        r = gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "start is on %s but end is on %s", a->dev->info.spec, b->dev->info.spec);
    double value = 0;
    if (r == GPUARR_OK) r = a->dev->backend->event_elapsed(a->dev, a->native, b->native, &value);
    if (r == GPUARR_OK) *ms = value;
    gpuarr__obj_release(&a->obj);
    gpuarr__obj_release(&b->obj);
    return r;
}

/* ---------------------------------------------------------------------------------------------
 * Memory pools: the public side
 * ------------------------------------------------------------------------------------------- */
/* GPUARR_FAULTS: "host:nth=3,opencl:0:above=1M" -- per device, fail the nth raw allocation from
   init, or every raw allocation above a size. */
static gpuarr_result gpuarr__apply_faults(const char *text) {
    gpuarr__tls.api = "gpuarr_init";
    for (const char *p = text; *p;) {
        size_t len = strcspn(p, ",");
        char item[128];
        if (len >= sizeof item) return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "GPUARR_FAULTS: item too long");
        memcpy(item, p, len);
        item[len] = '\0';
        char *colon = strrchr(item, ':'), *eq = colon ? strchr(colon, '=') : NULL;
        gpuarr__dev *d = NULL;
        uint64_t n = 0;
        if (colon) *colon = '\0';
        const char *key = colon ? colon + 1 : "";
        bool nth = strncmp(key, "nth=", 4) == 0, above = strncmp(key, "above=", 6) == 0, pinned = strncmp(key, "pinned_above=", 13) == 0;
        bool ok = colon && eq && gpuarr__parse_bytes(eq + 1, strlen(eq + 1), &n) && (nth || above || pinned);
        ok = ok && gpuarr__find_device(item, &d) == GPUARR_OK;
        if (!ok)
            return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT,
                                "GPUARR_FAULTS: \"%.*s\" is not <device>:nth=N, <device>:above=BYTES or <device>:pinned_above=BYTES "
                                "for a present device",
                                (int)len, p);
        if (nth) d->pool.fault_countdown = n;
        else if (above) d->pool.fault_above = n;
        else d->pinned.fault_above = n;
        p += len;
        if (*p) p++;
    }
    return GPUARR_OK;
}

GPUARR_API gpuarr_result gpuarr_pool_get_stats(gpuarr_device d, gpuarr_pool_stats *out) {
    GPUARR__BEGIN();
    GPUARR__REQUIRE_PTR(out);
    gpuarr__dev *dev;
    GPUARR__CHECK(gpuarr__get_dev(d, "d", &dev));
    gpuarr__holds_release(); /* the stats count no export the caller let go */
    pthread_mutex_lock(&dev->pool.lock);
    *out = gpuarr__pool_stats_now(&dev->pool);
    pthread_mutex_unlock(&dev->pool.lock);
    return GPUARR_OK;
}

GPUARR_API gpuarr_result gpuarr_pool_get_pinned_stats(gpuarr_device d, gpuarr_pool_stats *out) {
    GPUARR__BEGIN();
    GPUARR__REQUIRE_PTR(out);
    gpuarr__dev *dev;
    GPUARR__CHECK(gpuarr__get_dev(d, "d", &dev));
    pthread_mutex_lock(&dev->pinned.lock);
    *out = dev->pinned.stats;
    pthread_mutex_unlock(&dev->pinned.lock);
    return GPUARR_OK;
}

GPUARR_API gpuarr_result gpuarr_pool_reset_peaks(gpuarr_device d) {
    GPUARR__BEGIN();
    gpuarr__dev *dev;
    GPUARR__CHECK(gpuarr__get_dev(d, "d", &dev));
    gpuarr_pool_stats *st = &dev->pool.stats;
    pthread_mutex_lock(&dev->pool.lock);
    st->peak_allocated_bytes = st->allocated_bytes;
    st->peak_requested_bytes = st->requested_bytes;
    st->peak_reserved_bytes = st->reserved_bytes;
    st->peak_allocations = st->allocations;
    st->peak_segments = st->segments;
    pthread_mutex_unlock(&dev->pool.lock);
    return GPUARR_OK;
}

GPUARR_API gpuarr_result gpuarr_pool_set_limit(gpuarr_device d, uint64_t bytes) {
    GPUARR__BEGIN();
    gpuarr__dev *dev;
    GPUARR__CHECK(gpuarr__get_dev(d, "d", &dev));
    gpuarr__pool *p = &dev->pool;
    pthread_mutex_lock(&p->lock);
    p->stats.limit_bytes = bytes;
    gpuarr__pool_quick_flush(p); /* the threads' cached arrays count as cached, not allocated */
    if (bytes && p->stats.reserved_bytes > bytes) /* shed cache; live arrays stay */
        gpuarr__pool_release_cached(&dev->pool, 0, bytes > p->stats.allocated_bytes ? bytes - p->stats.allocated_bytes : 0);
    pthread_mutex_unlock(&p->lock);
    return GPUARR_OK;
}

GPUARR_API gpuarr_result gpuarr_pool_trim(gpuarr_device d) {
    GPUARR__BEGIN();
    gpuarr__dev *dev;
    GPUARR__CHECK(gpuarr__get_dev(d, "d", &dev));
    gpuarr__holds_release(); /* exports the caller let go, whose memory can then be trimmed */
    gpuarr__collect_device(dev); /* frees that were waiting on finished work */
    gpuarr__pool *pools[2] = {&dev->pool, &dev->pinned};
    for (int i = 0; i < 2; i++) {
        pthread_mutex_lock(&pools[i]->lock);
        gpuarr__pool_release_cached(pools[i], 0, 0);
        pthread_mutex_unlock(&pools[i]->lock);
    }
    return GPUARR_OK;
}

/* Appends to the NUL-terminated text in buf (cap bytes), cut at cap: summaries and messages
   built a piece at a time. */
/* Appends to the NUL-terminated buf of cap bytes, cut to fit; whole: all of it or nothing. */
static void gpuarr__vappend(char *buf, size_t cap, bool whole, const char *fmt, va_list ap) {
    size_t used = strlen(buf);
    if (used + 1 >= cap) return;
    int n = vsnprintf(buf + used, cap - used, fmt, ap);
    if (whole && (n < 0 || (size_t)n >= cap - used)) buf[used] = '\0';
}

static void gpuarr__append(char *buf, size_t cap, const char *fmt, ...) GPUARR__PRINTF(3, 4);
static void gpuarr__append(char *buf, size_t cap, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    gpuarr__vappend(buf, cap, false, fmt, ap);
    va_end(ap);
}

/* A line of a summary: appended whole or not at all, so that a summary cut to its buffer still
   ends with a whole line. */
static void gpuarr__append_line(char *buf, size_t cap, const char *fmt, ...) GPUARR__PRINTF(3, 4);
static void gpuarr__append_line(char *buf, size_t cap, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    gpuarr__vappend(buf, cap, true, fmt, ap);
    va_end(ap);
}

static int gpuarr__format_bytes(char *out, size_t cap, uint64_t n) {
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)n;
    int u = 0;
    while (v >= 1024.0 && u < 4) v /= 1024.0, u++;
    return snprintf(out, cap, u ? "%.1f %s" : "%.0f %s", v, units[u]);
}

GPUARR_API gpuarr_result gpuarr_pool_summary(gpuarr_device d, char *buf, size_t len) {
    GPUARR__BEGIN();
    GPUARR__REQUIRE_PTR(buf);
    if (!len) return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "len is 0");
    gpuarr__dev *dev;
    gpuarr_pool_stats st, pin;
    GPUARR__CHECK(gpuarr__get_dev(d, "d", &dev));
    pthread_mutex_lock(&dev->pool.lock);
    st = gpuarr__pool_stats_now(&dev->pool);
    pthread_mutex_unlock(&dev->pool.lock);
    pthread_mutex_lock(&dev->pinned.lock);
    pin = dev->pinned.stats;
    pthread_mutex_unlock(&dev->pinned.lock);
    char a[3][24];
    size_t used = 0;
#define GPUARR__PUT(...)                                                                       \
    do {                                                                                       \
        int n_ = snprintf(buf + used, len - used, __VA_ARGS__);                                \
        used += n_ > 0 ? GPUARR__MIN((size_t)n_, len - used - 1) : 0;                          \
    } while (0)
#define GPUARR__ROW(label, cur, peak, total)                                                   \
    do {                                                                                       \
        gpuarr__format_bytes(a[0], sizeof a[0], cur);                                          \
        gpuarr__format_bytes(a[1], sizeof a[1], peak);                                         \
        gpuarr__format_bytes(a[2], sizeof a[2], total);                                        \
        GPUARR__PUT("  %-16s %14s %14s %14s\n", label, a[0], a[1], a[2]);                      \
    } while (0)
    GPUARR__PUT("memory pool of %s (%s)\n  %-16s %14s %14s %14s\n", dev->info.spec, dev->pool.caching ? "caching" : "not caching",
                "", "current", "peak", "total");
    GPUARR__ROW("allocated", st.allocated_bytes, st.peak_allocated_bytes, st.total_allocated_bytes);
    GPUARR__ROW("requested", st.requested_bytes, st.peak_requested_bytes, st.total_requested_bytes);
    GPUARR__ROW("reserved", st.reserved_bytes, st.peak_reserved_bytes, st.total_reserved_bytes);
    GPUARR__PUT("  %-16s %14llu %14llu %14llu\n", "allocations", (unsigned long long)st.allocations,
                (unsigned long long)st.peak_allocations, (unsigned long long)st.total_allocations);
    GPUARR__PUT("  %-16s %14llu %14llu %14llu\n", "segments", (unsigned long long)st.segments, (unsigned long long)st.peak_segments,
                (unsigned long long)st.total_segments);
    gpuarr__format_bytes(a[0], sizeof a[0], st.limit_bytes);
    gpuarr__format_bytes(a[1], sizeof a[1], st.release_threshold_bytes);
    GPUARR__PUT("  limit %s, release threshold %s\n", st.limit_bytes ? a[0] : "none",
                st.release_threshold_bytes == UINT64_MAX ? "none" : a[1]);
    GPUARR__PUT("  cache hits %llu, misses %llu; device allocations %llu, frees %llu; cross-stream waits %llu\n",
                (unsigned long long)st.cache_hits, (unsigned long long)st.cache_misses, (unsigned long long)st.backend_allocs,
                (unsigned long long)st.backend_frees, (unsigned long long)st.cross_stream_waits);
    GPUARR__PUT("  out of memory: handler calls %llu, oversize releases %llu, waits %llu, trims %llu, retries %llu, "
                "failures %llu, placed on host %llu\n",
                (unsigned long long)st.oom_handler_calls, (unsigned long long)st.oom_oversize_releases, (unsigned long long)st.oom_waits,
                (unsigned long long)st.oom_trims, (unsigned long long)st.oom_retries, (unsigned long long)st.oom_failures,
                (unsigned long long)st.host_fallbacks);
    if (pin.total_segments) {
        gpuarr__format_bytes(a[0], sizeof a[0], pin.reserved_bytes);
        gpuarr__format_bytes(a[1], sizeof a[1], pin.peak_reserved_bytes);
        GPUARR__PUT("  pinned staging memory: reserved %s (peak %s), chunks handed out %llu (cache hits %llu)\n", a[0], a[1],
                    (unsigned long long)pin.total_allocations, (unsigned long long)pin.cache_hits);
    }
#undef GPUARR__ROW
#undef GPUARR__PUT
    return GPUARR_OK;
}

GPUARR_API gpuarr_result gpuarr_pool_snapshot(gpuarr_device d, gpuarr_pool_segment_info *segments, size_t max_segments,
                                              size_t *segment_count, gpuarr_pool_block_info *blocks, size_t max_blocks,
                                              size_t *block_count) {
    GPUARR__BEGIN();
    GPUARR__REQUIRE_PTR(segment_count);
    GPUARR__REQUIRE_PTR(block_count);
    if ((max_segments && !segments) || (max_blocks && !blocks))
        return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "a NULL array with a nonzero max");
    gpuarr__dev *dev;
    GPUARR__CHECK(gpuarr__get_dev(d, "d", &dev));
    size_t ns = 0, nb = 0;
    pthread_mutex_lock(&dev->pool.lock);
    gpuarr__pool_quick_flush(&dev->pool); /* the snapshot shows free blocks merged */
    for (gpuarr__segment *seg = dev->pool.segments; seg; seg = seg->next, ns++) {
        if (ns < max_segments) {
            segments[ns].size = seg->size;
            segments[ns].small_pool = seg->small;
            segments[ns].first_block = (uint32_t)nb;
            segments[ns].block_count = 0;
        }
        for (gpuarr__block *b = seg->first; b; b = b->next, nb++) {
            if (ns < max_segments) segments[ns].block_count++;
            if (nb >= max_blocks) continue;
            blocks[nb].offset = b->offset;
            blocks[nb].size = b->size;
            blocks[nb].requested = b->requested;
            blocks[nb].allocated = b->allocated;
            blocks[nb].pending_events = b->nevents;
        }
    }
    pthread_mutex_unlock(&dev->pool.lock);
    *segment_count = ns;
    *block_count = nb;
    return GPUARR_OK;
}

GPUARR_API gpuarr_result gpuarr_oom_handler_add(gpuarr_oom_fn fn, void *user_data) {
    GPUARR__BEGIN();
    GPUARR__REQUIRE_PTR(fn);
    pthread_mutex_lock(&gpuarr__g.oom_lock);
    gpuarr_result r = GPUARR_OK;
    int n = gpuarr__g.oom_handler_count;
    if (n == (int)(sizeof gpuarr__g.oom_handlers / sizeof gpuarr__g.oom_handlers[0])) {
        r = gpuarr__fail(GPUARR_ERROR_OVERFLOW, "there are already %d out-of-memory handlers", n);
    } else {
        gpuarr__g.oom_handlers[n].fn = fn;
        gpuarr__g.oom_handlers[n].user = user_data;
        gpuarr__g.oom_handler_count = n + 1;
    }
    pthread_mutex_unlock(&gpuarr__g.oom_lock);
    return r;
}

GPUARR_API gpuarr_result gpuarr_oom_handler_remove(gpuarr_oom_fn fn, void *user_data) {
    GPUARR__BEGIN();
    pthread_mutex_lock(&gpuarr__g.oom_lock);
    int n = gpuarr__g.oom_handler_count, found = -1;
    for (int i = 0; i < n && found < 0; i++)
        if (gpuarr__g.oom_handlers[i].fn == fn && gpuarr__g.oom_handlers[i].user == user_data) found = i;
    if (found >= 0) {
        memmove(&gpuarr__g.oom_handlers[found], &gpuarr__g.oom_handlers[found + 1], sizeof gpuarr__g.oom_handlers[0] * (size_t)(n - found - 1));
        gpuarr__g.oom_handler_count = n - 1;
    }
    pthread_mutex_unlock(&gpuarr__g.oom_lock);
    return found >= 0 ? GPUARR_OK : gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "no such handler (fn, user_data) was added");
}

GPUARR_API gpuarr_result gpuarr_pool_inject_faults(gpuarr_device d, uint64_t nth, uint64_t above_bytes) {
    GPUARR__BEGIN();
    gpuarr__dev *dev;
    GPUARR__CHECK(gpuarr__get_dev(d, "d", &dev));
    pthread_mutex_lock(&dev->pool.lock);
    dev->pool.fault_countdown = nth;
    dev->pool.fault_above = above_bytes;
    pthread_mutex_unlock(&dev->pool.lock);
    return GPUARR_OK;
}

/* Work the caller queued on s may have written a: a's contents are valid once s passes this
   point. s first waits for a's earlier producer, so one event stands for both, and every later
   reader (they wait for the ready event) and writer (they also wait for the use list) of a
   comes after the caller's work. */
static gpuarr_result gpuarr__array_written_on(gpuarr__array *a, gpuarr__stream *s) {
    gpuarr__array_note_use(a, s);
    if (gpuarr__backend_has(s->dev->backend, GPUARR__BACKEND_SYNCHRONOUS) || !gpuarr__root(a)->mem) return GPUARR_OK;
    gpuarr__event *before = gpuarr__ready_get(a), *after = NULL;
    gpuarr_result r = before ? gpuarr__stream_wait_raw(s, before) : GPUARR_OK;
    if (before) gpuarr__obj_release(&before->obj);
    if (r == GPUARR_OK) r = gpuarr__event_new(s->dev, false, &after);
    if (r == GPUARR_OK) r = gpuarr__event_record_raw(after, s);
    if (r == GPUARR_OK) gpuarr__ready_set(a, after);
    else if (after) gpuarr__obj_release(&after->obj);
    return r;
}

/* ---------------------------------------------------------------------------------------------
 * Portable kernels: the launch (checks, order, the backend's launch, the arrays' uses)
 * ------------------------------------------------------------------------------------------- */
static const char *const gpuarr__param_kind_names[] = {"?", "SCALAR", "IN", "OUT", "INOUT"};

/* k is what GPUARR_KERNEL makes. */
static gpuarr_result gpuarr__kernel_check(const gpuarr_kernel *k) {
    if (!k) return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "k is NULL");
    if (!k->name || !k->body || !k->params || !k->host || k->nparams < 1 || k->nparams > GPUARR_KERNEL_MAX_PARAMS)
        return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "k is not a kernel GPUARR_KERNEL made (name, body, params, host: "
                            "set; nparams = %d: 1..%d)", k->nparams, GPUARR_KERNEL_MAX_PARAMS);
    bool array = false;
    for (int i = 0; i < k->nparams; i++) {
        const gpuarr_kernel_param *p = &k->params[i];
        if (p->kind < GPUARR_PARAM_SCALAR || p->kind > GPUARR_PARAM_INOUT || !gpuarr__dtype_valid(p->dtype) || p->dtype == GPUARR_BOOL ||
            !p->name || !p->type)
            return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "kernel %s: parameter %d is not one GPUARR_KERNEL made", k->name, i);
        array = array || p->kind != GPUARR_PARAM_SCALAR;
    }
    if (!array)
        return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "kernel %s has no array parameter: a launch runs on its arrays' device", k->name);
    return GPUARR_OK;
}

/* The index space: l's, or 1-D over the first array's elements. */
static gpuarr_result gpuarr__launch_shape(const gpuarr_kernel *k, const gpuarr_launch *l, const gpuarr__array *first, gpuarr__kernel_call *c) {
    c->ndim = l && l->ndim ? l->ndim : 1;
    if (c->ndim < 1 || c->ndim > 3)
        return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "kernel %s: l->ndim = %d: must be 0 (1-D over the first array) or 1..3", k->name, l->ndim);
    int64_t total = 1;
    for (int d = 0; d < 3; d++) {
        c->global[d] = d >= c->ndim ? 1 : l && l->ndim ? l->global[d] : first->count;
        if (c->global[d] < 0)
            return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "kernel %s: l->global[%d] = %lld: must be >= 0", k->name, d, (long long)c->global[d]);
        if (c->global[d] && total > INT64_MAX / c->global[d])
            return gpuarr__fail(GPUARR_ERROR_OVERFLOW, "kernel %s: the index space %lld x %lld x %lld overflows int64", k->name,
                                (long long)l->global[0], (long long)l->global[1], (long long)l->global[2]);
        total *= c->global[d];
    }
    return GPUARR_OK;
}

/* Every argument against its parameter: arrays live, on one device, of the parameter's dtype,
   writable where written; scalars given. */
static gpuarr_result gpuarr__kernel_args(const gpuarr_kernel *k, const gpuarr_kernel_arg *args, gpuarr__array **arrs, gpuarr__kernel_call *c) {
    gpuarr__array *first = NULL;
    const char *first_name = NULL;
    for (int i = 0; i < k->nparams; i++) {
        const gpuarr_kernel_param *p = &k->params[i];
        if (p->kind == GPUARR_PARAM_SCALAR) {
            if (!args[i].scalar) return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "kernel %s: scalar parameter %s has no value (NULL)", k->name, p->name);
            c->scalar[i] = args[i].scalar;
            continue;
        }
        gpuarr_result r = gpuarr__get_array(args[i].array, p->name, &arrs[i]);
        if (r != GPUARR_OK) {
            char why[400];
            gpuarr__copy_string(why, sizeof why, gpuarr__tls.error_detail);
            return gpuarr__fail(r, "kernel %s: parameter %s", k->name, why);
        }
        gpuarr__array *a = arrs[i];
        char arg[80]; /* for the messages below, made only when one is given */
#define GPUARR__KARG_NAME() snprintf(arg, sizeof arg, "kernel %s: parameter %s", k->name, p->name)
        if (!first) first = a, first_name = p->name;
        if (a->dev != first->dev && GPUARR__KARG_NAME() > 0)
            return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "%s is on %s, but %s is on %s: a kernel's arrays live on one device "
                                "(gpuarr_convert moves them)", arg, a->dev->info.spec, first_name, first->dev->info.spec);
        if (a->dtype != p->dtype && GPUARR__KARG_NAME() > 0)
            return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "%s (%s %s) was given an array of %s", arg, gpuarr__param_kind_names[p->kind],
                                gpuarr__dtype_names[p->dtype], gpuarr__dtype_names[a->dtype]);
        if (p->kind != GPUARR_PARAM_IN && a->read_only && GPUARR__KARG_NAME() > 0)
            return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "%s is %s but its array is read-only (an import marked read-only)", arg,
                                gpuarr__param_kind_names[p->kind]);
        if (a->offset % gpuarr__dtype_sizes[a->dtype] && GPUARR__KARG_NAME() > 0)
            return gpuarr__fail(GPUARR_ERROR_UNSUPPORTED, "%s: its array starts %zu bytes into its memory, not at a whole element of %s", arg,
                                a->offset, gpuarr__dtype_names[a->dtype]);
        c->mem[i] = a->mem;
        c->offset[i] = a->offset;
#undef GPUARR__KARG_NAME
    }
    return GPUARR_OK;
}

/* After the launch: every array's use noted, and one event after the kernel made the ready point
   of every array it writes (the launch was ordered after their earlier work, so it covers it). */
static gpuarr_result gpuarr__kernel_note_uses(const gpuarr_kernel *k, gpuarr__array **arrs, gpuarr__stream *s) {
    bool async = !gpuarr__backend_has(s->dev->backend, GPUARR__BACKEND_SYNCHRONOUS);
    gpuarr__event *done = NULL;
    gpuarr_result r = GPUARR_OK;
    for (int i = 0; i < k->nparams; i++) {
        if (!arrs[i]) continue;
        gpuarr__array_note_use(arrs[i], s);
        if (!async) continue;
        if (k->params[i].kind != GPUARR_PARAM_IN && gpuarr__root(arrs[i])->mem && r == GPUARR_OK) {
            if (!done && (r = gpuarr__event_new(s->dev, false, &done)) == GPUARR_OK && (r = gpuarr__event_record_own(done, s)) != GPUARR_OK) {
                gpuarr__obj_release(&done->obj);
                done = NULL;
            }
            if (done) {
                gpuarr__obj_retain(&done->obj);
                gpuarr__ready_set(arrs[i], done);
            }
        }
        if (gpuarr__root(arrs[i])->wrapped) { /* the caller's memory: kept until the kernel passes */
            gpuarr__obj_retain(&arrs[i]->obj);
            gpuarr__stream_defer(s, gpuarr__release_obj_deferred, &arrs[i]->obj);
        }
    }
    if (done) gpuarr__obj_release(&done->obj);
    return r;
}

static gpuarr_result gpuarr__kernel_launch(const gpuarr_kernel *k, const gpuarr_launch *l, const gpuarr_kernel_arg *args, gpuarr__array **arrs) {
    GPUARR__CHECK(gpuarr__kernel_check(k));
    if (!args) return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "kernel %s: args is NULL", k->name);
    gpuarr__kernel_call c;
    memset(&c, 0, sizeof c);
    c.kernel = k;
    GPUARR__CHECK(gpuarr__kernel_args(k, args, arrs, &c));
    gpuarr__array *first = NULL;
    for (int i = 0; i < k->nparams && !first; i++) first = arrs[i];
    gpuarr__dev *dev = first->dev;
    GPUARR__CHECK(gpuarr__launch_shape(k, l, first, &c));
    gpuarr__stream *s = NULL;
    if (l && l->stream.id) {
        GPUARR__CHECK(gpuarr__get_stream(l->stream, "l->stream", &s));
        if (s->dev != dev) {
            gpuarr__obj_release(&s->obj);
            return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "kernel %s: l->stream is on %s, but the arrays are on %s", k->name, s->dev->info.spec,
                                dev->info.spec);
        }
    } else {
        GPUARR__CHECK(gpuarr__stream_for(dev, NULL, &s));
    }
    gpuarr_result r = GPUARR_OK;
    if (!dev->backend->kernel_launch)
        r = gpuarr__fail(GPUARR_ERROR_UNSUPPORTED, "kernel %s: %s (%s) runs no portable kernels", k->name, dev->info.spec, dev->backend->name);
    bool empty = c.global[0] == 0 || c.global[1] == 0 || c.global[2] == 0;
    if (r == GPUARR_OK && !empty) r = dev->backend->kernel_build(dev, k); /* a build failure enqueues nothing */
    for (int i = 0; i < k->nparams && r == GPUARR_OK && !empty; i++)
        if (arrs[i]) r = gpuarr__order_after_uses(s, arrs[i]);
    if (r == GPUARR_OK && !empty) r = dev->backend->kernel_launch(s, &c);
    if (r == GPUARR_OK && !empty) r = gpuarr__kernel_note_uses(k, arrs, s);
    gpuarr__obj_release(&s->obj);
    return r;
}

GPUARR_API gpuarr_result gpuarr_kernel_launch(const gpuarr_kernel *k, const gpuarr_launch *l, const gpuarr_kernel_arg *args) {
    GPUARR__BEGIN();
    gpuarr__array *arrs[GPUARR_KERNEL_MAX_PARAMS] = {0};
    gpuarr_result r = gpuarr__kernel_launch(k, l, args, arrs);
    for (int i = 0; i < GPUARR_KERNEL_MAX_PARAMS; i++)
        if (arrs[i]) gpuarr__obj_release(&arrs[i]->obj);
    return r;
}

GPUARR_API gpuarr_result gpuarr_kernel_build(const gpuarr_kernel *k, gpuarr_device d) {
    GPUARR__BEGIN();
    GPUARR__CHECK(gpuarr__kernel_check(k));
    gpuarr__dev *dev;
    GPUARR__CHECK(gpuarr__get_dev(d, "d", &dev));
    if (!dev->backend->kernel_build)
        return gpuarr__fail(GPUARR_ERROR_UNSUPPORTED, "kernel %s: %s (%s) runs no portable kernels", k->name, dev->info.spec, dev->backend->name);
    GPUARR__CHECK(gpuarr__dev_open(dev));
    return dev->backend->kernel_build(dev, k);
}

GPUARR_API gpuarr_result gpuarr_kernel_build_log(const gpuarr_kernel *k, gpuarr_device d, char *buf, size_t len) {
    GPUARR__BEGIN();
    GPUARR__CHECK(gpuarr__kernel_check(k));
    gpuarr__dev *dev;
    GPUARR__CHECK(gpuarr__get_dev(d, "d", &dev));
    if (!buf || !len) return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "buf is NULL or len is 0");
    buf[0] = '\0';
    pthread_mutex_lock(&gpuarr__g.kernel_logs_lock);
    for (gpuarr__kernel_log *e = gpuarr__g.kernel_logs; e; e = e->next)
        if (e->kernel == k && e->dev == dev && e->text) gpuarr__copy_string(buf, len, e->text);
    pthread_mutex_unlock(&gpuarr__g.kernel_logs_lock);
    return GPUARR_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Reductions: one fixed tree on every device. Each level folds blocks of 256 consecutive
 * elements left to right into one (GPUARR__REDUCE_BLOCK), until one is left; the sums are in the
 * accumulation dtype (out_dtype; f32 for f16 and bf16), integers wrapping, so the bits are the
 * same wherever it runs. The levels are portable kernels, one per op and accumulation dtype.
 * ------------------------------------------------------------------------------------------- */
#define GPUARR__REDUCE_BLOCK 256
/* X(T, dtype) for every accumulation dtype, integer and floating */
#define GPUARR__REDUCE_INT_TYPES(X)                                                            \
    X(int8_t, I8) X(uint8_t, U8) X(int16_t, I16) X(uint16_t, U16) X(int32_t, I32) X(uint32_t, U32) X(int64_t, I64) X(uint64_t, U64)
#define GPUARR__REDUCE_FLOAT_TYPES(X) X(float, F32) X(double, F64)
/* one block: j's elements [j * 256, min(n, j * 256 + 256)), folded by `step` */
#define GPUARR__REDUCE_BODY(T, step)                                                           \
    {                                                                                          \
        const int64_t j = gpuarr_index(0), lo = j * 256, hi = lo + 256 < n ? lo + 256 : n;     \
        T acc = in[lo];                                                                        \
        for (int64_t i = lo + 1; i < hi; i++) {                                                \
            const T v = in[i];                                                                 \
            step;                                                                              \
        }                                                                                      \
        out[j] = acc;                                                                          \
    }
#define GPUARR__REDUCE_SUM_INT(T) acc = (T)((uint64_t)acc + (uint64_t)v) /* wraps, no overflow */
#define GPUARR__REDUCE_SUM_FLOAT(T) acc = acc + v
#define GPUARR__REDUCE_MIN(T) acc = acc != acc ? acc : (v != v || v < acc) ? v : acc /* a NaN wins */
#define GPUARR__REDUCE_MAX(T) acc = acc != acc ? acc : (v != v || v > acc) ? v : acc
#define GPUARR__REDUCE_KERNEL(op, T, dtype, step)                                              \
    GPUARR__KERNEL_DEFINE(GPUARR__FOR_BACKENDS static, gpuarr__reduce_##op##_##dtype,          \
                          GPUARR__KXSTR(GPUARR__REDUCE_BODY(T, step(T))),                      \
                          (GPUARR_IN(T, in), GPUARR_OUT(T, out), GPUARR_SCALAR(int64_t, n)),   \
                          GPUARR__REDUCE_BODY(T, step(T)))
#define GPUARR__REDUCE_INT_KERNELS(T, dtype)                                                   \
    GPUARR__REDUCE_KERNEL(sum, T, dtype, GPUARR__REDUCE_SUM_INT)                               \
    GPUARR__REDUCE_KERNEL(min, T, dtype, GPUARR__REDUCE_MIN)                                   \
    GPUARR__REDUCE_KERNEL(max, T, dtype, GPUARR__REDUCE_MAX)
#define GPUARR__REDUCE_FLOAT_KERNELS(T, dtype)                                                 \
    GPUARR__REDUCE_KERNEL(sum, T, dtype, GPUARR__REDUCE_SUM_FLOAT)                             \
    GPUARR__REDUCE_KERNEL(min, T, dtype, GPUARR__REDUCE_MIN)                                   \
    GPUARR__REDUCE_KERNEL(max, T, dtype, GPUARR__REDUCE_MAX)
GPUARR__REDUCE_INT_TYPES(GPUARR__REDUCE_INT_KERNELS)
GPUARR__REDUCE_FLOAT_TYPES(GPUARR__REDUCE_FLOAT_KERNELS)

/* The level kernel of an op and accumulation dtype (a switch: C++ has no array designators). */
static const gpuarr_kernel *gpuarr__reduce_kernel(gpuarr_reduce_op op, gpuarr_dtype acc) {
    switch (acc) {
#define GPUARR__REDUCE_CASE(T, dtype)                                                          \
    case GPUARR_##dtype:                                                                       \
        return op == GPUARR_SUM   ? &gpuarr__reduce_sum_##dtype##_gpuarr_kernel                \
               : op == GPUARR_MIN ? &gpuarr__reduce_min_##dtype##_gpuarr_kernel                \
                                  : &gpuarr__reduce_max_##dtype##_gpuarr_kernel;
        GPUARR__REDUCE_INT_TYPES(GPUARR__REDUCE_CASE)
        GPUARR__REDUCE_FLOAT_TYPES(GPUARR__REDUCE_CASE)
#undef GPUARR__REDUCE_CASE
    default: return NULL; /* bool, f16, bf16: never an accumulation dtype */
    }
}

static const char *const gpuarr__reduce_op_names[] = {"?", "GPUARR_SUM", "GPUARR_MIN", "GPUARR_MAX"};

/* Drops a handle gpuarr_reduce made (none: nothing), keeping the thread's error: a failure being
   reported must not become the release's message. */
static void gpuarr__reduce_drop(gpuarr_array h) {
    if (!h.id) return;
    gpuarr__error_saved sv;
    gpuarr__error_save(&sv);
    gpuarr_release(h);
    gpuarr__error_restore(&sv);
}

/* The levels, from src (n elements of acc, a reference the caller gives up) to one element. */
static gpuarr_result gpuarr__reduce_levels(const gpuarr_kernel *k, gpuarr_array src, int64_t n, gpuarr_device dev, gpuarr_dtype acc,
                                           gpuarr_array *out) {
    gpuarr_result r = GPUARR_OK;
    while (r == GPUARR_OK && n > 1) {
        int64_t m = (n + GPUARR__REDUCE_BLOCK - 1) / GPUARR__REDUCE_BLOCK;
        gpuarr_array partial = {0};
        r = gpuarr_empty(dev, acc, 1, &m, &partial);
        gpuarr_launch l = {{0}, 1, {m, 0, 0}};
        gpuarr_kernel_arg args[3] = {{src, NULL}, {partial, NULL}, {{0}, &n}};
        if (r == GPUARR_OK) r = gpuarr_kernel_launch(k, &l, args);
        gpuarr__reduce_drop(src);
        src = partial;
        n = m;
    }
    if (r == GPUARR_OK) *out = src;
    else gpuarr__reduce_drop(src);
    return r;
}

GPUARR_API gpuarr_result gpuarr_reduce(gpuarr_array a, gpuarr_reduce_op op, gpuarr_dtype out_dtype, gpuarr_array *out) {
    GPUARR__BEGIN();
    GPUARR__REQUIRE_PTR(out);
    if (op < GPUARR_SUM || op > GPUARR_MAX)
        return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "op = %d: must be GPUARR_SUM, GPUARR_MIN or GPUARR_MAX", (int)op);
    gpuarr__array *arr;
    GPUARR__CHECK(gpuarr__get_array(a, "a", &arr));
    gpuarr_dtype in_t = arr->dtype;
    int64_t n = arr->count;
    int ndim = arr->ndim;
    gpuarr_device dev = arr->dev->info.device;
    gpuarr__obj_release(&arr->obj);
    gpuarr_dtype t = out_dtype ? out_dtype : in_t;
    if (!gpuarr__dtype_valid(t)) return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "out_dtype = %d is not a gpuarr_dtype", (int)out_dtype);
    if (t == GPUARR_BOOL) return gpuarr__fail(GPUARR_ERROR_UNSUPPORTED, "out_dtype bool: reduce to u8 instead (a bool has no sum)");
    if (n == 0 && op != GPUARR_SUM)
        return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "a is empty: %s of no elements is undefined", gpuarr__reduce_op_names[op]);
    gpuarr_dtype acc = t == GPUARR_F16 || t == GPUARR_BF16 ? GPUARR_F32 : t;
    gpuarr_array src = {0}, one = {0}, result = {0};
    gpuarr_result r;
    if (n == 0) { /* the sum of nothing */
        int64_t len = 1;
        r = gpuarr_zeros(dev, acc, 1, &len, &one);
    } else {
        r = in_t == acc ? gpuarr_retain(a) : gpuarr_convert(a, dev, acc, &src);
        if (in_t == acc) src = a;
        if (r == GPUARR_OK && ndim != 1) { /* the levels see a flat array */
            gpuarr_array flat = {0};
            r = gpuarr_reshape(src, 1, &n, &flat);
            gpuarr__reduce_drop(src);
            src = flat;
        }
        if (r == GPUARR_OK) r = gpuarr__reduce_levels(gpuarr__reduce_kernel(op, acc), src, n, dev, acc, &one);
    }
    if (r == GPUARR_OK && acc != t) {
        gpuarr_array narrow = {0};
        r = gpuarr_convert(one, dev, t, &narrow);
        gpuarr__reduce_drop(one);
        one = narrow;
    }
    if (r == GPUARR_OK) r = gpuarr_reshape(one, 0, NULL, &result);
    gpuarr__reduce_drop(one);
    gpuarr__tls.api = "gpuarr_reduce"; /* the calls above named themselves, in their messages too */
    if (r != GPUARR_OK) gpuarr__tls.error_api = "gpuarr_reduce";
    if (r == GPUARR_OK) *out = result;
    return r;
}

GPUARR_API gpuarr_result gpuarr_array_record_stream(gpuarr_array a, gpuarr_stream s) {
    GPUARR__BEGIN();
    gpuarr__array *arr;
    gpuarr__stream *st;
    GPUARR__CHECK(gpuarr__get_array(a, "a", &arr));
    gpuarr_result r = gpuarr__resolve_stream(s, "s", &st);
    if (r == GPUARR_OK) {
        /* a host array may be written by any device's work (pinned, mapped or wrapped memory) */
        if (st->dev != arr->dev && !gpuarr__backend_has(arr->dev->backend, GPUARR__BACKEND_HOST_MEMORY))
            r = gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "s is on %s but a lives on %s (only a host array may be recorded "
                             "on another device's stream)", st->dev->info.spec, arr->dev->info.spec);
        else
            r = gpuarr__array_written_on(arr, st);
        gpuarr__obj_release(&st->obj);
    }
    gpuarr__obj_release(&arr->obj);
    return r;
}

/* ---------------------------------------------------------------------------------------------
 * Current device and stream, scopes
 * ------------------------------------------------------------------------------------------- */
GPUARR_API gpuarr_device gpuarr_current_device(void) {
    gpuarr_device none = {0};
    if (!gpuarr__initialized() || gpuarr__tls.scope_failure) return none;
    return gpuarr__current_dev()->info.device;
}

/* Puts back the thread's native context from before gpuarr_set_current_device made a device's
   current, if it did so in this init cycle (an earlier cycle's devices are gone). */
static void gpuarr__activation_end(void) {
    gpuarr__dev *dev = gpuarr__tls.activation.dev;
    if (dev && gpuarr__tls.activation.epoch == gpuarr__g.epoch) gpuarr__backend_deactivate(dev, gpuarr__tls.activation.previous);
    memset(&gpuarr__tls.activation, 0, sizeof gpuarr__tls.activation);
}

GPUARR_API gpuarr_result gpuarr_set_current_device(gpuarr_device d) {
    GPUARR__BEGIN();
    if (d.id == 0) {
        gpuarr__activation_end();
        gpuarr__tls.device_id = 0;
        return GPUARR_OK;
    }
    gpuarr__dev *dev;
    GPUARR__CHECK(gpuarr__get_dev(d, "d", &dev));
    GPUARR__CHECK(gpuarr__dev_open(dev));
    gpuarr__activation_end(); /* so that `previous` is the thread's own context */
    void *previous;
    GPUARR__CHECK(gpuarr__backend_activate(dev, &previous));
    gpuarr__tls.activation.epoch = gpuarr__g.epoch;
    gpuarr__tls.activation.dev = dev;
    gpuarr__tls.activation.previous = previous;
    gpuarr__tls.device_id = d.id;
    return GPUARR_OK;
}

GPUARR_API gpuarr_stream gpuarr_current_stream(void) {
    gpuarr_stream s;
    s.id = gpuarr__tls.stream_id;
    return s;
}

GPUARR_API gpuarr_result gpuarr_set_current_stream(gpuarr_stream s) {
    GPUARR__BEGIN();
    if (s.id) {
        gpuarr__stream *st;
        GPUARR__CHECK(gpuarr__get_stream(s, "s", &st));
        gpuarr__obj_release(&st->obj);
    }
    gpuarr__tls.stream_id = s.id;
    return GPUARR_OK;
}

static gpuarr_scope gpuarr__scope_enter(gpuarr__dev *dev, uint32_t stream_id) {
    gpuarr_scope sc;
    memset(&sc, 0, sizeof sc);
    sc.previous_device.id = gpuarr__tls.device_id;
    sc.previous_stream.id = gpuarr__tls.stream_id;
    sc.previous_failure = gpuarr__tls.scope_failure;
    sc.result = gpuarr__dev_open(dev);
    if (sc.result == GPUARR_OK) sc.result = gpuarr__backend_activate(dev, &sc.native_previous);
    if (sc.result != GPUARR_OK) {
        gpuarr__log(GPUARR_LOG_WARN, "the scope did not start: %s", gpuarr_last_error());
        return sc;
    }
    gpuarr__tls.device_id = dev->info.device.id;
    gpuarr__tls.stream_id = stream_id;
    gpuarr__tls.scope_failure = GPUARR_OK; /* a scope that started inside a failed one has its device */
    sc.device = dev->info.device;
    sc.active = true;
    return sc;
}

static gpuarr_scope gpuarr__scope_failed(gpuarr_result r) {
    gpuarr_scope sc;
    memset(&sc, 0, sizeof sc);
    sc.result = r;
    gpuarr__log(GPUARR_LOG_WARN, "the scope did not start: %s", gpuarr_last_error());
    return sc;
}

GPUARR_API gpuarr_scope gpuarr_scope_enter_device(gpuarr_device d) {
    gpuarr__tls.api = __func__;
    if (!gpuarr__initialized())
        return gpuarr__scope_failed(gpuarr__fail(GPUARR_ERROR_NOT_INITIALIZED, "gpuarr is not initialized (call gpuarr_init first)"));
    gpuarr__dev *dev;
    gpuarr_result r = gpuarr__get_dev(d, "d", &dev);
    if (r != GPUARR_OK) return gpuarr__scope_failed(r);
    return gpuarr__scope_enter(dev, gpuarr__tls.stream_id);
}

GPUARR_API gpuarr_scope gpuarr_scope_enter_stream(gpuarr_stream s) {
    gpuarr__tls.api = __func__;
    if (!gpuarr__initialized())
        return gpuarr__scope_failed(gpuarr__fail(GPUARR_ERROR_NOT_INITIALIZED, "gpuarr is not initialized (call gpuarr_init first)"));
    gpuarr__stream *st;
    gpuarr_result r = gpuarr__get_stream(s, "s", &st);
    if (r != GPUARR_OK) return gpuarr__scope_failed(r);
    gpuarr__dev *dev = st->dev;
    gpuarr__obj_release(&st->obj);
    return gpuarr__scope_enter(dev, s.id);
}

GPUARR_API gpuarr_scope gpuarr_scope_hold(gpuarr_scope s) {
    if (s.active || s.held) return s;
    s.previous_device.id = gpuarr__tls.device_id;
    s.previous_stream.id = gpuarr__tls.stream_id;
    s.previous_failure = gpuarr__tls.scope_failure;
    s.held = true;
    gpuarr__tls.scope_failure = s.result != GPUARR_OK ? s.result : GPUARR_ERROR_INVALID_ARGUMENT;
    gpuarr__copy_string(gpuarr__tls.scope_why, sizeof gpuarr__tls.scope_why, gpuarr_last_error());
    return s;
}

GPUARR_API void gpuarr_scope_leave(gpuarr_scope *scope) {
    if (scope && scope->held) {
        scope->held = false;
        gpuarr__tls.scope_failure = scope->previous_failure;
        return;
    }
    if (!scope || !scope->active) return;
    scope->active = false;
    gpuarr__dev *dev;
    if (gpuarr__initialized() && gpuarr__get_dev(scope->device, "scope", &dev) == GPUARR_OK)
        gpuarr__backend_deactivate(dev, scope->native_previous);
    gpuarr__tls.device_id = scope->previous_device.id;
    gpuarr__tls.stream_id = scope->previous_stream.id;
    gpuarr__tls.scope_failure = scope->previous_failure;
    for (int i = 0; gpuarr__initialized() && i < gpuarr__g.layer_count; i++)
        if (gpuarr__g.layers[i].scope_leave) gpuarr__g.layers[i].scope_leave(scope);
    scope->lease.id = 0;
}

/* The definitions of the public interop functions declared in the interop sections, generated
   from each backend's GPUARR__INTEROP_<NAME> dispatch list: a call through the backend's interop
   table, or GPUARR_ERROR_UNSUPPORTED in a build without it. */
#define GPUARR__INTEROP_CALL(B, name, params, args)                                            \
    GPUARR_API gpuarr_result gpuarr_##name params {                                            \
        GPUARR__BEGIN();                                                                       \
        const gpuarr__backend *b = gpuarr__backend_get(GPUARR_BACKEND_##B);                    \
        if (!b)                                                                                \
            return gpuarr__fail(GPUARR_ERROR_UNSUPPORTED, "this build has no %s backend (GPUARR_NO_" #B ")", \
                                gpuarr__backend_names[GPUARR_BACKEND_##B]);                    \
        return ((const gpuarr__interop_##B *)b->interop)->name args;                           \
    }
#define GPUARR__INTEROP_CALLS(NAME, str) GPUARR__INTEROP_##NAME(GPUARR__INTEROP_CALL)
GPUARR_BACKEND_LIST(GPUARR__INTEROP_CALLS)
#undef GPUARR__INTEROP_CALLS
#undef GPUARR__INTEROP_CALL

/* ---------------------------------------------------------------------------------------------
 * The layers on the core (layers/). Each uses the core's internals and registers below; the core
 * reaches them only through that list. A layer may use one included before it.
 * ------------------------------------------------------------------------------------------- */
#include "layers/gpuarr_trace.h"       /* the trace recorder (TRACING) */
#include "layers/gpuarr_local_rank.h"  /* gpuarr_local_rank, the "local" specs (LOCAL RANK) */
#include "layers/gpuarr_dlpack.h"      /* DLPack export and import (DLPACK) */
#include "layers/gpuarr_lease.h"       /* slots per device, FIFO waits, placement, plans (LEASES) */
#include "layers/gpuarr_transfer_model.h" /* transfer models: fitted, persisted, predicted (TRANSFER MODEL) */
#include "layers/gpuarr_offload.h"     /* tasks, offload and map (OFFLOAD) */
#ifdef GPUARR_MPI
#include "layers/gpuarr_mpi.h"         /* sends, receives and allreduce of arrays (MPI), opt-in */
#endif

/* The registration list, in start order (stopped in reverse): leases before the models and the
   offload planner that use them, the trace last so that it records none of the start. */
static void gpuarr__layer_list(void (*add)(void (*fill)(gpuarr__layer *))) {
    add(gpuarr__local_rank_layer);
    add(gpuarr__dlpack_layer);
    add(gpuarr__lease_layer);
    add(gpuarr__xfer_layer);
    add(gpuarr__offload_layer);
    add(gpuarr__trace_layer);
#ifdef GPUARR_MPI
    add(gpuarr__mpi_layer);
#endif
}

#endif /* GPUARR_IMPLEMENTATION */

/*
 * LICENSE: MIT. Copyright (c) 2026 the gpuarr developers. Permission is hereby granted, free of
 * charge, to any person obtaining a copy of this software and associated documentation files (the
 * "Software"), to deal in the Software without restriction, including without limitation the
 * rights to use, copy, modify, merge, publish, distribute, sublicense, and/or sell copies of the
 * Software, and to permit persons to whom the Software is furnished to do so, subject to the
 * following conditions: The above copyright notice and this permission notice shall be included
 * in all copies or substantial portions of the Software. THE SOFTWARE IS PROVIDED "AS IS",
 * WITHOUT WARRANTY OF ANY KIND.
 */
