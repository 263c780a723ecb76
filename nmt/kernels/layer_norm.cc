// Layer normalisation over the last axis, forward and backward, one pass over the rows each: the fused kernels
// behind transformer.layer_norm when the training step runs on CPU without XLA (nmt/kernels
// builds and loads them). The math is that of transformer.layer_norm.layer_normalization, in float32 whatever the
// input's dtype:
//
//   forward:  mean, var = moments of the row (two passes over it, in registers and L1), inv = 1 / sqrt(var + eps),
//             y = (x - mean) * inv * gamma + beta
//   backward: xhat = (x - mean) * inv, g = dy * gamma,
//             dx = (g - mean(g) - xhat * mean(g * xhat)) * inv,
//             dgamma = sum over rows of dy * xhat, dbeta = sum over rows of dy
//
// Rows are split across the intra-op threads; dgamma and dbeta are summed per block of kBlockRows rows and the
// blocks then in order, so the result does not depend on the thread count or the schedule (resumed runs stay
// bit-exact).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "common.h"

namespace nmt {

constexpr int64_t kBlockRows = 16;

REGISTER_OP("NmtLayerNorm")
    .Input("x: T")
    .Input("gamma: float")
    .Input("beta: float")
    .Output("y: T")
    .Output("mean: float")
    .Output("inv_std: float")
    .Attr("T: {bfloat16, half, float}")
    .Attr("epsilon: float")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle x;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &x));
      c->set_output(0, x);
      c->set_output(1, c->Vector(c->Dim(x, 0)));
      c->set_output(2, c->Vector(c->Dim(x, 0)));
      return absl::OkStatus();
    });

REGISTER_OP("NmtLayerNormGrad")
    .Input("dy: T")
    .Input("x: T")
    .Input("mean: float")
    .Input("inv_std: float")
    .Input("gamma: float")
    .Output("dx: T")
    .Output("d_gamma: float")
    .Output("d_beta: float")
    .Attr("T: {bfloat16, half, float}")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle x;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 2, &x));
      c->set_output(0, x);
      c->set_output(1, c->Vector(c->Dim(x, 1)));
      c->set_output(2, c->Vector(c->Dim(x, 1)));
      return absl::OkStatus();
    });

namespace {

// Sums in kLanes interleaved accumulators, then the lanes in order: vectorisable without -ffast-math, and the
// same order (so the same float result) on every call.
constexpr int kLanes = 16;

inline float Sum(const float* v, int64_t n) {
  float lanes[kLanes] = {0.f};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    for (int k = 0; k < kLanes; ++k) lanes[k] += v[j + k];
  }
  float sum = 0.f;
  for (; j < n; ++j) sum += v[j];
  for (int k = 0; k < kLanes; ++k) sum += lanes[k];
  return sum;
}

inline float SumOfProducts(const float* a, const float* b, int64_t n) {
  float lanes[kLanes] = {0.f};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    for (int k = 0; k < kLanes; ++k) lanes[k] += a[j + k] * b[j + k];
  }
  float sum = 0.f;
  for (; j < n; ++j) sum += a[j] * b[j];
  for (int k = 0; k < kLanes; ++k) sum += lanes[k];
  return sum;
}

tensorflow::Status CheckShapes(const Tensor& x, const Tensor& gamma) {
  if (x.dims() != 2) return InvalidArgument("x must be (rows, d), got ", x.shape().DebugString());
  if (gamma.dims() != 1 || gamma.dim_size(0) != x.dim_size(1)) {
    return InvalidArgument("gamma/beta must be (", x.dim_size(1), "), got ", gamma.shape().DebugString());
  }
  return absl::OkStatus();
}


}  // namespace

template <typename T>
class LayerNormOp : public OpKernel {
 public:
  explicit LayerNormOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("epsilon", &epsilon_));
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& x = context->input(0);
    const Tensor& gamma = context->input(1);
    const Tensor& beta = context->input(2);
    OP_REQUIRES_OK(context, CheckShapes(x, gamma));
    OP_REQUIRES_OK(context, CheckShapes(x, beta));
    const int64_t rows = x.dim_size(0), d = x.dim_size(1);
    Tensor *y, *mean, *inv_std;
    OP_REQUIRES_OK(context, context->allocate_output(0, x.shape(), &y));
    OP_REQUIRES_OK(context, context->allocate_output(1, TensorShape({rows}), &mean));
    OP_REQUIRES_OK(context, context->allocate_output(2, TensorShape({rows}), &inv_std));
    if (rows == 0) return;
    const T* xs = x.flat<T>().data();
    const float* g = gamma.flat<float>().data();
    const float* b = beta.flat<float>().data();
    T* ys = y->flat<T>().data();
    float* means = mean->flat<float>().data();
    float* invs = inv_std->flat<float>().data();
    const float epsilon = epsilon_;
    const int64_t blocks = (rows + kBlockRows - 1) / kBlockRows;
    Shard(context, blocks, kBlockRows * d * 12, [&](int64_t first, int64_t last) {
      std::vector<float> row(d);
      for (int64_t r = first * kBlockRows; r < std::min(rows, last * kBlockRows); ++r) {
        const T* in = xs + r * d;
        Widen(in, row.data(), d);
        const float mu = Sum(row.data(), d) / d;
        for (int64_t j = 0; j < d; ++j) row[j] -= mu;
        const float inv = 1.f / std::sqrt(SumOfProducts(row.data(), row.data(), d) / d + epsilon);
        T* out = ys + r * d;
        for (int64_t j = 0; j < d; ++j) out[j] = FromFloat<T>(row[j] * inv * g[j] + b[j]);
        means[r] = mu;
        invs[r] = inv;
      }
    });
  }

 private:
  float epsilon_;
};

