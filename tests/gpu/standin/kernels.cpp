// Stand-in for the host stubs nvcc emits, one per CUDA kernel: a program hands cudaLaunchKernel
// the stub's address, and the stub carries the kernel's C++ (mangled) name, which is all the agent
// reads of it. The bodies differ so that no two stubs are folded into one address.
static volatile int launched;

namespace at {
namespace native {
template <typename T>
__attribute__((noinline)) void vectorized_elementwise_kernel(int n, T *out) {
    launched = n + (out != nullptr);
}
template void vectorized_elementwise_kernel<float>(int, float *);
}  // namespace native
}  // namespace at

namespace flash {
__attribute__((noinline)) void flash_fwd_kernel(const float *q, const float *k, float *o) {
    launched = 2 + (q == k) + (o != nullptr);
}
}  // namespace flash

extern "C" __attribute__((noinline)) void plain_c_kernel(void) { launched = 3; }
