// The optimizer update of every variable in one op, the kernel behind nmt.optimizer.FusedAdam when the training step
// runs on CPU under the default strategy (nmt/kernels builds and loads it).
//
//   NmtApplyAdam: for each variable i, g = grad_i * factor (the token normalisation, loss scale and clipping factor
//                 of nmt.train_step), then TensorFlow's ResourceApplyAdam on (var_i, m_i, v_i) with g:
//                   m += (g - m) (1 - beta1);  v += (g g - v) (1 - beta2);  var -= (m alpha) / (sqrt(v) + epsilon)
//                 with alpha = lr sqrt(1 - beta2_power) / (1 - beta1_power).
//
// TensorFlow runs this as one Mul per gradient and one ResourceApplyAdam per variable: 127 of each per step for the
// base model, each a separate pass over memory and a separate launch. Here it is one pass over all of them, split
// into chunks of kChunk elements across the intra-op threads (the base model's update alone on the AMX Xeon: 12.9 ->
// 8.3 ms, docs/amx-2026-12-07j/micro/). The same float operations in the same order, each rounded (this
// file is compiled without contracting a * b + c into a fused multiply-add, as TensorFlow's Eigen kernel computes
// it), so the results are TensorFlow's bit for bit. Variables are locked (each mutex once, in address order) and
// copied first where TensorFlow's PrepareToUpdateVariable would copy them: a buffer some read still holds, or a
// variable in copy-on-read mode.

#pragma GCC optimize("fp-contract=off")

#include <algorithm>
#include <cstdint>
#include <vector>

#ifdef __AVX2__
#include <immintrin.h>
#endif

#include "common.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"

namespace nmt {

using tensorflow::core::RefCountPtr;

namespace {
constexpr int64_t kChunk = 16384;
}  // namespace

REGISTER_OP("NmtApplyAdam")
    .Input("var: N * resource")
    .Input("m: N * resource")
    .Input("v: N * resource")
    .Input("grad: N * float")
    .Input("factor: float")
    .Input("beta1_power: float")
    .Input("beta2_power: float")
    .Input("lr: float")
    .Input("beta1: float")
    .Input("beta2: float")
    .Input("epsilon: float")
    .Attr("N: int >= 1")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs);

namespace {

// One element's update (TensorFlow's ApplyAdamNonCuda, without nesterov, after the gradient's Mul).
inline void UpdateOne(float* __restrict var, float* __restrict m, float* __restrict v, float grad, float factor,
                      float alpha, float one_minus_beta1, float one_minus_beta2, float epsilon) {
  const float g = grad * factor;
  *m = *m + (g - *m) * one_minus_beta1;
  *v = *v + (g * g - *v) * one_minus_beta2;
  *var = *var - (*m * alpha) / (std::sqrt(*v) + epsilon);
}

// n elements' update
void Update(float* __restrict var, float* __restrict m, float* __restrict v, const float* __restrict grad, int64_t n,
            float factor, float alpha, float one_minus_beta1, float one_minus_beta2, float epsilon) {
  int64_t j = 0;
#ifdef __AVX2__
  // 8 at a time (std::sqrt keeps the loop above from vectorising: errno); the same operations, each rounded
  const __m256 f = _mm256_set1_ps(factor), a = _mm256_set1_ps(alpha), e = _mm256_set1_ps(epsilon);
  const __m256 c1 = _mm256_set1_ps(one_minus_beta1), c2 = _mm256_set1_ps(one_minus_beta2);
  for (; j + 8 <= n; j += 8) {
    const __m256 g = _mm256_mul_ps(_mm256_loadu_ps(grad + j), f);
    __m256 mj = _mm256_loadu_ps(m + j), vj = _mm256_loadu_ps(v + j);
    mj = _mm256_add_ps(mj, _mm256_mul_ps(_mm256_sub_ps(g, mj), c1));
    vj = _mm256_add_ps(vj, _mm256_mul_ps(_mm256_sub_ps(_mm256_mul_ps(g, g), vj), c2));
    const __m256 step = _mm256_div_ps(_mm256_mul_ps(mj, a), _mm256_add_ps(_mm256_sqrt_ps(vj), e));
    _mm256_storeu_ps(m + j, mj);
    _mm256_storeu_ps(v + j, vj);
    _mm256_storeu_ps(var + j, _mm256_sub_ps(_mm256_loadu_ps(var + j), step));
  }
#endif
  for (; j < n; ++j) {
    UpdateOne(var + j, m + j, v + j, grad[j], factor, alpha, one_minus_beta1, one_minus_beta2, epsilon);
  }
}

float Scalar(OpKernelContext* context, int index) { return context->input(index).scalar<float>()(); }

}  // namespace

