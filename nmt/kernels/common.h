// What the kernels share: TensorFlow's op headers and names, sharding over the intra-op threads, and float
// conversions of their element types, written as bit operations for bfloat16 so that the loops around them
// vectorise (Eigen's conversion does not). bfloat16: the high half of the float, rounded to nearest even; a NaN
// stays a (quiet) NaN, as in Eigen's conversion, so the results are Eigen's bit for bit.
#ifndef NMT_KERNELS_COMMON_H_
#define NMT_KERNELS_COMMON_H_

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>

#include "tensorflow/core/framework/numeric_types.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/util/work_sharder.h"

namespace nmt {

using tensorflow::DEVICE_CPU;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;
using tensorflow::errors::InvalidArgument;
using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;

// `work(first, last)` over [0, units) split across the op's intra-op threads (`cost_per_unit`: cycles, roughly).
inline void Shard(OpKernelContext* context, int64_t units, int64_t cost_per_unit,
                  const std::function<void(int64_t, int64_t)>& work) {
  auto* workers = context->device()->tensorflow_cpu_worker_threads();
  tensorflow::Shard(workers->num_threads, workers->workers, units, cost_per_unit, work);
}

template <typename T>
inline float ToFloat(T v) {
  return static_cast<float>(v);
}
template <>
inline float ToFloat(Eigen::bfloat16 v) {
  uint16_t half;
  std::memcpy(&half, &v, 2);
  const uint32_t bits = static_cast<uint32_t>(half) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
template <typename T>
inline T FromFloat(float f) {
  return static_cast<T>(f);
}
// The bits of the bfloat16 nearest to f (ties to even); a NaN gives the quiet NaN 0x7FC0
inline uint16_t BFloat16Bits(float f) {
  const uint32_t bits = __builtin_bit_cast(uint32_t, f);
  const uint16_t rounded = static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
  return (bits & 0x7FFFFFFFu) > 0x7F800000u ? static_cast<uint16_t>(0x7FC0u) : rounded;
}
template <>
inline Eigen::bfloat16 FromFloat(float f) {
  const uint16_t half = BFloat16Bits(f);
  Eigen::bfloat16 v;
  std::memcpy(&v, &half, 2);
  return v;
}

// A row of T widened to float, and narrowed back (rounded to nearest even); bfloat16 on its raw 16 bits, so that
// the loops vectorise.
template <typename T>
inline void Widen(const T* __restrict in, float* __restrict out, int64_t n) {
  for (int64_t j = 0; j < n; ++j) out[j] = ToFloat(in[j]);
}
template <>
inline void Widen(const Eigen::bfloat16* __restrict in, float* __restrict out, int64_t n) {
  const uint16_t* __restrict raw = reinterpret_cast<const uint16_t*>(in);
  for (int64_t j = 0; j < n; ++j) out[j] = __builtin_bit_cast(float, static_cast<uint32_t>(raw[j]) << 16);
}

template <typename T>
inline void Narrow(const float* __restrict in, T* __restrict out, int64_t n) {
  for (int64_t j = 0; j < n; ++j) out[j] = FromFloat<T>(in[j]);
}
template <>
inline void Narrow(const float* __restrict in, Eigen::bfloat16* __restrict out, int64_t n) {
  uint16_t* __restrict raw = reinterpret_cast<uint16_t*>(out);
  for (int64_t j = 0; j < n; ++j) raw[j] = BFloat16Bits(in[j]);
}

// out[j] = the sum over blocks b of partials[b * d + j], in block order: a fixed order, so per-block partial sums
// computed by any threads in any schedule add up to the same bits.
inline void SumBlocks(const float* partials, int64_t blocks, int64_t d, float* out) {
  for (int64_t j = 0; j < d; ++j) out[j] = 0.f;
  for (int64_t block = 0; block < blocks; ++block) {
    const float* sums = partials + block * d;
    for (int64_t j = 0; j < d; ++j) out[j] += sums[j];
  }
}

}  // namespace nmt

#endif  // NMT_KERNELS_COMMON_H_
