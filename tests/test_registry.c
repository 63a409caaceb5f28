/*
 * test_registry.c -- white-box tests of the registry's linking of one GPU seen through two
 * backends (CUDA and OpenCL): UUID first, else the full PCI address, never the bus alone; and
 * "gpu" never counting a linked GPU twice. CI has no GPU whose CUDA and OpenCL views could be
 * compared, so the device infos are made up here and the registry's own functions run on them.
 * This file compiles the implementation itself (it is linked without gpuarr.o).
 */
#define GPUARR_IMPLEMENTATION
#include "test_common.h"

static gpuarr__dev made[6];

static gpuarr_device_info *add_gpu(int i, gpuarr_backend b, int compute_units, const char *pci, int uuid_byte) {
    gpuarr_device_info *info = &made[i].info;
    memset(info, 0, sizeof *info);
    info->backend = b;
    info->type = GPUARR_DEVICE_TYPE_GPU;
    info->device = gpuarr__device_handle(i);
    info->compute_units = compute_units;
    info->clock_mhz = 1000;
    if (pci) {
        info->has_pci = sscanf(pci, "%x:%x:%x.%x", (unsigned *)&info->pci_domain, (unsigned *)&info->pci_bus, (unsigned *)&info->pci_device,
                               (unsigned *)&info->pci_function) == 4;
        cr_assert(info->has_pci, "bad test PCI address %s", pci);
    }
    if (uuid_byte >= 0) {
        info->has_uuid = true;
        memset(info->uuid, uuid_byte, sizeof info->uuid);
    }
    return info;
}

static void link_devices(int count) {
    gpuarr__g.devices = made;
    gpuarr__g.device_count = count;
    gpuarr__registry_link();
}

static void forget_devices(void) {
    memset(&gpuarr__g, 0, sizeof gpuarr__g);
    memset(made, 0, sizeof made);
}

TestSuite(registry, .fini = forget_devices);

Test(registry, the_same_uuid_links_a_cuda_and_an_opencl_device_and_gpu_counts_it_once) {
    add_gpu(0, GPUARR_BACKEND_CUDA, 132, "0000:18:00.0", 0x5a);
    add_gpu(1, GPUARR_BACKEND_OPENCL, 132, NULL, 0x5a); /* no PCI: the UUID decides */
    add_gpu(2, GPUARR_BACKEND_OPENCL, 100, "0000:40:00.0", 0x11);
    link_devices(3);
    cr_assert_eq(made[0].info.same_as.id, made[1].info.device.id);
    cr_assert_eq(made[1].info.same_as.id, made[0].info.device.id);
    cr_assert_eq(made[2].info.same_as.id, 0u);
    cr_assert(!gpuarr__is_duplicate(&made[0]), "the CUDA view represents the GPU");
    cr_assert(gpuarr__is_duplicate(&made[1]), "the OpenCL view of it is the duplicate");
    cr_assert_eq(gpuarr__g.best_gpu, 0);
}

Test(registry, without_uuids_the_full_pci_address_decides_never_the_bus_alone) {
    add_gpu(0, GPUARR_BACKEND_CUDA, 80, "0000:18:00.0", -1);
    add_gpu(1, GPUARR_BACKEND_OPENCL, 80, "0000:18:00.0", -1); /* the same GPU */
    add_gpu(2, GPUARR_BACKEND_OPENCL, 80, "0001:18:00.0", -1); /* same bus, other domain */
    add_gpu(3, GPUARR_BACKEND_OPENCL, 80, "0000:18:01.0", -1); /* same bus, other device */
    add_gpu(4, GPUARR_BACKEND_OPENCL, 80, "0000:18:00.1", -1); /* same bus, other function */
    link_devices(5);
    cr_assert_eq(made[0].info.same_as.id, made[1].info.device.id);
    for (int i = 2; i < 5; i++) cr_assert_eq(made[i].info.same_as.id, 0u, "device %d linked by a partial PCI address", i);
}

Test(registry, different_uuids_are_different_gpus_even_at_one_pci_address) {
    add_gpu(0, GPUARR_BACKEND_CUDA, 80, "0000:18:00.0", 0x01);
    add_gpu(1, GPUARR_BACKEND_OPENCL, 80, "0000:18:00.0", 0x02); /* e.g. MIG instances, or a reused slot */
    link_devices(2);
    cr_assert_eq(made[0].info.same_as.id, 0u);
    cr_assert_eq(made[1].info.same_as.id, 0u);
}

Test(registry, devices_of_one_backend_are_never_linked) {
    add_gpu(0, GPUARR_BACKEND_OPENCL, 80, "0000:18:00.0", 0x07);
    add_gpu(1, GPUARR_BACKEND_OPENCL, 80, "0000:18:00.0", 0x07); /* two platforms' views stay apart */
    link_devices(2);
    cr_assert_eq(made[0].info.same_as.id, 0u);
}

Test(registry, the_best_gpu_skips_duplicates_and_prefers_more_compute) {
    add_gpu(0, GPUARR_BACKEND_CUDA, 40, "0000:18:00.0", 0x01);
    add_gpu(1, GPUARR_BACKEND_CUDA, 132, "0000:19:00.0", 0x02);
    add_gpu(2, GPUARR_BACKEND_OPENCL, 132, "0000:19:00.0", 0x02);  /* cuda:1 again */
    add_gpu(3, GPUARR_BACKEND_OPENCL, 200, "0000:40:00.0", 0x03);  /* a bigger GPU, OpenCL only */
    link_devices(4);
    cr_assert_eq(gpuarr__g.best_gpu, 3);
    made[3].info.compute_units = 100;
    link_devices(4);
    cr_assert_eq(gpuarr__g.best_gpu, 1, "the linked GPU must be represented by its CUDA view");
}
