// TensorFlow's Philox-4x32-10 draws (tsl::random::PhiloxRandom), 32 blocks a call, vectorised: 8 blocks per AVX2
// register set (4 sets interleaved, the rounds being a chain), or 16 per AVX-512 register where the CPU has them
// (picked at run time; the library is built for AVX2), the words transposed in registers into the order
// TensorFlow's FillPhiloxRandom writes them; one block at a time without AVX2. The dropout kernels' generator
// (dropout.cc).
#ifndef NMT_KERNELS_PHILOX_H_
#define NMT_KERNELS_PHILOX_H_

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "xla/tsl/lib/random/philox_random.h"

#ifdef __AVX2__
#include <immintrin.h>
#endif

namespace nmt {

using tsl::random::PhiloxRandom;

constexpr int kLanes = 8;                        // Philox blocks in one AVX2 register set
constexpr int kSets = 4;                         // register sets per call, interleaved (the rounds are a chain)
constexpr int kBlocks = kLanes * kSets;          // Philox blocks per call of PhiloxBlocks
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

// a word's two 16-bit halves, low first
inline void Halves(uint32_t word, uint16_t* __restrict pair) {
  pair[0] = static_cast<uint16_t>(word);
  pair[1] = static_cast<uint16_t>(word >> 16);
}

// The counters of blocks first + b, b < kBlocks, by word: c[j][b] = word j (PhiloxRandom::Skip's 128-bit sum).
inline void Counters(const PhiloxRandom::ResultType& counter, uint64_t first, uint32_t (*c)[kBlocks]) {
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

__attribute__((target("avx512f"))) inline void PhiloxBlocks512(const PhiloxRandom::Key& key,
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

#endif

// Whether the kernels take their AVX-512 paths: the CPU has AVX-512F and NMT_KERNELS_ISA is not "avx2" (which runs
// the AVX2 paths an AVX2 CPU runs, on an AVX-512 one: for the tests of both paths, and for measuring them). Read
// once per kernel call, not per block.
inline bool UseAvx512() {
#ifdef __AVX2__
  static const bool cpu = __builtin_cpu_supports("avx512f");
  const char* isa = std::getenv("NMT_KERNELS_ISA");
  return cpu && (isa == nullptr || std::strcmp(isa, "avx2") != 0);
#else
  return false;
#endif
}

// The 16-bit halves (low first) of the words of the Philox blocks of `counter` + first + b under `key`, b <
// kBlocks: draws[8 b + 2 j + h] = half h of word j of block b. PhiloxRandom's rounds, on kBlocks blocks at a time.
inline void PhiloxBlocks(const PhiloxRandom::Key& key, const PhiloxRandom::ResultType& counter, uint64_t first,
                  uint16_t* __restrict draws, bool avx512) {
#ifdef __AVX2__
  if (avx512) return PhiloxBlocks512(key, counter, first, draws);
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

}  // namespace nmt

#endif  // NMT_KERNELS_PHILOX_H_
