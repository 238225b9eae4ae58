#include "core/cuda/sdpa_cudnn.h"

#include <spdlog/spdlog.h>

#include <limits>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "core/cuda/check.h"
#include "core/cuda/cuda_kernels.h"
#include "core/cuda/cudnn_graph.h"
#include "core/cuda/handles.h"
#include "core/cuda/stream.h"
#include "core/error.h"

namespace dpt::cuda_kernels {

namespace {

using cuda::cudnn_graph::DescriptorPtr;
using cuda::cudnn_graph::Dims;
using cuda::cudnn_graph::GraphBuilder;

// One built graph: its descriptors, its plan (null: cuDNN has no engine for it) and the uids the
// variant pack binds (0: not in this graph).
struct AttentionPlan {
  GraphBuilder graph;
  DescriptorPtr plan;
  int64_t workspace_bytes = 0;
  int64_t q = 0, k = 0, v = 0, out = 0, lse = 0, scale = 0, neg_inf = 0;  // both directions
  int64_t grad_out = 0, grad_q = 0, grad_k = 0, grad_v = 0, one = 0;      // backward
  int64_t dot = 0;                                                        // backward, float32 scratch
  int64_t seed = 0, offset = 0, dropout_scale = 0;                        // with dropout

  // Asks cuDNN for a plan of the finished graph (none: no engine) and the workspace it needs.
  void build(cudnnHandle_t handle) {
    plan = graph.build_plan(handle);
    if (plan) workspace_bytes = cuda::cudnn_graph::plan_workspace_bytes(*plan);
  }
};

// The operands as cuDNN sees them: [b, heads, rows, d] with the layout's strides (its offset goes into
// the pointer), or transposed to [b, heads, d, rows] by swapping the last two strides.
struct Shapes {
  int64_t b, heads, t, d;
  Dims operand() const { return {b, heads, t, d}; }
  Dims transposed() const { return {b, heads, d, t}; }
  Dims scores() const { return {b, heads, t, t}; }
  Dims score_strides() const { return {heads * t * t, t * t, t, 1}; }
  Dims scores_transposed_strides() const { return {heads * t * t, t * t, 1, t}; }
  Dims rows() const { return {b, heads, t, 1}; }
  Dims row_strides() const { return {heads * t, t, 1, 1}; }
  Dims dense_strides() const { return {heads * t * d, t * d, d, 1}; }
};
Dims strides_of(const AttentionLayout& l) { return {l.batch_stride, l.head_stride, l.row_stride, 1}; }
Dims transposed_strides_of(const AttentionLayout& l) { return {l.batch_stride, l.head_stride, 1, l.row_stride}; }

// scale S, then the causal mask as generated row and column indices compared (row >= column kept) and
// -inf selected elsewhere: the spelling cuDNN's attention engines recognise.
DescriptorPtr scaled_causal(GraphBuilder& g, const Shapes& sh, const DescriptorPtr& s, const DescriptorPtr& scale,
                            const DescriptorPtr& neg_inf, const DescriptorPtr& subtract = nullptr) {
  auto score = [&](cudnnDataType_t type) { return g.virtual_tensor(type, sh.scores(), sh.score_strides()); };
  auto scaled = score(CUDNN_DATA_FLOAT);
  g.pointwise(CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, s, scaled, scale);
  if (subtract) {  // the backward subtracts the forward's logsumexp before masking
    auto shifted = score(CUDNN_DATA_FLOAT);
    g.pointwise(CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, scaled, shifted, subtract);
    scaled = shifted;
  }
  auto row = score(CUDNN_DATA_INT32), col = score(CUDNN_DATA_INT32);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, scaled, row, nullptr, nullptr, 2);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, scaled, col, nullptr, nullptr, 3);
  auto keep = score(CUDNN_DATA_BOOLEAN);
  g.pointwise(CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, row, keep, col);
  auto masked = score(CUDNN_DATA_FLOAT);
  g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, scaled, masked, neg_inf, keep);
  return masked;
}

