// An attention projection's bias add and head split in one pass, and its gradient: the kernels behind
// transformer.attention_ops.dense_heads when the training step runs on CPU without XLA (nmt/kernels builds and
// loads them). TensorFlow runs the split as a BiasAdd (or oneDNN's matmul with the bias fused, which in bfloat16
// takes about twice the matmul's time on the AMX Xeon) and a transpose, forward, and a transpose and BiasAddGrad
// backward: two passes each way where one does.
//
//   NmtBiasAddHeads:   x (B, L, D), bias (D,) -> y (B, heads, L, D / heads), y[b, h, l, j] = x[b, l, h * d + j] +
//                      bias[h * d + j], rounded to the dtype once (TensorFlow's BiasAdd, then the transpose)
//   NmtHeadsBiasGrad:  dy (B, heads, L, d) -> dx (B, L, heads * d), its transpose (the same bits), and d_bias =
//                      the sum of dx over B and L, in float32 (TensorFlow's BiasAddGrad rounds it to the dtype)
//
// Rows (b, l) are summed per block of kBlockRows and the blocks then in order, so the result does not depend on the
// thread count or the schedule.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common.h"

namespace nmt {

namespace {
constexpr int64_t kBlockRows = 64;
}  // namespace

REGISTER_OP("NmtBiasAddHeads")
    .Input("x: T")
    .Input("bias: T")
    .Output("y: T")
    .Attr("heads: int >= 1")
    .Attr("T: {bfloat16, half, float}")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle x, bias;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 3, &x));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &bias));
      tensorflow::shape_inference::DimensionHandle units, depth;
      TF_RETURN_IF_ERROR(c->Merge(c->Dim(x, 2), c->Dim(bias, 0), &units));
      int64_t heads;
      TF_RETURN_IF_ERROR(c->GetAttr("heads", &heads));
      TF_RETURN_IF_ERROR(c->Divide(units, heads, /*evenly_divisible=*/true, &depth));
      c->set_output(0, c->MakeShape({c->Dim(x, 0), c->MakeDim(heads), c->Dim(x, 1), depth}));
      return absl::OkStatus();
    });

REGISTER_OP("NmtHeadsBiasGrad")
    .Input("dy: T")
    .Output("dx: T")
    .Output("d_bias: float")
    .Attr("T: {bfloat16, half, float}")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle dy;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 4, &dy));
      tensorflow::shape_inference::DimensionHandle units;
      TF_RETURN_IF_ERROR(c->Multiply(c->Dim(dy, 1), c->Dim(dy, 3), &units));
      c->set_output(0, c->MakeShape({c->Dim(dy, 0), c->Dim(dy, 2), units}));
      c->set_output(1, c->Vector(units));
      return absl::OkStatus();
    });

template <typename T>
class BiasAddHeadsOp : public OpKernel {
 public:
  explicit BiasAddHeadsOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("heads", &heads_));
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& x = context->input(0);
    const Tensor& bias = context->input(1);
    OP_REQUIRES(context, x.dims() == 3,
                InvalidArgument("x must be (batch, length, units), got ", x.shape().DebugString()));
    const int64_t batch = x.dim_size(0), length = x.dim_size(1), units = x.dim_size(2), heads = heads_;
    OP_REQUIRES(context, bias.dims() == 1 && bias.dim_size(0) == units,
                InvalidArgument("bias ", bias.shape().DebugString(), " must be (units,) for x ",
                                x.shape().DebugString()));
    OP_REQUIRES(context, units % heads == 0,
                InvalidArgument("units (", units, ") must be a multiple of heads (", heads, ")"));
    const int64_t depth = units / heads;
    Tensor* y;
    OP_REQUIRES_OK(context, context->allocate_output(0, TensorShape({batch, heads, length, depth}), &y));
    const T* xs = x.flat<T>().data();
    T* ys = y->flat<T>().data();
    std::vector<float> bias_buffer(units);
    float* __restrict b = bias_buffer.data();
    Widen(bias.flat<T>().data(), b, units);
    Shard(context, batch * length, units * 2, [&](int64_t first, int64_t last) {
      std::vector<float> row_buffer(units);
      float* __restrict row = row_buffer.data();
      for (int64_t r = first; r < last; ++r) {
        const int64_t s = r / length, l = r % length;
        Widen(xs + r * units, row, units);
        for (int64_t j = 0; j < units; ++j) row[j] += b[j];
        // head h's slice of the row: row h of (s, h)'s (length, depth) matrix
        for (int64_t h = 0; h < heads; ++h) Narrow(row + h * depth, ys + ((s * heads + h) * length + l) * depth, depth);
      }
    });
  }

 private:
  int64_t heads_;
};

template <typename T>
class HeadsBiasGradOp : public OpKernel {
 public:
  explicit HeadsBiasGradOp(OpKernelConstruction* context) : OpKernel(context) {}

  void Compute(OpKernelContext* context) override {
    const Tensor& dy = context->input(0);
    OP_REQUIRES(context, dy.dims() == 4,
                InvalidArgument("dy must be (batch, heads, length, depth), got ", dy.shape().DebugString()));
    const int64_t batch = dy.dim_size(0), heads = dy.dim_size(1), length = dy.dim_size(2), depth = dy.dim_size(3);
    const int64_t units = heads * depth, rows = batch * length;
    Tensor *dx, *d_bias;
    OP_REQUIRES_OK(context, context->allocate_output(0, TensorShape({batch, length, units}), &dx));
    OP_REQUIRES_OK(context, context->allocate_output(1, TensorShape({units}), &d_bias));
    const int64_t blocks = (rows + kBlockRows - 1) / kBlockRows;
    Tensor partial;
    OP_REQUIRES_OK(context, context->allocate_temp(tensorflow::DT_FLOAT, TensorShape({blocks, units}), &partial));
    const T* dys = dy.flat<T>().data();
    T* dxs = dx->flat<T>().data();
    float* partials = partial.flat<float>().data();
    Shard(context, blocks, kBlockRows * units * 3, [&](int64_t first, int64_t last) {
      std::vector<float> row_buffer(units);
      float* __restrict row = row_buffer.data();
      for (int64_t block = first; block < last; ++block) {
        float* __restrict sums = partials + block * units;
        std::fill(sums, sums + units, 0.f);
        for (int64_t r = block * kBlockRows; r < std::min(rows, (block + 1) * kBlockRows); ++r) {
          const int64_t s = r / length, l = r % length;
          for (int64_t h = 0; h < heads; ++h) {
            std::memcpy(dxs + r * units + h * depth, dys + ((s * heads + h) * length + l) * depth, depth * sizeof(T));
          }
          Widen(dxs + r * units, row, units);
          for (int64_t j = 0; j < units; ++j) sums[j] += row[j];
        }
      }
    });
    SumBlocks(partials, blocks, units, d_bias->flat<float>().data());
  }
};

#define REGISTER(T)                                                                                      \
  REGISTER_KERNEL_BUILDER(Name("NmtBiasAddHeads").Device(DEVICE_CPU).TypeConstraint<T>("T"),             \
                          BiasAddHeadsOp<T>);                                                            \
  REGISTER_KERNEL_BUILDER(Name("NmtHeadsBiasGrad").Device(DEVICE_CPU).TypeConstraint<T>("T"),            \
                          HeadsBiasGradOp<T>);

REGISTER(float);
REGISTER(Eigen::bfloat16);
REGISTER(Eigen::half);

}  // namespace nmt
