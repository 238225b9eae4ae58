#include "core/cuda/sdpa_cudnn.h"

#include <spdlog/spdlog.h>

#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "core/cuda/check.h"
#include "core/cuda/cudnn_graph.h"
#include "core/cuda/handles.h"
#include "core/cuda/stream.h"
#include "core/error.h"

namespace dpt::cuda_kernels {

namespace {

using cuda::cudnn_graph::Descriptor;
using cuda::cudnn_graph::DescriptorPtr;
using cuda::cudnn_graph::Dims;
using cuda::cudnn_graph::GraphBuilder;

// One built forward: the graph's descriptors, its plan (null: cuDNN has no engine for it) and the uids
// the variant pack binds.
struct ForwardPlan {
  GraphBuilder graph;
  DescriptorPtr plan;
  int64_t workspace_bytes = 0;
  int64_t q = 0, k = 0, v = 0, out = 0, lse = 0, scale = 0, neg_inf = 0;
};

// [b, heads, rows, d] as cuDNN sees an operand at `layout` (offset applied to the pointer instead).
Dims dims_of(int64_t b, const AttentionLayout& layout, int64_t t, int64_t d) { return {b, layout.heads, t, d}; }
Dims strides_of(const AttentionLayout& layout) {
  return {layout.batch_stride, layout.head_stride, layout.row_stride, 1};
}

// The composite graph cuDNN's fused attention engines recognise: the first product, the scale, the
// causal mask as generated indices compared and selected, the softmax spelled out (max, subtract, exp,
// sum, divide; log-sum for the statistics), the second product.
std::unique_ptr<ForwardPlan> build_forward(cudnnHandle_t handle, const AttentionLayouts& layouts, int64_t bh,
                                           int64_t t, int64_t d) {
  auto p = std::make_unique<ForwardPlan>();
  GraphBuilder& g = p->graph;
  const int64_t heads = layouts.q.heads, b = bh / heads;
  const Dims scores{b, heads, t, t}, score_strides{heads * t * t, t * t, t, 1};
  const Dims rows{b, heads, t, 1}, row_strides{heads * t, t, 1, 1};

  auto q = g.tensor(CUDNN_DATA_BFLOAT16, dims_of(b, layouts.q, t, d), strides_of(layouts.q), &p->q);
  // K^T: [b, heads, d, t], the same memory with the last two strides swapped.
  auto k = g.tensor(CUDNN_DATA_BFLOAT16, {b, heads, d, t},
                    {layouts.k.batch_stride, layouts.k.head_stride, 1, layouts.k.row_stride}, &p->k);
  auto v = g.tensor(CUDNN_DATA_BFLOAT16, dims_of(b, layouts.v, t, d), strides_of(layouts.v), &p->v);
  auto out = g.tensor(CUDNN_DATA_BFLOAT16, dims_of(b, layouts.out, t, d), strides_of(layouts.out), &p->out);
  auto lse = g.tensor(CUDNN_DATA_FLOAT, rows, row_strides, &p->lse);
  auto scale = g.scalar(&p->scale);
  auto neg_inf = g.scalar(&p->neg_inf);

  auto score = [&](cudnnDataType_t type) { return g.virtual_tensor(type, scores, score_strides); };
  auto per_row = [&] { return g.virtual_tensor(CUDNN_DATA_FLOAT, rows, row_strides); };

  auto s = score(CUDNN_DATA_FLOAT);
  g.matmul(q, k, s);
  auto scaled = score(CUDNN_DATA_FLOAT);
  g.pointwise(CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, s, scaled, scale);
  auto row = score(CUDNN_DATA_INT32), col = score(CUDNN_DATA_INT32);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, scaled, row, nullptr, nullptr, 2);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, scaled, col, nullptr, nullptr, 3);
  auto keep = score(CUDNN_DATA_BOOLEAN);
  g.pointwise(CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, row, keep, col);
  auto masked = score(CUDNN_DATA_FLOAT);
  g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, scaled, masked, neg_inf, keep);

  auto max = per_row();
  g.reduction(CUDNN_REDUCE_TENSOR_MAX, masked, max);
  auto shifted = score(CUDNN_DATA_FLOAT);
  g.pointwise(CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, masked, shifted, max);
  auto e = score(CUDNN_DATA_FLOAT);
  g.pointwise(CUDNN_POINTWISE_EXP, CUDNN_DATA_FLOAT, shifted, e);
  auto sum = per_row();
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, e, sum);
  auto log_sum = per_row();
  g.pointwise(CUDNN_POINTWISE_LOG, CUDNN_DATA_FLOAT, sum, log_sum);
  g.pointwise(CUDNN_POINTWISE_ADD, CUDNN_DATA_FLOAT, max, lse, log_sum);
  // P in the operands' type: the second product runs on bfloat16 tensor cores.
  auto probs = score(CUDNN_DATA_BFLOAT16);
  g.pointwise(CUDNN_POINTWISE_DIV, CUDNN_DATA_FLOAT, e, probs, sum);
  g.matmul(probs, v, out);

  p->plan = g.build_plan(handle);
  if (p->plan) p->workspace_bytes = cuda::cudnn_graph::plan_workspace_bytes(*p->plan);
  return p;
}

