#include <immintrin.h>
#include <cstdint>
#include <cstring>
#include <chrono>
#include <cstdio>
#include <vector>
#include <algorithm>
constexpr int kLanes = 8, kSets = 4, kBlocks = kLanes * kSets;
constexpr int64_t kBlockElements = kBlocks * 8, kBlockBytes = kBlockElements / 8;
inline uint16_t BFloat16Bits(float f) {
  const uint32_t bits = __builtin_bit_cast(uint32_t, f);
  const uint16_t rounded = static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
  return (bits & 0x7FFFFFFFu) > 0x7F800000u ? static_cast<uint16_t>(0x7FC0u) : rounded;
}
inline void MulHiLo(__m256i c, __m256i m, __m256i* hi, __m256i* lo) {
  const __m256i even = _mm256_mul_epu32(c, m);
  const __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(c, 32), m);
  *lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
  *hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
}
inline void Halves(uint32_t word, uint16_t* __restrict pair) { pair[0] = (uint16_t)word; pair[1] = (uint16_t)(word >> 16); }
template <int MODE>
void PhiloxBlocks(const uint32_t* key, const uint32_t* counter, uint64_t first, uint16_t* __restrict draws) {
  const uint64_t low = counter[0] | (static_cast<uint64_t>(counter[1]) << 32);
  const uint64_t high = counter[2] | (static_cast<uint64_t>(counter[3]) << 32);
  alignas(32) uint32_t c[4][kBlocks];
  for (int b = 0; b < kBlocks; ++b) {
    const uint64_t sum = low + (first + b);
    const uint64_t top = high + (sum < low ? 1 : 0);
    c[0][b] = (uint32_t)sum; c[1][b] = (uint32_t)(sum >> 32); c[2][b] = (uint32_t)top; c[3][b] = (uint32_t)(top >> 32);
  }
  __m256i c0[kSets], c1[kSets], c2[kSets], c3[kSets];
  for (int s = 0; s < kSets; ++s) {
    c0[s] = _mm256_load_si256((const __m256i*)(c[0] + s * kLanes));
    c1[s] = _mm256_load_si256((const __m256i*)(c[1] + s * kLanes));
    c2[s] = _mm256_load_si256((const __m256i*)(c[2] + s * kLanes));
    c3[s] = _mm256_load_si256((const __m256i*)(c[3] + s * kLanes));
  }
  const __m256i ma = _mm256_set1_epi32((int)0xD2511F53u), mb = _mm256_set1_epi32((int)0xCD9E8D57u);
  uint32_t k0 = key[0], k1 = key[1];
  for (int round = 0; round < 10; ++round) {
    const __m256i key0 = _mm256_set1_epi32((int)k0), key1 = _mm256_set1_epi32((int)k1);
    for (int s = 0; s < kSets; ++s) {
      __m256i hi0, lo0, hi1, lo1;
      MulHiLo(c0[s], ma, &hi0, &lo0);
      MulHiLo(c2[s], mb, &hi1, &lo1);
      c0[s] = _mm256_xor_si256(_mm256_xor_si256(hi1, c1[s]), key0);
      c2[s] = _mm256_xor_si256(_mm256_xor_si256(hi0, c3[s]), key1);
      c1[s] = lo1; c3[s] = lo0;
    }
    k0 += 0x9E3779B9u; k1 += 0xBB67AE85u;
  }
  if (MODE == 0) {
    for (int s = 0; s < kSets; ++s) {
      _mm256_store_si256((__m256i*)(c[0] + s * kLanes), c0[s]);
      _mm256_store_si256((__m256i*)(c[1] + s * kLanes), c1[s]);
      _mm256_store_si256((__m256i*)(c[2] + s * kLanes), c2[s]);
      _mm256_store_si256((__m256i*)(c[3] + s * kLanes), c3[s]);
    }
    for (int b = 0; b < kBlocks; ++b) for (int j = 0; j < 4; ++j) Halves(c[j][b], draws + 8 * b + 2 * j);
  } else {
    // 4x8 transpose: out words [4b + j] = c_j[b]
    __m256i* out = reinterpret_cast<__m256i*>(draws);
    for (int s = 0; s < kSets; ++s) {
      const __m256i t0 = _mm256_unpacklo_epi32(c0[s], c1[s]);  // c0b0 c1b0 c0b1 c1b1 | b4 b5
      const __m256i t1 = _mm256_unpackhi_epi32(c0[s], c1[s]);  // b2 b3 | b6 b7
      const __m256i t2 = _mm256_unpacklo_epi32(c2[s], c3[s]);
      const __m256i t3 = _mm256_unpackhi_epi32(c2[s], c3[s]);
      const __m256i u0 = _mm256_unpacklo_epi64(t0, t2);  // b0 | b4
      const __m256i u1 = _mm256_unpackhi_epi64(t0, t2);  // b1 | b5
      const __m256i u2 = _mm256_unpacklo_epi64(t1, t3);  // b2 | b6
      const __m256i u3 = _mm256_unpackhi_epi64(t1, t3);  // b3 | b7
      _mm256_storeu_si256(out + 4 * s + 0, _mm256_permute2x128_si256(u0, u1, 0x20));  // b0 b1
      _mm256_storeu_si256(out + 4 * s + 1, _mm256_permute2x128_si256(u2, u3, 0x20));  // b2 b3
      _mm256_storeu_si256(out + 4 * s + 2, _mm256_permute2x128_si256(u0, u1, 0x31));  // b4 b5
      _mm256_storeu_si256(out + 4 * s + 3, _mm256_permute2x128_si256(u2, u3, 0x31));  // b6 b7
    }
  }
}

