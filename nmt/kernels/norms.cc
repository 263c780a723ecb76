// The gradient's squared norms per variable in one op, the kernel behind the global norm of nmt.train_step (the
// clipping factor and the per-layer norms) when the training step runs on CPU (nmt/kernels builds and loads it).
//
//   NmtHalfSquares: half_squares[i] = sum(x_i^2) / 2 for each of the N tensors x_i (TensorFlow's L2Loss of each).
//
// TensorFlow runs one L2Loss per variable (~130 ops for the base model, most of them under 1,000 elements) and a
// Pack. Here all tensors are cut into chunks of kChunk elements, split across the intra-op threads; each chunk sums
// its squares in float in 8 lanes of 4 interleaved accumulators, in a fixed order, and a tensor's chunk sums are
// added in double in chunk order: the same bits for any thread count or schedule, the rounding of a float32
// sum of at most kChunk / 32 terms per lane (TensorFlow's L2Loss sums in float32 in Eigen's tree order: the two
// differ by float32 rounding).

#include <algorithm>
#include <cstdint>
#include <vector>

#include "common.h"

#ifdef __AVX2__
#include <immintrin.h>
#endif

namespace nmt {

namespace {
constexpr int64_t kChunk = 16384;
}  // namespace

REGISTER_OP("NmtHalfSquares")
    .Input("x: N * float")
    .Output("half_squares: float")
    .Attr("N: int >= 1")
    .SetShapeFn([](InferenceContext* c) {
      int n;
      TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
      c->set_output(0, c->Vector(n));
      return absl::OkStatus();
    });

namespace {

// sum of x[j]^2 over j < n, in a fixed order
float SumSquares(const float* __restrict x, int64_t n) {
  int64_t j = 0;
  float total = 0.f;
#ifdef __AVX2__
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  for (; j + 32 <= n; j += 32) {
    for (int k = 0; k < 4; ++k) {
      const __m256 v = _mm256_loadu_ps(x + j + 8 * k);
      acc[k] = _mm256_add_ps(acc[k], _mm256_mul_ps(v, v));
    }
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
  for (int k = 0; k < 8; ++k) total += lanes[k];
#endif
  for (; j < n; ++j) total += x[j] * x[j];
  return total;
}

}  // namespace

class HalfSquaresOp : public OpKernel {
 public:
  explicit HalfSquaresOp(OpKernelConstruction* context) : OpKernel(context) {}

  void Compute(OpKernelContext* context) override {
    const int n = context->num_inputs();
    // (tensor, first element) of every chunk; an empty tensor has none
    std::vector<std::pair<int, int64_t>> chunks;
    for (int i = 0; i < n; ++i) {
      const int64_t size = context->input(i).NumElements();
      for (int64_t first = 0; first < size; first += kChunk) chunks.emplace_back(i, first);
    }
    std::vector<float> sums(chunks.size());
    Shard(context, static_cast<int64_t>(chunks.size()), kChunk * 2, [&](int64_t first, int64_t last) {
      for (int64_t c = first; c < last; ++c) {
        const auto [i, start] = chunks[c];
        const Tensor& x = context->input(i);
        sums[c] = SumSquares(x.flat<float>().data() + start, std::min(kChunk, x.NumElements() - start));
      }
    });
    Tensor* out;
    OP_REQUIRES_OK(context, context->allocate_output(0, TensorShape({n}), &out));
    std::vector<double> totals(n, 0.0);
    for (size_t c = 0; c < chunks.size(); ++c) totals[chunks[c].first] += sums[c];
    for (int i = 0; i < n; ++i) out->flat<float>()(i) = static_cast<float>(totals[i] / 2);
  }
};

REGISTER_KERNEL_BUILDER(Name("NmtHalfSquares").Device(DEVICE_CPU), HalfSquaresOp);

}  // namespace nmt
