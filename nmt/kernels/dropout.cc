// Inverted dropout, one pass: out = in * (draw >= threshold ? scale : 0), with `scale` in the input's dtype (the
// caller passes it rounded so) and the product rounded to it, as the TensorFlow ops of transformer.dropout.dropout
// compute it (tf.where on the draws, then a multiply in the input's dtype), so both paths give the same bits, but
// for the sign of a NaN (always positive here; Eigen's bfloat16 multiply keeps it in the elements its vector loop
// leaves to scalar code).
//
// The draws are those of transformer.dropout.random_halves, made here instead of read: element i gets the 16-bit
// half i % 2 (low first) of 32-bit word i / 2 of tf.random.stateless_uniform(dtype=uint32), which on CPU is
// word w % 4 of the Philox-4x32-10 block of counter + w / 4 under the key, both from
// StatelessRandomGetKeyCounter(seed) (TensorFlow's FillPhiloxRandom: group g skips g blocks), vectorised in
// philox.h.
// The forward also writes the keep decisions as bits (element i: bit i % 8 of byte i / 8), for NmtDropoutGrad:
// dx = dy * (kept ? scale : 0), the same product without drawing again (1 bit per element kept between the passes;
// on 2048 x 1024 bfloat16 on the AMX Xeon the backward took 0.9 ms against the forward's 1.4, which drawing again
// cost). bfloat16 on AVX-512 runs 16 elements a step, the keep bits a mask register: a compare gives the forward's,
// two mask bytes the backward's (forward 1.48 -> 1.20 ms with the AVX-512 Philox, backward 0.93 -> 0.89, there).

#include <algorithm>
#include <type_traits>

#include "common.h"
#include "philox.h"

#ifdef __AVX2__
#include <immintrin.h>
#endif

namespace nmt {

REGISTER_OP("NmtDropout")
    .Input("x: T")
    .Input("key: uint64")
    .Input("counter: uint64")
    .Output("y: T")
    .Output("mask: uint8")
    .Attr("T: {bfloat16, half, float}")
    .Attr("threshold: int")
    .Attr("scale: float")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->input(0));
      c->set_output(1, c->Vector(InferenceContext::kUnknownDim));
      return absl::OkStatus();
    });

// residual + NmtDropout(x) in one pass (the residual connection's add, rounded to T as TensorFlow's add rounds it)
REGISTER_OP("NmtDropoutAdd")
    .Input("x: T")
    .Input("residual: T")
    .Input("key: uint64")
    .Input("counter: uint64")
    .Output("y: T")
    .Output("mask: uint8")
    .Attr("T: {bfloat16, half, float}")
    .Attr("threshold: int")
    .Attr("scale: float")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle shape;
      TF_RETURN_IF_ERROR(c->Merge(c->input(0), c->input(1), &shape));
      c->set_output(0, shape);
      c->set_output(1, c->Vector(InferenceContext::kUnknownDim));
      return absl::OkStatus();
    });

REGISTER_OP("NmtDropoutGrad")
    .Input("dy: T")
    .Input("mask: uint8")
    .Output("dx: T")
    .Attr("T: {bfloat16, half, float}")
    .Attr("scale: float")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->input(0));
      return absl::OkStatus();
    });

namespace {

constexpr int64_t kBlockBytes = kBlockElements / 8;  // of the mask

// The mask's bytes for `size` elements (the last byte's unused bits 0).
inline int64_t MaskBytes(int64_t size) { return (size + 7) / 8; }

// The attribute `scale` as the constant the TensorFlow path multiplies by: rounded to T (a no-op when the caller
// rounded it so already).
template <typename T>
void GetScale(OpKernelConstruction* context, float* scale) {
  OP_REQUIRES_OK(context, context->GetAttr("scale", scale));
  *scale = static_cast<float>(static_cast<T>(*scale));
}


// out = in * (draws >= threshold ? scale : 0) over [0, n), rounded to T, as the TensorFlow path computes it (x * 0:
// -0 for a negative x, NaN for a NaN or inf)
template <typename T>
void Range(const T* __restrict in, const uint16_t* __restrict draws, T* __restrict out, int64_t n,
           uint16_t threshold, float scale) {
  for (int64_t i = 0; i < n; ++i) out[i] = FromFloat<T>(ToFloat(in[i]) * (draws[i] >= threshold ? scale : 0.f));
}

// bfloat16 on its raw 16 bits (the loop vectorises; Eigen::bfloat16 loads do not)
template <>
void Range(const Eigen::bfloat16* __restrict in, const uint16_t* __restrict draws, Eigen::bfloat16* __restrict out,
           int64_t n, uint16_t threshold, float scale) {
  const uint16_t* __restrict raw_in = reinterpret_cast<const uint16_t*>(in);
  uint16_t* __restrict raw_out = reinterpret_cast<uint16_t*>(out);
  for (int64_t i = 0; i < n; ++i) {
    const float value = __builtin_bit_cast(float, static_cast<uint32_t>(raw_in[i]) << 16);
    raw_out[i] = BFloat16Bits(value * (draws[i] >= threshold ? scale : 0.f));
  }
}

#ifdef __AVX2__
// bfloat16 on AVX-512, 16 elements a step: the bits of FromFloat's rounding (a NaN: 0x7FC0) of 16 floats
__attribute__((target("avx512f"))) inline __m256i BFloat16Bits512(__m512 value) {
  const __m512i bits = _mm512_castps_si512(value);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i biased = _mm512_add_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(0x7FFF)), odd);
  const __m512i rounded = _mm512_srli_epi32(biased, 16);
  const __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(bits, _mm512_set1_epi32(0x7FFFFFFF)),
                                                _mm512_set1_epi32(0x7F800000));
  return _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(rounded, nan, _mm512_set1_epi32(0x7FC0)));
}