__attribute__((target("avx512f")))
inline void MulHiLo512(__m512i c, __m512i m, __m512i* hi, __m512i* lo) {
  const __m512i even = _mm512_mul_epu32(c, m);
  const __m512i odd = _mm512_mul_epu32(_mm512_srli_epi64(c, 32), m);
  *lo = _mm512_mask_blend_epi32(0xAAAA, even, _mm512_slli_epi64(odd, 32));
  *hi = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(even, 32), odd);
}
__attribute__((target("avx512f")))
void PhiloxBlocks512(const uint32_t* key, const uint32_t* counter, uint64_t first, uint16_t* __restrict draws) {
  constexpr int L = 16, S = kBlocks / L;
  const uint64_t low = counter[0] | (static_cast<uint64_t>(counter[1]) << 32);
  const uint64_t high = counter[2] | (static_cast<uint64_t>(counter[3]) << 32);
  alignas(64) uint32_t c[4][kBlocks];
  for (int b = 0; b < kBlocks; ++b) {
    const uint64_t sum = low + (first + b);
    const uint64_t top = high + (sum < low ? 1 : 0);
    c[0][b] = (uint32_t)sum; c[1][b] = (uint32_t)(sum >> 32); c[2][b] = (uint32_t)top; c[3][b] = (uint32_t)(top >> 32);
  }
  __m512i c0[S], c1[S], c2[S], c3[S];
  for (int s = 0; s < S; ++s) {
    c0[s] = _mm512_load_si512(c[0] + s * L); c1[s] = _mm512_load_si512(c[1] + s * L);
    c2[s] = _mm512_load_si512(c[2] + s * L); c3[s] = _mm512_load_si512(c[3] + s * L);
  }
  const __m512i ma = _mm512_set1_epi32((int)0xD2511F53u), mb = _mm512_set1_epi32((int)0xCD9E8D57u);
  uint32_t k0 = key[0], k1 = key[1];
  for (int round = 0; round < 10; ++round) {
    const __m512i key0 = _mm512_set1_epi32((int)k0), key1 = _mm512_set1_epi32((int)k1);
    for (int s = 0; s < S; ++s) {
      __m512i hi0, lo0, hi1, lo1;
      MulHiLo512(c0[s], ma, &hi0, &lo0);
      MulHiLo512(c2[s], mb, &hi1, &lo1);
      c0[s] = _mm512_xor_si512(_mm512_xor_si512(hi1, c1[s]), key0);
      c2[s] = _mm512_xor_si512(_mm512_xor_si512(hi0, c3[s]), key1);
      c1[s] = lo1; c3[s] = lo0;
    }
    k0 += 0x9E3779B9u; k1 += 0xBB67AE85u;
  }
  __m512i* out = reinterpret_cast<__m512i*>(draws);
  const __m512i lo_idx = _mm512_set_epi64(11, 10, 3, 2, 9, 8, 1, 0), hi_idx = _mm512_set_epi64(15, 14, 7, 6, 13, 12, 5, 4);
  for (int s = 0; s < S; ++s) {
    const __m512i t0 = _mm512_unpacklo_epi32(c0[s], c1[s]);
    const __m512i t1 = _mm512_unpackhi_epi32(c0[s], c1[s]);
    const __m512i t2 = _mm512_unpacklo_epi32(c2[s], c3[s]);
    const __m512i t3 = _mm512_unpackhi_epi32(c2[s], c3[s]);
    const __m512i u0 = _mm512_unpacklo_epi64(t0, t2);  // per 128-bit lane q: block 4q+0
    const __m512i u1 = _mm512_unpackhi_epi64(t0, t2);  // 4q+1
    const __m512i u2 = _mm512_unpacklo_epi64(t1, t3);  // 4q+2
    const __m512i u3 = _mm512_unpackhi_epi64(t1, t3);  // 4q+3
    // want out: b0 b1 b2 b3 | b4 ... : lane q of u0,u1,u2,u3 in order
    const __m512i v01lo = _mm512_permutex2var_epi64(u0, lo_idx, u1);  // u0.q0 u1.q0 u0.q1 u1.q1
    const __m512i v01hi = _mm512_permutex2var_epi64(u0, hi_idx, u1);  // q2, q3
    const __m512i v23lo = _mm512_permutex2var_epi64(u2, lo_idx, u3);
    const __m512i v23hi = _mm512_permutex2var_epi64(u2, hi_idx, u3);
    // blocks: v01lo = b0 b1 b4 b5 ; v23lo = b2 b3 b6 b7
    _mm512_storeu_si512(out + 4 * s + 0, _mm512_shuffle_i64x2(v01lo, v23lo, 0x44));  // b0 b1 b2 b3
    _mm512_storeu_si512(out + 4 * s + 1, _mm512_shuffle_i64x2(v01lo, v23lo, 0xEE));  // b4 b5 b6 b7
    _mm512_storeu_si512(out + 4 * s + 2, _mm512_shuffle_i64x2(v01hi, v23hi, 0x44));
    _mm512_storeu_si512(out + 4 * s + 3, _mm512_shuffle_i64x2(v01hi, v23hi, 0xEE));
  }
}

