// The attention weights' masked softmax, forward and backward, one pass over the scores each: the fused kernels
// behind transformer.attention.scaled_dot_product_attention when the training step runs on CPU without XLA
// (nmt/kernels builds and loads them). The math is that of its TensorFlow path (`_masked_softmax` on the scores
// cast to float32, the weights cast back), in float32 whatever the scores' dtype, on z = scores * scale (the
// attention's 1 / sqrt(depth), which the caller then need not multiply the queries by: a pass over them forward and
// one backward; a power of 2 gives the same bits either way):
//
//   forward:  over the allowed keys of a row, top = max z, log_sum = log(sum exp(z - top)),
//             w = exp(z - top) / sum exp(z - top); w = 0 at masked keys, and everywhere in a row with none allowed
//   backward: p = exp((z - top) - log_sum) at allowed keys (the float32 weights again, not the rounded ones),
//             dz = p * (dw - sum_k dw_k p_k), 0 at masked keys; d scores = scale * dz
//
// Scores are (B, H, Lq, Lk); the mask is bool (B or 1, 1, 1 or Lq, Lk), the model's padding and causal masks,
// broadcast over heads (and queries). Rows are independent and each is reduced in one fixed order, so the results
// do not depend on the thread count or the schedule. A NaN among a row's allowed scores makes the row NaN.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "Eigen/Core"
#include "common.h"

namespace nmt {

REGISTER_OP("NmtMaskedSoftmax")
    .Input("scores: T")
    .Input("mask: bool")
    .Output("weights: T")
    .Output("top: float")
    .Output("log_sum: float")
    .Attr("T: {bfloat16, half, float}")
    .Attr("scale: float = 1.0")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle scores;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 4, &scores));
      c->set_output(0, scores);
      c->set_output(1, c->UnknownShapeOfRank(1));
      c->set_output(2, c->UnknownShapeOfRank(1));
      return absl::OkStatus();
    });

REGISTER_OP("NmtMaskedSoftmaxGrad")
    .Input("d_weights: T")
    .Input("scores: T")
    .Input("mask: bool")
    .Input("top: float")
    .Input("log_sum: float")
    .Output("d_scores: T")
    .Attr("T: {bfloat16, half, float}")
    .Attr("scale: float = 1.0")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle scores;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 4, &scores));
      c->set_output(0, scores);
      return absl::OkStatus();
    });

namespace {

// Where row r of the scores (b, h, i flattened) finds its mask row.
struct Layout {
  int64_t rows, heads, queries, keys;
  bool batch_broadcast, query_broadcast;

  const bool* MaskRow(const bool* mask, int64_t r) const {
    const int64_t i = r % queries, b = r / (queries * heads);
    const int64_t mask_rows = query_broadcast ? 1 : queries;
    return mask + ((batch_broadcast ? 0 : b) * mask_rows + (query_broadcast ? 0 : i)) * keys;
  }
};

tensorflow::Status MakeLayout(const Tensor& scores, const Tensor& mask, Layout* layout) {
  if (scores.dims() != 4) return InvalidArgument("scores must be (B, H, Lq, Lk), got ", scores.shape().DebugString());
  const int64_t batch = scores.dim_size(0), queries = scores.dim_size(2), keys = scores.dim_size(3);
  const bool fits = mask.dims() == 4 && (mask.dim_size(0) == batch || mask.dim_size(0) == 1) &&
                    mask.dim_size(1) == 1 && (mask.dim_size(2) == queries || mask.dim_size(2) == 1) &&
                    mask.dim_size(3) == keys;
  if (!fits) {
    return InvalidArgument("mask must be (B or 1, 1, Lq or 1, Lk) for scores ", scores.shape().DebugString(),
                           ", got ", mask.shape().DebugString());
  }
  *layout = {batch * scores.dim_size(1) * queries, scores.dim_size(1), queries, keys, mask.dim_size(0) == 1,
             mask.dim_size(2) == 1};
  return absl::OkStatus();
}

}  // namespace