// Dropout's mask on the attention weights, as cuDNN's own SDPA graphs spell it: a Bernoulli(1 - p) draw of
// cuDNN's Philox generator at the device scalars seed and offset, the same draw in the forward and in the
// backward, which makes it again. Multiplied in, then scaled by 1 / (1 - p) (the scalar dropout_scale).
DescriptorPtr dropout_mask(GraphBuilder& g, const Shapes& sh, AttentionPlan& plan, double dropout) {
  DescriptorPtr mask = g.virtual_tensor(CUDNN_DATA_FLOAT, sh.scores(), sh.score_strides());
  g.bernoulli(1.0 - dropout, g.device_int64(&plan.seed), g.device_int64(&plan.offset), mask);
  return mask;
}

// a * b elementwise over the scores, in float32.
DescriptorPtr product(GraphBuilder& g, const Shapes& sh, const DescriptorPtr& a, const DescriptorPtr& b) {
  DescriptorPtr y = g.virtual_tensor(CUDNN_DATA_FLOAT, sh.scores(), sh.score_strides());
  g.pointwise(CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, a, y, b);
  return y;
}

// Forward: S = Q K^T, scaled and masked, softmax spelled out (max, subtract, exp, sum, divide; the
// logsumexp from the max and the log of the sum), O = P V.
std::unique_ptr<AttentionPlan> build_forward(cudnnHandle_t handle, const AttentionLayouts& layouts, const Shapes& sh,
                                             double dropout) {
  auto p = std::make_unique<AttentionPlan>();
  GraphBuilder& g = p->graph;
  auto q = g.tensor(CUDNN_DATA_BFLOAT16, sh.operand(), strides_of(layouts.q), &p->q);
  auto kt = g.tensor(CUDNN_DATA_BFLOAT16, sh.transposed(), transposed_strides_of(layouts.k), &p->k);
  auto v = g.tensor(CUDNN_DATA_BFLOAT16, sh.operand(), strides_of(layouts.v), &p->v);
  auto out = g.tensor(CUDNN_DATA_BFLOAT16, sh.operand(), strides_of(layouts.out), &p->out);
  auto lse = g.tensor(CUDNN_DATA_FLOAT, sh.rows(), sh.row_strides(), &p->lse);
  auto scale = g.scalar(&p->scale);
  auto neg_inf = g.scalar(&p->neg_inf);
  auto score = [&](cudnnDataType_t type) { return g.virtual_tensor(type, sh.scores(), sh.score_strides()); };
  auto per_row = [&] { return g.virtual_tensor(CUDNN_DATA_FLOAT, sh.rows(), sh.row_strides()); };

  auto s = score(CUDNN_DATA_FLOAT);
  g.matmul(q, kt, s);
  auto masked = scaled_causal(g, sh, s, scale, neg_inf);
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
  if (dropout > 0) {
    auto weights = score(CUDNN_DATA_FLOAT);
    g.pointwise(CUDNN_POINTWISE_DIV, CUDNN_DATA_FLOAT, e, weights, sum);
    auto dropped = product(g, sh, weights, dropout_mask(g, sh, *p, dropout));
    g.pointwise(CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, dropped, probs, g.scalar(&p->dropout_scale));
  } else {
    g.pointwise(CUDNN_POINTWISE_DIV, CUDNN_DATA_FLOAT, e, probs, sum);
  }
  g.matmul(probs, v, out);

  p->build(handle);
  return p;
}

