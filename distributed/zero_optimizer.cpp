#include "distributed/zero_optimizer.h"

#include <algorithm>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>

#include "core/autograd.h"
#include "core/error.h"

namespace dpt::dist {

namespace {

// A 1-D view of elements [begin, end) of contiguous `t`, outside autograd.
Tensor flat_range(const Tensor& t, int64_t begin, int64_t end) {
  return make_view(t, {end - begin}, {1}, t.impl()->offset + begin);
}

}  // namespace

ZeroOptimizer::ZeroOptimizer(DistributedDataParallel& ddp, const std::vector<optim::ParamGroup>& groups,
                             const Factory& make)
    : ddp_(ddp) {
  NoGradGuard no_grad;
  ddp_.shard_buckets();
  std::unordered_map<std::string, std::pair<size_t, Tensor>> target_of;  // name -> (group, updated tensor)
  for (size_t g = 0; g < groups.size(); ++g)
    for (const auto& [name, t] : groups[g].params) target_of.emplace(name, std::make_pair(g, t));

  std::vector<optim::ParamGroup> piece_groups;
  for (const auto& g : groups) piece_groups.push_back({{}, g.weight_decay, g.lr_scale});
  NamedTensors twins;
  std::set<std::string> covered;
  const NamedTensors& params = ddp_.parameters();
  const int64_t world = ddp_.process_group()->size();
  const int64_t rank = ddp_.process_group()->rank();
  pieces_.resize(ddp_.num_buckets());
  for (size_t b = 0; b < ddp_.num_buckets(); ++b) {
    const GradBucket& bucket = ddp_.bucket(b);
    const int64_t block = bucket.buffer.numel() / world;
    const int64_t mine_begin = rank * block, mine_end = mine_begin + block;
    for (size_t j = 0; j < bucket.params.size(); ++j) {
      const auto& [name, p] = params[bucket.params[j]];
      auto it = target_of.find(name);
      DPT_CHECK(it != target_of.end(), "ZeroOptimizer: DDP parameter '{}' is in none of the optimizer's groups", name);
      const Tensor& target = it->second.second;
      DPT_CHECK(target.numel() == p.numel() && target.is_contiguous() && target.device() == p.device(),
                "ZeroOptimizer: '{}' to update is {} on {}, expected a contiguous tensor like DDP's {} on {}", name,
                shape_str(target.shape()), target.device().str(), shape_str(p.shape()), p.device().str());
      covered.insert(name);
      // The part of this parameter inside this rank's block, in parameter and in bucket coordinates.
      const int64_t offset = bucket.offsets[j];
      const int64_t lo = std::max(offset, mine_begin), hi = std::min(offset + p.numel(), mine_end);
      if (lo >= hi) continue;
      const std::string piece_name = fmt::format("{}[{}:{}]", name, lo - offset, hi - offset);
      Tensor piece = flat_range(target, lo - offset, hi - offset);
      piece.requires_grad_(true);
      Tensor grad = flat_range(bucket.buffer, lo, hi);  // the reduce-scattered average lands here
      if (target.same(p)) {
        piece.set_grad(grad);
      } else {  // mixed precision: DDP's parameter is the compute twin of the float32 master
        Tensor twin = flat_range(p, lo - offset, hi - offset);
        twin.set_grad(grad);
        twins.emplace_back(piece_name, twin);
      }
      piece_groups[it->second.first].params.emplace_back(piece_name, piece);
      pieces_[b].push_back(piece);
      sharded_elements_ += hi - lo;
    }
  }
  for (const auto& [name, entry] : target_of)
    DPT_CHECK(covered.count(name), "ZeroOptimizer: optimizer parameter '{}' is not one of DDP's parameters", name);
  size_t n_pieces = 0;
  for (const auto& g : piece_groups) n_pieces += g.params.size();
  DPT_CHECK(twins.empty() || twins.size() == n_pieces,
            "ZeroOptimizer: either every parameter has a float32 master or none does ({} of {} have one)",
            twins.size(), n_pieces);
  inner_ = make(std::move(piece_groups));
  DPT_CHECK(inner_ != nullptr, "ZeroOptimizer: the optimizer factory returned nothing");
  if (!twins.empty()) inner_->set_compute_twins(twins);
  ddp_.set_bucket_reduced_hook([this](size_t bucket, const std::vector<Tensor>&) { on_bucket_reduced(bucket); });
}

ZeroOptimizer::~ZeroOptimizer() { ddp_.set_bucket_reduced_hook(nullptr); }

// Runs at the end of backward once the compute stream waits for bucket b's reduce-scatter (ddp.h).
void ZeroOptimizer::on_bucket_reduced(size_t b) {
  NoGradGuard no_grad;
  if (b == 0) inner_->begin_step();
  inner_->update(pieces_[b]);
  const GradBucket& bucket = ddp_.bucket(b);
  const auto& group = ddp_.process_group();
  const int64_t block = bucket.param_buffer.numel() / group->size();
  const int64_t mine = group->rank() * block;
  // Queued after update(b) on the compute stream (the process group orders its stream after ours).
  gathers_.push_back(group->allgather(bucket.param_buffer, bucket.param_buffer.slice(mine, mine + block)));
  if (b + 1 == ddp_.num_buckets()) {
    for (auto& w : gathers_) w->wait();  // CUDA: the compute stream waits; Gloo: the host does
    gathers_.clear();
  }
}

}  // namespace dpt::dist
