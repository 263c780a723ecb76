// Inverted dropout, one pass: out = in * (draw >= threshold ? scale : 0), with `scale` in the input's dtype (the
// caller passes it rounded so) and the product rounded to it, as the TensorFlow ops of transformer.dropout.dropout
// compute it (tf.where on the draws, then a multiply in the input's dtype), so both paths give the same bits, but
// for the sign of a NaN (always positive here; Eigen's bfloat16 multiply keeps it in the elements its vector loop
// leaves to scalar code).
//
// The draws are those of transformer.dropout.random_halves, made here instead of read: element i gets the 16-bit
// half i % 2 (low first) of 32-bit word i / 2 of tf.random.stateless_uniform(dtype=uint32), which on CPU is
// word w % 4 of the Philox-4x32-10 block of counter + w / 4 under the key, both from
// StatelessRandomGetKeyCounter(seed) (TensorFlow's FillPhiloxRandom: group g skips g blocks). Philox runs on 32
// blocks at once in AVX2 registers, or in AVX-512 registers where the CPU has them (picked at run time; the
// library is built for AVX2), TensorFlow's generator (tsl::random::PhiloxRandom) one block at a time without AVX2.
// The forward also writes the keep decisions as bits (element i: bit i % 8 of byte i / 8), for NmtDropoutGrad:
// dx = dy * (kept ? scale : 0), the same product without drawing again (1 bit per element kept between the passes;
// on 2048 x 1024 bfloat16 on the AMX Xeon the backward took 0.9 ms against the forward's 1.4, which drawing again
// cost). bfloat16 on AVX-512 runs 16 elements a step, the keep bits a mask register: a compare gives the forward's,
// two mask bytes the backward's (forward 1.48 -> 1.20 ms with the AVX-512 Philox, backward 0.93 -> 0.89, there).

#include <algorithm>
#include <type_traits>

#include "common.h"
#include "xla/tsl/lib/random/philox_random.h"

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

using tsl::random::PhiloxRandom;

constexpr int kLanes = 8;                       // Philox blocks in one AVX2 register set
constexpr int kSets = 4;                        // register sets per call, interleaved (the rounds are a chain)
constexpr int kBlocks = kLanes * kSets;         // Philox blocks per call of PhiloxBlocks
constexpr int64_t kBlockElements = kBlocks * 8;  // each Philox block: 4 words, 8 draws
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

#ifdef __AVX2__
// The high and low 32 bits of the 8 products m * c.
inline void MulHiLo(__m256i c, __m256i m, __m256i* hi, __m256i* lo) {
  const __m256i even = _mm256_mul_epu32(c, m);
  const __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(c, 32), m);
  *lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
  *hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
}
#endif

// a word's two 16-bit halves, low first
inline void Halves(uint32_t word, uint16_t* __restrict pair) {
  pair[0] = static_cast<uint16_t>(word);
  pair[1] = static_cast<uint16_t>(word >> 16);
}

// The counters of blocks first + b, b < kBlocks, by word: c[j][b] = word j (PhiloxRandom::Skip's 128-bit sum).
void Counters(const PhiloxRandom::ResultType& counter, uint64_t first, uint32_t (*c)[kBlocks]) {
  const uint64_t low = counter[0] | (static_cast<uint64_t>(counter[1]) << 32);
  const uint64_t high = counter[2] | (static_cast<uint64_t>(counter[3]) << 32);
  for (int b = 0; b < kBlocks; ++b) {
    const uint64_t sum = low + (first + b);
    const uint64_t top = high + (sum < low ? 1 : 0);
    c[0][b] = static_cast<uint32_t>(sum);
    c[1][b] = static_cast<uint32_t>(sum >> 32);
    c[2][b] = static_cast<uint32_t>(top);
    c[3][b] = static_cast<uint32_t>(top >> 32);
  }
}

#ifdef __AVX2__
// PhiloxBlocks on AVX-512 (16 blocks per register, picked at run time where the CPU has it): the same rounds and
// the same draws.
__attribute__((target("avx512f"))) inline void MulHiLo512(__m512i c, __m512i m, __m512i* hi, __m512i* lo) {
  const __m512i even = _mm512_mul_epu32(c, m);
  const __m512i odd = _mm512_mul_epu32(_mm512_srli_epi64(c, 32), m);
  *lo = _mm512_mask_blend_epi32(0xAAAA, even, _mm512_slli_epi64(odd, 32));
  *hi = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(even, 32), odd);
}

