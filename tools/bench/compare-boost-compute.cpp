/*
 * compare-boost-compute.cpp -- gpuarr against Boost.Compute (and raw OpenCL) on one OpenCL device,
 * in one process, with interleaved repetitions. `make bench-compare` builds and runs it.
 *
 *   compare-boost-compute [--mib N] [--reps N] [--device SPEC]     (defaults: 64, 15, opencl:0)
 *
 * Boost.Compute runs on gpuarr's own context for the device (gpuarr_opencl_context), with its own
 * profiling queue. Every table row is a median over repetitions; in each repetition the
 * contenders run back to back, their order alternating, and ratios are medians of per-repetition
 * ratios.
 *   (a) on-device casts f32->f64, f64->f32, f32->f16 of an N MiB source into an existing array /
 *       vector: gpuarr_copy_async between arrays of the two dtypes (gpuarr's cast kernel) against
 *       boost::compute::transform(..., convert<T>()). Both timed two ways: wall time from the call
 *       to the end of a finish of that queue, and markers enqueued before and after (OpenCL
 *       profiling: end of the second minus end of the first). Boost.Compute has no half type:
 *       its f32->f16 is transform with a BOOST_COMPUTE_FUNCTION calling OpenCL's vstore_half_rte
 *       into a ushort (also round-to-nearest-even, so the same bits). Rates count bytes read
 *       plus written; "vs memcpy" divides by single-thread memcpy's rate (2 x source bytes / time)
 *       of the same repetition.
 *   (b) a cached 4 KiB allocation: gpuarr_empty + gpuarr_release against constructing and
 *       destroying boost::compute::vector<float>(1024, context), and raw clCreateBuffer +
 *       clReleaseMemObject; per-operation medians of batches of 200.
 *   (c) uploads of 4 KiB and N MiB: gpuarr_from_host_as + gpuarr_release (allocates the array)
 *       against boost::compute::copy into an existing vector, constructing a vector from the
 *       host range, and a blocking clEnqueueWriteBuffer into an existing buffer.
 */
#define CL_TARGET_OPENCL_VERSION 120
#define BOOST_COMPUTE_MAX_CL_VERSION 102
#include <CL/cl.h>
#include <boost/compute/algorithm/copy.hpp>
#include <boost/compute/algorithm/transform.hpp>
#include <boost/compute/command_queue.hpp>
#include <boost/compute/container/vector.hpp>
#include <boost/compute/context.hpp>
#include <boost/compute/function.hpp>
#include <boost/compute/functional/convert.hpp>

#include "gpuarr.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace compute = boost::compute;