// 16 bfloat16 (raw bits) widened to float
__attribute__((target("avx512f"))) inline __m512 Widen512(const uint16_t* raw) {
  return _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(raw))), 16));
}

// in * (kept ? scale : 0), rounded, for the 16 elements of `kept` (x * 0 as the TensorFlow path: -0, NaN)
__attribute__((target("avx512f"))) inline void Scale512(const uint16_t* in, __mmask16 kept, float scale,
                                                       uint16_t* out) {
  const __m512 factors = _mm512_maskz_mov_ps(kept, _mm512_set1_ps(scale));
  // `in` may be `out` (in place): read, then write
  const __m256i result = BFloat16Bits512(_mm512_mul_ps(Widen512(in), factors));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), result);
}

// The forward's Range and keep bits of n elements (16 at a time, the rest as Range and PackKeeps); the number
// of elements done
__attribute__((target("avx512f"))) int64_t RangeKeeps512(const Eigen::bfloat16* in, const uint16_t* draws,
                                                         Eigen::bfloat16* out, uint8_t* keep, int64_t n,
                                                         uint16_t threshold, float scale) {
  const uint16_t* raw_in = reinterpret_cast<const uint16_t*>(in);
  uint16_t* raw_out = reinterpret_cast<uint16_t*>(out);
  const __m512i limit = _mm512_set1_epi32(threshold);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i d = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(draws + i)));
    const __mmask16 kept = _mm512_cmpge_epu32_mask(d, limit);
    keep[i / 8] = static_cast<uint8_t>(kept);
    keep[i / 8 + 1] = static_cast<uint8_t>(kept >> 8);
    Scale512(raw_in + i, kept, scale, raw_out + i);
  }
  return i;
}

// The backward's product of n elements, 16 at a time; the number of elements done
__attribute__((target("avx512f"))) int64_t Multiply512(const Eigen::bfloat16* in, const uint8_t* keep,
                                                       Eigen::bfloat16* out, int64_t n, float scale) {
  const uint16_t* raw_in = reinterpret_cast<const uint16_t*>(in);
  uint16_t* raw_out = reinterpret_cast<uint16_t*>(out);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __mmask16 kept = static_cast<__mmask16>(keep[i / 8] | (keep[i / 8 + 1] << 8));
    Scale512(raw_in + i, kept, scale, raw_out + i);
  }
  return i;
}
#endif

// out[i] = residual[i] + out[i], rounded to T, i < n
template <typename T>
void AddInto(const T* __restrict residual, T* __restrict out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = FromFloat<T>(ToFloat(residual[i]) + ToFloat(out[i]));
}

// bfloat16 on its raw 16 bits (vectorises)
template <>
void AddInto(const Eigen::bfloat16* __restrict residual, Eigen::bfloat16* __restrict out, int64_t n) {
  const uint16_t* __restrict raw_residual = reinterpret_cast<const uint16_t*>(residual);
  uint16_t* __restrict raw_out = reinterpret_cast<uint16_t*>(out);
  for (int64_t i = 0; i < n; ++i) {
    const float sum = __builtin_bit_cast(float, static_cast<uint32_t>(raw_residual[i]) << 16) +
                      __builtin_bit_cast(float, static_cast<uint32_t>(raw_out[i]) << 16);
    raw_out[i] = BFloat16Bits(sum);
  }
}

}  // namespace

