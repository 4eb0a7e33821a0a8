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
// ones), ATTNMETA_SHFL_IDX32 (a lane of the same 32-lane group) and ATTNMETA_BALLOT32 (the
// predicates of the 32-lane group as bits), and order a 32-lane group's shared-memory accesses
// with ATTNMETA_SYNC_WARP(). MmaM16N8K16 is the warp-level matrix product on
// 32-lane groups: the tensor cores on NVIDIA, a portable form on AMD. Kernels declare
// ATTNMETA_LAUNCH_BOUNDS(threads, min blocks per multiprocessor) and convert fp16 through
// HalfBitsToFloat / FloatToHalfBits (the vendor's conversion instructions, round to nearest
// even), on raw bits so that no vendor half type reaches a shared header. A kernel that may
// start under the tail of the kernel ahead of it is launched by LaunchKernelAfterPreceding and
// calls WaitForPrecedingGrid before it touches that kernel's writes (NVIDIA's programmatic
// dependent launch; a plain launch on AMD).
//
// No Abseil and no glog here: device sources include this header.

#ifndef ATTNMETA_ATTENTION_KERNELS_HIP_PORT_H_
#define ATTNMETA_ATTENTION_KERNELS_HIP_PORT_H_

#include <cstddef>
#include <cstdint>

namespace attnmeta {
// The lanes that the attention kernels' warp-level code is written for: a warp on NVIDIA and on
// RDNA, half a wave on CDNA (ATTNMETA_SHFL_IDX32, ATTNMETA_BALLOT32 and MmaM16N8K16 work
// within one). Unlike kWaveSize it is the same in host and device code, so block sizes may be
// written in it.
inline constexpr int kLaneGroup = 32;
}  // namespace attnmeta

#if defined(ATTNMETA_GPU_ROCM)

#include <hip/hip_runtime.h>

namespace attnmeta {
// MmaM16N8K16 below is the portable form here (MFMA fragments differ).
inline constexpr bool kNativeMmaM16N8K16 = false;
// LaunchKernelAfterPreceding below launches plainly here.
inline constexpr bool kOverlappingLaunches = false;
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
#define ATTNMETA_SHFL_IDX32(value, lane) __shfl((value), (lane), 32)
// Bit i: the predicate of lane i of the caller's 32-lane group (a wave64 holds two).
#define ATTNMETA_BALLOT32(pred) static_cast<uint32_t>(__ballot(pred) >> (__lane_id() & 32))
// A wave's lanes run in lockstep: only the compiler's ordering of memory accesses is needed.
#define ATTNMETA_SYNC_WARP() __builtin_amdgcn_wave_barrier()
// HIP's second __launch_bounds__ argument is waves per execution unit, not blocks per
// multiprocessor: the register hint is NVIDIA's only.
#define ATTNMETA_LAUNCH_BOUNDS(threads, min_blocks) __launch_bounds__(threads)

namespace attnmeta {
// NVIDIA's hint for the bytes DRAM fetches per L2 miss (cudaLimitMaxL2FetchGranularity); AMD
// has none.
inline hipError_t GetL2FetchGranularity(size_t* bytes) {
  *bytes = 0;
  return hipErrorNotSupported;
}
inline hipError_t SetL2FetchGranularity(size_t) { return hipErrorNotSupported; }
// CountProgrammaticGraphEdges (below for NVIDIA): no edge of a HIP graph lets a node start
// before the node ahead has ended.
inline hipError_t CountProgrammaticGraphEdges(hipGraph_t, int64_t* count) {
  *count = 0;
  return hipSuccess;
}
}  // namespace attnmeta

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
// MmaM16N8K16 below is the tensor cores' mma.sync.
inline constexpr bool kNativeMmaM16N8K16 = true;
// LaunchKernelAfterPreceding below may start a kernel under the tail of the one ahead.
inline constexpr bool kOverlappingLaunches = true;
}  // namespace attnmeta