namespace {

[[noreturn]] void die(const char *what) {
    std::fprintf(stderr, "compare-boost-compute: %s: %s\n", what, gpuarr_last_error());
    std::exit(1);
}

void ok(gpuarr_result r, const char *what) {
    if (r != GPUARR_OK) die(what);
}

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double memcpy_s(void *dst, const void *src, size_t bytes) {
    double t0 = now_s();
    std::memcpy(dst, src, bytes);
    return now_s() - t0;
}

/* Boost.Compute has no half type: OpenCL's own f32 -> f16 store, nearest-even, into a ushort. */
BOOST_COMPUTE_FUNCTION(compute::ushort_, boost_f32_to_f16, (float x), {
    ushort h;
    vstore_half_rte(x, 0, (half *)&h);
    return h;
});

struct timing {
    double wall, events; /* seconds */
};

/* Marker events on a profiling queue: end of `after` minus end of `before`. */
double marker_span(const compute::event &before, const compute::event &after) {
    cl_ulong a = before.get_profiling_info<cl_ulong>(CL_PROFILING_COMMAND_END);
    cl_ulong b = after.get_profiling_info<cl_ulong>(CL_PROFILING_COMMAND_END);
    return (double)(b - a) * 1e-9;
}

struct cast_case {
    const char *name;
    gpuarr_dtype src, dst;
};

/* ---- (a) on-device casts ---- */
void compare_casts(gpuarr_device dev, compute::command_queue &queue, size_t mib, int reps) {
    static const cast_case cases[] = {{"f32->f64", GPUARR_F32, GPUARR_F64},
                                      {"f64->f32", GPUARR_F64, GPUARR_F32},
                                      {"f32->f16", GPUARR_F32, GPUARR_F16}};
    size_t src_bytes = mib << 20;
    std::vector<unsigned char> host(src_bytes), scratch(src_bytes, 1);
    gpuarr_event e0, e1;
    ok(gpuarr_event_create(dev, GPUARR_EVENT_TIMING, &e0), "gpuarr_event_create");
    ok(gpuarr_event_create(dev, GPUARR_EVENT_TIMING, &e1), "gpuarr_event_create");
    std::printf("\n### (a) on-device casts, %zu MiB source, medians of %d interleaved repetitions\n\n", mib, reps);
    std::printf("| cast | contender | wall (call + finish) | rate | vs memcpy | events (markers) | rate | vs memcpy | "
                "gpuarr / Boost time (wall) | (events) |\n|---|---|---|---|---|---|---|---|---|---|\n");
    for (const cast_case &c : cases) {
        size_t n = src_bytes / gpuarr_dtype_size(c.src), moved = src_bytes + n * gpuarr_dtype_size(c.dst);
        for (size_t i = 0; i < n; i++) { /* values of every magnitude, both signs */
            if (c.src == GPUARR_F32) {
                float v = (float)((double)(i % 100003) * 1.37e-3 - 50.0) * (float)(1u << (i % 23));
                std::memcpy(&host[i * 4], &v, 4);
            } else {
                double v = ((double)(i % 100003) * 1.37e-3 - 50.0) * (double)(1u << (i % 23));
                std::memcpy(&host[i * 8], &v, 8);
            }
        }
        int64_t shape[1] = {(int64_t)n};
        gpuarr_array ga, gb;
        ok(gpuarr_from_host_as(dev, c.src, host.data(), 1, shape, &ga), "gpuarr_from_host_as");
        ok(gpuarr_empty(dev, c.dst, 1, shape, &gb), "gpuarr_empty");
        compute::context ctx = queue.get_context();
        compute::buffer bsrc(ctx, src_bytes), bdst(ctx, n * gpuarr_dtype_size(c.dst));
        queue.enqueue_write_buffer(bsrc, 0, src_bytes, host.data());
        std::function<void()> boost_cast;
        if (c.src == GPUARR_F32 && c.dst == GPUARR_F64) {
            boost_cast = [&] {
                compute::transform(compute::make_buffer_iterator<float>(bsrc, 0), compute::make_buffer_iterator<float>(bsrc, n),
                                   compute::make_buffer_iterator<double>(bdst, 0), compute::convert<double>(), queue);
            };
        } else if (c.src == GPUARR_F64) {
            boost_cast = [&] {
                compute::transform(compute::make_buffer_iterator<double>(bsrc, 0), compute::make_buffer_iterator<double>(bsrc, n),
                                   compute::make_buffer_iterator<float>(bdst, 0), compute::convert<float>(), queue);
            };
        } else {
            boost_cast = [&] {
                compute::transform(compute::make_buffer_iterator<float>(bsrc, 0), compute::make_buffer_iterator<float>(bsrc, n),
                                   compute::make_buffer_iterator<compute::ushort_>(bdst, 0), boost_f32_to_f16, queue);
            };
        }
        auto run_gpuarr = [&]() -> timing {
            double t0 = now_s();
            ok(gpuarr_event_record(e0, gpuarr_stream{0}), "gpuarr_event_record");
            ok(gpuarr_copy_async(gb, ga, gpuarr_stream{0}), "gpuarr_copy_async");
            ok(gpuarr_event_record(e1, gpuarr_stream{0}), "gpuarr_event_record");
            ok(gpuarr_event_sync(e1), "gpuarr_event_sync");
            double wall = now_s() - t0, ms = 0;
            ok(gpuarr_event_elapsed_ms(e0, e1, &ms), "gpuarr_event_elapsed_ms");
            return {wall, ms * 1e-3};
        };
        auto run_boost = [&]() -> timing {
            double t0 = now_s();
            compute::event m0 = queue.enqueue_marker();
            boost_cast();
            compute::event m1 = queue.enqueue_marker();
            queue.finish();
            return {now_s() - t0, marker_span(m0, m1)};
        };
        std::vector<double> gw, ge, bw, be, gw_r, ge_r, bw_r, be_r, ratio_w, ratio_e;
        for (int r = -2; r < reps; r++) { /* two warm-up rounds: kernel builds, first touches */
            double tm1 = memcpy_s(scratch.data(), host.data(), src_bytes);
            timing g, b;
            if (r % 2 == 0) g = run_gpuarr(), b = run_boost();
            else b = run_boost(), g = run_gpuarr();
            double tm = std::min(tm1, memcpy_s(scratch.data(), host.data(), src_bytes));
            if (r < 0) continue;
            double mrate = 2.0 * (double)src_bytes / tm;
            gw.push_back(g.wall), ge.push_back(g.events), bw.push_back(b.wall), be.push_back(b.events);
            gw_r.push_back((double)moved / g.wall / mrate), ge_r.push_back((double)moved / g.events / mrate);
            bw_r.push_back((double)moved / b.wall / mrate), be_r.push_back((double)moved / b.events / mrate);
            ratio_w.push_back(g.wall / b.wall), ratio_e.push_back(g.events / b.events);
        }
        double gwm = median(gw), gem = median(ge), bwm = median(bw), bem = median(be);
        std::printf("| %s | gpuarr | %.2f ms | %.2f GB/s | %.2f | %.2f ms | %.2f GB/s | %.2f | %.2f | %.2f |\n", c.name, gwm * 1e3,
                    (double)moved / gwm / 1e9, median(gw_r), gem * 1e3, (double)moved / gem / 1e9, median(ge_r), median(ratio_w),
                    median(ratio_e));
        std::printf("| %s | Boost.Compute transform%s | %.2f ms | %.2f GB/s | %.2f | %.2f ms | %.2f GB/s | %.2f | | |\n", c.name,
                    c.dst == GPUARR_F16 ? " (vstore_half_rte)" : "", bwm * 1e3, (double)moved / bwm / 1e9, median(bw_r), bem * 1e3,
                    (double)moved / bem / 1e9, median(be_r));
        /* the two agree bit for bit */
        size_t out_bytes = n * gpuarr_dtype_size(c.dst);
        std::vector<unsigned char> x(out_bytes), y(out_bytes);
        ok(gpuarr_to_host_as(gb, c.dst, x.data(), n), "gpuarr_to_host_as");
        queue.enqueue_read_buffer(bdst, 0, out_bytes, y.data());
        if (std::memcmp(x.data(), y.data(), out_bytes) != 0) std::printf("| %s | **results differ** | | | | | | | | |\n", c.name);
        ok(gpuarr_release(ga), "gpuarr_release");
        ok(gpuarr_release(gb), "gpuarr_release");
    }
    gpuarr_event_destroy(e0);
    gpuarr_event_destroy(e1);
}

/* ---- (b) cached small allocation ---- */
void compare_allocation(gpuarr_device dev, const compute::context &ctx) {
    enum { BATCH = 200, BATCHES = 21 };
    int64_t shape[1] = {1024};
    std::vector<double> g, b, raw, ratio_b, ratio_raw;
    for (int k = -2; k < BATCHES; k++) {
        double t0 = now_s();
        for (int i = 0; i < BATCH; i++) {
            gpuarr_array a;
            ok(gpuarr_empty(dev, GPUARR_F32, 1, shape, &a), "gpuarr_empty");
            ok(gpuarr_release(a), "gpuarr_release");
        }
        double tg = (now_s() - t0) / BATCH;
        t0 = now_s();
        for (int i = 0; i < BATCH; i++) {
            compute::vector<float> v(1024, ctx);
        }
        double tb = (now_s() - t0) / BATCH;
        t0 = now_s();
        for (int i = 0; i < BATCH; i++) {
            cl_int e = CL_SUCCESS;
            cl_mem m = clCreateBuffer(ctx.get(), CL_MEM_READ_WRITE, 4096, nullptr, &e);
            if (!m) die("clCreateBuffer");
            clReleaseMemObject(m);
        }
        double tr = (now_s() - t0) / BATCH;
        if (k < 0) continue;
        g.push_back(tg), b.push_back(tb), raw.push_back(tr), ratio_b.push_back(tb / tg), ratio_raw.push_back(tr / tg);
    }
    std::printf("\n### (b) a 4 KiB allocation and its release, per operation, medians of %d batches of %d\n\n", BATCHES, BATCH);
    std::printf("| operation | median time | time / gpuarr's |\n|---|---|---|\n");
    std::printf("| gpuarr_empty + gpuarr_release (f32, 1024; from the pool) | %.2f us | 1.00 |\n", median(g) * 1e6);
    std::printf("| boost::compute::vector<float>(1024, ctx) constructed + destroyed | %.2f us | %.1f |\n", median(b) * 1e6, median(ratio_b));
    std::printf("| clCreateBuffer + clReleaseMemObject (4 KiB) | %.2f us | %.1f |\n", median(raw) * 1e6, median(ratio_raw));
}

/* ---- (c) uploads ---- */
void compare_uploads(gpuarr_device dev, compute::command_queue &queue, size_t big_mib, int big_reps) {
    std::printf("\n### (c) uploads, host -> device, blocking; medians of interleaved repetitions\n\n");
    std::printf("| size | operation | median time | rate | time / gpuarr's |\n|---|---|---|---|---|\n");
    compute::context ctx = queue.get_context();
    size_t sizes[2] = {4096, big_mib << 20};
    for (size_t bytes : sizes) {
        int reps = bytes <= 4096 ? 501 : big_reps;
        size_t n = bytes / 4;
        std::vector<float> host(n);
        for (size_t i = 0; i < n; i++) host[i] = (float)i * 0.5f;
        int64_t shape[1] = {(int64_t)n};
        compute::vector<float> existing(n, ctx);
        cl_int e = CL_SUCCESS;
        cl_mem buf = clCreateBuffer(ctx.get(), CL_MEM_READ_WRITE, bytes, nullptr, &e);
        if (!buf) die("clCreateBuffer");
        std::vector<double> tg, tc, tv, tw, rc, rv, rw;
        for (int r = -5; r < reps; r++) {
            double t0 = now_s();
            gpuarr_array a;
            ok(gpuarr_from_host_as(dev, GPUARR_F32, host.data(), 1, shape, &a), "gpuarr_from_host_as");
            ok(gpuarr_release(a), "gpuarr_release");
            double g = now_s() - t0;
            t0 = now_s();
            compute::copy(host.begin(), host.end(), existing.begin(), queue);
            double c = now_s() - t0;
            t0 = now_s();
            {
                compute::vector<float> v(host.begin(), host.end(), queue);
            }
            double v = now_s() - t0;
            t0 = now_s();
            if (clEnqueueWriteBuffer(queue.get(), buf, CL_TRUE, 0, bytes, host.data(), 0, nullptr, nullptr) != CL_SUCCESS)
                die("clEnqueueWriteBuffer");
            double w = now_s() - t0;
            if (r < 0) continue;
            tg.push_back(g), tc.push_back(c), tv.push_back(v), tw.push_back(w);
            rc.push_back(c / g), rv.push_back(v / g), rw.push_back(w / g);
        }
        clReleaseMemObject(buf);
        std::string size = bytes <= 4096 ? std::to_string(bytes >> 10) + " KiB" : std::to_string(bytes >> 20) + " MiB";
        auto row = [&](const char *what, const std::vector<double> &t, double ratio) {
            double m = median(t);
            std::printf("| %s | %s | %.1f us | %.2f GB/s | %.2f |\n", size.c_str(), what, m * 1e6, (double)bytes / m / 1e9, ratio);
        };
        row("gpuarr_from_host_as + gpuarr_release (allocates)", tg, 1.0);
        row("boost::compute::copy into an existing vector", tc, median(rc));
        row("boost::compute::vector(first, last, queue) + destroy (allocates)", tv, median(rv));
        row("clEnqueueWriteBuffer, blocking, existing buffer", tw, median(rw));
    }
}

} // namespace

