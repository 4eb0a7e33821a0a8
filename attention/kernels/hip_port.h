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
// the device (hipDeviceGetAttribute, warp size). Device code uses attnmeta::kWaveSize (the
// target's, in the device pass) and the wave shuffles ATTNMETA_SHFL_UP / ATTNMETA_SHFL_DOWN /
// ATTNMETA_SHFL_XOR (all lanes active; CUDA has only the _sync forms, HIP 5.2 only the plain
// ones). Kernels declare ATTNMETA_LAUNCH_BOUNDS(threads, min blocks per multiprocessor) and
// convert fp16 through HalfBitsToFloat / FloatToHalfBits (the vendor's conversion
// instructions, round to nearest even), on raw bits so that no vendor half type reaches a
// shared header.
//
// No Abseil and no glog here: device sources include this header.

#ifndef ATTNMETA_ATTENTION_KERNELS_HIP_PORT_H_
#define ATTNMETA_ATTENTION_KERNELS_HIP_PORT_H_

#include <cstddef>
#include <cstdint>

#if defined(ATTNMETA_GPU_ROCM)

#include <hip/hip_runtime.h>

namespace attnmeta {
// The device pass knows the target's wave size; the host pass gets a placeholder that host
// code must not use (see above).
#if defined(__AMDGCN_WAVEFRONT_SIZE)
inline constexpr int kWaveSize = __AMDGCN_WAVEFRONT_SIZE;
#else
inline constexpr int kWaveSize = 64;
#endif
}  // namespace attnmeta

#define ATTNMETA_SHFL_UP(value, delta) __shfl_up((value), (delta))
#define ATTNMETA_SHFL_DOWN(value, delta) __shfl_down((value), (delta))
#define ATTNMETA_SHFL_XOR(value, mask) __shfl_xor((value), (mask))
// HIP's second __launch_bounds__ argument is waves per execution unit, not blocks per
// multiprocessor: the register hint is NVIDIA's only.
#define ATTNMETA_LAUNCH_BOUNDS(threads, min_blocks) __launch_bounds__(threads)

#if defined(__HIPCC__)
#include <hip/hip_fp16.h>

namespace attnmeta {
__device__ inline float HalfBitsToFloat(uint16_t bits) { return __half2float(__ushort_as_half(bits)); }
__device__ inline uint16_t FloatToHalfBits(float x) { return __half_as_ushort(__float2half(x)); }
}  // namespace attnmeta
#endif

#elif defined(ATTNMETA_GPU_CUDA)

#include <cuda_runtime.h>

namespace attnmeta {
inline constexpr int kWaveSize = 32;
}  // namespace attnmeta

#define ATTNMETA_SHFL_UP(value, delta) __shfl_up_sync(0xffffffffu, (value), (delta))
#define ATTNMETA_SHFL_DOWN(value, delta) __shfl_down_sync(0xffffffffu, (value), (delta))
#define ATTNMETA_SHFL_XOR(value, mask) __shfl_xor_sync(0xffffffffu, (value), (mask))
#define ATTNMETA_LAUNCH_BOUNDS(threads, min_blocks) __launch_bounds__(threads, min_blocks)

#if defined(__CUDACC__)
#include <cuda_fp16.h>

namespace attnmeta {
__device__ inline float HalfBitsToFloat(uint16_t bits) { return __half2float(__ushort_as_half(bits)); }
__device__ inline uint16_t FloatToHalfBits(float x) { return __half_as_ushort(__float2half_rn(x)); }
}  // namespace attnmeta
#endif

using hipError_t = cudaError_t;
using hipStream_t = cudaStream_t;
using hipEvent_t = cudaEvent_t;
using hipMemcpyKind = cudaMemcpyKind;
using hipGraph_t = cudaGraph_t;
using hipGraphExec_t = cudaGraphExec_t;
using hipStreamCaptureMode = cudaStreamCaptureMode;

constexpr hipError_t hipSuccess = cudaSuccess;
constexpr hipError_t hipErrorInvalidValue = cudaErrorInvalidValue;
constexpr hipStreamCaptureMode hipStreamCaptureModeThreadLocal = cudaStreamCaptureModeThreadLocal;
constexpr hipMemcpyKind hipMemcpyHostToDevice = cudaMemcpyHostToDevice;
constexpr hipMemcpyKind hipMemcpyDeviceToHost = cudaMemcpyDeviceToHost;
constexpr hipMemcpyKind hipMemcpyDeviceToDevice = cudaMemcpyDeviceToDevice;

inline hipError_t hipGetLastError() { return cudaGetLastError(); }
inline const char* hipGetErrorString(hipError_t e) { return cudaGetErrorString(e); }
inline hipError_t hipGetDeviceCount(int* n) { return cudaGetDeviceCount(n); }
inline hipError_t hipGetDevice(int* device) { return cudaGetDevice(device); }
using hipDeviceAttribute_t = cudaDeviceAttr;
constexpr hipDeviceAttribute_t hipDeviceAttributeMultiprocessorCount = cudaDevAttrMultiProcessorCount;
inline hipError_t hipDeviceGetAttribute(int* value, hipDeviceAttribute_t attr, int device) {
  return cudaDeviceGetAttribute(value, attr, device);
}
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
inline hipError_t hipMemsetAsync(void* dst, int value, size_t bytes, hipStream_t stream) {
  return cudaMemsetAsync(dst, value, bytes, stream);
}
inline hipError_t hipStreamCreate(hipStream_t* s) { return cudaStreamCreate(s); }
inline hipError_t hipStreamDestroy(hipStream_t s) { return cudaStreamDestroy(s); }
inline hipError_t hipStreamSynchronize(hipStream_t s) { return cudaStreamSynchronize(s); }
inline hipError_t hipStreamBeginCapture(hipStream_t s, hipStreamCaptureMode mode) {
  return cudaStreamBeginCapture(s, mode);
}
inline hipError_t hipStreamEndCapture(hipStream_t s, hipGraph_t* graph) {
  return cudaStreamEndCapture(s, graph);
}
inline hipError_t hipGraphInstantiate(hipGraphExec_t* exec, hipGraph_t graph, void* /*error_node*/,
                                      char* /*log*/, size_t /*log_size*/) {
  // CUDA 12 dropped the five-argument form; HIP keeps it.
  return cudaGraphInstantiate(exec, graph, 0);
}
inline hipError_t hipGraphLaunch(hipGraphExec_t exec, hipStream_t s) {
  return cudaGraphLaunch(exec, s);
}
inline hipError_t hipGraphExecDestroy(hipGraphExec_t exec) { return cudaGraphExecDestroy(exec); }
inline hipError_t hipGraphDestroy(hipGraph_t graph) { return cudaGraphDestroy(graph); }
inline hipError_t hipEventCreate(hipEvent_t* e) { return cudaEventCreate(e); }
constexpr unsigned hipEventDisableTiming = cudaEventDisableTiming;
inline hipError_t hipEventCreateWithFlags(hipEvent_t* e, unsigned flags) {
  return cudaEventCreateWithFlags(e, flags);
}
constexpr unsigned hipHostMallocDefault = 0;
inline hipError_t hipHostMalloc(void** p, size_t bytes, unsigned /*flags*/) {
  return cudaMallocHost(p, bytes);
}
inline hipError_t hipHostFree(void* p) { return cudaFreeHost(p); }
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