#define ATTNMETA_SHFL_UP(value, delta) __shfl_up_sync(0xffffffffu, (value), (delta))
#define ATTNMETA_SHFL_DOWN(value, delta) __shfl_down_sync(0xffffffffu, (value), (delta))
#define ATTNMETA_SHFL_XOR(value, mask) __shfl_xor_sync(0xffffffffu, (value), (mask))
#define ATTNMETA_SHFL_IDX32(value, lane) __shfl_sync(0xffffffffu, (value), (lane))
#define ATTNMETA_BALLOT32(pred) __ballot_sync(0xffffffffu, (pred))
#define ATTNMETA_SYNC_WARP() __syncwarp()
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
using hipGraphNode_t = cudaGraphNode_t;
using hipStreamCaptureMode = cudaStreamCaptureMode;

constexpr hipError_t hipSuccess = cudaSuccess;
constexpr hipError_t hipErrorInvalidValue = cudaErrorInvalidValue;
constexpr hipError_t hipErrorNotReady = cudaErrorNotReady;
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
constexpr hipDeviceAttribute_t hipDeviceAttributeComputeCapabilityMajor =
    cudaDevAttrComputeCapabilityMajor;
inline hipError_t hipDeviceGetAttribute(int* value, hipDeviceAttribute_t attr, int device) {
  return cudaDeviceGetAttribute(value, attr, device);
}
template <typename Kernel>
inline hipError_t hipOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, Kernel kernel,
                                                               int block_threads,
                                                               size_t dynamic_shared_bytes) {
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks, kernel, block_threads,
                                                       dynamic_shared_bytes);
}
inline hipError_t hipDeviceSynchronize() { return cudaDeviceSynchronize(); }
using hipFuncAttribute = cudaFuncAttribute;
constexpr hipFuncAttribute hipFuncAttributeMaxDynamicSharedMemorySize =
    cudaFuncAttributeMaxDynamicSharedMemorySize;