using PlanKey = std::tuple<int, int64_t, int64_t, int64_t, std::vector<int64_t>>;

PlanKey key_of(int device, const AttentionLayouts& layouts, int64_t bh, int64_t t, int64_t d) {
  std::vector<int64_t> strides;
  for (const AttentionLayout* l : {&layouts.q, &layouts.k, &layouts.v, &layouts.out}) {
    strides.insert(strides.end(), {l->heads, l->batch_stride, l->head_stride, l->row_stride});
  }
  return {device, bh, t, d, strides};
}

bool same_heads(const AttentionLayouts& l) {
  return l.q.heads == l.k.heads && l.q.heads == l.v.heads && l.q.heads == l.out.heads;
}

}  // namespace

bool sdpa_forward_cudnn(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                        const AttentionLayouts& layouts, int64_t bh, int64_t t, int64_t d, double scale) {
  if (!same_heads(layouts) || bh % layouts.q.heads != 0 || !lse.is_contiguous()) return false;
  const int device = out.device().index;
  cudaStream_t stream = cuda::current_stream(device);
  // Plans are per thread (cuDNN handles are) and built outside stream capture: building one may
  // allocate and synchronise, which a capture forbids. A capture that meets an unbuilt shape runs our
  // own kernels.
  thread_local std::map<PlanKey, std::unique_ptr<ForwardPlan>> plans;
  const PlanKey key = key_of(device, layouts, bh, t, d);
  auto it = plans.find(key);
  if (it == plans.end()) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    DPT_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
    if (capture != cudaStreamCaptureStatusNone) return false;
    it = plans.emplace(key, build_forward(cuda::cudnn_handle(device), layouts, bh, t, d)).first;
    if (!it->second->plan) {
      spdlog::warn("cuDNN attention: no engine for causal attention over {} heads of {} x {} ({}); using own kernels",
                   bh, t, d, it->second->graph.failure());
    }
  }
  ForwardPlan& p = *it->second;
  if (!p.plan) return false;

  Tensor workspace;
  if (p.workspace_bytes > 0) workspace = Tensor::empty({(p.workspace_bytes + 7) / 8}, out.options().with_dtype(DType::Int64));
  float scale_value = static_cast<float>(scale), neg_inf_value = -std::numeric_limits<float>::infinity();
  auto at = [](const Tensor& buffer, const AttentionLayout& layout) {  // element (0, 0, 0) of a bfloat16 operand
    return static_cast<void*>(static_cast<char*>(buffer.data_ptr()) + layout.offset * sizeof(uint16_t));
  };
  cuda::cudnn_graph::execute(cuda::cudnn_handle(device), *p.plan,
                             {p.q, p.k, p.v, p.out, p.lse, p.scale, p.neg_inf},
                             {at(q, layouts.q), at(k, layouts.k), at(v, layouts.v), at(out, layouts.out),
                              lse.data_ptr(), &scale_value, &neg_inf_value},
                             workspace.defined() ? workspace.data_ptr() : nullptr);
  return true;
}

}  // namespace dpt::cuda_kernels
