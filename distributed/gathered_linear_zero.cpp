#include "distributed/gathered_linear_zero.h"

#include <algorithm>
#include <utility>

#include "core/autograd.h"
#include "core/device_stream.h"
#include "core/error.h"
#include "core/kernels.h"
#include "distributed/shard_pieces.h"
#include "distributed/split_linear.h"
#include "layers/linear.h"
#include "optim/grad_clip.h"

namespace dpt::dist {

// Layers [begin, end) whose inputs go to every rank in one gather, issued once the last of them has run
// forward (see the header).
struct GatheredLinearZero::InputGroup {
  size_t begin = 0, end = 0;
  Tensor window;                 // [world, block]: every rank's input rows of these layers
  Tensor staging;                // [block]: this rank's, what the gather sends
  std::shared_ptr<Work> gather;  // this step's
};

struct GatheredLinearZero::Layer {
  std::string name;              // the Linear's path in the model ("0", "block.fc", ...)
  nn::Linear* linear = nullptr;  // whose op this class installs (nn::Linear::op)
  Tensor weight, bias;           // DDP's (compute) parameters; bias may be undefined
  std::unique_ptr<SplitLinear> op;
  int64_t out = 0, in = 0;
  int64_t row0 = 0, rows = 0;  // this rank's rows of weight
  Tensor x_all, dpre_all;      // [world * m, in], [world * m, out]: every rank's rows, rank order
  Tensor dpre_mine;            // [world * m, rows]: the columns of dpre_all this rank's rows need
  Tensor x;                    // this step's input rows [m, in], from forward until the inputs' gather
  size_t group = 0;            // its input group (input_groups_)
  int64_t x_offset = 0;        // where x sits in each rank's block of its group's window
  bool forwarded = false;      // ran forward this step, and its backward has not formed its gradient yet
  std::shared_ptr<Work> dpre_gather;
  Tensor grad_w, grad_b;               // [rows, in]: the averaged gradient of this rank's rows; [out]: of the bias
  std::vector<Tensor> pieces;          // the optimizer's parameters for those rows
  std::unique_ptr<StreamEvent> ready;  // OnStep: recorded when the last step's all-gather of weight has ended
};

// Events of one timed step (CUDA): a start mark (the first forward input), each collective's launch (on
// the stream it is ordered after) and end (on a probe stream that waits for it alone), and the end of
// backward's compute and the updates.
struct GatheredLinearZero::TimingState {
  struct Op {
    int communicator;
    StreamEvent launch, end;
  };
  Device device;
  StreamEvent start;
  std::unique_ptr<StreamEvent> compute_end;
  std::vector<Op> ops;
  SideStream probe;
  explicit TimingState(Device d) : device(d), start(d, true), probe(d) {}
};

namespace {

// Hands a layer's rows to the owner while it lives.
class Sink : public LinearGradSink {
 public:
  Sink(std::shared_ptr<GatheredLinearZero*> owner, size_t layer) : owner_(std::move(owner)), layer_(layer) {}
  void on_input(const Tensor& x) override {
    if (*owner_) (*owner_)->on_input(layer_, x);
  }
  void on_output_grad(const Tensor& dpre) override {
    if (*owner_) (*owner_)->on_output_grad(layer_, dpre);
  }