template <typename T>
class LayerNormGradOp : public OpKernel {
 public:
  explicit LayerNormGradOp(OpKernelConstruction* context) : OpKernel(context) {}

  void Compute(OpKernelContext* context) override {
    const Tensor& dy = context->input(0);
    const Tensor& x = context->input(1);
    const Tensor& mean = context->input(2);
    const Tensor& inv_std = context->input(3);
    const Tensor& gamma = context->input(4);
    OP_REQUIRES_OK(context, CheckShapes(x, gamma));
    OP_REQUIRES(context, dy.shape() == x.shape(),
                InvalidArgument("dy ", dy.shape().DebugString(), " must have x's shape ", x.shape().DebugString()));
    const int64_t rows = x.dim_size(0), d = x.dim_size(1);
    OP_REQUIRES(context, mean.NumElements() == rows && inv_std.NumElements() == rows,
                InvalidArgument("mean and inv_std must have one value per row"));
    Tensor *dx, *d_gamma, *d_beta;
    OP_REQUIRES_OK(context, context->allocate_output(0, x.shape(), &dx));
    OP_REQUIRES_OK(context, context->allocate_output(1, TensorShape({d}), &d_gamma));
    OP_REQUIRES_OK(context, context->allocate_output(2, TensorShape({d}), &d_beta));
    const int64_t blocks = (rows + kBlockRows - 1) / kBlockRows;
    // per block: d_gamma partial sums, then d_beta's
    Tensor partial;
    OP_REQUIRES_OK(context, context->allocate_temp(tensorflow::DT_FLOAT, TensorShape({blocks, 2 * d}), &partial));
    const T* dys = dy.flat<T>().data();
    const T* xs = x.flat<T>().data();
    const float* means = mean.flat<float>().data();
    const float* invs = inv_std.flat<float>().data();
    const float* g = gamma.flat<float>().data();
    T* dxs = dx->flat<T>().data();
    float* partials = partial.flat<float>().data();
    Shard(context, blocks, kBlockRows * d * 20, [&](int64_t first, int64_t last) {
      std::vector<float> xhat_row(d), gy_row(d), dy_row(d);
      float* __restrict xhat = xhat_row.data();
      float* __restrict gy = gy_row.data();
      float* __restrict dyf = dy_row.data();
      for (int64_t block = first; block < last; ++block) {
        float* __restrict pg = partials + block * 2 * d;
        float* __restrict pb = pg + d;
        std::fill(pg, pg + 2 * d, 0.f);
        for (int64_t r = block * kBlockRows; r < std::min(rows, (block + 1) * kBlockRows); ++r) {
          const T* __restrict in = xs + r * d;
          const T* __restrict grad = dys + r * d;
          const float mu = means[r], inv = invs[r];
          for (int64_t j = 0; j < d; ++j) {
            dyf[j] = ToFloat(grad[j]);
            xhat[j] = (ToFloat(in[j]) - mu) * inv;
          }
          for (int64_t j = 0; j < d; ++j) {
            gy[j] = dyf[j] * g[j];
            pg[j] += dyf[j] * xhat[j];
            pb[j] += dyf[j];
          }
          const float mean_g = Sum(gy, d) / d;
          const float mean_gx = SumOfProducts(gy, xhat, d) / d;
          T* out = dxs + r * d;
          for (int64_t j = 0; j < d; ++j) out[j] = FromFloat<T>((gy[j] - mean_g - xhat[j] * mean_gx) * inv);
        }
      }
    });
    float* dg = d_gamma->flat<float>().data();
    float* db = d_beta->flat<float>().data();
    std::fill(dg, dg + d, 0.f);
    std::fill(db, db + d, 0.f);
    for (int64_t block = 0; block < blocks; ++block) {
      const float* pg = partials + block * 2 * d;
      for (int64_t j = 0; j < d; ++j) {
        dg[j] += pg[j];
        db[j] += pg[d + j];
      }
    }
  }
};

#define REGISTER(T)                                                                         \
  REGISTER_KERNEL_BUILDER(Name("NmtLayerNorm").Device(DEVICE_CPU).TypeConstraint<T>("T"),  \
                          LayerNormOp<T>);                                                  \
  REGISTER_KERNEL_BUILDER(Name("NmtLayerNormGrad").Device(DEVICE_CPU).TypeConstraint<T>("T"), \
                          LayerNormGradOp<T>);

REGISTER(float);
REGISTER(Eigen::bfloat16);
REGISTER(Eigen::half);

}  // namespace nmt
