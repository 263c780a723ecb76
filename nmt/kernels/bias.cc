// A dense layer's bias (and ReLU) forward and its gradients, the kernels behind transformer.attention_ops.flat_dense
// when the training step runs on CPU without XLA (nmt/kernels builds and loads them).
//
//   NmtBiasAdd:       y = x + bias, then max(y, 0) with relu: the matmul's product is rounded to its dtype first, as
//                     without grappler's fusion. oneDNN's matmul with the bias (and ReLU) fused takes about twice the
//                     time of the matmul alone in bfloat16 on the AMX Xeon (2048 x 256 x 1024: 2.2 against 1.0 ms).
//   NmtBiasGrad:      d_bias = sum over rows of dy
//   NmtReluBiasGrad:  dx = dy * (y > 0 ? 1 : 0), d_bias = sum over rows of dx
//
// The forward rounds x + bias (in float) to the dtype once, and the ReLU is Eigen's max(y, 0) (a NaN stays a NaN),
// so y is TensorFlow's BiasAdd then Relu bit for bit. TensorFlow runs the gradients as ReluGrad (a pass reading dy
// and the activations, writing dx) and BiasAddGrad (a second pass reading dx), the latter at a third of the memory
// bandwidth in bfloat16. Here dx is as ReluGrad computes it (-0 for a negative dy, NaN for a NaN dy, where y <= 0)
// with y the ReLU's output (y > 0 exactly where its input is; TensorFlow's ReluGrad takes the same), and the sums
// in float32, left in float32 (TensorFlow's BiasAddGrad rounds them to the input's dtype). Rows are summed per block
// of kBlockRows and the blocks then in order, so the result does not depend on the thread count or the schedule.

#include <algorithm>
#include <cstdint>
#include <vector>

#include "common.h"

namespace nmt {

namespace {
constexpr int64_t kBlockRows = 64;
}  // namespace

REGISTER_OP("NmtBiasAdd")
    .Input("x: T")
    .Input("bias: T")
    .Output("y: T")
    .Attr("relu: bool = false")
    .Attr("T: {bfloat16, half, float}")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle x, bias;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &x));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &bias));
      tensorflow::shape_inference::DimensionHandle units;
      TF_RETURN_IF_ERROR(c->Merge(c->Dim(x, 1), c->Dim(bias, 0), &units));
      c->set_output(0, c->Matrix(c->Dim(x, 0), units));
      return absl::OkStatus();
    });

REGISTER_OP("NmtBiasGrad")
    .Input("dy: T")
    .Output("d_bias: float")
    .Attr("T: {bfloat16, half, float}")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle dy;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &dy));
      c->set_output(0, c->Vector(c->Dim(dy, 1)));
      return absl::OkStatus();
    });

REGISTER_OP("NmtReluBiasGrad")
    .Input("dy: T")
    .Input("y: T")
    .Output("dx: T")
    .Output("d_bias: float")
    .Attr("T: {bfloat16, half, float}")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle dy;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &dy));
      TF_RETURN_IF_ERROR(c->Merge(dy, c->input(1), &dy));
      c->set_output(0, dy);
      c->set_output(1, c->Vector(c->Dim(dy, 1)));
      return absl::OkStatus();
    });

template <typename T>
class BiasAddOp : public OpKernel {
 public:
  explicit BiasAddOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("relu", &relu_));
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& x = context->input(0);
    const Tensor& bias = context->input(1);
    OP_REQUIRES(context, x.dims() == 2, InvalidArgument("x must be (rows, units), got ", x.shape().DebugString()));
    OP_REQUIRES(context, bias.dims() == 1 && bias.dim_size(0) == x.dim_size(1),
                InvalidArgument("bias ", bias.shape().DebugString(), " must be (units,) for x ",
                                x.shape().DebugString()));
    const int64_t rows = x.dim_size(0), d = x.dim_size(1);
    Tensor* y;
    OP_REQUIRES_OK(context, context->forward_input_or_allocate_output({0}, 0, x.shape(), &y));
    const T* xs = x.flat<T>().data();
    T* ys = y->flat<T>().data();
    std::vector<float> bias_buffer(d);
    float* __restrict b = bias_buffer.data();
    Widen(bias.flat<T>().data(), b, d);
    const bool relu = relu_;
    Shard(context, rows, d * 2, [&](int64_t first, int64_t last) {
      std::vector<float> row_buffer(d);
      float* __restrict row = row_buffer.data();
      for (int64_t r = first; r < last; ++r) {
        Widen(xs + r * d, row, d);  // before the write: y may be x's buffer (forwarded)
        for (int64_t j = 0; j < d; ++j) row[j] += b[j];
        if (relu) {
          // Eigen's max(y, 0): y unless y < 0, so a NaN stays
          for (int64_t j = 0; j < d; ++j) row[j] = row[j] < 0.f ? 0.f : row[j];
        }
        Narrow(row, ys + r * d, d);
      }
    });
  }

 private:
  bool relu_;
};

template <typename T, bool kRelu>
class BiasGradOp : public OpKernel {
 public:
  explicit BiasGradOp(OpKernelConstruction* context) : OpKernel(context) {}