void Range(const uint16_t* __restrict raw_in, const uint16_t* __restrict draws, uint16_t* __restrict raw_out, int64_t n, uint16_t threshold, float scale) {
  for (int64_t i = 0; i < n; ++i) {
    const float value = __builtin_bit_cast(float, static_cast<uint32_t>(raw_in[i]) << 16);
    raw_out[i] = BFloat16Bits(value * (draws[i] >= threshold ? scale : 0.f));
  }
}

// forward: out = in * (draw >= threshold ? scale : 0) rounded, and the keep bits, 8 elements per step
void RangeNew(const uint16_t* __restrict in, const uint16_t* __restrict draws, uint16_t* __restrict out, uint8_t* __restrict keep, int64_t n, uint16_t threshold, float scale) {
  const __m256 sc = _mm256_set1_ps(scale);
  const __m256i limit = _mm256_set1_epi32((int)threshold - 1);
  const __m256i bias = _mm256_set1_epi32(0x7FFF), one = _mm256_set1_epi32(1), abs_mask = _mm256_set1_epi32(0x7FFFFFFF);
  const __m256i inf = _mm256_set1_epi32(0x7F800000), qnan = _mm256_set1_epi32(0x7FC0);
  int64_t k = 0;
  for (; 8 * k + 8 <= n; ++k) {
    const __m256i d = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)(draws + 8 * k)));
    const __m256 m = _mm256_castsi256_ps(_mm256_cmpgt_epi32(d, limit));
    keep[k] = (uint8_t)_mm256_movemask_ps(m);
    const __m256 f = _mm256_and_ps(m, sc);
    const __m256 x = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)(in + 8 * k))), 16));
    const __m256i y = _mm256_castps_si256(_mm256_mul_ps(x, f));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(y, bias), _mm256_and_si256(_mm256_srli_epi32(y, 16), one)), 16);
    r = _mm256_blendv_epi8(r, qnan, _mm256_cmpgt_epi32(_mm256_and_si256(y, abs_mask), inf));
    _mm_storeu_si128((__m128i*)(out + 8 * k), _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1)));
  }
}

