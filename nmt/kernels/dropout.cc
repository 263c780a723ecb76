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
// blocks at once in AVX2 registers (TensorFlow's generator, tsl::random::PhiloxRandom, one block at a time
// otherwise). The mask does not depend on the input, so the same op is its own gradient (dx = dropout(dy) with
// the same key and counter).

#include <algorithm>

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
    .Attr("T: {bfloat16, half, float}")
    .Attr("threshold: int")
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

#ifdef __AVX2__
// The high and low 32 bits of the 8 products m * c.
inline void MulHiLo(__m256i c, __m256i m, __m256i* hi, __m256i* lo) {
  const __m256i even = _mm256_mul_epu32(c, m);
  const __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(c, 32), m);
  *lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
  *hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
}
#endif

// The 16-bit halves (low first) of the words of the Philox blocks of `counter` + first + b under `key`, b <
// kBlocks: draws[8 b + 2 j + h] = half h of word j of block b. PhiloxRandom's rounds, on kBlocks blocks at a time.
inline void Halves(uint32_t word, uint16_t* __restrict pair) {
  pair[0] = static_cast<uint16_t>(word);
  pair[1] = static_cast<uint16_t>(word >> 16);
}

void PhiloxBlocks(const PhiloxRandom::Key& key, const PhiloxRandom::ResultType& counter, uint64_t first,
                  uint16_t* __restrict draws) {
#ifdef __AVX2__
  const uint64_t low = counter[0] | (static_cast<uint64_t>(counter[1]) << 32);
  const uint64_t high = counter[2] | (static_cast<uint64_t>(counter[3]) << 32);
  alignas(32) uint32_t c[4][kBlocks];
  for (int b = 0; b < kBlocks; ++b) {
    // the 128-bit counter plus first + b, as PhiloxRandom::Skip adds it
    const uint64_t sum = low + (first + b);
    const uint64_t top = high + (sum < low ? 1 : 0);
    c[0][b] = static_cast<uint32_t>(sum);
    c[1][b] = static_cast<uint32_t>(sum >> 32);
    c[2][b] = static_cast<uint32_t>(top);
    c[3][b] = static_cast<uint32_t>(top >> 32);
  }
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
  for (int s = 0; s < kSets; ++s) {
    _mm256_store_si256(reinterpret_cast<__m256i*>(c[0] + s * kLanes), c0[s]);
    _mm256_store_si256(reinterpret_cast<__m256i*>(c[1] + s * kLanes), c1[s]);
    _mm256_store_si256(reinterpret_cast<__m256i*>(c[2] + s * kLanes), c2[s]);
    _mm256_store_si256(reinterpret_cast<__m256i*>(c[3] + s * kLanes), c3[s]);
  }
  for (int b = 0; b < kBlocks; ++b) {
    for (int j = 0; j < 4; ++j) Halves(c[j][b], draws + 8 * b + 2 * j);
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
    float scale;
    OP_REQUIRES_OK(context, context->GetAttr("scale", &scale));
    // the constant the TensorFlow path multiplies by (a no-op when the caller rounded it to T already)
    scale_ = static_cast<float>(static_cast<T>(scale));
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& x = context->input(0);
    const Tensor& key = context->input(1);
    const Tensor& counter = context->input(2);
    OP_REQUIRES(context, key.NumElements() == 1 && counter.NumElements() == 2,
                InvalidArgument("key and counter must be StatelessRandomGetKeyCounter's (1 and 2 uint64), got ",
                                key.NumElements(), " and ", counter.NumElements()));
    Tensor* y;
    // in place when TensorFlow can give x's buffer away (the backward's dy, mostly): `in` and `out` may then be the
    // same array, which the loops below read and write at the same index only, one element at a time
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
    const uint16_t threshold = threshold_;
    const float scale = scale_;
    Shard(context, (size + kBlockElements - 1) / kBlockElements, kBlockElements * 8,
          [&](int64_t first, int64_t last) {
            // element e of a block: half e % 2 of word e / 2
            uint16_t draws[kBlockElements];
            for (int64_t block = first; block < last; ++block) {
              const int64_t start = block * kBlockElements;
              PhiloxBlocks(philox_key, philox_counter, static_cast<uint64_t>(block) * kBlocks, draws);
              Range(in + start, draws, out + start, 0, std::min(kBlockElements, size - start), threshold, scale);
            }
          });
  }

 private:
  // x * 0 as the TensorFlow path computes it: -0 for a negative x, NaN for a NaN or inf
  static void Range(const T* __restrict in, const uint16_t* __restrict draws, T* __restrict out, int64_t first,
                    int64_t last, uint16_t threshold, float scale) {
    for (int64_t i = first; i < last; ++i) {
      out[i] = FromFloat<T>(ToFloat(in[i]) * (draws[i] >= threshold ? scale : 0.f));
    }
  }

  uint16_t threshold_;
  float scale_;
};

// bfloat16 on its raw 16 bits (the loop vectorises; Eigen::bfloat16 loads do not)
template <>
void DropoutOp<Eigen::bfloat16>::Range(const Eigen::bfloat16* __restrict in, const uint16_t* __restrict draws,
                                       Eigen::bfloat16* __restrict out, int64_t first, int64_t last,
                                       uint16_t threshold, float scale) {
  const uint16_t* __restrict raw_in = reinterpret_cast<const uint16_t*>(in);
  uint16_t* __restrict raw_out = reinterpret_cast<uint16_t*>(out);
  for (int64_t i = first; i < last; ++i) {
    const float value = __builtin_bit_cast(float, static_cast<uint32_t>(raw_in[i]) << 16);
    raw_out[i] = BFloat16Bits(value * (draws[i] >= threshold ? scale : 0.f));
  }
}

#define REGISTER(T) \
  REGISTER_KERNEL_BUILDER(Name("NmtDropout").Device(DEVICE_CPU).TypeConstraint<T>("T"), DropoutOp<T>);

REGISTER(float);
REGISTER(Eigen::bfloat16);
REGISTER(Eigen::half);

}  // namespace nmt