// Backward (core/ops_flash_attention.h has the math): D = rowsum(dO * O) into float32 scratch,
// P = exp(scale S - lse) masked, dV = P^T dO, dS = P (dO V^T - D) scale, dK = dS^T Q, dQ = dS K. With
// dropout's mask M and r = 1 / (1 - p): dV = (r P M)^T dO and dS = r P (M dO V^T - D / r) scale, the
// scratch D then holding D (1 - p) (the scalar `one`). dQ is
// written straight from dS K, which the engine forms deterministically: no float32 accumulator that
// tiles add to in no fixed order, so a step repeats bit for bit.
std::unique_ptr<AttentionPlan> build_backward(cudnnHandle_t handle, const AttentionLayouts& layouts, const Shapes& sh,
                                              double dropout) {
  auto p = std::make_unique<AttentionPlan>();
  GraphBuilder& g = p->graph;
  auto q = g.tensor(CUDNN_DATA_BFLOAT16, sh.operand(), strides_of(layouts.q), &p->q);
  auto kt = g.tensor(CUDNN_DATA_BFLOAT16, sh.transposed(), transposed_strides_of(layouts.k), &p->k);
  auto vt = g.tensor(CUDNN_DATA_BFLOAT16, sh.transposed(), transposed_strides_of(layouts.v), &p->v);
  auto out = g.tensor(CUDNN_DATA_BFLOAT16, sh.operand(), strides_of(layouts.out), &p->out);
  auto grad_out = g.tensor(CUDNN_DATA_BFLOAT16, sh.operand(), strides_of(layouts.out), &p->grad_out);
  auto lse = g.tensor(CUDNN_DATA_FLOAT, sh.rows(), sh.row_strides(), &p->lse);
  auto grad_q = g.tensor(CUDNN_DATA_BFLOAT16, sh.operand(), strides_of(layouts.q), &p->grad_q);
  auto grad_k = g.tensor(CUDNN_DATA_BFLOAT16, sh.operand(), strides_of(layouts.k), &p->grad_k);
  auto grad_v = g.tensor(CUDNN_DATA_BFLOAT16, sh.operand(), strides_of(layouts.v), &p->grad_v);
  auto scale = g.scalar(&p->scale);
  auto neg_inf = g.scalar(&p->neg_inf);
  auto one = g.scalar(&p->one);
  auto score = [&](cudnnDataType_t type) { return g.virtual_tensor(type, sh.scores(), sh.score_strides()); };
  auto transposed_score = [&] {
    return g.virtual_tensor(CUDNN_DATA_BFLOAT16, sh.scores(), sh.scores_transposed_strides());
  };

  auto products = g.virtual_tensor(CUDNN_DATA_FLOAT, sh.operand(), sh.dense_strides());
  g.pointwise(CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, grad_out, products, out);
  auto dot_sum = g.virtual_tensor(CUDNN_DATA_FLOAT, sh.rows(), sh.row_strides());
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, products, dot_sum);
  auto dot = g.tensor(CUDNN_DATA_FLOAT, sh.rows(), sh.row_strides(), &p->dot);
  g.pointwise(CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, dot_sum, dot, one);

  auto s = score(CUDNN_DATA_FLOAT);
  g.matmul(q, kt, s);
  auto masked = scaled_causal(g, sh, s, scale, neg_inf, lse);
  auto probs = score(CUDNN_DATA_FLOAT);
  g.pointwise(CUDNN_POINTWISE_EXP, CUDNN_DATA_FLOAT, masked, probs);
  auto probs_t = transposed_score();
  DescriptorPtr mask, dropout_scale;
  if (dropout > 0) {
    mask = dropout_mask(g, sh, *p, dropout);
    dropout_scale = g.scalar(&p->dropout_scale);
    g.reshape(product(g, sh, product(g, sh, probs, mask), dropout_scale), probs_t);
  } else {
    g.reshape(probs, probs_t);
  }
  g.matmul(probs_t, grad_out, grad_v);

  auto dp = score(CUDNN_DATA_FLOAT);
  g.matmul(grad_out, vt, dp);
  if (mask) dp = product(g, sh, dp, mask);
  auto centred = score(CUDNN_DATA_FLOAT);
  g.pointwise(CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, dp, centred, dot);
  auto weighted = product(g, sh, centred, probs);
  if (dropout_scale) weighted = product(g, sh, weighted, dropout_scale);
  auto ds = score(CUDNN_DATA_FLOAT);
  g.pointwise(CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, weighted, ds, scale);
  auto ds_t = transposed_score();
  g.reshape(ds, ds_t);
  g.matmul(ds_t, q, grad_k);

  auto k = g.virtual_tensor(CUDNN_DATA_BFLOAT16, sh.operand(), strides_of(layouts.k));
  g.reshape(kt, k);
  g.matmul(ds, k, grad_q);

  p->build(handle);
  return p;
}

// Plans are per thread (cuDNN handles are) and device, per direction, shape, layout and dropout probability.
using PlanKey = std::tuple<int, int, int64_t, int64_t, int64_t, float, std::vector<int64_t>>;

