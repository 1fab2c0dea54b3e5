// Stand-in CUDA driver (libcuda.so.1) for tests on machines without a GPU: the real exported
// symbol names and signatures, "device" memory backed by host allocations, copies that really
// copy, launches that only count. Built by tests/gpu/standin/build.py; never shipped.
#define _GNU_SOURCE  // memfd_create
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

// Real CUDA/NCCL entry points begin with `push %rbp` (built with frame pointers); leaf functions
// here would not, and a first instruction uprobes cannot emulate costs an extra trap per hit.
// Using the frame address forces the same prologue.
#define REAL_PROLOGUE __asm__ __volatile__("" ::"r"(__builtin_frame_address(0)))

typedef int CUresult;            // CUDA_SUCCESS = 0
typedef uint64_t CUdeviceptr;    // 64-bit device address
typedef void *CUstream;
typedef void *CUfunction;
typedef struct {                  // the leading fields of CUlaunchConfig (cuda.h 12.x)
    unsigned int gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
    CUstream hStream;
    void *attrs;
    unsigned int numAttrs;
} CUlaunchConfig;

typedef unsigned long long CUmemGenericAllocationHandle;
typedef struct {                  // cuda.h: CUmemLocation
    int type;                     // CU_MEM_LOCATION_TYPE_DEVICE = 1
    int id;
} CUmemLocation;
typedef struct {                  // cuda.h: CUmemAllocationProp
    int type;                     // CU_MEM_ALLOCATION_TYPE_PINNED = 1
    int requestedHandleTypes;
    CUmemLocation location;
    void *win32HandleMetaData;
    struct { unsigned char compressionType, gpuDirectRDMACapable; unsigned short usage; unsigned char reserved[4]; } allocFlags;
} CUmemAllocationProp;

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_OUT_OF_MEMORY 2

// The stand-in device's capacity: larger requests fail like a full GPU (error 2).
#define CAPACITY (1ULL << 32)

static volatile unsigned long launches;  // observable side effect, so calls are not optimised out

CUresult cuInit(unsigned int flags) { (void)flags; return CUDA_SUCCESS; }

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) {
    if (!dptr || bytesize == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (bytesize > CAPACITY)
        return CUDA_ERROR_OUT_OF_MEMORY;
    void *p = malloc(bytesize);
    if (!p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *dptr = (CUdeviceptr)(uintptr_t)p;
    return CUDA_SUCCESS;
}

CUresult cuMemFree_v2(CUdeviceptr dptr) {
    free((void *)(uintptr_t)dptr);
    return CUDA_SUCCESS;
}

CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream stream) {
    (void)stream;
    return cuMemAlloc_v2(dptr, bytesize);
}

CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream) {
    (void)stream;
    return cuMemFree_v2(dptr);
}

// Managed and pinned host memory: host memory here, as the device memory is.
CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags) {
    (void)flags;
    return cuMemAlloc_v2(dptr, bytesize);
}

CUresult cuMemAllocHost_v2(void **pp, size_t bytesize) {
    if (!pp)
        return CUDA_ERROR_INVALID_VALUE;
    return cuMemAlloc_v2((CUdeviceptr *)pp, bytesize);
}

CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int flags) {
    (void)flags;
    return cuMemAllocHost_v2(pp, bytesize);
}

CUresult cuMemFreeHost(void *p) {
    free(p);
    return CUDA_SUCCESS;
}

typedef void *CUmemoryPool;

CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream stream) {
    (void)pool; (void)stream;
    return cuMemAlloc_v2(dptr, bytesize);
}

CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) {
    memcpy((void *)(uintptr_t)dst, src, n);
    return CUDA_SUCCESS;
}

CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) {
    memcpy(dst, (const void *)(uintptr_t)src, n);
    return CUDA_SUCCESS;
}

CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n) {
    memcpy((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
    return CUDA_SUCCESS;
}

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream s) {
    (void)s;
    return cuMemcpyHtoD_v2(dst, src, n);
}

CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream s) {
    (void)s;
    return cuMemcpyDtoH_v2(dst, src, n);
}

CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                        unsigned int by, unsigned int bz, unsigned int shared, CUstream stream, void **params,
                        void **extra) { REAL_PROLOGUE;
    (void)f; (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)shared; (void)stream;
    (void)params; (void)extra;
    launches++;
    return CUDA_SUCCESS;
}

CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **params, void **extra) { REAL_PROLOGUE;
    if (!config)
        return CUDA_ERROR_INVALID_VALUE;
    (void)f; (void)params; (void)extra;
    launches++;
    return CUDA_SUCCESS;
}

CUresult cuCtxSynchronize(void) { REAL_PROLOGUE; return CUDA_SUCCESS; }
CUresult cuStreamSynchronize(CUstream s) { REAL_PROLOGUE; (void)s; return CUDA_SUCCESS; }

// Virtual memory management, really done: physical memory is a memfd (the handle: a generation
// above its descriptor, so that a handle value is never reused, as the driver's), an address reservation is an inaccessible mapping, cuMemMap maps the memfd over part of it
// and cuMemUnmap puts the inaccessible mapping back. As on a GPU, a released handle's memory lives
// on while it is mapped (the kernel keeps the memfd's pages for the mapping).
CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                     unsigned long long flags) {
    if (!handle || !prop || size == 0 || flags || prop->location.type != 1)
        return CUDA_ERROR_INVALID_VALUE;
    if (size > CAPACITY)
        return CUDA_ERROR_OUT_OF_MEMORY;
    int fd = memfd_create("standin-cuMemCreate", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, (off_t)size) != 0) {
        if (fd >= 0)
            close(fd);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    static unsigned long long generation;
    *handle = (++generation << 32) | (unsigned)fd;
    return CUDA_SUCCESS;
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
    REAL_PROLOGUE;
    return handle && close((int)(handle & 0xFFFFFFFF)) == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags) {
    (void)alignment; (void)flags;
    if (!ptr || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    void *p = mmap((void *)(uintptr_t)addr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *ptr = (CUdeviceptr)(uintptr_t)p;
    return CUDA_SUCCESS;
}

CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
    REAL_PROLOGUE;
    return munmap((void *)(uintptr_t)ptr, size) == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags) {
    if (!handle || flags)
        return CUDA_ERROR_INVALID_VALUE;
    void *p = mmap((void *)(uintptr_t)ptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED,
                   (int)(handle & 0xFFFFFFFF), (off_t)offset);
    return p == MAP_FAILED ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
    REAL_PROLOGUE;
    void *p = mmap((void *)(uintptr_t)ptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED,
                   -1, 0);
    return p == MAP_FAILED ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}