inline hipError_t hipFuncSetAttribute(const void* kernel, hipFuncAttribute attr, int value) {
  return cudaFuncSetAttribute(kernel, attr, value);
}
namespace attnmeta {
// NVIDIA's hint for the bytes DRAM fetches per L2 miss (cudaLimitMaxL2FetchGranularity); AMD
// has none.
inline hipError_t GetL2FetchGranularity(size_t* bytes) {
  return cudaDeviceGetLimit(bytes, cudaLimitMaxL2FetchGranularity);
}
inline hipError_t SetL2FetchGranularity(size_t bytes) {
  return cudaDeviceSetLimit(cudaLimitMaxL2FetchGranularity, bytes);
}
// The edges of `graph` along which a node may start before the node ahead has ended (what a
// captured LaunchKernelAfterPreceding with `overlap` becomes), into *count: at most
// kMaxCountedGraphEdges edges in all (hipErrorInvalidValue beyond).
inline constexpr int kMaxCountedGraphEdges = 64;
inline hipError_t CountProgrammaticGraphEdges(hipGraph_t graph, int64_t* count) {
  *count = 0;
  cudaGraphNode_t from[kMaxCountedGraphEdges];
  cudaGraphNode_t to[kMaxCountedGraphEdges];
  cudaGraphEdgeData edges[kMaxCountedGraphEdges];
  size_t n = 0;
  if (cudaError_t err = cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &n); err != cudaSuccess) {
    return err;
  }
  if (n > static_cast<size_t>(kMaxCountedGraphEdges)) return hipErrorInvalidValue;
  if (cudaError_t err = cudaGraphGetEdges(graph, from, to, edges, &n); err != cudaSuccess) {
    return err;
  }
  for (size_t i = 0; i < n; ++i) {
    if (edges[i].type == cudaGraphDependencyTypeProgrammatic) ++*count;
  }
  return hipSuccess;
}
}  // namespace attnmeta
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
inline hipError_t hipStreamQuery(hipStream_t s) { return cudaStreamQuery(s); }
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
inline hipError_t hipGraphGetNodes(hipGraph_t graph, hipGraphNode_t* nodes, size_t* count) {
  return cudaGraphGetNodes(graph, nodes, count);
}
inline hipError_t hipEventCreate(hipEvent_t* e) { return cudaEventCreate(e); }
constexpr unsigned hipEventDisableTiming = cudaEventDisableTiming;
inline hipError_t hipEventCreateWithFlags(hipEvent_t* e, unsigned flags) {
  return cudaEventCreateWithFlags(e, flags);
}
constexpr unsigned hipHostMallocDefault = cudaHostAllocDefault;
constexpr unsigned hipHostMallocMapped = cudaHostAllocMapped;
// CUDA's pinned memory is coherent with the device without a flag.
constexpr unsigned hipHostMallocCoherent = 0;
inline hipError_t hipHostMalloc(void** p, size_t bytes, unsigned flags) {
  return cudaHostAlloc(p, bytes, flags);
}
inline hipError_t hipHostGetDevicePointer(void** device, void* host, unsigned flags) {
  return cudaHostGetDevicePointer(device, host, flags);
}
inline hipError_t hipHostFree(void* p) { return cudaFreeHost(p); }
inline hipError_t hipEventDestroy(hipEvent_t e) { return cudaEventDestroy(e); }
inline hipError_t hipEventRecord(hipEvent_t e, hipStream_t s) { return cudaEventRecord(e, s); }
inline hipError_t hipEventSynchronize(hipEvent_t e) { return cudaEventSynchronize(e); }
inline hipError_t hipEventQuery(hipEvent_t e) { return cudaEventQuery(e); }
inline hipError_t hipEventElapsedTime(float* ms, hipEvent_t a, hipEvent_t b) {
  return cudaEventElapsedTime(ms, a, b);
}

#else
#error "hip_port.h needs ATTNMETA_GPU_CUDA or ATTNMETA_GPU_ROCM (build with --config=cuda or --config=rocm)"
#endif