bool same_heads(const AttentionLayouts& l) {
  return l.q.heads == l.k.heads && l.q.heads == l.v.heads && l.q.heads == l.out.heads;
}

// The plan for `key`, built by `build` on first use; null when cuDNN has no engine, or when the stream
// is being captured and the plan is not built yet (building may allocate and synchronise, which a
// capture forbids): the caller then runs our own kernels.
template <class Build>
AttentionPlan* find_plan(int device, int direction, const AttentionLayouts& layouts, int64_t bh, int64_t t, int64_t d,
                         float dropout, const char* what, Build&& build) {
  thread_local std::map<PlanKey, std::unique_ptr<AttentionPlan>> plans;
  std::vector<int64_t> strides;
  for (const AttentionLayout* l : {&layouts.q, &layouts.k, &layouts.v, &layouts.out}) {
    strides.insert(strides.end(), {l->heads, l->batch_stride, l->head_stride, l->row_stride});
  }
  const PlanKey key{device, direction, bh, t, d, dropout, strides};
  auto it = plans.find(key);
  if (it == plans.end()) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    DPT_CUDA_CHECK(cudaStreamIsCapturing(cuda::current_stream(device), &capture));
    if (capture != cudaStreamCaptureStatusNone) return nullptr;
    const Shapes sh{bh / layouts.q.heads, layouts.q.heads, t, d};
    std::unique_ptr<AttentionPlan> built;
    std::string failure;
    try {  // a cuDNN that rejects a descriptor of the graph has no engine for it either
      built = build(cuda::cudnn_handle(device), sh);
      failure = built->graph.failure();
    } catch (const std::exception& e) {
      built = std::make_unique<AttentionPlan>();
      failure = e.what();
    }
    if (!built->plan) {
      spdlog::warn(
          "cuDNN attention: no {} engine for causal attention over {} heads of {} x {}{} ({}); "
          "using own kernels",
          what, bh, t, d, dropout > 0 ? fmt::format(" with dropout {}", dropout) : "", failure);
    }
    it = plans.emplace(key, std::move(built)).first;
  }
  return it->second->plan ? it->second.get() : nullptr;
}

// Element (0, 0, 0) of a bfloat16 operand.
void* operand_at(const Tensor& buffer, const AttentionLayout& layout) {
  return static_cast<char*>(buffer.data_ptr()) + layout.offset * static_cast<int64_t>(sizeof(uint16_t));
}

Tensor scratch(const Tensor& like, int64_t bytes) {
  return Tensor::empty({(bytes + 3) / 4}, like.options().with_dtype(DType::Float32));
}

bool usable(const AttentionLayouts& layouts, int64_t bh, const Tensor& lse) {
  return same_heads(layouts) && bh % layouts.q.heads == 0 && lse.is_contiguous();
}

// The seed and offset of dropout's draw as two int64 device scalars, read by the engine when it runs (a CUDA
// graph's replays then draw fresh masks as the generator's device counter moves on).
Tensor seed_and_offset(const Tensor& like, const AttentionDropout& drop) {
  Tensor state = Tensor::empty({2}, like.options().with_dtype(DType::Int64));
  philox_state(drop.rng, state);
  return state;
}

// The dropout bindings of plan `p`: seed, offset and the rescaling 1 / (1 - p); none without dropout.
void bind_dropout(const AttentionPlan& p, const AttentionDropout& drop, const Tensor& state, float& rescale,
                  std::vector<int64_t>& uids, std::vector<void*>& pointers) {
  if (drop.p == 0) return;
  rescale = 1.0f / (1.0f - drop.p);
  int64_t* values = static_cast<int64_t*>(state.data_ptr());
  uids.insert(uids.end(), {p.seed, p.offset, p.dropout_scale});
  pointers.insert(pointers.end(), {values, values + 1, &rescale});
}

AttentionPlan* backward_plan(int device, const AttentionLayouts& layouts, int64_t bh, int64_t t, int64_t d,
                             float dropout) {
  return find_plan(device, 1, layouts, bh, t, d, dropout, "backward", [&](cudnnHandle_t handle, const Shapes& sh) {
    return build_backward(handle, layouts, sh, dropout);
  });
}

}  // namespace