 private:
  std::shared_ptr<GatheredLinearZero*> owner_;
  size_t layer_;
};

void collect_linears(const std::shared_ptr<nn::Module>& m, const std::string& path,
                     std::vector<std::pair<std::string, nn::Linear*>>& out) {
  if (auto* linear = dynamic_cast<nn::Linear*>(m.get())) out.emplace_back(path, linear);
  for (const auto& [name, child] : m->named_children())
    collect_linears(child, path.empty() ? name : path + "." + name, out);
}

std::string param_name(const std::string& path, const char* leaf) { return path.empty() ? leaf : path + "." + leaf; }

}  // namespace

bool GatheredLinearZero::shards_evenly(const std::shared_ptr<nn::Module>& module, int world) {
  std::vector<std::pair<std::string, nn::Linear*>> linears;
  collect_linears(module, "", linears);
  return std::all_of(linears.begin(), linears.end(),
                     [world](const auto& l) { return l.second->weight.size(0) % world == 0; });
}

// The copy engines gather only between symmetric windows: the weights move into one window of the parameter
// communicator, each starting on a 256-element boundary, keeping their values and their identity as tensors
// (nn::replace_data: the Linear layers, DDP and mixed precision hold the same tensors).
void GatheredLinearZero::move_weights_into_window(const std::vector<std::pair<std::string, nn::Linear*>>& linears) {
  constexpr int64_t kAlign = 256;
  std::vector<int64_t> offsets;
  int64_t total = 0;
  for (const auto& [path, linear] : linears) {
    offsets.push_back(total);
    total += (linear->weight.numel() + kAlign - 1) / kAlign * kAlign;
  }
  const Tensor window = param_group_->symmetric_zeros(total, linears.front().second->weight.options());
  for (size_t i = 0; i < linears.size(); ++i) {
    const Tensor& w = linears[i].second->weight;
    Tensor slot = window.slice(offsets[i], offsets[i] + w.numel()).reshape(w.shape());
    slot.copy_(w);
    nn::replace_data(w, slot);
  }
}

// [rows, cols] for every rank's rows: in a window of the row communicator on the copy engines. Collective
// then (every rank allocates the same buffers in the same order, at the first forward).
Tensor GatheredLinearZero::rows_buffer(int64_t rows, int64_t cols, const TensorOptions& options) {
  if (!copy_engines_) return Tensor::empty({rows, cols}, options);
  return row_group_->symmetric_zeros(rows * cols, options).reshape({rows, cols});
}

// Every rank's rows of `mine` into `all`, in rank order. On the copy engines the gather runs in place inside
// `all`'s window: this rank's rows are copied into their slot first, on the current stream, which the
// gather is ordered after.
std::shared_ptr<Work> GatheredLinearZero::gather_rows(const Tensor& all, const Tensor& mine) {
  if (!copy_engines_) return row_group_->allgather(all, mine);
  const int64_t rows = all.size(0) / row_group_->size();
  Tensor slot = all.slice(row_group_->rank() * rows, (row_group_->rank() + 1) * rows);
  slot.copy_(mine.reshape(slot.shape()));
  return row_group_->allgather(all, slot);
}

GatheredLinearZero::GatheredLinearZero(DistributedDataParallel& ddp, const std::vector<optim::ParamGroup>& groups,
                                       const Factory& make, UpdateTiming when)
    : ddp_(ddp), when_(when), shard_("GatheredLinearZero", groups), group_(ddp.process_group()) {
  NoGradGuard no_grad;
  DPT_CHECK(when_ != UpdateTiming::AtBackwardEnd,
            "GatheredLinearZero: updates run as each layer's gradients are formed (WhenReduced) or on step() "
            "(OnStep), not AtBackwardEnd");
  DPT_CHECK(ddp.module() != nullptr, "GatheredLinearZero: DDP must wrap a module (its Linear layers are sharded)");
  const int64_t world = group_->size(), rank = group_->rank();
  std::vector<std::pair<std::string, nn::Linear*>> linears;
  collect_linears(ddp.module(), "", linears);
  copy_engines_ = ddp.options().copy_engines && !linears.empty() && linears.front().second->weight.device().is_cuda();
  row_group_ = group_;
  if (copy_engines_) {
    ProcessGroupOptions options = group_->options();
    options.copy_engines = true;
    row_group_ = group_->duplicate(options);
  }
  // WhenReduced: a weight's gather is ordered after its update, so on the row communicator it would hold up
  // the next layer's dpre gather. OnStep updates after backward: one communicator runs every gather in issue
  // order (see the header).
  param_group_ = when_ == UpdateTiming::WhenReduced ? row_group_->duplicate() : row_group_;
  if (copy_engines_) move_weights_into_window(linears);
  for (const auto& [path, linear] : linears) {
    Layer layer;
    layer.name = path;
    layer.linear = linear;
    layer.weight = linear->weight;
    layer.bias = linear->bias;
    layer.out = linear->weight.size(0);
    layer.in = linear->weight.size(1);
    DPT_CHECK(layer.out % world == 0,
              "GatheredLinearZero: Linear '{}' has {} output features, not divisible by the world size {} (each "
              "rank owns an equal block of rows)",
              path, layer.out, world);
    layer.rows = layer.out / world;
    layer.row0 = rank * layer.rows;
    const TensorOptions opts = layer.weight.options();
    layer.grad_w = Tensor::empty({layer.rows, layer.in}, opts);
    layer.ready = std::make_unique<StreamEvent>(layer.weight.device());
    layer.pieces.push_back(shard_.add(param_name(path, "weight"), layer.weight, layer.row0 * layer.in,
                                      (layer.row0 + layer.rows) * layer.in,
                                      layer.grad_w.reshape({layer.rows * layer.in})));
    if (layer.bias.defined()) {  // whole on every rank (see the header)
      layer.grad_b = Tensor::empty({layer.out}, layer.bias.options());
      layer.pieces.push_back(
          shard_.add(param_name(path, "bias"), layer.bias, 0, layer.out, layer.grad_b, /*replicated=*/true));
    }
    layers_.push_back(std::move(layer));
  }
  for (const auto& [name, p] : ddp.parameters())
    DPT_CHECK(shard_.covers(name),
              "GatheredLinearZero: parameter '{}' is not a Linear's weight or bias; every "
              "parameter must be (use ZeroOptimizer for other models)",
              name);
  // One gather for every layer's inputs on more than two ranks; one a layer on two (see the header).
  for (size_t l = 0; l < layers_.size(); ++l) {
    if (l == 0 || world <= 2) input_groups_.emplace_back().begin = l;
    input_groups_.back().end = l + 1;
    layers_[l].group = input_groups_.size() - 1;
  }
  sharded_elements_ = shard_.elements();
  inner_ = shard_.make_optimizer(make);

  if (!layers_.empty() && layers_.front().weight.device().is_cuda()) {
    update_stream_ = std::make_unique<SideStream>(layers_.front().weight.device());
    ready_stream_ = std::make_unique<SideStream>(layers_.front().weight.device());
  }
  for (size_t l = 0; l < layers_.size(); ++l) {
    Layer& layer = layers_[l];
    layer.op = std::make_unique<SplitLinear>(layer.weight, layer.bias, std::make_shared<Sink>(alive_, l));
    split_ops_.push_back(layer.op.get());
    layer.linear->op = [this, l](const Tensor& x, Activation act) { return forward(l, x, act); };
  }
  callback_id_ = add_backward_end_callback([alive = alive_] {
    if (*alive) (*alive)->finish_backward();
  });
}

GatheredLinearZero::~GatheredLinearZero() {
  *alive_ = nullptr;
  remove_backward_end_callback(callback_id_);
  for (auto& layer : layers_) layer.linear->op = nullptr;
}

// A layer's op: reads the weight only once its last gather has ended (OnStep), and under autograd leaves
// the weight's and bias's gradients to this class (split_linear.h).
Tensor GatheredLinearZero::forward(size_t l, const Tensor& x, Activation act) {
  Layer& layer = layers_[l];
  if (when_ == UpdateTiming::OnStep) layer.ready->wait_external();
  if (!grad_mode_enabled() || !layer.weight.requires_grad()) return linear(x, layer.weight, layer.bias, act);
  return layer.op->forward(x, act, split_ops_);
}

// Forward: the layer's input rows are kept (autograd keeps them for backward anyway) until every layer of its
// input group has run forward; then the group's rows go to every rank in one gather (see the header).
void GatheredLinearZero::on_input(size_t l, const Tensor& x) {
  NoGradGuard no_grad;
  Layer& layer = layers_[l];
  DPT_CHECK(!layer.forwarded,
            "GatheredLinearZero: Linear '{}' ran forward twice before a backward (each forward "
            "must be followed by its backward, and each Linear used once per forward)",
            layer.name);
  if (record_timing_ && update_stream_ && !timing_) {
    timing_ = std::make_unique<TimingState>(layer.weight.device());
    timing_->start.record();
  }
  layer.x = x;
  layer.forwarded = true;
  const InputGroup& group = input_groups_[layer.group];
  if (std::all_of(layers_.begin() + static_cast<int64_t>(group.begin),
                  layers_.begin() + static_cast<int64_t>(group.end), [](const Layer& each) { return each.forwarded; }))
    gather_inputs(input_groups_[layer.group]);
}

// Each rank's block of a group's window holds its rows of every layer of the group, one after another. A
// group of one layer gathers straight into the layer's x_all; after a larger group's gather, form_gradients
// copies a layer's rows out of every rank's block into its x_all.
void GatheredLinearZero::gather_inputs(InputGroup& group) {
  const int64_t world = group_->size();
  const auto begin = layers_.begin() + static_cast<int64_t>(group.begin);
  const auto end = layers_.begin() + static_cast<int64_t>(group.end);
  int64_t block = 0;
  bool same_shapes = group.window.defined();
  for (auto layer = begin; layer != end; ++layer) {
    const int64_t rows_all = world * layer->x.size(0);
    same_shapes = same_shapes && layer->x_all.size(0) == rows_all && layer->x_all.dtype() == layer->x.dtype();
    layer->x_offset = block;
    block += layer->x.numel();
  }
  const TensorOptions options = begin->x.options();
  if (!same_shapes) {  // the first step, or the batch's rows or dtype changed
    group.window = rows_buffer(world, block, options);
    // On the copy engines the gather runs in place: this rank's rows go straight into its block.
    group.staging = copy_engines_ ? group.window.slice(group_->rank(), group_->rank() + 1).reshape({block})
                                  : Tensor::empty({block}, options);
    for (auto layer = begin; layer != end; ++layer) {
      const int64_t rows_all = world * layer->x.size(0);
      layer->x_all = end - begin == 1 ? group.window.reshape({rows_all, layer->in})
                                      : Tensor::empty({rows_all, layer->in}, options);
      layer->dpre_all = rows_buffer(rows_all, layer->out, options);
      layer->dpre_mine = Tensor::empty({rows_all, layer->rows}, options);
    }
  }
  for (auto layer = begin; layer != end; ++layer) {
    group.staging.slice(layer->x_offset, layer->x_offset + layer->x.numel())
        .copy_(layer->x.reshape({layer->x.numel()}));
    layer->x = Tensor();
  }
  group.gather = collective(0, [&] { return row_group_->allgather(group.window, group.staging); });
}

// Backward: the output gradient goes to every rank at once; the update that uses it is queued at the
// next layer's gradient, when backward has queued its last read of this layer's weight (see the header).
void GatheredLinearZero::on_output_grad(size_t l, const Tensor& dpre) {
  NoGradGuard no_grad;
  Layer& layer = layers_[l];
  DPT_CHECK(layer.forwarded, "GatheredLinearZero: Linear '{}' reached backward without its forward", layer.name);
  DPT_CHECK(input_groups_[layer.group].gather,
            "GatheredLinearZero: Linear '{}' reached backward before every Linear ran forward (each must take "
            "part in every forward)",
            layer.name);
  DPT_CHECK(dpre.numel() == layer.dpre_all.numel() / group_->size(),
            "GatheredLinearZero: Linear '{}': the output gradient has {} elements, expected {}", layer.name,
            dpre.numel(), layer.dpre_all.numel() / group_->size());
  if (!in_backward_) {
    in_backward_ = true;
    if (when_ == UpdateTiming::WhenReduced) inner_->begin_step();
  }
  layer.dpre_gather = collective(0, [&] { return gather_rows(layer.dpre_all, dpre); });
  if (pending_ >= 0) launch_update(static_cast<size_t>(pending_));
  pending_ = static_cast<int64_t>(l);
}

// dW[R_r] = 1/N dpre_all[:, R_r]^T x_all and db = 1/N colsum(dpre_all): the average over ranks of their
// gradients, as one GEMM (one column sum) over every rank's rows. Nothing here allocates: on CUDA this runs
// on the update stream, and a CUDA graph's allocator serves the order of one stream only
// (core/cuda/graph_memory.h), so a block freed here could be handed to the compute stream too early.
void GatheredLinearZero::form_gradients(Layer& layer) {
  const int64_t rows_all = layer.x_all.size(0), world = group_->size();
  const double inv_world = 1.0 / static_cast<double>(world);
  const InputGroup& group = input_groups_[layer.group];
  if (group.end - group.begin > 1) {
    const Tensor& window = group.window;
    const int64_t per_rank = layer.x_all.numel() / world;
    layer.x_all.reshape({world, per_rank})
        .copy_(make_view(window, {world, per_rank}, {window.size(1), 1}, window.impl()->offset + layer.x_offset));
  }
  layer.dpre_mine.copy_(
      make_view(layer.dpre_all, {rows_all, layer.rows}, {layer.out, 1}, layer.dpre_all.impl()->offset + layer.row0));
  kernels::GemmArgs args;
  args.m = layer.rows;
  args.n = layer.in;
  args.k = rows_all;
  args.transpose_a = true;
  args.alpha = inv_world;
  kernels::gemm(layer.dpre_mine, layer.x_all, layer.grad_w, args);
  if (layer.bias.defined()) {
    kernels::reduce(kernels::ReduceOp::Sum, layer.dpre_all, 1, rows_all, layer.out, layer.grad_b, Tensor());
    kernels::unary(kernels::UnaryOp::Scale, layer.grad_b, layer.grad_b, inv_world);
  }
}

std::unique_ptr<SideStreamGuard> GatheredLinearZero::on_update_stream(const Device& device) {
  if (!update_stream_) return nullptr;
  StreamEvent queued(device);
  queued.record();
  queued.wait(*update_stream_);
  return std::make_unique<SideStreamGuard>(*update_stream_);
}

// Stream order (CUDA): the update stream waits for the compute stream (backward has queued every read
// of this layer's weight), then for the x and dpre gathers; the parameter gather on the second
// communicator's stream is ordered after the update by the process group's own event.
void GatheredLinearZero::launch_update(size_t l) {
  Layer& layer = layers_[l];
  const std::unique_ptr<SideStreamGuard> on_updates = on_update_stream(layer.weight.device());
  input_groups_[layer.group].gather->wait();
  layer.dpre_gather->wait();
  layer.dpre_gather.reset();
  layer.forwarded = false;
  form_gradients(layer);
  if (when_ == UpdateTiming::WhenReduced) update_and_gather(layer);
}

// The update of this rank's pieces, then the all-gather of the weight's rows (second communicator, ordered
// after the update by the process group's event on the current stream).
void GatheredLinearZero::update_and_gather(Layer& layer) {
  inner_->update(layer.pieces);
  Tensor w = layer.weight.detach();
  param_gathers_.push_back(collective(param_group_ == row_group_ ? 0 : 1, [&] {
    return param_group_->allgather(w, w.slice(layer.row0, layer.row0 + layer.rows));
  }));
}

// The compute stream (CUDA) or the host (Gloo) waits for the last updates and every parameter gather:
// after backward() the parameters hold this step's values on every rank.
void GatheredLinearZero::finish_backward() {
  if (!in_backward_) return;
  in_backward_ = false;
  NoGradGuard no_grad;
  if (pending_ >= 0) launch_update(static_cast<size_t>(pending_));
  pending_ = -1;
  if (update_stream_) {
    StreamEvent updates_done(update_stream_->device());
    updates_done.record(*update_stream_);
    updates_done.wait();
    if (timing_) {
      timing_->compute_end = std::make_unique<StreamEvent>(timing_->device, true);
      timing_->compute_end->record();
    }
  }
  for (auto& w : param_gathers_) w->wait();
  param_gathers_.clear();
  for (InputGroup& group : input_groups_) group.gather.reset();
  if (timing_) finished_timing_ = std::move(timing_);
  for (const auto& layer : layers_)
    DPT_CHECK(!layer.forwarded,
              "GatheredLinearZero: Linear '{}' ran forward but received no gradient in this "
              "backward (every Linear must take part in the loss)",
              layer.name);
}

Tensor GatheredLinearZero::grad_sum_of_squares() {
  DPT_CHECK(when_ == UpdateTiming::OnStep,
            "GatheredLinearZero::grad_sum_of_squares: only when the update runs on step() (UpdateTiming::OnStep)");
  NoGradGuard no_grad;
  std::vector<Tensor> counted;
  for (const Layer& layer : layers_) {
    counted.push_back(layer.grad_w);
    if (layer.bias.defined() && group_->rank() == 0) counted.push_back(layer.grad_b);
  }
  return optim::sum_of_squares(counted, layers_.front().weight.device());
}

// Each layer's gather, once issued, is waited for by the ready stream alone, which then records the layer's
// event (see the header). Gloo: the host waits for each gather here.
void GatheredLinearZero::step() {
  DPT_CHECK(when_ == UpdateTiming::OnStep, "GatheredLinearZero::step: the update already runs inside backward");
  NoGradGuard no_grad;
  if (!inner_->take_gate()) return;  // every rank reads the same gate: none updates or gathers
  // On CUDA the updates run on the update stream, behind the decision: the next forward waits for each
  // layer's gather alone (its ready event), so the later layers' updates run beside the earlier layers'
  // forward instead of before it.
  const std::unique_ptr<SideStreamGuard> on_updates = on_update_stream(layers_.front().weight.device());
  inner_->begin_step();
  for (Layer& layer : layers_) {
    update_and_gather(layer);
    if (!ready_stream_) continue;
    SideStreamGuard on_ready(*ready_stream_);
    param_gathers_.back()->wait();
    layer.ready->record(*ready_stream_);
  }
  if (!ready_stream_)
    for (auto& w : param_gathers_) w->wait();
  param_gathers_.clear();
}

void GatheredLinearZero::wait_for_parameters() {
  for (Layer& layer : layers_) layer.ready->wait();
}

void GatheredLinearZero::gather_targets() {
  wait_for_parameters();
  shard_.gather_targets(*group_, ddp_.parameters());
}

NamedTensors GatheredLinearZero::full_state_dict() {
  wait_for_parameters();
  return shard_.full_state_dict(*inner_, *group_, ddp_.parameters());
}

void GatheredLinearZero::load_full_state_dict(const NamedTensors& full) {
  wait_for_parameters();
  shard_.load_full_state_dict(*inner_, full);
}

std::shared_ptr<Work> GatheredLinearZero::collective(int communicator,
                                                     const std::function<std::shared_ptr<Work>()>& issue) {
  if (!timing_) return issue();
  TimingState::Op op{communicator, StreamEvent(timing_->device, true), StreamEvent(timing_->device, true)};
  op.launch.record();  // the current stream: what the collective is ordered after
  std::shared_ptr<Work> work = issue();
  {
    SideStreamGuard on_probe(timing_->probe);
    work->wait();
    op.end.record(timing_->probe);
  }
  timing_->ops.push_back(std::move(op));
  return work;
}

// Each communicator runs one collective at a time in issue order, so an op starts at its launch or at
// its predecessor's end, whichever is later; the busy spans of both are merged into one timeline.
GatheredLinearZero::Timing GatheredLinearZero::last_timing() {
  Timing t;
  if (!finished_timing_ || !finished_timing_->compute_end) return t;
  TimingState& s = *finished_timing_;
  s.compute_end->synchronize();
  std::vector<std::pair<float, float>> spans;
  float busy_until[2] = {0, 0};
  for (auto& op : s.ops) {
    op.end.synchronize();
    const float begin = std::max(s.start.elapsed_ms(op.launch), busy_until[op.communicator]);
    const float end = s.start.elapsed_ms(op.end);
    busy_until[op.communicator] = end;
    if (end > begin) spans.emplace_back(begin, end);
  }
  std::sort(spans.begin(), spans.end());
  float covered_until = 0;
  for (const auto& [begin, end] : spans) {
    t.comm_ms += std::max(0.0f, end - std::max(begin, covered_until));
    covered_until = std::max(covered_until, end);
  }
  t.exposed_ms = std::max(0.0f, covered_until - s.start.elapsed_ms(*s.compute_end));
  return t;
}

}  // namespace dpt::dist
