// Stand-in for PyTorch's CUDA caching allocator (libc10_cuda.so): tensor allocations fire the
// same USDT probes as PyTorch's, pytorch:malloc(devPtr, device, size, stream) and
// pytorch:free(devPtr), both gated by their semaphores. Memory comes from the host.
#include <stdlib.h>
#include "sdt.h"

SDT_SEMAPHORE(pytorch, malloc)
SDT_SEMAPHORE(pytorch, free)

void *c10_cuda_alloc(size_t size, int device, void *stream) {
    void *p = malloc(size);
    if (p && SDT_ENABLED(pytorch, malloc))
        SDT_PROBE4(pytorch, malloc, p, device, size, stream);
    return p;
}

void c10_cuda_free(void *p) {
    if (SDT_ENABLED(pytorch, free))
        SDT_PROBE1(pytorch, free, p);
    free(p);
}

// How many tracers enabled the probes (the semaphores' values), for tests.
int c10_cuda_tracers(void) { return pytorch_malloc_semaphore + pytorch_free_semaphore; }