#if defined(__CUDACC__) || defined(__HIPCC__)
namespace attnmeta {

// Warp-level matrix multiply-accumulate on tiles of 2-byte floats (bf16 when kBf16, else fp16)
// with fp32 accumulators: d[16][8] += a[16][16] * b[16][8], spread over 32 lanes in the
// fragment layout of NVIDIA's mma.m16n8k16 (lane = 4 * g + t, g = lane / 4, t = lane % 4):
//   a[0] = a(g, 2t..2t+1)      a[1] = a(g + 8, 2t..2t+1)
//   a[2] = a(g, 2t+8..2t+9)    a[3] = a(g + 8, 2t+8..2t+9)
//   b[0] = b(2t..2t+1, g)      b[1] = b(2t+8..2t+9, g)
//   d[0..1] = d(g, 2t..2t+1)   d[2..3] = d(g + 8, 2t..2t+1)
// with two elements per 32-bit word, the lower column (or row of b) in the low half. On AMD the
// lanes are each half of a 64-wide wave. Every lane of the 32 must call it (it is collective).
//
// PortableMmaM16N8K16 computes it with shuffles and fp32 FMAs on any GPU (so that NVIDIA runs
// can test the code path AMD takes); MmaM16N8K16 is the tensor-core instruction on NVIDIA and
// the portable form on AMD, whose MFMA instructions use other fragment layouts.
template <bool kBf16>
__device__ inline float2 Unpack2xF16(uint32_t w) {
  if constexpr (kBf16) {
    return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
  } else {
    return make_float2(HalfBitsToFloat(static_cast<uint16_t>(w & 0xffffu)),
                       HalfBitsToFloat(static_cast<uint16_t>(w >> 16)));
  }
}

template <bool kBf16>
__device__ inline void PortableMmaM16N8K16(float (&d)[4], const uint32_t (&a)[4],
                                           const uint32_t (&b)[2]) {
  const int lane = static_cast<int>(threadIdx.x) % kLaneGroup;
  const int g = lane / 4;
  const int t = lane % 4;
  for (int k = 0; k < 4; ++k) {
    // Row g and g + 8 of a, columns 2k..2k+1 and 2k+8..2k+9: lane 4g + k's words.
    const int a_lane = 4 * g + k;
    const float2 a_lo = Unpack2xF16<kBf16>(ATTNMETA_SHFL_IDX32(a[0], a_lane));
    const float2 a8_lo = Unpack2xF16<kBf16>(ATTNMETA_SHFL_IDX32(a[1], a_lane));
    const float2 a_hi = Unpack2xF16<kBf16>(ATTNMETA_SHFL_IDX32(a[2], a_lane));
    const float2 a8_hi = Unpack2xF16<kBf16>(ATTNMETA_SHFL_IDX32(a[3], a_lane));
    // Columns 2t and 2t + 1 of b, rows 2k..2k+1 and 2k+8..2k+9: lanes 4(2t) + k, 4(2t+1) + k.
    const float2 b0_lo = Unpack2xF16<kBf16>(ATTNMETA_SHFL_IDX32(b[0], 8 * t + k));
    const float2 b0_hi = Unpack2xF16<kBf16>(ATTNMETA_SHFL_IDX32(b[1], 8 * t + k));
    const float2 b1_lo = Unpack2xF16<kBf16>(ATTNMETA_SHFL_IDX32(b[0], 8 * t + 4 + k));
    const float2 b1_hi = Unpack2xF16<kBf16>(ATTNMETA_SHFL_IDX32(b[1], 8 * t + 4 + k));
    d[0] += a_lo.x * b0_lo.x + a_lo.y * b0_lo.y + a_hi.x * b0_hi.x + a_hi.y * b0_hi.y;
    d[1] += a_lo.x * b1_lo.x + a_lo.y * b1_lo.y + a_hi.x * b1_hi.x + a_hi.y * b1_hi.y;
    d[2] += a8_lo.x * b0_lo.x + a8_lo.y * b0_lo.y + a8_hi.x * b0_hi.x + a8_hi.y * b0_hi.y;
    d[3] += a8_lo.x * b1_lo.x + a8_lo.y * b1_lo.y + a8_hi.x * b1_hi.x + a8_hi.y * b1_hi.y;
  }
}

template <bool kBf16>
__device__ inline void MmaM16N8K16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if defined(ATTNMETA_GPU_CUDA)
  if constexpr (kBf16) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
#else
  PortableMmaM16N8K16<kBf16>(d, a, b);
#endif
}

// The low (high false) or high 16-bit halves of x and y as one word, x's in the low half: one
// byte permute on NVIDIA; shifts and masks on AMD, where HIP 5.2's __byte_perm goes through
// memory.
__device__ inline uint32_t HalvesOf(uint32_t x, uint32_t y, bool high) {
#if defined(ATTNMETA_GPU_CUDA)
  return __byte_perm(x, y, high ? 0x7632u : 0x5410u);
#else
  return high ? (x >> 16) | (y & 0xffff0000u) : (x & 0xffffu) | (y << 16);
#endif
}

// a * b in 64 bits from 32-bit operands: one wide multiply on NVIDIA, where the compiler may
// otherwise widen the operands and multiply in 64 bits.
__device__ inline int64_t MulWide(int32_t a, int32_t b) {
#if defined(ATTNMETA_GPU_CUDA)
  int64_t product;
  asm("mul.wide.s32 %0, %1, %2;\n" : "=l"(product) : "r"(a), "r"(b));
  return product;
#else
  return int64_t{a} * b;
#endif
}