void PackKeeps(const uint16_t* __restrict draws, int64_t n, uint16_t threshold, uint8_t* __restrict keep) {
  const __m256i limit = _mm256_set1_epi16((int16_t)threshold);
  for (int64_t i = 0; i + 16 <= n; i += 16) {
    const __m256i d = _mm256_loadu_si256((const __m256i*)(draws + i));
    const __m256i kept = _mm256_cmpeq_epi16(_mm256_max_epu16(d, limit), d);
    const __m128i bytes = _mm_packs_epi16(_mm256_castsi256_si128(kept), _mm256_extracti128_si256(kept, 1));
    const uint16_t bits = (uint16_t)_mm_movemask_epi8(bytes);
    keep[i / 8] = (uint8_t)bits; keep[i / 8 + 1] = (uint8_t)(bits >> 8);
  }
}

void BackCur(const uint16_t* __restrict in, const uint8_t* __restrict packed, uint16_t* __restrict out, int64_t n, const float (*table)[8]) {
  alignas(32) float factors[kBlockElements];
  for (int64_t byte = 0; byte < (n + 7) / 8; ++byte) memcpy(factors + 8 * byte, table[packed[byte]], 32);
  for (int64_t i = 0; i < n; ++i) out[i] = BFloat16Bits(__builtin_bit_cast(float, (uint32_t)in[i] << 16) * factors[i]);
}
void BackNew(const uint16_t* __restrict in, const uint8_t* __restrict packed, uint16_t* __restrict out, int64_t n, float scale) {
  const __m256i bitsel = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  const __m256 sc = _mm256_set1_ps(scale);
  const __m256i bias = _mm256_set1_epi32(0x7FFF), one = _mm256_set1_epi32(1), abs_mask = _mm256_set1_epi32(0x7FFFFFFF);
  const __m256i inf = _mm256_set1_epi32(0x7F800000), qnan = _mm256_set1_epi32(0x7FC0);
  int64_t k = 0;
  for (; 8 * k + 8 <= n; ++k) {
    const __m256i m = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(packed[k]), bitsel), bitsel);
    const __m256 f = _mm256_and_ps(_mm256_castsi256_ps(m), sc);
    const __m256 x = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)(in + 8 * k))), 16));
    const __m256i y = _mm256_castps_si256(_mm256_mul_ps(x, f));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(y, bias), _mm256_and_si256(_mm256_srli_epi32(y, 16), one)), 16);
    r = _mm256_blendv_epi8(r, qnan, _mm256_cmpgt_epi32(_mm256_and_si256(y, abs_mask), inf));
    _mm_storeu_si128((__m128i*)(out + 8 * k), _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1)));
  }
  for (int64_t i = 8 * k; i < n; ++i) out[i] = BFloat16Bits(__builtin_bit_cast(float, (uint32_t)in[i] << 16) * (((packed[i / 8] >> (i % 8)) & 1) ? scale : 0.f));
}

