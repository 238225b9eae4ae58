#include "distributed/zero_optimizer.h"

#include <algorithm>
#include <typeinfo>

#include "core/autograd.h"
#include "core/error.h"
#include "distributed/updating_exchange.h"
#include "layers/sequential.h"
#include "optim/grad_clip.h"

namespace dpt::dist {

ZeroOptimizer::ZeroOptimizer(DistributedDataParallel& ddp, const std::vector<optim::ParamGroup>& groups,
                             const Factory& make, UpdateTiming when)
    : ddp_(ddp), when_(when), shard_("ZeroOptimizer", groups) {
  NoGradGuard no_grad;
  const DDPOptions& options = ddp_.options();
  DPT_CHECK(!options.comm_dtype || ddp_.parameters().empty() ||
                *options.comm_dtype == ddp_.parameters().front().second.dtype(),
            "ZeroOptimizer: comm_dtype is not supported with sharded buckets");
  auto sharded = std::make_unique<ShardedExchange>(
      ddp_.process_group(), static_cast<size_t>(options.bucket_cap_mb * 1024 * 1024), options.copy_engines);
  exchange_ = sharded.get();
  if (when_ == UpdateTiming::OnStep) {
    ddp_.set_exchange(std::move(sharded));  // DDP only reduce-scatters; step() does the rest
  } else {
    auto update = [alive = alive_](const GradBucket& bucket) {
      if (*alive) (*alive)->on_bucket_reduced(bucket.index);
    };
    ddp_.set_exchange(std::make_unique<UpdatingExchange>(std::move(sharded), update, when_));
  }
  gather_group_ = exchange_->group();
  const NamedTensors& params = ddp_.parameters();
  const int64_t world = ddp_.process_group()->size();
  const int64_t rank = ddp_.process_group()->rank();
  pieces_.resize(ddp_.num_buckets());
  for (size_t b = 0; b < ddp_.num_buckets(); ++b) {
    const GradBucket& bucket = ddp_.bucket(b);
    const int64_t block = bucket.buffer.numel() / world;
    const int64_t mine_begin = rank * block, mine_end = mine_begin + block;
    grad_blocks_.push_back(bucket.buffer.slice(mine_begin, mine_end));
    for (size_t j = 0; j < bucket.params.size(); ++j) {
      const auto& [name, p] = params[bucket.params[j]];
      shard_.cover(name, p);
      // The part of this parameter inside this rank's block, in parameter and in bucket coordinates.
      const int64_t offset = bucket.offsets[j];
      const int64_t lo = std::max(offset, mine_begin), hi = std::min(offset + p.numel(), mine_end);
      if (lo >= hi) continue;
      // The reduce-scattered average lands in the bucket's range.
      pieces_[b].push_back(shard_.add(name, p, lo - offset, hi - offset, flat_range(bucket.buffer, lo, hi)));
    }
  }
  sharded_elements_ = shard_.elements();
  inner_ = shard_.make_optimizer(make);
  if (when_ == UpdateTiming::WhenReduced) {
    // The all-gathers queue behind updates; on the reduce-scatters' communicator they would hold back the
    // reduce-scatters of the buckets backward finishes meanwhile.
    gather_group_ = gather_group_->duplicate();
    // A copy-engine group's all-gathers need the parameters in one of its own symmetric windows.
    if (gather_group_->options().copy_engines) gather_group_->register_symmetric(exchange_->parameters());
  }
  if (when_ == UpdateTiming::OnStep && !params.empty()) plan_forward_waits();
}

ZeroOptimizer::~ZeroOptimizer() {
  *alive_ = nullptr;
  for (auto& seq : hooked_) seq->set_before_child(nullptr);
}

namespace {

// The Sequential containers of `m`'s tree (exactly that type: a subclass may run its children otherwise) with
// their paths, outermost first; one inside another's child is that child's.
void find_sequentials(const std::shared_ptr<nn::Module>& m, const std::string& path,
                      std::vector<std::pair<std::string, std::shared_ptr<nn::Sequential>>>& found) {
  if (!m) return;  // DDP over a list of parameters: no module
  if (typeid(*m) == typeid(nn::Sequential)) {
    found.emplace_back(path, std::static_pointer_cast<nn::Sequential>(m));
    return;
  }
  for (const auto& [name, child] : m->named_children())
    find_sequentials(child, path.empty() ? name : path + "." + name, found);
}

}  // namespace

// Orders the buckets for step() and sets each Sequential child's wait (see the header): the buckets holding any
// parameter outside the Sequentials' children first, then every child's in forward order. A child waits for
// the event of its bucket placed last: the ready stream records the events in step order, each after waiting
// for its gather, so that event ends after every earlier gather.
void ZeroOptimizer::plan_forward_waits() {
  const NamedTensors& params = ddp_.parameters();
  const size_t num_buckets = ddp_.num_buckets();
  std::vector<std::vector<size_t>> buckets_of(params.size());
  for (size_t b = 0; b < num_buckets; ++b)
    for (size_t i : ddp_.bucket(b).params) buckets_of[i].push_back(b);

  std::vector<std::pair<std::string, std::shared_ptr<nn::Sequential>>> sequentials;
  find_sequentials(ddp_.module(), "", sequentials);
  // children[s][c]: the parameter indices under child c of Sequential s.
  std::vector<std::vector<std::vector<size_t>>> children(sequentials.size());
  std::vector<bool> in_child(params.size(), false);
  for (size_t s = 0; s < sequentials.size(); ++s) {
    const auto& [path, seq] = sequentials[s];
    children[s].resize(seq->size());
    for (size_t c = 0; c < seq->size(); ++c) {
      const std::string prefix = (path.empty() ? "" : path + ".") + std::to_string(c) + ".";
      for (size_t i = 0; i < params.size(); ++i) {
        if (params[i].first.rfind(prefix, 0) != 0) continue;
        children[s][c].push_back(i);
        in_child[i] = true;
      }
    }
  }

  std::vector<size_t> position(num_buckets, num_buckets);  // in step_order_; num_buckets: not placed yet
  auto place = [&](size_t b) {
    if (position[b] != num_buckets) return;
    position[b] = step_order_.size();
    step_order_.push_back(b);
  };
  // Buckets are in backward order: forward order is the reverse.
  for (size_t b = num_buckets; b-- > 0;)
    for (size_t i : ddp_.bucket(b).params)
      if (!in_child[i]) place(b);
  waited_in_step_ = step_order_.size();
  for (size_t s = 0; s < sequentials.size(); ++s) {
    std::vector<size_t> waits;  // [child] the bucket it waits for; num_buckets: none (no parameters)
    for (const auto& indices : children[s]) {
      std::vector<size_t> buckets;
      for (size_t i : indices) buckets.insert(buckets.end(), buckets_of[i].begin(), buckets_of[i].end());
      std::sort(buckets.rbegin(), buckets.rend());
      for (size_t b : buckets) place(b);
      size_t last = num_buckets;
      for (size_t b : buckets)
        if (last == num_buckets || position[b] > position[last]) last = b;
      waits.push_back(last);
    }
    sequentials[s].second->set_before_child([alive = alive_, waits, num_buckets](size_t c) {
      if (*alive && c < waits.size() && waits[c] != num_buckets) (*alive)->ready_[waits[c]].wait_external();
    });
    hooked_.push_back(sequentials[s].second);
  }
  DPT_CHECK(step_order_.size() == num_buckets, "ZeroOptimizer: {} of {} buckets ordered for step()", step_order_.size(),
            num_buckets);  // every parameter is inside a child or not

  const Device device = params.front().second.device();
  for (size_t b = 0; b < num_buckets; ++b) ready_.emplace_back(device);
  ready_stream_ = std::make_unique<SideStream>(device);
}

// The update inside backward (AtBackwardEnd, WhenReduced). Runs once the current stream waits for bucket b's
// reduce-scatter: the compute stream at the end of backward, or the update stream when the reduce-scatter is
// launched (WhenReduced, updating_exchange.h). Nothing here allocates: on the update stream inside CUDA graph
// capture that would break the graph allocator's single-stream order (core/cuda/graph_memory.h).
void ZeroOptimizer::on_bucket_reduced(size_t b) {
  NoGradGuard no_grad;
  if (b == 0) inner_->begin_step();
  inner_->update(pieces_[b]);
  gathers_.push_back(gather(b));
  if (b + 1 == ddp_.num_buckets()) {
    // CUDA: the current stream waits (under WhenReduced the update stream, which the compute stream
    // joins at the end of backward); Gloo: the host does.
    for (auto& w : gathers_) w->wait();
    gathers_.clear();
  }
}

// Queued after what the current stream has queued (the process group orders its stream after ours).
std::shared_ptr<Work> ZeroOptimizer::gather(size_t b) {
  const Tensor& values = exchange_->param_buffer(b);
  const int64_t block = values.numel() / gather_group_->size();
  const int64_t mine = gather_group_->rank() * block;
  return gather_group_->allgather(values, values.slice(mine, mine + block));
}

Tensor ZeroOptimizer::grad_sum_of_squares() {
  DPT_CHECK(when_ == UpdateTiming::OnStep,
            "ZeroOptimizer::grad_sum_of_squares: only when the update runs on step() (UpdateTiming::OnStep)");
  NoGradGuard no_grad;
  return optim::sum_of_squares(grad_blocks_, ddp_.parameters().front().second.device());
}

void ZeroOptimizer::step() {
  DPT_CHECK(when_ == UpdateTiming::OnStep, "ZeroOptimizer::step: the update already runs inside backward");
  if (!inner_->take_gate()) return;  // every rank reads the same gate: none updates or gathers
  NoGradGuard no_grad;
  wait_for_parameters();  // the last step's gathers, which read the blocks these updates write, have ended
  inner_->begin_step();
  for (size_t b : step_order_) {
    inner_->update(pieces_[b]);
    std::shared_ptr<Work> work = gather(b);
    SideStreamGuard on_ready(*ready_stream_);
    work->wait();  // the ready stream waits (Gloo: the host; the stream and the events do nothing there)
    ready_[b].record(*ready_stream_);
  }
  for (size_t k = 0; k < waited_in_step_; ++k) ready_[step_order_[k]].wait();
}

void ZeroOptimizer::wait_for_parameters() {
  for (StreamEvent& e : ready_) e.wait();
}

void ZeroOptimizer::gather_targets() {
  wait_for_parameters();
  shard_.gather_targets(*ddp_.process_group(), ddp_.parameters());
}

NamedTensors ZeroOptimizer::full_state_dict() {
  wait_for_parameters();
  return shard_.full_state_dict(*inner_, *ddp_.process_group(), ddp_.parameters());
}

void ZeroOptimizer::load_full_state_dict(const NamedTensors& full) {
  wait_for_parameters();
  shard_.load_full_state_dict(*inner_, full);
}

}  // namespace dpt::dist