// 2^x with results below 2^-126 (denormals) flushed to zero, for softmax weights, where such a
// weight is nothing beside the maximum's own weight of 1: one ex2.approx.ftz on NVIDIA. exp2f
// keeps denormal results at the cost of a compare and two predicated multiplies per call, and
// where registers are short its predicates went through a register: in the tiled tensor-core
// varlen kernel that took most of the softmax's instructions (docs/varlen_attention.md).
__device__ inline float Exp2FlushToZero(float x) {
#if defined(ATTNMETA_GPU_CUDA)
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
#else
  return exp2f(x);
#endif
}

// Two floats rounded to bf16 (to nearest even; a NaN stays a NaN, its bits the vendor's), lo
// in the low half: one instruction on NVIDIA since sm_80 (the project builds sm_90).
__device__ inline uint32_t PackBf16x2(float lo, float hi) {
#if defined(ATTNMETA_GPU_CUDA)
  uint32_t packed;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(packed) : "f"(hi), "f"(lo));
  return packed;
#else
  const auto round = [](float x) -> uint32_t {
    const uint32_t b = __float_as_uint(x);
    if ((b & 0x7fffffffu) > 0x7f800000u) return 0x7fc0u;
    return (b + 0x7fffu + ((b >> 16) & 1u)) >> 16;
  };
  return round(lo) | (round(hi) << 16);
#endif
}

// The 16 read-only bytes at p (16-byte aligned, global memory) for a kernel that reads each
// of them once: on NVIDIA not allocated in L1 and with a 128-byte L2 prefetch; a plain load on
// AMD. The split decode launches read K and V this way (bs 1 x 16k 2-4% faster on the H200;
// unsplit launches not faster, bs 256 x 4k 0.5-1% slower: docs/paged_decode_attention.md).
__device__ inline uint4 LoadReadOnceGlobal16(const void* p) {
#if defined(ATTNMETA_GPU_CUDA)
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.L2::128B.v4.u32 {%0, %1, %2, %3}, [%4];\n"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
#else
  return __ldg(static_cast<const uint4*>(p));
#endif
}

// For a kernel that warms L2 before WaitForPrecedingGrid (below) with lines it will read
// after it: LoadThroughL2 is the 4 bytes at p from L2, not allocated in L1 (on NVIDIA; a plain
// load on AMD), so that a value the kernel ahead may still rewrite leaves no line in L1 that a
// load after the wait could hit; PrefetchToL2 asks for p's line in L2 and returns at once
// (nothing on AMD, where launches never overlap). p must lie in an allocation.
__device__ inline int32_t LoadThroughL2(const int32_t* p) {
#if defined(ATTNMETA_GPU_CUDA)
  return __ldcg(p);
#else
  return *p;
#endif
}
__device__ inline void PrefetchToL2(const void* p) {
#if defined(ATTNMETA_GPU_CUDA)
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p));
#else
  (void)p;
#endif
}

// The 8 bytes at p, in shared memory and 8-byte aligned, loaded where the call stands: the
// compiler may not hoist the load out of a loop, so a value reread at every iteration holds no
// registers between them. The caller orders it after the stores it reads (a warp or block
// barrier).
__device__ inline uint2 LoadSharedInPlace(const uint2* p) {
#if defined(ATTNMETA_GPU_CUDA)
  uint2 v;
  asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n"
               : "=r"(v.x), "=r"(v.y)
               : "r"(static_cast<uint32_t>(__cvta_generic_to_shared(p))));
  return v;
#else
  const volatile uint32_t* w = reinterpret_cast<const volatile uint32_t*>(p);
  return make_uint2(w[0], w[1]);
#endif
}

