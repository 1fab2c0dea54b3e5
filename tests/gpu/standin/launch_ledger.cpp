// A native program with a known ledger of named driver launches and graph launches, for
// tests/live/test_gpu_launches_live.py. C++, so that its own frames in the GPU call stacks carry
// mangled names; the kernel names it hands the driver are mangled C++ names (and one C name, as
// Triton's are). It prints "ready", waits for a line, makes its calls, prints the ledger as one
// JSON line, and waits for another line before it exits (so the agent still sees it alive).
#include <stdio.h>
#include <unistd.h>

typedef struct { unsigned int x, y, z; } dim3;
typedef struct {
    unsigned int gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
    void *hStream;
    void *attrs;
    unsigned int numAttrs;
} CUlaunchConfig;
typedef struct {
    void *func;
    dim3 gridDim, blockDim;
    unsigned int sharedMemBytes;
    void **kernelParams, **extra;
} cudaKernelNodeParams;
typedef unsigned long Node;

extern "C" {
int cuModuleGetFunction(void **function, void *module, const char *name);
int cuLibraryGetKernel(void **kernel, void *library, const char *name);
int cuKernelGetFunction(void **function, void *kernel);
int cuLaunchKernel(void *f, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *, void **,
                   void **);
int cuLaunchKernelEx(const CUlaunchConfig *config, void *f, void **params, void **extra);
int cuGraphCreate(void **graph, unsigned flags);
int cuGraphAddKernelNode_v2(Node *node, void *graph, const Node *deps, size_t n, const void *params);
int cuGraphInstantiateWithFlags(void **exec, void *graph, unsigned long long flags);
int cuGraphLaunch(void *exec, void *stream);
int cudaLaunchKernel(const void *func, dim3 grid, dim3 block, void **args, size_t shared, void *stream);
int cudaGraphCreate(void **graph, unsigned flags);
int cudaGraphAddKernelNode(Node *node, void *graph, const Node *deps, size_t n, const cudaKernelNodeParams *params);
int cudaGraphAddChildGraphNode(Node *node, void *graph, const Node *deps, size_t n, void *child);
int cudaGraphInstantiate(void **exec, void *graph, unsigned long long flags);
int cudaGraphLaunch(void *exec, void *stream);
int cudaStreamBeginCapture(void *stream, int mode);
int cudaStreamEndCapture(void *stream, void **graph);
}

namespace ledger {

static int failures;

static void check(int result) { failures += result != 0; }

__attribute__((noinline)) void launch(void *function, int times, int *ledger, void *stream = nullptr) {
    for (int i = 0; i < times; i++, ++*ledger)
        check(cuLaunchKernel(function, 1, 1, 1, 32, 1, 1, 0, stream, nullptr, nullptr));
}

__attribute__((noinline)) void launch_ex(void *function, int times, int *ledger, void *stream = nullptr) {
    CUlaunchConfig config = {1, 1, 1, 32, 1, 1, 0, stream, nullptr, 0};
    for (int i = 0; i < times; i++, ++*ledger)
        check(cuLaunchKernelEx(&config, function, nullptr, nullptr));
}

// The host stub of the kernel captured into a graph (a runtime launch names its stub).
__attribute__((noinline)) void captured_kernel(int n) { failures += n < 0; }

__attribute__((noinline)) void *runtime_graph(int kernels) {
    void *graph = nullptr;
    check(cudaGraphCreate(&graph, 0));
    cudaKernelNodeParams params = {(void *)&captured_kernel, {1, 1, 1}, {32, 1, 1}, 0, nullptr, nullptr};
    Node node;
    for (int i = 0; i < kernels; i++)
        check(cudaGraphAddKernelNode(&node, graph, nullptr, 0, &params));
    return graph;
}

__attribute__((noinline)) void launch_graph(void *graph, int times, bool driver, int *ledger) {
    void *exec = nullptr;
    check(driver ? cuGraphInstantiateWithFlags(&exec, graph, 0) : cudaGraphInstantiate(&exec, graph, 0));
    for (int i = 0; i < times; i++, ++*ledger)
        check(driver ? cuGraphLaunch(exec, nullptr) : cudaGraphLaunch(exec, nullptr));
}

}  // namespace ledger

