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
int standin_capture_launch(CUstream stream);  // below, with stream capture

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
    (void)f; (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)shared;
    (void)params; (void)extra;
    if (!standin_capture_launch(stream))
        launches++;
    return CUDA_SUCCESS;
}

CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **params, void **extra) { REAL_PROLOGUE;
    if (!config)
        return CUDA_ERROR_INVALID_VALUE;
    (void)f; (void)params; (void)extra;
    if (!standin_capture_launch(config->hStream))
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

// Kernels by name: a handle is a copy of the name it was asked for (a distinct pointer per call,
// as the driver's handles are distinct objects). cuKernelGetFunction gives a CUfunction of its own.
#define CUDA_ERROR_NOT_FOUND 500
typedef void *CUmodule;
typedef void *CUlibrary;
typedef void *CUkernel;

CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name) {
    REAL_PROLOGUE;
    (void)hmod;
    if (!hfunc || !name)
        return CUDA_ERROR_INVALID_VALUE;
    if (!*name)
        return CUDA_ERROR_NOT_FOUND;
    *hfunc = strdup(name);
    return CUDA_SUCCESS;
}

CUresult cuLibraryGetKernel(CUkernel *pKernel, CUlibrary library, const char *name) {
    REAL_PROLOGUE;
    return cuModuleGetFunction(pKernel, library, name);
}

CUresult cuKernelGetFunction(CUfunction *pFunc, CUkernel kernel) {
    REAL_PROLOGUE;
    if (!pFunc || !kernel)
        return CUDA_ERROR_INVALID_VALUE;
    *pFunc = strdup((const char *)kernel);
    return CUDA_SUCCESS;
}

// Graphs: a graph counts its kernel nodes (a child graph's included), an instantiated graph runs
// that many launches. Stream capture records the kernels launched on the capturing stream into a
// graph made inside the driver (not through the exported cuGraphCreate, as in the real driver).
typedef struct { unsigned long kernels; } *CUgraph;
typedef struct { unsigned long kernels; } *CUgraphExec;
typedef unsigned long CUgraphNode;

static CUgraph new_graph(void) { return calloc(1, sizeof(*(CUgraph)0)); }

CUresult cuGraphCreate(CUgraph *phGraph, unsigned int flags) {
    REAL_PROLOGUE;
    if (!phGraph || flags)
        return CUDA_ERROR_INVALID_VALUE;
    *phGraph = new_graph();
    return *phGraph ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

static CUresult add_node(CUgraphNode *node, CUgraph graph, unsigned long kernels) {
    static unsigned long nodes;
    if (!node || !graph)
        return CUDA_ERROR_INVALID_VALUE;
    graph->kernels += kernels;
    *node = ++nodes;
    return CUDA_SUCCESS;
}

// cuGraphAddKernelNode(_v2)(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode
// *dependencies, size_t numDependencies, const CUDA_KERNEL_NODE_PARAMS *nodeParams)
CUresult cuGraphAddKernelNode_v2(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                                 size_t numDependencies, const void *nodeParams) {
    REAL_PROLOGUE;
    (void)dependencies; (void)numDependencies;
    return nodeParams ? add_node(phGraphNode, hGraph, 1) : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGraphAddKernelNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                              size_t numDependencies, const void *nodeParams) {
    REAL_PROLOGUE;
    return cuGraphAddKernelNode_v2(phGraphNode, hGraph, dependencies, numDependencies, nodeParams);
}

CUresult cuGraphAddChildGraphNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                                  size_t numDependencies, CUgraph childGraph) {
    REAL_PROLOGUE;
    (void)dependencies; (void)numDependencies;
    return childGraph ? add_node(phGraphNode, hGraph, childGraph->kernels) : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph, unsigned long long flags) {
    REAL_PROLOGUE;
    (void)flags;
    if (!phGraphExec || !hGraph)
        return CUDA_ERROR_INVALID_VALUE;
    *phGraphExec = calloc(1, sizeof(**phGraphExec));
    if (!*phGraphExec)
        return CUDA_ERROR_OUT_OF_MEMORY;
    (*phGraphExec)->kernels = hGraph->kernels;
    return CUDA_SUCCESS;
}

// CUDA 11's form (CUDA 12 headers map cuGraphInstantiate to cuGraphInstantiateWithFlags)
CUresult cuGraphInstantiate_v2(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode, char *logBuffer,
                               size_t bufferSize) {
    REAL_PROLOGUE;
    (void)phErrorNode; (void)logBuffer; (void)bufferSize;
    return cuGraphInstantiateWithFlags(phGraphExec, hGraph, 0);
}

CUresult cuGraphInstantiateWithParams(CUgraphExec *phGraphExec, CUgraph hGraph, void *instantiateParams) {
    REAL_PROLOGUE;
    (void)instantiateParams;
    return cuGraphInstantiateWithFlags(phGraphExec, hGraph, 0);
}

// The generic node (CUDA 12.2+): CUgraphNodeParams begins with its CUgraphNodeType (kernel = 0).
CUresult cuGraphAddNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                        size_t numDependencies, const int *nodeParams) {
    REAL_PROLOGUE;
    (void)dependencies; (void)numDependencies;
    return nodeParams ? add_node(phGraphNode, hGraph, *nodeParams == 0) : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGraphAddNode_v2(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                           const void *dependencyData, size_t numDependencies, const int *nodeParams) {
    REAL_PROLOGUE;
    (void)dependencyData;
    return cuGraphAddNode(phGraphNode, hGraph, dependencies, numDependencies, nodeParams);
}

CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream) {
    REAL_PROLOGUE;
    (void)hStream;
    if (!hGraphExec)
        return CUDA_ERROR_INVALID_VALUE;
    launches += hGraphExec->kernels;
    return CUDA_SUCCESS;
}

CUresult cuGraphDestroy(CUgraph hGraph) { REAL_PROLOGUE; free(hGraph); return CUDA_SUCCESS; }
CUresult cuGraphExecDestroy(CUgraphExec hGraphExec) { REAL_PROLOGUE; free(hGraphExec); return CUDA_SUCCESS; }

static __thread CUstream capturing;  // one capture per thread, enough for the stand-in
static __thread CUgraph captured;

CUresult cuStreamBeginCapture_v2(CUstream hStream, int mode) {
    REAL_PROLOGUE;
    (void)mode;
    if (!hStream || captured)
        return CUDA_ERROR_INVALID_VALUE;
    captured = new_graph();
    capturing = hStream;
    return captured ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

// CUDA 10.0's form, without a mode (global)
CUresult cuStreamBeginCapture(CUstream hStream) {
    REAL_PROLOGUE;
    return cuStreamBeginCapture_v2(hStream, 0);
}

CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph) {
    REAL_PROLOGUE;
    if (!phGraph || !captured || hStream != capturing)
        return CUDA_ERROR_INVALID_VALUE;
    *phGraph = captured;
    captured = 0;
    capturing = 0;
    return CUDA_SUCCESS;
}

// What a launch on stream does: run now, or be recorded into the graph being captured.
int standin_capture_launch(CUstream stream) {
    if (!captured || stream != capturing)
        return 0;
    captured->kernels++;
    return 1;
}