template <typename T>
class MaskedSoftmaxOp : public OpKernel {
 public:
  explicit MaskedSoftmaxOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("scale", &scale_));
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& scores = context->input(0);
    const Tensor& mask = context->input(1);
    Layout layout;
    OP_REQUIRES_OK(context, MakeLayout(scores, mask, &layout));
    Tensor *weights, *top, *log_sum;
    OP_REQUIRES_OK(context, context->allocate_output(0, scores.shape(), &weights));
    OP_REQUIRES_OK(context, context->allocate_output(1, TensorShape({layout.rows}), &top));
    OP_REQUIRES_OK(context, context->allocate_output(2, TensorShape({layout.rows}), &log_sum));
    const int64_t keys = layout.keys;
    const T* zs = scores.flat<T>().data();
    const bool* allowed_all = mask.flat<bool>().data();
    T* ws = weights->flat<T>().data();
    float* tops = top->flat<float>().data();
    float* log_sums = log_sum->flat<float>().data();
    const float scale = scale_;
    Shard(context, layout.rows, keys * 40, [&](int64_t first, int64_t last) {
      Eigen::ArrayXf z(keys);  // Eigen's allocation: aligned, so the reductions' order is fixed
      for (int64_t r = first; r < last; ++r) {
        const bool* allowed = layout.MaskRow(allowed_all, r);
        Widen(zs + r * keys, z.data(), keys);
        if (scale != 1.f) z *= scale;
        float row_top = -std::numeric_limits<float>::infinity();
        bool any = false;
        for (int64_t j = 0; j < keys; ++j) {
          if (allowed[j]) {
            // a NaN score wins the max: the row comes out NaN
            row_top = (z[j] > row_top || std::isnan(z[j])) ? z[j] : row_top;
            any = true;
          }
        }
        if (!any) row_top = 0.f;
        z = (z - row_top).exp();
        for (int64_t j = 0; j < keys; ++j) z[j] = allowed[j] ? z[j] : 0.f;
        const float sum = z.sum();
        tops[r] = row_top;
        log_sums[r] = any ? std::log(sum) : std::numeric_limits<float>::infinity();
        if (any) z *= 1.f / sum;
        Narrow(z.data(), ws + r * keys, keys);
      }
    });
  }

 private:
  float scale_;
};

template <typename T>
class MaskedSoftmaxGradOp : public OpKernel {
 public:
  explicit MaskedSoftmaxGradOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("scale", &scale_));
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& d_weights = context->input(0);
    const Tensor& scores = context->input(1);
    const Tensor& mask = context->input(2);
    Layout layout;
    OP_REQUIRES_OK(context, MakeLayout(scores, mask, &layout));
    OP_REQUIRES(context, d_weights.shape() == scores.shape(),
                InvalidArgument("d_weights ", d_weights.shape().DebugString(), " must have the scores' shape ",
                                scores.shape().DebugString()));
    const Tensor& top = context->input(3);
    const Tensor& log_sum = context->input(4);
    OP_REQUIRES(context, top.NumElements() == layout.rows && log_sum.NumElements() == layout.rows,
                InvalidArgument("top and log_sum must have one value per row of scores (", layout.rows, ")"));
    Tensor* d_scores;
    OP_REQUIRES_OK(context, context->allocate_output(0, scores.shape(), &d_scores));
    const int64_t keys = layout.keys;
    const T* dws = d_weights.flat<T>().data();
    const T* zs = scores.flat<T>().data();
    const bool* allowed_all = mask.flat<bool>().data();
    const float* tops = top.flat<float>().data();
    const float* log_sums = log_sum.flat<float>().data();
    T* out = d_scores->flat<T>().data();
    const float scale = scale_;
    Shard(context, layout.rows, keys * 40, [&](int64_t first, int64_t last) {
      Eigen::ArrayXf p(keys), g(keys);
      for (int64_t r = first; r < last; ++r) {
        const bool* allowed = layout.MaskRow(allowed_all, r);
        Widen(zs + r * keys, p.data(), keys);
        Widen(dws + r * keys, g.data(), keys);
        if (scale != 1.f) p *= scale;
        p = ((p - tops[r]) - log_sums[r]).exp();
        // masked keys: no weight and no gradient reaching it (the TensorFlow path's two tf.where)
        for (int64_t j = 0; j < keys; ++j) {
          p[j] = allowed[j] ? p[j] : 0.f;
          g[j] = allowed[j] ? g[j] : 0.f;
        }
        const float dot = (g * p).sum();
        p *= g - dot;
        if (scale != 1.f) p *= scale;
        Narrow(p.data(), out + r * keys, keys);
      }
    });
  }

 private:
  float scale_;
};

#define REGISTER(T)                                                                                  \
  REGISTER_KERNEL_BUILDER(Name("NmtMaskedSoftmax").Device(DEVICE_CPU).TypeConstraint<T>("T"),        \
                          MaskedSoftmaxOp<T>);                                                       \
  REGISTER_KERNEL_BUILDER(Name("NmtMaskedSoftmaxGrad").Device(DEVICE_CPU).TypeConstraint<T>("T"),    \
                          MaskedSoftmaxGradOp<T>);

REGISTER(float);
REGISTER(Eigen::bfloat16);
REGISTER(Eigen::half);

}  // namespace nmt
