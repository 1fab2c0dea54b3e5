// Stand-in CUDA runtime (libcudart.so.12): real symbol names and signatures, implemented over the
// stand-in driver like the real runtime (cudaMalloc calls cuMemAlloc_v2, cudaLaunchKernel calls
// cuLaunchKernel), so the agent sees the nested driver calls it must not count twice.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int cudaError_t;
typedef void *cudaStream_t;
typedef uint64_t CUdeviceptr;
typedef struct { unsigned int x, y, z; } dim3;
enum cudaMemcpyKind { cudaMemcpyHostToHost, cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost,
                      cudaMemcpyDeviceToDevice, cudaMemcpyDefault };

#define cudaSuccess 0
#define cudaErrorInvalidValue 1
#define cudaErrorInvalidDevice 101
#define DEVICES 2

extern int cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize);
extern int cuMemFree_v2(CUdeviceptr dptr);
extern int cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags);
extern int cuMemAllocHost_v2(void **pp, size_t bytesize);
extern int cuMemHostAlloc(void **pp, size_t bytesize, unsigned int flags);
extern int cuMemFreeHost(void *p);
extern int cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, void *pool, void *stream);
extern int cuLaunchKernel(void *f, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int,
                          unsigned int, unsigned int, void *, void **, void **);

static __thread int current_device;

cudaError_t cudaGetDeviceCount(int *count) { *count = DEVICES; return cudaSuccess; }
cudaError_t cudaGetDevice(int *device) { *device = current_device; return cudaSuccess; }

cudaError_t cudaSetDevice(int device) {
    if (device < 0 || device >= DEVICES)
        return cudaErrorInvalidDevice;
    current_device = device;
    return cudaSuccess;
}

cudaError_t cudaMalloc(void **devPtr, size_t size) {
    if (!devPtr)
        return cudaErrorInvalidValue;
    return cuMemAlloc_v2((CUdeviceptr *)devPtr, size);  // driver errors 1/2 match the runtime's
}

cudaError_t cudaFree(void *devPtr) {
    if (!devPtr)
        return cudaSuccess;  // like the real runtime: freeing NULL is allowed
    return cuMemFree_v2((CUdeviceptr)(uintptr_t)devPtr);
}

cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t stream) {
    (void)stream;
    return cudaMalloc(devPtr, size);
}

cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t stream) {
    (void)stream;
    return cudaFree(devPtr);
}

cudaError_t cudaMallocManaged(void **devPtr, size_t size, unsigned int flags) {
    if (!devPtr)
        return cudaErrorInvalidValue;
    return cuMemAllocManaged((CUdeviceptr *)devPtr, size, flags);
}

cudaError_t cudaMallocHost(void **ptr, size_t size) {
    if (!ptr)
        return cudaErrorInvalidValue;
    return cuMemAllocHost_v2(ptr, size);
}

cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags) {
    if (!pHost)
        return cudaErrorInvalidValue;
    return cuMemHostAlloc(pHost, size, flags);
}

cudaError_t cudaFreeHost(void *ptr) {
    return cuMemFreeHost(ptr);
}

typedef void *cudaMemPool_t;

cudaError_t cudaMallocFromPoolAsync(void **ptr, size_t size, cudaMemPool_t memPool, cudaStream_t stream) {
    if (!ptr || !memPool)
        return cudaErrorInvalidValue;
    return cuMemAllocFromPoolAsync((CUdeviceptr *)ptr, size, memPool, stream);
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind) {
    if ((unsigned)kind > cudaMemcpyDefault || (count && (!dst || !src)))
        return cudaErrorInvalidValue;
    memcpy(dst, src, count);
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream) {
    (void)stream;
    return cudaMemcpy(dst, src, count, kind);
}

cudaError_t cudaLaunchKernel(const void *func, dim3 grid, dim3 block, void **args, size_t sharedMem,
                             cudaStream_t stream) {
    if (!func)
        return cudaErrorInvalidValue;
    return cuLaunchKernel((void *)func, grid.x, grid.y, grid.z, block.x, block.y, block.z,
                          (unsigned)sharedMem, stream, args, 0);
}

// Waits are real waits: STANDIN_SYNC_US microseconds each (default 0), so the wait-time views have
// something exact-enough to measure.
static void wait_a_while(void) {
    static long us = -1;
    if (us < 0) {
        const char *s = getenv("STANDIN_SYNC_US");
        us = s ? atol(s) : 0;
    }
    if (us > 0) {
        struct timespec t = {us / 1000000, (us % 1000000) * 1000};
        nanosleep(&t, 0);
    }
}

cudaError_t cudaDeviceSynchronize(void) { wait_a_while(); return cudaSuccess; }
cudaError_t cudaStreamSynchronize(cudaStream_t stream) { (void)stream; wait_a_while(); return cudaSuccess; }
const char *cudaGetErrorString(cudaError_t error) { return error ? "stand-in error" : "no error"; }