int main(int argc, char **argv) {
    size_t mib = 64;
    int reps = 15;
    const char *spec = "opencl:0";
    for (int i = 1; i < argc; i++) {
        if (std::strcmp(argv[i], "--mib") == 0 && i + 1 < argc) mib = (size_t)std::atol(argv[++i]);
        else if (std::strcmp(argv[i], "--reps") == 0 && i + 1 < argc) reps = std::atoi(argv[++i]);
        else if (std::strcmp(argv[i], "--device") == 0 && i + 1 < argc) spec = argv[++i];
        else {
            std::fprintf(stderr, "usage: %s [--mib N] [--reps N] [--device SPEC]\n", argv[0]);
            return 2;
        }
    }
    if (mib < 1 || reps < 1) {
        std::fprintf(stderr, "compare-boost-compute: --mib and --reps must be positive\n");
        return 2;
    }
    ok(gpuarr_init(nullptr), "gpuarr_init");
    gpuarr_device dev;
    ok(gpuarr_device_find(spec, &dev), spec);
    cl_context cl_ctx;
    cl_device_id cl_dev;
    ok(gpuarr_opencl_context(dev, &cl_ctx), "gpuarr_opencl_context");
    ok(gpuarr_opencl_device_id(dev, &cl_dev), "gpuarr_opencl_device_id");
    try {
        compute::context ctx(cl_ctx);
        compute::device bdev(cl_dev);
        compute::command_queue queue(ctx, bdev, compute::command_queue::enable_profiling);
        gpuarr_device_info info;
        ok(gpuarr_device_get_info(dev, &info), "gpuarr_device_get_info");
        std::printf("## gpuarr and Boost.Compute %d.%d on %s: %s\n", BOOST_VERSION / 100000, BOOST_VERSION / 100 % 1000, spec, info.name);
        compare_casts(dev, queue, mib, reps);
        compare_allocation(dev, ctx);
        compare_uploads(dev, queue, mib, reps);
    } catch (const std::exception &ex) {
        std::fprintf(stderr, "compare-boost-compute: %s\n", ex.what());
        return 1;
    }
    gpuarr_shutdown();
    return 0;
}