bool sdpa_forward_cudnn(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                        const AttentionLayouts& layouts, int64_t bh, int64_t t, int64_t d, double scale,
                        const AttentionDropout& drop) {
  if (!usable(layouts, bh, lse)) return false;
  const int device = out.device().index;
  AttentionPlan* p =
      find_plan(device, 0, layouts, bh, t, d, drop.p, "forward", [&](cudnnHandle_t handle, const Shapes& sh) {
        return build_forward(handle, layouts, sh, drop.p);
      });
  if (!p) return false;
  // Only cuDNN can draw its mask again: with dropout, its forward runs only where its backward will.
  if (drop.p > 0 && !backward_plan(device, layouts, bh, t, d, drop.p)) return false;
  Tensor workspace = p->workspace_bytes > 0 ? scratch(out, p->workspace_bytes) : Tensor();
  Tensor state = drop.p > 0 ? seed_and_offset(out, drop) : Tensor();
  float scale_value = static_cast<float>(scale), neg_inf_value = -std::numeric_limits<float>::infinity(), rescale = 1;
  std::vector<int64_t> uids{p->q, p->k, p->v, p->out, p->lse, p->scale, p->neg_inf};
  std::vector<void*> pointers{operand_at(q, layouts.q),     operand_at(k, layouts.k), operand_at(v, layouts.v),
                              operand_at(out, layouts.out), lse.data_ptr(),           &scale_value,
                              &neg_inf_value};
  bind_dropout(*p, drop, state, rescale, uids, pointers);
  cuda::cudnn_graph::execute(cuda::cudnn_handle(device), *p->plan, uids, pointers,
                             workspace.defined() ? workspace.data_ptr() : nullptr);
  return true;
}

bool sdpa_backward_cudnn(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& grad_out,
                         const Tensor& lse, const Tensor& grad_q, const Tensor& grad_k, const Tensor& grad_v,
                         const AttentionLayouts& layouts, int64_t bh, int64_t t, int64_t d, double scale,
                         const AttentionDropout& drop) {
  if (!usable(layouts, bh, lse)) return false;
  const int device = out.device().index;
  AttentionPlan* p = backward_plan(device, layouts, bh, t, d, drop.p);
  if (!p) return false;
  // Scratch from the stream-ordered pool, free again once the call is enqueued. The deterministic graph's
  // workspace holds dP for every head (b heads t t bfloat16: 384 MiB for GPT-2), transient: under a
  // CUDA graph it is carved from a larger block the step has freed by then (core/cuda/graph_memory.h).
  Tensor workspace = p->workspace_bytes > 0 ? scratch(out, p->workspace_bytes) : Tensor();
  Tensor dot = scratch(out, bh * t * 4);
  Tensor state = drop.p > 0 ? seed_and_offset(out, drop) : Tensor();
  float scale_value = static_cast<float>(scale), neg_inf_value = -std::numeric_limits<float>::infinity(),
        one_value = 1.0f - drop.p, rescale = 1;
  std::vector<int64_t> uids{p->q,      p->k,      p->v,   p->out,   p->grad_out, p->lse, p->grad_q,
                            p->grad_k, p->grad_v, p->dot, p->scale, p->neg_inf,  p->one};
  std::vector<void*> pointers{operand_at(q, layouts.q),
                              operand_at(k, layouts.k),
                              operand_at(v, layouts.v),
                              operand_at(out, layouts.out),
                              operand_at(grad_out, layouts.out),
                              lse.data_ptr(),
                              operand_at(grad_q, layouts.q),
                              operand_at(grad_k, layouts.k),
                              operand_at(grad_v, layouts.v),
                              dot.data_ptr(),
                              &scale_value,
                              &neg_inf_value,
                              &one_value};
  bind_dropout(*p, drop, state, rescale, uids, pointers);
  cuda::cudnn_graph::execute(cuda::cudnn_handle(device), *p->plan, uids, pointers,
                             workspace.defined() ? workspace.data_ptr() : nullptr);
  return true;
}

}  // namespace dpt::cuda_kernels