// Graphs, over the driver's as in the real runtime (cudaGraphLaunch calls cuGraphLaunch, ...).
typedef void *cudaGraph_t;
typedef void *cudaGraphExec_t;
typedef unsigned long cudaGraphNode_t;
typedef struct {                  // driver_types.h: cudaKernelNodeParams
    void *func;
    dim3 gridDim, blockDim;
    unsigned int sharedMemBytes;
    void **kernelParams, **extra;
} cudaKernelNodeParams;
enum cudaStreamCaptureMode { cudaStreamCaptureModeGlobal, cudaStreamCaptureModeThreadLocal,
                             cudaStreamCaptureModeRelaxed };

extern int cuGraphCreate(void **graph, unsigned int flags);
extern int cuGraphAddKernelNode_v2(cudaGraphNode_t *node, void *graph, const cudaGraphNode_t *dependencies,
                                   size_t numDependencies, const void *params);
extern int cuGraphAddChildGraphNode(cudaGraphNode_t *node, void *graph, const cudaGraphNode_t *dependencies,
                                    size_t numDependencies, void *child);
extern int cuGraphInstantiateWithFlags(void **exec, void *graph, unsigned long long flags);
extern int cuGraphLaunch(void *exec, void *stream);
extern int cuGraphInstantiateWithParams(void **exec, void *graph, void *params);
extern int cuGraphAddNode(cudaGraphNode_t *node, void *graph, const cudaGraphNode_t *dependencies,
                          size_t numDependencies, const void *params);
extern int cuGraphDestroy(void *graph);
extern int cuGraphExecDestroy(void *exec);
extern int cuStreamBeginCapture_v2(void *stream, int mode);
extern int cuStreamEndCapture(void *stream, void **graph);

cudaError_t cudaGraphCreate(cudaGraph_t *pGraph, unsigned int flags) { return cuGraphCreate(pGraph, flags); }

cudaError_t cudaGraphAddKernelNode(cudaGraphNode_t *pGraphNode, cudaGraph_t graph,
                                   const cudaGraphNode_t *pDependencies, size_t numDependencies,
                                   const cudaKernelNodeParams *pNodeParams) {
    if (!pNodeParams || !pNodeParams->func)
        return cudaErrorInvalidValue;
    return cuGraphAddKernelNode_v2(pGraphNode, graph, pDependencies, numDependencies, pNodeParams);
}

cudaError_t cudaGraphAddChildGraphNode(cudaGraphNode_t *pGraphNode, cudaGraph_t graph,
                                       const cudaGraphNode_t *pDependencies, size_t numDependencies,
                                       cudaGraph_t childGraph) {
    return cuGraphAddChildGraphNode(pGraphNode, graph, pDependencies, numDependencies, childGraph);
}

// CUDA 12's signature (CUDA 11's took an error node and a log buffer instead of the flags)
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *pGraphExec, cudaGraph_t graph, unsigned long long flags) {
    return cuGraphInstantiateWithFlags(pGraphExec, graph, flags);
}

cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t *pGraphExec, cudaGraph_t graph, unsigned long long flags) {
    return cuGraphInstantiateWithFlags(pGraphExec, graph, flags);
}

cudaError_t cudaGraphInstantiateWithParams(cudaGraphExec_t *pGraphExec, cudaGraph_t graph, void *instantiateParams) {
    return cuGraphInstantiateWithParams(pGraphExec, graph, instantiateParams);
}

// CUDA 12.2's generic node: cudaGraphNodeParams begins with its cudaGraphNodeType
cudaError_t cudaGraphAddNode(cudaGraphNode_t *pGraphNode, cudaGraph_t graph, const cudaGraphNode_t *pDependencies,
                             size_t numDependencies, const void *nodeParams) {
    return cuGraphAddNode(pGraphNode, graph, pDependencies, numDependencies, nodeParams);
}

// CUDA 12.3's, with edge data
cudaError_t cudaGraphAddNode_v2(cudaGraphNode_t *pGraphNode, cudaGraph_t graph, const cudaGraphNode_t *pDependencies,
                                const void *dependencyData, size_t numDependencies, const void *nodeParams) {
    (void)dependencyData;
    return cudaGraphAddNode(pGraphNode, graph, pDependencies, numDependencies, nodeParams);
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t graphExec, cudaStream_t stream) { return cuGraphLaunch(graphExec, stream); }
cudaError_t cudaGraphDestroy(cudaGraph_t graph) { return cuGraphDestroy(graph); }
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t graphExec) { return cuGraphExecDestroy(graphExec); }

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode) {
    return cuStreamBeginCapture_v2(stream, mode);
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *pGraph) { return cuStreamEndCapture(stream, pGraph); }