class ApplyAdamOp : public OpKernel {
 public:
  explicit ApplyAdamOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("N", &n_));
  }

  void Compute(OpKernelContext* context) override {
    const int n = n_;
    static constexpr const char* kScalars[] = {"factor", "beta1_power", "beta2_power", "lr",
                                               "beta1",  "beta2",       "epsilon"};
    for (int k = 0; k < 7; ++k) {
      OP_REQUIRES(context, tensorflow::TensorShapeUtils::IsScalar(context->input(4 * n + k).shape()),
                  InvalidArgument("NmtApplyAdam: ", kScalars[k], " must be a scalar, got shape ",
                                  context->input(4 * n + k).shape().DebugString()));
    }
    // the 3n variables (var, m, v of each), looked up, locked, and made safe to write in place
    std::vector<RefCountPtr<tensorflow::Var>> vars(3 * n);
    for (int i = 0; i < 3 * n; ++i) {
      OP_REQUIRES_OK(context, LookupResource(context, HandleFromInput(context, i), &vars[i]));
    }
    std::vector<tensorflow::mutex*> mutexes;
    for (const auto& var : vars) mutexes.push_back(var->mu());
    std::sort(mutexes.begin(), mutexes.end());
    mutexes.erase(std::unique(mutexes.begin(), mutexes.end()), mutexes.end());
    // a variable twice would be written by two threads at once
    OP_REQUIRES(context, static_cast<int>(mutexes.size()) == 3 * n,
                InvalidArgument("NmtApplyAdam: the ", 3 * n, " var, m and v inputs must be distinct variables, got ",
                                mutexes.size()));
    std::vector<tensorflow::mutex_lock> locks;
    locks.reserve(mutexes.size());
    for (tensorflow::mutex* mu : mutexes) locks.emplace_back(*mu);

    static constexpr const char* kLists[] = {"var", "m", "v"};
    std::vector<float*> data(3 * n);
    for (int i = 0; i < 3 * n; ++i) {
      tensorflow::Var* var = vars[i].get();
      const Tensor& grad = context->input(3 * n + i % n);
      OP_REQUIRES(context, var->is_initialized,
                  tensorflow::errors::FailedPrecondition("NmtApplyAdam: ", kLists[i / n], "[", i % n,
                                                         "] is not initialized"));
      Tensor* tensor = var->tensor();
      OP_REQUIRES(context, tensor->dtype() == tensorflow::DT_FLOAT && tensor->shape() == grad.shape(),
                  InvalidArgument("NmtApplyAdam: ", kLists[i / n], "[", i % n, "] is ", var->DebugString(),
                                  ", its gradient float/", grad.shape().DebugString()));
      if (var->copy_on_read_mode.load() || !tensor->RefCountIsOne()) {
        Tensor copy;
        OP_REQUIRES_OK(context, context->allocate_temp(tensorflow::DT_FLOAT, tensor->shape(), &copy));
        std::memcpy(copy.flat<float>().data(), tensor->flat<float>().data(), tensor->NumElements() * sizeof(float));
        *tensor = copy;
      }
      data[i] = tensor->flat<float>().data();
    }

    const float factor = Scalar(context, 4 * n);
    const float beta1_power = Scalar(context, 4 * n + 1), beta2_power = Scalar(context, 4 * n + 2);
    const float lr = Scalar(context, 4 * n + 3), beta1 = Scalar(context, 4 * n + 4);
    const float beta2 = Scalar(context, 4 * n + 5), epsilon = Scalar(context, 4 * n + 6);
    // TensorFlow's expressions, in float
    const float alpha = lr * std::sqrt(1.f - beta2_power) / (1.f - beta1_power);
    const float one_minus_beta1 = 1.f - beta1, one_minus_beta2 = 1.f - beta2;

    // (variable, first element) of every chunk
    std::vector<std::pair<int, int64_t>> chunks;
    for (int i = 0; i < n; ++i) {
      const int64_t size = context->input(3 * n + i).NumElements();
      for (int64_t first = 0; first < size; first += kChunk) chunks.emplace_back(i, first);
    }
    Shard(context, static_cast<int64_t>(chunks.size()), kChunk * 20, [&](int64_t first, int64_t last) {
      for (int64_t c = first; c < last; ++c) {
        const auto [i, start] = chunks[c];
        const float* grad = context->input(3 * n + i).flat<float>().data();
        const int64_t size = context->input(3 * n + i).NumElements();
        Update(data[i] + start, data[n + i] + start, data[2 * n + i] + start, grad + start,
               std::min(kChunk, size - start), factor, alpha, one_minus_beta1, one_minus_beta2, epsilon);
      }
    });
  }

 private:
  int n_;
};

REGISTER_KERNEL_BUILDER(Name("NmtApplyAdam").Device(DEVICE_CPU), ApplyAdamOp);

}  // namespace nmt