// NmtDropout, and NmtDropoutAdd with `kResidual` (its input 1 the residual)
template <typename T, bool kResidual>
class DropoutOp : public OpKernel {
 public:
  explicit DropoutOp(OpKernelConstruction* context) : OpKernel(context) {
    int threshold;
    OP_REQUIRES_OK(context, context->GetAttr("threshold", &threshold));
    OP_REQUIRES(context, threshold >= 0 && threshold < 65536,
                InvalidArgument("threshold must be in [0, 65536), got ", threshold));
    threshold_ = static_cast<uint16_t>(threshold);
    GetScale<T>(context, &scale_);
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& x = context->input(0);
    const Tensor& key = context->input(kResidual ? 2 : 1);
    const Tensor& counter = context->input(kResidual ? 3 : 2);
    const T* residual = nullptr;
    if (kResidual) {
      const Tensor& tensor = context->input(1);
      OP_REQUIRES(context, tensor.shape() == x.shape(),
                  InvalidArgument("x and residual must have one shape, got ", x.shape().DebugString(), " and ",
                                  tensor.shape().DebugString()));
      residual = tensor.flat<T>().data();
    }
    OP_REQUIRES(context, key.NumElements() == 1 && counter.NumElements() == 2,
                InvalidArgument("key and counter must be StatelessRandomGetKeyCounter's (1 and 2 uint64), got ",
                                key.NumElements(), " and ", counter.NumElements()));
    Tensor* y;
    // in place when TensorFlow can give x's buffer away: `in` and `out` may then be the same array, which the loops
    // below read and write at the same index only, one element at a time
    OP_REQUIRES_OK(context, context->forward_input_or_allocate_output({0}, 0, x.shape(), &y));
    const T* in = x.flat<T>().data();
    T* out = y->flat<T>().data();
    // the generator as TensorFlow builds it from these tensors (GetPhiloxRandomFromCounterKeyMem)
    const uint64_t key_word = key.flat<uint64_t>()(0);
    PhiloxRandom::Key philox_key;
    philox_key[0] = static_cast<uint32_t>(key_word);
    philox_key[1] = static_cast<uint32_t>(key_word >> 32);
    PhiloxRandom::ResultType philox_counter;
    for (int i = 0; i < 2; ++i) {
      const uint64_t word = counter.flat<uint64_t>()(i);
      philox_counter[2 * i] = static_cast<uint32_t>(word);
      philox_counter[2 * i + 1] = static_cast<uint32_t>(word >> 32);
    }
    const int64_t size = x.NumElements();
    Tensor* mask;
    OP_REQUIRES_OK(context, context->allocate_output(1, TensorShape({MaskBytes(size)}), &mask));
    uint8_t* bits = mask->flat<uint8_t>().data();
    const uint16_t threshold = threshold_;
    const float scale = scale_;
    const bool avx512 = UseAvx512();
    Shard(context, (size + kBlockElements - 1) / kBlockElements, kBlockElements * 8,
          [&](int64_t first, int64_t last) {
            // element e of a block: half e % 2 of word e / 2
            uint16_t draws[kBlockElements];
            for (int64_t block = first; block < last; ++block) {
              const int64_t start = block * kBlockElements;
              const int64_t n = std::min(kBlockElements, size - start);
              PhiloxBlocks(philox_key, philox_counter, static_cast<uint64_t>(block) * kBlocks, draws, avx512);
              RangeKeeps(in + start, draws, out + start, bits + block * kBlockBytes, n, threshold, scale, avx512);
              // x's buffer may be out's, never residual's (only input 0 is forwarded)
              if (kResidual) AddInto(residual + start, out + start, n);
            }
          });
  }

 private:
  // Range and PackKeeps (bfloat16 on AVX-512: both in one pass)
  static void RangeKeeps(const T* in, const uint16_t* draws, T* out, uint8_t* keep, int64_t n, uint16_t threshold,
                         float scale, bool avx512) {
    int64_t done = 0;
#ifdef __AVX2__
    if constexpr (std::is_same_v<T, Eigen::bfloat16>) {
      if (avx512) done = RangeKeeps512(in, draws, out, keep, n, threshold, scale);
    }
#endif
    Range(in + done, draws + done, out + done, n - done, threshold, scale);
    PackKeeps(draws + done, n - done, threshold, keep + done / 8);
  }

  // bit i % 8 of keep[i / 8]: draws[i] >= threshold, for i < n (the rest of the last byte 0)
  static void PackKeeps(const uint16_t* __restrict draws, int64_t n, uint16_t threshold, uint8_t* __restrict keep) {
    int64_t i = 0;
#ifdef __AVX2__
    // 16 draws at a time: unsigned d >= threshold as max(d, threshold) == d, narrowed to bytes in order, their
    // sign bits gathered (bit j = element j)
    const __m256i limit = _mm256_set1_epi16(static_cast<int16_t>(threshold));
    for (; i + 16 <= n; i += 16) {
      const __m256i d = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(draws + i));
      const __m256i kept = _mm256_cmpeq_epi16(_mm256_max_epu16(d, limit), d);
      const __m128i bytes = _mm_packs_epi16(_mm256_castsi256_si128(kept), _mm256_extracti128_si256(kept, 1));
      const uint16_t bits = static_cast<uint16_t>(_mm_movemask_epi8(bytes));
      keep[i / 8] = static_cast<uint8_t>(bits);
      keep[i / 8 + 1] = static_cast<uint8_t>(bits >> 8);
    }
#endif
    for (; i < n; i += 8) {
      uint8_t packed = 0;
      for (int bit = 0; bit < 8 && i + bit < n; ++bit) {
        packed |= static_cast<uint8_t>(draws[i + bit] >= threshold) << bit;
      }
      keep[i / 8] = packed;
    }
  }

  uint16_t threshold_;
  float scale_;
};

