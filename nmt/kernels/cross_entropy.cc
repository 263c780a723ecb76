// Label-smoothed cross-entropy over the vocabulary, forward and backward, one pass over the logits each: the fused
// kernels behind nmt.losses.token_cross_entropy when the training step runs on CPU without XLA (nmt/kernels builds
// and loads them). The math is that of the TensorFlow path, in float32 whatever the logits' dtype, so bfloat16
// logits need no float32 copy (nor their gradient a float32 one):
//
//   forward:  top = max_k z_k, log_sum = log(sum_k exp(z_k - top)),  nll = (top - z_label) + log_sum,
//             loss = (1 - eps) * nll + eps * ((top - mean_k z_k) + log_sum)
//   backward: with a = d_loss, b = d_nll (per row) and p = exp((z - top) - log_sum),
//             dz = p * (a + b) - eps / V * a,  dz_label -= (1 - eps) * a + b
//
// The log-sum-exp stays in its two parts: top + log_sum rounds to the logits' magnitude (1e-3 at 1e4), the
// differences from the top do not; and the nll never takes the log of p_label, so it stays exact where p_label
// underflows. Rows are independent
// and each is summed in one fixed order (Eigen's vectorised reductions over a buffer of fixed alignment: over an
// unaligned one their order would depend on the address), so the results do not depend on the thread count or
// the schedule. A NaN or an infinity among a row's logits makes its loss NaN (the step's finite
// check then skips the update).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "common.h"
#include "Eigen/Core"

namespace nmt {

REGISTER_OP("NmtCrossEntropy")
    .Input("logits: T")
    .Input("labels: int32")
    .Output("loss: float")
    .Output("nll: float")
    .Output("top: float")
    .Output("log_sum: float")
    .Attr("T: {bfloat16, half, float}")
    .Attr("label_smoothing: float")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle logits;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &logits));
      for (int i = 0; i < 4; ++i) c->set_output(i, c->Vector(c->Dim(logits, 0)));
      return absl::OkStatus();
    });

REGISTER_OP("NmtCrossEntropyGrad")
    .Input("logits: T")
    .Input("labels: int32")
    .Input("top: float")
    .Input("log_sum: float")
    .Input("d_loss: float")
    .Input("d_nll: float")
    .Output("d_logits: T")
    .Attr("T: {bfloat16, half, float}")
    .Attr("label_smoothing: float")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle logits;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &logits));
      c->set_output(0, logits);
      return absl::OkStatus();
    });

namespace {

// Logits (N, V) and labels (N,) in [0, V); every per-row input has N values.
tensorflow::Status CheckInputs(OpKernelContext* context, std::initializer_list<int> per_row) {
  const Tensor& logits = context->input(0);
  const Tensor& labels = context->input(1);
  if (logits.dims() != 2) return InvalidArgument("logits must be (tokens, vocab), got ", logits.shape().DebugString());
  const int64_t rows = logits.dim_size(0), vocab = logits.dim_size(1);
  for (int index : per_row) {
    const Tensor& values = context->input(index);
    if (values.dims() != 1 || values.dim_size(0) != rows) {
      return InvalidArgument("input ", index, " must have one value per row of logits (", rows, "), got ",
                             values.shape().DebugString());
    }
  }
  if (rows > 0 && vocab == 0) return InvalidArgument("logits have an empty vocabulary axis");
  const int32_t* ids = labels.flat<int32_t>().data();
  for (int64_t r = 0; r < rows; ++r) {
    if (ids[r] < 0 || ids[r] >= vocab) {
      return InvalidArgument("label ", ids[r], " at row ", r, " is outside the vocabulary [0, ", vocab, ")");
    }
  }
  return absl::OkStatus();
}

}  // namespace