int main() {
    printf("ready\n");
    fflush(stdout);
    char line[64];
    if (!fgets(line, sizeof line, stdin))
        return 1;
    // driver launches of named kernels: by CUfunction, by CUkernel, by a CUkernel's CUfunction
    void *flash = nullptr, *gemm = nullptr, *gemm_function = nullptr, *triton = nullptr;
    ledger::check(cuModuleGetFunction(&flash, nullptr, "_ZN5flash16flash_fwd_kernelEPKfS1_Pf"));
    ledger::check(cuLibraryGetKernel(&gemm, nullptr, "_ZN7cutlass6KernelINS_4gemm6kernel4GemmIfEEEEvNT_6ParamsE"));
    ledger::check(cuKernelGetFunction(&gemm_function, gemm));
    ledger::check(cuModuleGetFunction(&triton, nullptr, "triton_poi_fused_add_0"));
    void *missing = nullptr;
    int not_found = cuModuleGetFunction(&missing, nullptr, "");  // CUDA_ERROR_NOT_FOUND: names nothing
    int flash_n = 0, gemm_n = 0, triton_n = 0, unnamed_n = 0;
    ledger::launch(flash, 7, &flash_n);
    ledger::launch_ex(flash, 3, &flash_n);
    ledger::launch(gemm, 4, &gemm_n);
    ledger::launch_ex(gemm_function, 5, &gemm_n);
    ledger::launch(triton, 6, &triton_n);
    ledger::launch(&ledger::failures, 2, &unnamed_n);  // a handle no call named
    // graphs: built node by node (runtime: 3 kernels; driver: 5), by stream capture (4 kernels,
    // launched through the runtime and the driver on the capturing stream), and one with a child
    // graph (its kernels are not counted: unknown)
    int three_n = 0, five_n = 0, captured_n = 0, unknown_n = 0;
    void *three = ledger::runtime_graph(3);
    ledger::launch_graph(three, 4, false, &three_n);
    void *five = nullptr;
    ledger::check(cuGraphCreate(&five, 0));
    CUlaunchConfig unused = {};
    Node node;
    for (int i = 0; i < 5; i++)
        ledger::check(cuGraphAddKernelNode_v2(&node, five, nullptr, 0, &unused));
    ledger::launch_graph(five, 3, true, &five_n);
    void *stream = (void *)0x5157, *captured = nullptr;
    int stub_captured = 0, flash_captured = 0, triton_captured = 0;
    ledger::check(cudaStreamBeginCapture(stream, 0));
    for (; stub_captured < 2; stub_captured++)
        ledger::check(cudaLaunchKernel((const void *)&ledger::captured_kernel, {1, 1, 1}, {32, 1, 1}, nullptr, 0,
                                       stream));
    ledger::launch(triton, 1, &triton_captured, stream);
    ledger::launch_ex(flash, 1, &flash_captured, stream);
    ledger::launch(triton, 1, &triton_n, (void *)0x0711);  // another stream: runs now
    ledger::check(cudaStreamEndCapture(stream, &captured));
    ledger::launch_graph(captured, 5, false, &captured_n);
    void *parent = ledger::runtime_graph(1);
    ledger::check(cudaGraphAddChildGraphNode(&node, parent, nullptr, 0, three));
    ledger::launch_graph(parent, 2, false, &unknown_n);
    printf("{\"pid\": %d, \"failures\": %d, \"not_found\": %d, \"driver\": {\"flash\": %d, \"gemm\": %d, "
           "\"triton\": %d, \"unnamed\": %d}, \"captured\": {\"stub\": %d, \"flash\": %d, \"triton\": %d}, "
           "\"graphs\": [[\"runtime\", 3, %d], [\"driver\", 5, %d], [\"runtime\", %d, %d], [\"runtime\", null, %d]]}\n",
           getpid(), ledger::failures, not_found, flash_n, gemm_n, triton_n, unnamed_n, stub_captured, flash_captured,
           triton_captured, three_n, five_n, stub_captured + flash_captured + triton_captured, captured_n, unknown_n);
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin))
        return 0;
    return 0;
}