int main() {
  const int64_t size = 2048 * 1024, blocks = size / kBlockElements;
  std::vector<uint16_t> in(size), out(size), out2(size); std::vector<uint8_t> bits(size / 8), bits2(size/8);
  for (int64_t i = 0; i < size; ++i) in[i] = 0x3f80 + (i % 97);
  uint32_t key[2] = {123, 456}, counter[4] = {1, 2, 3, 4};
  alignas(32) uint16_t draws[kBlockElements], draws2[kBlockElements];

  {
    static float table[256][8];
    for (int b = 0; b < 256; ++b) for (int bit = 0; bit < 8; ++bit) table[b][bit] = ((b >> bit) & 1) ? 1.1f : 0.f;
    for (int64_t i = 0; i < size / 8; ++i) bits[i] = (uint8_t)(i * 2654435761u >> 13);
    for (int64_t i = 0; i < size; i += 1000) in[i] = (i % 3 == 0) ? 0x7F80 : (i % 3 == 1) ? 0xFFC1 : 0x8001;  // inf, nan, -tiny
    for (int mode = 0; mode < 2; ++mode) {
      double best = 1e9;
      for (int rep = 0; rep < 15; ++rep) {
        auto t0 = std::chrono::steady_clock::now();
        for (int64_t block = 0; block < blocks; ++block) {
          if (mode == 0) BackCur(in.data() + block * kBlockElements, bits.data() + block * kBlockBytes, out.data() + block * kBlockElements, kBlockElements, table);
          else BackNew(in.data() + block * kBlockElements, bits.data() + block * kBlockBytes, out2.data() + block * kBlockElements, kBlockElements, 1.1f);
        }
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
      printf("backward mode %d: %.3f ms, %.3f ns/elem (one core)\n", mode, best * 1e3, best * 1e9 / size);
    }
    printf("backward equal: %d\n", memcmp(out.data(), out2.data(), size * 2) == 0);
    BackCur(in.data(), bits.data(), out.data(), 77, table); BackNew(in.data(), bits.data(), out2.data(), 77, 1.1f);
    printf("tail equal: %d\n", memcmp(out.data(), out2.data(), 77 * 2) == 0);
  }
  // check equality of modes
  for (int64_t b = 0; b < 100; ++b) { PhiloxBlocks<0>(key, counter, b * kBlocks, draws); PhiloxBlocks<1>(key, counter, b * kBlocks, draws2);
    if (memcmp(draws, draws2, sizeof(draws))) { printf("MISMATCH at %ld\n", b); return 1; }
    PhiloxBlocks512(key, counter, b * kBlocks, draws2);
    if (memcmp(draws, draws2, sizeof(draws))) { printf("MISMATCH512 at %ld\n", b); for (int i = 0; i < 40; ++i) printf("%04x/%04x ", draws[i], draws2[i]); printf("\n"); return 1; } }
  for (int mode = 0; mode < 4; ++mode) for (int part = 0; part < 3; ++part) {
    double best = 1e9;
    for (int rep = 0; rep < 15; ++rep) {
      auto t0 = std::chrono::steady_clock::now();
      for (int64_t block = 0; block < blocks; ++block) {
        if (mode == 0) PhiloxBlocks<0>(key, counter, block * kBlocks, draws); else if (mode == 1) PhiloxBlocks<1>(key, counter, block * kBlocks, draws); else PhiloxBlocks512(key, counter, block * kBlocks, draws);
        if (mode == 3) { if (part >= 1) RangeNew(in.data() + block * kBlockElements, draws, out2.data() + block * kBlockElements, bits2.data() + block * kBlockBytes, kBlockElements, 6554, 1.1f); continue; }
        if (part >= 1) Range(in.data() + block * kBlockElements, draws, out.data() + block * kBlockElements, kBlockElements, 6554, 1.1f);
        if (part >= 2) PackKeeps(draws, kBlockElements, 6554, bits.data() + block * kBlockBytes);
      }
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    if (mode == 3 && part == 2) { printf("fwd equal: out %d bits %d\n", memcmp(out.data(), out2.data(), size * 2) == 0, memcmp(bits.data(), bits2.data(), size / 8) == 0); }
    printf("mode %d part %d: %.3f ms, %.3f ns/elem (one core)\n", mode, part, best * 1e3, best * 1e9 / size);
  }
}