template <typename T>
class CrossEntropyOp : public OpKernel {
 public:
  explicit CrossEntropyOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("label_smoothing", &eps_));
  }

  void Compute(OpKernelContext* context) override {
    OP_REQUIRES_OK(context, CheckInputs(context, {1}));
    const Tensor& logits = context->input(0);
    const int64_t rows = logits.dim_size(0), vocab = logits.dim_size(1);
    Tensor *loss, *nll, *top, *log_sum;
    OP_REQUIRES_OK(context, context->allocate_output(0, TensorShape({rows}), &loss));
    OP_REQUIRES_OK(context, context->allocate_output(1, TensorShape({rows}), &nll));
    OP_REQUIRES_OK(context, context->allocate_output(2, TensorShape({rows}), &top));
    OP_REQUIRES_OK(context, context->allocate_output(3, TensorShape({rows}), &log_sum));
    const T* zs = logits.flat<T>().data();
    const int32_t* ids = context->input(1).flat<int32_t>().data();
    float* losses = loss->flat<float>().data();
    float* nlls = nll->flat<float>().data();
    float* tops = top->flat<float>().data();
    float* log_sums = log_sum->flat<float>().data();
    const float eps = eps_;
    Shard(context, rows, vocab * 24, [&](int64_t first, int64_t last) {
      Eigen::ArrayXf z(vocab), e(vocab);  // Eigen's allocation: aligned, so the reductions' order is fixed
      for (int64_t r = first; r < last; ++r) {
        Widen(zs + r * vocab, z.data(), vocab);
        const float row_top = z.maxCoeff();
        e = (z - row_top).exp();
        const float row_log_sum = std::log(e.sum());
        const float label_nll = (row_top - z[ids[r]]) + row_log_sum;
        tops[r] = row_top;
        log_sums[r] = row_log_sum;
        nlls[r] = label_nll;
        // -mean_k log p_k = lse - mean_k z_k
        losses[r] = eps > 0.f ? (1.f - eps) * label_nll + eps * ((row_top - z.sum() / vocab) + row_log_sum)
                              : label_nll;
      }
    });
  }

 private:
  float eps_;
};

template <typename T>
class CrossEntropyGradOp : public OpKernel {
 public:
  explicit CrossEntropyGradOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("label_smoothing", &eps_));
  }

  void Compute(OpKernelContext* context) override {
    OP_REQUIRES_OK(context, CheckInputs(context, {1, 2, 3, 4, 5}));
    const Tensor& logits = context->input(0);
    const int64_t rows = logits.dim_size(0), vocab = logits.dim_size(1);
    Tensor* d_logits;
    OP_REQUIRES_OK(context, context->allocate_output(0, logits.shape(), &d_logits));
    const T* zs = logits.flat<T>().data();
    const int32_t* ids = context->input(1).flat<int32_t>().data();
    const float* tops = context->input(2).flat<float>().data();
    const float* log_sums = context->input(3).flat<float>().data();
    const float* d_losses = context->input(4).flat<float>().data();
    const float* d_nlls = context->input(5).flat<float>().data();
    T* out = d_logits->flat<T>().data();
    const float eps = eps_;
    Shard(context, rows, vocab * 24, [&](int64_t first, int64_t last) {
      Eigen::ArrayXf z(vocab);
      for (int64_t r = first; r < last; ++r) {
        const float a = d_losses[r], b = d_nlls[r];
        Widen(zs + r * vocab, z.data(), vocab);
        z = ((z - tops[r]) - log_sums[r]).exp() * (a + b) - eps / vocab * a;
        z[ids[r]] -= (1.f - eps) * a + b;
        Narrow(z.data(), out + r * vocab, vocab);
      }
    });
  }

 private:
  float eps_;
};

#define REGISTER(T)                                                                                 \
  REGISTER_KERNEL_BUILDER(Name("NmtCrossEntropy").Device(DEVICE_CPU).TypeConstraint<T>("T"),        \
                          CrossEntropyOp<T>);                                                       \
  REGISTER_KERNEL_BUILDER(Name("NmtCrossEntropyGrad").Device(DEVICE_CPU).TypeConstraint<T>("T"),    \
                          CrossEntropyGradOp<T>);

REGISTER(float);
REGISTER(Eigen::bfloat16);
REGISTER(Eigen::half);

}  // namespace nmt