__attribute__((target("avx512f"))) void PhiloxBlocks512(const PhiloxRandom::Key& key,
                                                        const PhiloxRandom::ResultType& counter, uint64_t first,
                                                        uint16_t* __restrict draws) {
  constexpr int kLanes512 = 16, kSets512 = kBlocks / kLanes512;
  alignas(64) uint32_t c[4][kBlocks];
  Counters(counter, first, c);
  __m512i c0[kSets512], c1[kSets512], c2[kSets512], c3[kSets512];
  for (int s = 0; s < kSets512; ++s) {
    c0[s] = _mm512_load_si512(c[0] + s * kLanes512);
    c1[s] = _mm512_load_si512(c[1] + s * kLanes512);
    c2[s] = _mm512_load_si512(c[2] + s * kLanes512);
    c3[s] = _mm512_load_si512(c[3] + s * kLanes512);
  }
  const __m512i ma = _mm512_set1_epi32(static_cast<int>(0xD2511F53u));
  const __m512i mb = _mm512_set1_epi32(static_cast<int>(0xCD9E8D57u));
  uint32_t k0 = key[0], k1 = key[1];
  for (int round = 0; round < 10; ++round) {
    const __m512i key0 = _mm512_set1_epi32(static_cast<int>(k0));
    const __m512i key1 = _mm512_set1_epi32(static_cast<int>(k1));
    for (int s = 0; s < kSets512; ++s) {
      __m512i hi0, lo0, hi1, lo1;
      MulHiLo512(c0[s], ma, &hi0, &lo0);
      MulHiLo512(c2[s], mb, &hi1, &lo1);
      c0[s] = _mm512_xor_si512(_mm512_xor_si512(hi1, c1[s]), key0);
      c2[s] = _mm512_xor_si512(_mm512_xor_si512(hi0, c3[s]), key1);
      c1[s] = lo1;
      c3[s] = lo0;
    }
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  // the 4 x 16 transpose: per 128-bit quarter q, blocks 4q..4q+3 after the unpacks, then the quarters in order
  __m512i* out = reinterpret_cast<__m512i*>(draws);
  const __m512i low_quarters = _mm512_set_epi64(11, 10, 3, 2, 9, 8, 1, 0);
  const __m512i high_quarters = _mm512_set_epi64(15, 14, 7, 6, 13, 12, 5, 4);
  for (int s = 0; s < kSets512; ++s) {
    const __m512i t0 = _mm512_unpacklo_epi32(c0[s], c1[s]);
    const __m512i t1 = _mm512_unpackhi_epi32(c0[s], c1[s]);
    const __m512i t2 = _mm512_unpacklo_epi32(c2[s], c3[s]);
    const __m512i t3 = _mm512_unpackhi_epi32(c2[s], c3[s]);
    const __m512i u0 = _mm512_unpacklo_epi64(t0, t2);  // in quarter q: block 4 q
    const __m512i u1 = _mm512_unpackhi_epi64(t0, t2);  // 4 q + 1
    const __m512i u2 = _mm512_unpacklo_epi64(t1, t3);  // 4 q + 2
    const __m512i u3 = _mm512_unpackhi_epi64(t1, t3);  // 4 q + 3
    const __m512i b0145 = _mm512_permutex2var_epi64(u0, low_quarters, u1);
    const __m512i b8_9_12_13 = _mm512_permutex2var_epi64(u0, high_quarters, u1);
    const __m512i b2367 = _mm512_permutex2var_epi64(u2, low_quarters, u3);
    const __m512i b10_11_14_15 = _mm512_permutex2var_epi64(u2, high_quarters, u3);
    _mm512_storeu_si512(out + 4 * s + 0, _mm512_shuffle_i64x2(b0145, b2367, 0x44));
    _mm512_storeu_si512(out + 4 * s + 1, _mm512_shuffle_i64x2(b0145, b2367, 0xEE));
    _mm512_storeu_si512(out + 4 * s + 2, _mm512_shuffle_i64x2(b8_9_12_13, b10_11_14_15, 0x44));
    _mm512_storeu_si512(out + 4 * s + 3, _mm512_shuffle_i64x2(b8_9_12_13, b10_11_14_15, 0xEE));
  }
}

const bool kAvx512 = __builtin_cpu_supports("avx512f");
#endif

// The 16-bit halves (low first) of the words of the Philox blocks of `counter` + first + b under `key`, b <
// kBlocks: draws[8 b + 2 j + h] = half h of word j of block b. PhiloxRandom's rounds, on kBlocks blocks at a time.
void PhiloxBlocks(const PhiloxRandom::Key& key, const PhiloxRandom::ResultType& counter, uint64_t first,
                  uint16_t* __restrict draws) {
#ifdef __AVX2__
  if (kAvx512) return PhiloxBlocks512(key, counter, first, draws);
  alignas(32) uint32_t c[4][kBlocks];
  Counters(counter, first, c);
  __m256i c0[kSets], c1[kSets], c2[kSets], c3[kSets];
  for (int s = 0; s < kSets; ++s) {
    c0[s] = _mm256_load_si256(reinterpret_cast<const __m256i*>(c[0] + s * kLanes));
    c1[s] = _mm256_load_si256(reinterpret_cast<const __m256i*>(c[1] + s * kLanes));
    c2[s] = _mm256_load_si256(reinterpret_cast<const __m256i*>(c[2] + s * kLanes));
    c3[s] = _mm256_load_si256(reinterpret_cast<const __m256i*>(c[3] + s * kLanes));
  }
  const __m256i ma = _mm256_set1_epi32(static_cast<int>(0xD2511F53u));
  const __m256i mb = _mm256_set1_epi32(static_cast<int>(0xCD9E8D57u));
  uint32_t k0 = key[0], k1 = key[1];
  for (int round = 0; round < 10; ++round) {
    const __m256i key0 = _mm256_set1_epi32(static_cast<int>(k0));
    const __m256i key1 = _mm256_set1_epi32(static_cast<int>(k1));
    for (int s = 0; s < kSets; ++s) {
      __m256i hi0, lo0, hi1, lo1;
      MulHiLo(c0[s], ma, &hi0, &lo0);
      MulHiLo(c2[s], mb, &hi1, &lo1);
      c0[s] = _mm256_xor_si256(_mm256_xor_si256(hi1, c1[s]), key0);
      c2[s] = _mm256_xor_si256(_mm256_xor_si256(hi0, c3[s]), key1);
      c1[s] = lo1;
      c3[s] = lo0;
    }
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  // words 4 b + j of the draws = word j of block b: a 4 x 8 transpose of each register set
  __m256i* out = reinterpret_cast<__m256i*>(draws);
  for (int s = 0; s < kSets; ++s) {
    const __m256i t0 = _mm256_unpacklo_epi32(c0[s], c1[s]);  // (c0, c1) of blocks 0, 1 | 4, 5
    const __m256i t1 = _mm256_unpackhi_epi32(c0[s], c1[s]);  // 2, 3 | 6, 7
    const __m256i t2 = _mm256_unpacklo_epi32(c2[s], c3[s]);
    const __m256i t3 = _mm256_unpackhi_epi32(c2[s], c3[s]);
    const __m256i u0 = _mm256_unpacklo_epi64(t0, t2);  // block 0 | 4
    const __m256i u1 = _mm256_unpackhi_epi64(t0, t2);  // 1 | 5
    const __m256i u2 = _mm256_unpacklo_epi64(t1, t3);  // 2 | 6
    const __m256i u3 = _mm256_unpackhi_epi64(t1, t3);  // 3 | 7
    _mm256_storeu_si256(out + 4 * s + 0, _mm256_permute2x128_si256(u0, u1, 0x20));
    _mm256_storeu_si256(out + 4 * s + 1, _mm256_permute2x128_si256(u2, u3, 0x20));
    _mm256_storeu_si256(out + 4 * s + 2, _mm256_permute2x128_si256(u0, u1, 0x31));
    _mm256_storeu_si256(out + 4 * s + 3, _mm256_permute2x128_si256(u2, u3, 0x31));
  }
#else
  for (int b = 0; b < kBlocks; ++b) {
    PhiloxRandom generator(counter, key);
    generator.Skip(first + b);
    const PhiloxRandom::ResultType block = generator();
    for (int j = 0; j < 4; ++j) Halves(block[j], draws + 8 * b + 2 * j);
  }
#endif
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

}  // namespace

template <typename T>
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
    const Tensor& key = context->input(1);
    const Tensor& counter = context->input(2);
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
    Shard(context, (size + kBlockElements - 1) / kBlockElements, kBlockElements * 8,
          [&](int64_t first, int64_t last) {
            // element e of a block: half e % 2 of word e / 2
            uint16_t draws[kBlockElements];
            for (int64_t block = first; block < last; ++block) {
              const int64_t start = block * kBlockElements;
              const int64_t n = std::min(kBlockElements, size - start);
              PhiloxBlocks(philox_key, philox_counter, static_cast<uint64_t>(block) * kBlocks, draws);
              RangeKeeps(in + start, draws, out + start, bits + block * kBlockBytes, n, threshold, scale);
            }
          });
  }

 private:
  // bit i % 8 of keep[i / 8]: draws[i] >= threshold, for i < n (the rest of the last byte 0)
  // Range and PackKeeps (bfloat16 on AVX-512: both in one pass)
  static void RangeKeeps(const T* in, const uint16_t* draws, T* out, uint8_t* keep, int64_t n, uint16_t threshold,
                         float scale) {
    int64_t done = 0;
#ifdef __AVX2__
    if constexpr (std::is_same_v<T, Eigen::bfloat16>) {
      if (kAvx512) done = RangeKeeps512(in, draws, out, keep, n, threshold, scale);
    }
#endif
    Range(in + done, draws + done, out + done, n - done, threshold, scale);
    PackKeeps(draws + done, n - done, threshold, keep + done / 8);
  }

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
                if (kAvx512) done = Multiply512(in + start, packed, out + start, n, scale_);
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
  REGISTER_KERNEL_BUILDER(Name("NmtDropout").Device(DEVICE_CPU).TypeConstraint<T>("T"), DropoutOp<T>); \
  REGISTER_KERNEL_BUILDER(Name("NmtDropoutGrad").Device(DEVICE_CPU).TypeConstraint<T>("T"), DropoutGradOp<T>);

REGISTER(float);
REGISTER(Eigen::bfloat16);
REGISTER(Eigen::half);

}  // namespace nmt
