// The one portability header between project code and the GPU vendor runtime.
//
// Project code (host launchers, device sources, GPU tests) uses the HIP runtime API names
// and includes only this header. On AMD (ATTNMETA_GPU_ROCM) they are HIP's own; on NVIDIA
// (ATTNMETA_GPU_CUDA) this header maps each name the project uses onto the CUDA runtime.
// (Debian's HIP 5.2 ships its own NVIDIA mapping, which does not compile against CUDA 13.)
// Add a name here when the project first needs it; nothing else may include a vendor header.
//
// Wave size is 64 on CDNA (gfx9) and 32 on RDNA and NVIDIA, and HIP's host pass reports 64
// whatever the target: block sizes that host and device code both use must not derive from
// it (the launch would not match the kernel's stride on AMD), and host code that needs it asks
// the device (hipDeviceGetAttribute, warp size).
//
// No Abseil and no glog here: device sources include this header.

#ifndef ATTNMETA_ATTENTION_KERNELS_HIP_PORT_H_
#define ATTNMETA_ATTENTION_KERNELS_HIP_PORT_H_

#include <cstddef>

#if defined(ATTNMETA_GPU_ROCM)

#include <hip/hip_runtime.h>

#elif defined(ATTNMETA_GPU_CUDA)

#include <cuda_runtime.h>

using hipError_t = cudaError_t;
using hipStream_t = cudaStream_t;
using hipEvent_t = cudaEvent_t;
using hipMemcpyKind = cudaMemcpyKind;

constexpr hipError_t hipSuccess = cudaSuccess;
constexpr hipMemcpyKind hipMemcpyHostToDevice = cudaMemcpyHostToDevice;
constexpr hipMemcpyKind hipMemcpyDeviceToHost = cudaMemcpyDeviceToHost;
constexpr hipMemcpyKind hipMemcpyDeviceToDevice = cudaMemcpyDeviceToDevice;

inline hipError_t hipGetLastError() { return cudaGetLastError(); }
inline const char* hipGetErrorString(hipError_t e) { return cudaGetErrorString(e); }
inline hipError_t hipGetDeviceCount(int* n) { return cudaGetDeviceCount(n); }
inline hipError_t hipDeviceSynchronize() { return cudaDeviceSynchronize(); }
inline hipError_t hipMalloc(void** p, size_t bytes) { return cudaMalloc(p, bytes); }
template <typename T>
inline hipError_t hipMalloc(T** p, size_t bytes) {
  return cudaMalloc(reinterpret_cast<void**>(p), bytes);
}
inline hipError_t hipFree(void* p) { return cudaFree(p); }
inline hipError_t hipMemcpy(void* dst, const void* src, size_t bytes, hipMemcpyKind kind) {
  return cudaMemcpy(dst, src, bytes, kind);
}
inline hipError_t hipMemcpyAsync(void* dst, const void* src, size_t bytes, hipMemcpyKind kind,
                                 hipStream_t stream) {
  return cudaMemcpyAsync(dst, src, bytes, kind, stream);
}
inline hipError_t hipMemset(void* dst, int value, size_t bytes) {
  return cudaMemset(dst, value, bytes);
}
inline hipError_t hipEventCreate(hipEvent_t* e) { return cudaEventCreate(e); }
inline hipError_t hipEventDestroy(hipEvent_t e) { return cudaEventDestroy(e); }
inline hipError_t hipEventRecord(hipEvent_t e, hipStream_t s) { return cudaEventRecord(e, s); }
inline hipError_t hipEventSynchronize(hipEvent_t e) { return cudaEventSynchronize(e); }
inline hipError_t hipEventElapsedTime(float* ms, hipEvent_t a, hipEvent_t b) {
  return cudaEventElapsedTime(ms, a, b);
}

#else
#error "hip_port.h needs ATTNMETA_GPU_CUDA or ATTNMETA_GPU_ROCM (build with --config=cuda or --config=rocm)"
#endif

#endif  // ATTNMETA_ATTENTION_KERNELS_HIP_PORT_H_