template <typename T>
class DropoutGradOp : public OpKernel {
 public:
  explicit DropoutGradOp(OpKernelConstruction* context) : OpKernel(context) {
    float scale;
    GetScale<T>(context, &scale);
    scale_ = scale;
    // each mask byte's 8 factors: scale where its bit is set, else 0
    for (int byte = 0; byte < 256; ++byte) {
      for (int bit = 0; bit < 8; ++bit) factors_[byte][bit] = ((byte >> bit) & 1) ? scale : 0.f;
    }
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& dy = context->input(0);
    const Tensor& mask = context->input(1);
    const int64_t size = dy.NumElements();
    OP_REQUIRES(context, mask.dims() == 1 && mask.NumElements() == MaskBytes(size),
                InvalidArgument("mask must be NmtDropout's for ", size, " elements (", MaskBytes(size),
                                " bytes), got shape ", mask.shape().DebugString()));
    Tensor* dx;
    // in place as the forward (dy's buffer, mostly)
    OP_REQUIRES_OK(context, context->forward_input_or_allocate_output({0}, 0, dy.shape(), &dx));
    const T* in = dy.flat<T>().data();
    T* out = dx->flat<T>().data();
    const uint8_t* bits = mask.flat<uint8_t>().data();
    [[maybe_unused]] const bool avx512 = UseAvx512();
    Shard(context, (size + kBlockElements - 1) / kBlockElements, kBlockElements * 3,
          [&](int64_t first, int64_t last) {
            // the block's factors, 8 per mask byte, then one vectorised multiply
            alignas(32) float factors[kBlockElements];
            for (int64_t block = first; block < last; ++block) {
              const int64_t start = block * kBlockElements;
              const int64_t n = std::min(kBlockElements, size - start);
              const uint8_t* __restrict packed = bits + block * kBlockBytes;
              int64_t done = 0;
#ifdef __AVX2__
              if constexpr (std::is_same_v<T, Eigen::bfloat16>) {
                if (avx512) done = Multiply512(in + start, packed, out + start, n, scale_);
              }
#endif
              for (int64_t byte = done / 8; byte < MaskBytes(n); ++byte) {
                std::memcpy(factors + 8 * byte, factors_[packed[byte]], sizeof(factors_[0]));
              }
              Multiply(in + start + done, factors + done, out + start + done, n - done);
            }
          });
  }

 private:
  // out[i] = in[i] * factors[i], i < n, rounded to T as the forward's multiply
  static void Multiply(const T* __restrict in, const float* __restrict factors, T* __restrict out, int64_t n) {
    for (int64_t i = 0; i < n; ++i) out[i] = FromFloat<T>(ToFloat(in[i]) * factors[i]);
  }

  alignas(32) float factors_[256][8];
  float scale_;
};

// bfloat16 on its raw 16 bits (vectorises)
template <>
void DropoutGradOp<Eigen::bfloat16>::Multiply(const Eigen::bfloat16* __restrict in, const float* __restrict factors,
                                              Eigen::bfloat16* __restrict out, int64_t n) {
  const uint16_t* __restrict raw_in = reinterpret_cast<const uint16_t*>(in);
  uint16_t* __restrict raw_out = reinterpret_cast<uint16_t*>(out);
  for (int64_t i = 0; i < n; ++i) {
    raw_out[i] = BFloat16Bits(__builtin_bit_cast(float, static_cast<uint32_t>(raw_in[i]) << 16) * factors[i]);
  }
}

#define REGISTER(T)                                                                              \
  REGISTER_KERNEL_BUILDER(Name("NmtDropout").Device(DEVICE_CPU).TypeConstraint<T>("T"), DropoutOp<T, false>); \
  REGISTER_KERNEL_BUILDER(Name("NmtDropoutAdd").Device(DEVICE_CPU).TypeConstraint<T>("T"), DropoutOp<T, true>); \
  REGISTER_KERNEL_BUILDER(Name("NmtDropoutGrad").Device(DEVICE_CPU).TypeConstraint<T>("T"), DropoutGradOp<T>);

REGISTER(float);
REGISTER(Eigen::bfloat16);
REGISTER(Eigen::half);

}  // namespace nmt