// Copies from global to shared memory that the caller overlaps with other work: on NVIDIA
// cp.async (16 bytes, not allocated in L1), grouped by CommitSharedCopies and awaited by
// WaitSharedCopies<n> (until at most n of the calling thread's groups are in flight), then a
// block barrier for the other threads' copies; on AMD a load and a store where the call stands,
// so buffering copies ahead buys nothing there (kSharedCopyStages). `read` false: the 16 bytes
// are zero and src is not read. dst and src 16-byte aligned.
#if defined(ATTNMETA_GPU_CUDA)
inline constexpr int kSharedCopyStages = 2;
#else
inline constexpr int kSharedCopyStages = 1;
#endif
__device__ inline void CopyGlobalToShared16(void* dst, const void* src, bool read) {
#if defined(ATTNMETA_GPU_CUDA)
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
               :
               : "r"(static_cast<uint32_t>(__cvta_generic_to_shared(dst))), "l"(src),
                 "r"(read ? 16 : 0)
               : "memory");
#else
  *static_cast<uint4*>(dst) = read ? *static_cast<const uint4*>(src) : make_uint4(0, 0, 0, 0);
#endif
}
__device__ inline void CommitSharedCopies() {
#if defined(ATTNMETA_GPU_CUDA)
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
template <int kInFlight>
__device__ inline void WaitSharedCopies() {
#if defined(ATTNMETA_GPU_CUDA)
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kInFlight) : "memory");
#endif
}

// Four 8 x 8 matrices of 2-byte elements from shared memory, transposed: lane 8 m + r passes
// the address of row r of matrix m (16 bytes, 16-byte aligned), and word m of lane (g, t) =
// (lane / 4, lane % 4) holds elements (2t, g) and (2t + 1, g) of matrix m, the first in the
// low half: with rows as the k dimension, the b fragment of MmaM16N8K16 (matrices 0 and 1:
// b[0] and b[1]). ldmatrix on NVIDIA; on AMD each lane reads its elements through the rows'
// addresses, shuffled from the lanes that pass them. Every lane of the 32 must call it.
__device__ inline uint4 LoadSharedMatrices8x8x4Trans(const void* row) {
#if defined(ATTNMETA_GPU_CUDA)
  uint4 v;
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(static_cast<uint32_t>(__cvta_generic_to_shared(row))));
  return v;
#else
  const int lane = static_cast<int>(threadIdx.x) % kLaneGroup;
  const int g = lane / 4;
  const int t = lane % 4;
  const uint64_t at = reinterpret_cast<uintptr_t>(row);
  const uint32_t at_lo = static_cast<uint32_t>(at);
  const uint32_t at_hi = static_cast<uint32_t>(at >> 32);
  uint32_t w[4];
  for (int m = 0; m < 4; ++m) {
    uint32_t e[2];
    for (int i = 0; i < 2; ++i) {
      const int from = 8 * m + 2 * t + i;
      const uint64_t r = uint64_t{static_cast<uint32_t>(ATTNMETA_SHFL_IDX32(at_hi, from))} << 32 |
                         static_cast<uint32_t>(ATTNMETA_SHFL_IDX32(at_lo, from));
      e[i] = reinterpret_cast<const uint16_t*>(static_cast<uintptr_t>(r))[g];
    }
    w[m] = e[0] | e[1] << 16;
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
#endif
}

