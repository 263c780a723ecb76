// Inverted dropout from precomputed 16-bit random draws, one pass: out = in * (bits >= threshold ? scale : 0), with
// `scale` in the input's dtype (the caller passes it rounded so) and the product rounded to it, as the TensorFlow
// ops of transformer.dropout.dropout compute it (tf.where on the draws, then a multiply in the input's dtype), so
// both paths give the same bits, but for the sign of a NaN (always positive here; Eigen's bfloat16 multiply keeps
// it in the elements its vector loop leaves to scalar code). The mask does not depend on the input, so the same
// op is its own gradient (dx = dropout(dy) with the same draws).

#include "common.h"

namespace nmt {

REGISTER_OP("NmtDropout")
    .Input("x: T")
    .Input("bits: uint16")
    .Output("y: T")
    .Attr("T: {bfloat16, half, float}")
    .Attr("threshold: int")
    .Attr("scale: float")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->input(0));
      return absl::OkStatus();
    });

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
    const Tensor& bits = context->input(1);
    OP_REQUIRES(context, x.NumElements() == bits.NumElements(),
                InvalidArgument("bits must have one draw per element: ", bits.NumElements(), " for ",
                                x.NumElements()));
    Tensor* y;
    // in place when TensorFlow can give x's buffer away (the backward's dy, mostly): `in` and `out` may then be the
    // same array, which the loops below read and write at the same index only, one element at a time
    OP_REQUIRES_OK(context, context->forward_input_or_allocate_output({0}, 0, x.shape(), &y));
    const T* in = x.flat<T>().data();
    const uint16_t* draws = bits.flat<uint16_t>().data();
    T* out = y->flat<T>().data();
    const uint16_t threshold = threshold_;
    const float scale = scale_;
    Shard(context, x.NumElements(), 4,
          [&](int64_t first, int64_t last) { Range(in, draws, out, first, last, threshold, scale); });
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