  void Compute(OpKernelContext* context) override {
    const Tensor& dy = context->input(0);
    OP_REQUIRES(context, dy.dims() == 2, InvalidArgument("dy must be (rows, units), got ", dy.shape().DebugString()));
    const int64_t rows = dy.dim_size(0), d = dy.dim_size(1);
    const T* ys = nullptr;
    T* dxs = nullptr;
    int bias_output = 0;
    if (kRelu) {
      const Tensor& y = context->input(1);
      OP_REQUIRES(context, y.shape() == dy.shape(),
                  InvalidArgument("y ", y.shape().DebugString(), " must have dy's shape ", dy.shape().DebugString()));
      Tensor* dx;
      OP_REQUIRES_OK(context, context->forward_input_or_allocate_output({0}, 0, dy.shape(), &dx));
      ys = y.flat<T>().data();
      dxs = dx->flat<T>().data();
      bias_output = 1;
    }
    Tensor* d_bias;
    OP_REQUIRES_OK(context, context->allocate_output(bias_output, TensorShape({d}), &d_bias));
    const int64_t blocks = (rows + kBlockRows - 1) / kBlockRows;
    Tensor partial;
    OP_REQUIRES_OK(context, context->allocate_temp(tensorflow::DT_FLOAT, TensorShape({blocks, d}), &partial));
    const T* dys = dy.flat<T>().data();
    float* partials = partial.flat<float>().data();
    Shard(context, blocks, kBlockRows * d * (kRelu ? 4 : 2), [&](int64_t first, int64_t last) {
      std::vector<float> row_buffer(d);
      float* __restrict row = row_buffer.data();
      for (int64_t block = first; block < last; ++block) {
        float* __restrict sums = partials + block * d;
        std::fill(sums, sums + d, 0.f);
        for (int64_t r = block * kBlockRows; r < std::min(rows, (block + 1) * kBlockRows); ++r) {
          if (kRelu) {
            ReluRow(dys + r * d, ys + r * d, dxs + r * d, row, d);
          } else {
            Widen(dys + r * d, row, d);
          }
          for (int64_t j = 0; j < d; ++j) sums[j] += row[j];
        }
      }
    });
    SumBlocks(partials, blocks, d, d_bias->flat<float>().data());
  }

 private:
  // dx = dy * (y > 0 ? 1 : 0), a multiply as ReluGrad's (so that -0 and NaN come out as there), into `dx` and,
  // as float, into `row`
  static void ReluRow(const T* __restrict dy, const T* __restrict y, T* dx, float* __restrict row, int64_t d) {
    // no branch on the comparison (half the activations are 0, in no pattern a branch predictor could learn)
    for (int64_t j = 0; j < d; ++j) row[j] = ToFloat(dy[j]) * static_cast<float>(ToFloat(y[j]) > 0.f);
    Narrow(row, dx, d);
  }
};

// bfloat16 on its raw bits (the multiply by 1 or 0 is exact: dy itself, or its sign alone, or a NaN), in one
// loop that vectorises. `dx` may be `dy`'s buffer (forwarded): each element is read before it is written.
template <>
void BiasGradOp<Eigen::bfloat16, true>::ReluRow(const Eigen::bfloat16* __restrict dy,
                                                const Eigen::bfloat16* __restrict y, Eigen::bfloat16* dx,
                                                float* __restrict row, int64_t d) {
  const uint16_t* raw_dy = reinterpret_cast<const uint16_t*>(dy);
  const uint16_t* __restrict raw_y = reinterpret_cast<const uint16_t*>(y);
  uint16_t* raw_dx = reinterpret_cast<uint16_t*>(dx);
  for (int64_t j = 0; j < d; ++j) {
    const uint16_t g = raw_dy[j], v = raw_y[j];
    // y > 0: positive sign, not zero, not a NaN; a NaN dy stays a NaN (quiet, as the float multiply makes it)
    const bool keep = static_cast<int16_t>(v) > 0 && v <= 0x7F80u;
    const bool nan = (g & 0x7FFFu) > 0x7F80u;
    const uint16_t out = keep ? g : (nan ? static_cast<uint16_t>(g | 0x0040u) : static_cast<uint16_t>(g & 0x8000u));
    raw_dx[j] = out;
    row[j] = __builtin_bit_cast(float, static_cast<uint32_t>(out) << 16);
  }
}

#define REGISTER(T)                                                                                      \
  REGISTER_KERNEL_BUILDER(Name("NmtBiasAdd").Device(DEVICE_CPU).TypeConstraint<T>("T"), BiasAddOp<T>);    \
  REGISTER_KERNEL_BUILDER(Name("NmtBiasGrad").Device(DEVICE_CPU).TypeConstraint<T>("T"),                 \
                          BiasGradOp<T, false>);                                                         \
  REGISTER_KERNEL_BUILDER(Name("NmtReluBiasGrad").Device(DEVICE_CPU).TypeConstraint<T>("T"),             \
                          BiasGradOp<T, true>);

REGISTER(float);
REGISTER(Eigen::bfloat16);
REGISTER(Eigen::half);

}  // namespace nmt