// Programmatic dependent launches. A kernel launched by LaunchKernelAfterPreceding with
// `overlap` may start its blocks before the kernel ahead of it on the stream has ended (once
// every block of that kernel has called AllowDependentGridLaunch or exited), so that its start
// runs under that kernel's tail. Until it calls WaitForPrecedingGrid, which returns once that
// kernel has completed and its writes are visible, it may read only what that kernel does not
// write, and write nothing. NVIDIA GPUs of compute capability 9.0 and later (griddepcontrol;
// the calls compile to nothing for older targets, and launchers ask for the overlap only on
// such devices); a captured graph keeps the overlap as a programmatic edge. AMD has no such
// launch: LaunchKernelAfterPreceding launches plainly there and both calls do nothing; so do
// the calls in a kernel launched plainly.
__device__ inline void WaitForPrecedingGrid() {
#if defined(ATTNMETA_GPU_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ inline void AllowDependentGridLaunch() {
#if defined(ATTNMETA_GPU_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
// Whether the calling code has WaitForPrecedingGrid's instruction, as its compiler knew it:
// what KernelWaitsForPrecedingGrid asks the runtime of a kernel, known at compile time (tests
// compare the two).
__device__ inline bool CompiledToWaitForPrecedingGrid() {
#if defined(ATTNMETA_GPU_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  return true;
#else
  return false;
#endif
}
// `x` unchanged, as a value the compiler cannot know before this point. WaitForPrecedingGrid
// orders what the compiler sees as memory accesses, and a load it takes as read-only (__ldg,
// LoadReadOnceGlobal16) is not one of them: it may be moved above the wait. An address
// computed from OpaqueAfter's result after the wait cannot be.
__device__ inline int64_t OpaqueAfter(int64_t x) {
#if defined(ATTNMETA_GPU_CUDA)
  asm volatile("" : "+l"(x));
#endif
  return x;
}
__device__ inline const void* OpaqueAfter(const void* p) {
  return reinterpret_cast<const void*>(OpaqueAfter(reinterpret_cast<int64_t>(p)));
}
template <typename... Params, typename... Args>
inline hipError_t LaunchKernelAfterPreceding(bool overlap, void (*kernel)(Params...), dim3 grid,
                                             dim3 block, size_t shared_bytes, hipStream_t stream,
                                             Args... args) {
#if defined(ATTNMETA_GPU_CUDA)
  cudaLaunchAttribute attribute = {};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = overlap ? 1 : 0;
  const cudaError_t launched = cudaLaunchKernelEx(&config, kernel, args...);
  // As after <<<>>>: the last error read (and cleared), an earlier asynchronous one included.
  const cudaError_t last = cudaGetLastError();
  return launched != cudaSuccess ? launched : last;
#else
  (void)overlap;
  kernel<<<grid, block, shared_bytes, stream>>>(args...);
  return hipGetLastError();
#endif
}

// Whether the code of `kernel` that runs on the current device has WaitForPrecedingGrid's
// instruction, into *waits: NVIDIA code compiled for a virtual architecture of 9.0 or later
// (a build for older targets only, run through the driver's JIT, has none, and a launch
// overlapping the kernel ahead would then not wait for it); never on AMD.
template <typename... Params>
inline hipError_t KernelWaitsForPrecedingGrid(void (*kernel)(Params...), bool* waits) {
#if defined(ATTNMETA_GPU_CUDA)
  cudaFuncAttributes attributes = {};
  const cudaError_t err = cudaFuncGetAttributes(&attributes, kernel);
  *waits = err == cudaSuccess && attributes.ptxVersion >= 90;
  return err;
#else
  (void)kernel;
  *waits = false;
  return hipSuccess;
#endif
}

// *counter = (*counter >= limit) ? 0 : *counter + 1, returning the old value, as one atomic at
// device scope with acquire-release order: it releases what the calling thread has seen
// (the block's stores, after a barrier) and acquires what earlier counters released. Cheaper
// than a full fence on each side of a relaxed atomicInc.
__device__ inline uint32_t AtomicIncAcqRelDevice(uint32_t* counter, uint32_t limit) {
#if defined(ATTNMETA_GPU_CUDA)
  uint32_t old;
  asm volatile("atom.acq_rel.gpu.global.inc.u32 %0, [%1], %2;\n"
               : "=r"(old)
               : "l"(counter), "r"(limit)
               : "memory");
  return old;
#else
  return __builtin_amdgcn_atomic_inc32(counter, limit, __ATOMIC_ACQ_REL, "agent");
#endif
}

}  // namespace attnmeta
#endif  // defined(__CUDACC__) || defined(__HIPCC__)

#endif  // ATTNMETA_ATTENTION_KERNELS_HIP_PORT_H_
