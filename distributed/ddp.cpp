#include "distributed/ddp.h"

#include <algorithm>
#include <numeric>
#include <sstream>

#include "core/autograd.h"
#include "core/error.h"
#include "core/factory.h"
#include "distributed/allreduce_exchange.h"

namespace dpt::dist {

// Events of one synchronised backward (CUDA; on the CPU they record nothing): a start mark, one
// launch/end pair per bucket, and the end of backward. The end event of a bucket is recorded on a side
// stream that only waits for that bucket's exchange, so it fires when the communication finished, whatever
// compute is doing.
struct DistributedDataParallel::TimingState {
  struct Bucket {
    size_t index;
    StreamEvent launch, end;
  };
  Device device;
  StreamEvent start;
  std::unique_ptr<StreamEvent> backward_end;  // compute stream, before it waits for communication
  std::vector<Bucket> buckets;
  SideStream probe;
  explicit TimingState(Device d) : device(d), start(d, true), probe(d) {}
};

namespace {

std::string describe_params(const NamedTensors& params) {
  std::ostringstream os;
  for (const auto& [name, t] : params)
    os << name << ' ' << shape_str(t.shape()) << ' ' << dtype_name(t.dtype()) << '\n';
  return os.str();
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream is(text);
  for (std::string line; std::getline(is, line);) lines.push_back(line);
  return lines;
}

size_t cap_bytes(double mb) { return static_cast<size_t>(mb * 1024 * 1024); }

NamedTensors trainable(const NamedTensors& params) {
  NamedTensors out;
  for (const auto& p : params) {
    if (p.second.requires_grad()) out.push_back(p);
  }
  return out;
}

}  // namespace

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<nn::Module> module,
                                                 std::shared_ptr<ProcessGroup> group, DDPOptions options)
    : DistributedDataParallel(module->named_parameters(), module->named_buffers(), std::move(group), options) {
  module_ = std::move(module);
}

DistributedDataParallel::DistributedDataParallel(NamedTensors params, NamedTensors buffers,
                                                 std::shared_ptr<ProcessGroup> group, DDPOptions options)
    : params_(trainable(params)), buffers_(std::move(buffers)), group_(std::move(group)), options_(options) {
  DPT_CHECK(group_ != nullptr, "DistributedDataParallel: no process group");
  DPT_CHECK(options_.bucket_cap_mb > 0 && options_.first_bucket_mb > 0,
            "DistributedDataParallel: bucket sizes must be positive (bucket_cap_mb {}, first_bucket_mb {})",
            options_.bucket_cap_mb, options_.first_bucket_mb);
  verify_same_model_across_ranks();
  broadcast_from_rank0();
  exchange_ = std::make_unique<AllReduceExchange>(group_, options_.comm_dtype);
  std::vector<size_t> reverse(params_.size());
  std::iota(reverse.rbegin(), reverse.rend(), size_t{0});
  build_buckets(reverse);
  register_hooks();
  callback_id_ = add_backward_end_callback([alive = alive_] {
    if (*alive) (*alive)->finish_backward();
  });
}

DistributedDataParallel::~DistributedDataParallel() {
  *alive_ = nullptr;
  remove_backward_end_callback(callback_id_);
}

// Every rank publishes its parameter list; every rank compares all lists with rank 0's, so a mismatch
// is reported on every rank (not just the odd one out, which would leave the others hanging).
void DistributedDataParallel::verify_same_model_across_ranks() {
  Store& store = *group_->store();
  std::string prefix = "ddp/" + std::to_string(instance_id()) + "/params/";
  store.set(prefix + std::to_string(group_->rank()), describe_params(params_));
  std::vector<std::string> mine = split_lines(store.get(prefix + "0"));
  std::string problem;
  for (int r = 1; r < group_->size() && problem.empty(); ++r) {
    std::vector<std::string> theirs = split_lines(store.get(prefix + std::to_string(r)));
    size_t n = std::max(mine.size(), theirs.size());
    for (size_t i = 0; i < n; ++i) {
      std::string a = i < mine.size() ? mine[i] : "(none)";
      std::string b = i < theirs.size() ? theirs[i] : "(none)";
      if (a != b) {
        problem = fmt::format(
            "rank {} has a different model than rank 0: parameter #{} is '{}' on rank 0 but "
            "'{}' on rank {}",
            r, i, a, b, r);
        break;
      }
    }
  }
  // Nobody leaves (rank 0 hosts the store) until every rank has read every list.
  store.barrier(prefix + "checked");
  DPT_CHECK(problem.empty(), "DistributedDataParallel: {}", problem);
}

uint64_t DistributedDataParallel::instance_id() {
  // Same value on every rank as long as every rank builds its DDP wrappers in the same order.
  static uint64_t next = 0;
  if (!instance_id_) instance_id_ = ++next;
  return *instance_id_;
}

void DistributedDataParallel::broadcast_from_rank0() {
  NoGradGuard no_grad;
  std::vector<std::shared_ptr<Work>> works;
  for (const auto& [name, p] : params_) works.push_back(group_->broadcast(p.detach(), 0));
  if (options_.broadcast_buffers) {
    for (const auto& [name, b] : buffers_) works.push_back(group_->broadcast(b.detach(), 0));
  }
  for (auto& w : works) w->wait();
}

void DistributedDataParallel::build_buckets(const std::vector<size_t>& order) {
  NoGradGuard no_grad;
  std::vector<Tensor> tensors;
  for (const auto& p : params_) tensors.push_back(p.second);
  const std::vector<BucketSpec> specs =
      assign_buckets(tensors, order, cap_bytes(options_.first_bucket_mb), cap_bytes(options_.bucket_cap_mb));
  BucketLayout layout = exchange_->lay_out(params_, specs);
  buckets_ = std::move(layout.buckets);
  grads_ = std::move(layout.grads);
  // A parameter's first bucket holds its start (offset >= 0); a later one may hold the rest of it.
  first_bucket_of_.assign(params_.size(), 0);
  last_bucket_of_.assign(params_.size(), 0);
  for (const GradBucket& bucket : buckets_) {
    for (size_t j = 0; j < bucket.params.size(); ++j) {
      if (bucket.offsets[j] >= 0) first_bucket_of_[bucket.params[j]] = bucket.index;
      last_bucket_of_[bucket.params[j]] = bucket.index;
    }
  }
  // Gradients already accumulated (a rebuild mid-run) move into the new buckets.
  for (size_t i = 0; i < params_.size(); ++i) bind_grad_to_bucket(i);
  ready_.assign(params_.size(), false);
  next_to_launch_ = 0;
}

void DistributedDataParallel::set_exchange(std::unique_ptr<BucketExchange> exchange) {
  DPT_CHECK(exchange != nullptr, "DistributedDataParallel::set_exchange: no exchange");
  DPT_CHECK(!in_backward_, "DistributedDataParallel::set_exchange: called during backward");
  exchange_ = std::move(exchange);
  if (!exchange_->rebuildable()) {
    rebuilt_ = true;  // the layout is frozen from here on
    ready_order_.clear();
  }
  // The current order, each parameter once (a sharded layout lists a straddling parameter in two buckets).
  std::vector<size_t> order;
  std::vector<bool> seen(params_.size(), false);
  for (const auto& b : buckets_) {
    for (size_t i : b.params) {
      if (!seen[i]) order.push_back(i);
      seen[i] = true;
    }
  }
  build_buckets(order);
}

// The communicated buffer must be the one the optimizer reads: a gradient replaced behind our back
// (zero_grad(set_to_none), user code) is copied into the bucket, a missing one becomes zeros there.
void DistributedDataParallel::bind_grad_to_bucket(size_t param_index) {
  const Tensor& p = params_[param_index].second;
  Tensor view = grads_[param_index];
  Tensor grad = p.grad();
  if (grad.defined() && grad.data_ptr() == view.data_ptr()) return;
  if (grad.defined()) {
    view.copy_(grad);
  } else {
    view.zero_();
  }
  p.set_grad(view);
}

void DistributedDataParallel::register_hooks() {
  for (size_t i = 0; i < params_.size(); ++i) {
    params_[i].second.register_grad_ready_hook([alive = alive_, i](const Tensor&) {
      if (*alive) (*alive)->on_grad_ready(i);
    });
  }
}

void DistributedDataParallel::on_grad_ready(size_t param_index) {
  if (!sync_enabled_) return;
  if (!in_backward_) {
    in_backward_ = true;
    const Device device = params_[0].second.device();
    if (record_timing_ && device.is_cuda()) {
      timing_ = std::make_unique<TimingState>(device);
      timing_->start.record();
    }
  }
  bind_grad_to_bucket(param_index);
  DPT_CHECK(!ready_[param_index],
            "DistributedDataParallel: the gradient of '{}' became final twice in one backward (a parameter "
            "used in two backward passes without a step in between needs no_sync())",
            params_[param_index].first);
  ready_[param_index] = true;
  if (!rebuilt_) ready_order_.push_back(param_index);
  for (size_t b = first_bucket_of_[param_index]; b <= last_bucket_of_[param_index]; ++b) --buckets_[b].pending;
  launch_ready_buckets();
}

void DistributedDataParallel::launch_ready_buckets() {
  while (next_to_launch_ < buckets_.size() && buckets_[next_to_launch_].pending == 0) {
    launch(buckets_[next_to_launch_]);
    ++next_to_launch_;
  }
}

void DistributedDataParallel::launch(GradBucket& bucket) {
  NoGradGuard no_grad;
  if (!timing_) {
    exchange_->launch(bucket);
    return;
  }
  TimingState::Bucket timed{bucket.index, StreamEvent(timing_->device, true), StreamEvent(timing_->device, true)};
  timed.launch.record();
  exchange_->launch(bucket);
  {
    SideStreamGuard on_probe(timing_->probe);
    bucket.work->wait();  // the probe stream (only) waits for the exchange
    timed.end.record(timing_->probe);
  }
  timing_->buckets.push_back(std::move(timed));
}

void DistributedDataParallel::finish_backward() {
  if (!in_backward_) return;  // a backward that reached none of our parameters, or inside no_sync
  in_backward_ = false;
  if (timing_) {
    timing_->backward_end = std::make_unique<StreamEvent>(timing_->device, true);
    timing_->backward_end->record();
  }
  // Parameters that got no gradient: with find_unused_parameters their (zero) gradients are
  // communicated so every rank still runs the same collectives; otherwise it is the user's error.
  std::vector<std::string> unused;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (ready_[i]) continue;
    if (!options_.find_unused_parameters) {
      unused.push_back(params_[i].first);
      continue;
    }
    bind_grad_to_bucket(i);
    ready_[i] = true;
    for (size_t b = first_bucket_of_[i]; b <= last_bucket_of_[i]; ++b) --buckets_[b].pending;
  }
  if (!unused.empty()) {
    std::string names;
    for (size_t i = 0; i < unused.size() && i < 8; ++i) names += (i ? ", " : "") + unused[i];
    for (auto& b : buckets_) b.pending = b.params.size();
    ready_.assign(params_.size(), false);
    next_to_launch_ = 0;
    DPT_FAIL(
        "DistributedDataParallel: {} parameter(s) received no gradient in this backward ({}); construct "
        "DDP with find_unused_parameters = true if the model skips parameters",
        unused.size(), names);
  }
  launch_ready_buckets();

  // The compute stream waits on every exchange (CUDA: event waits; Gloo: the host waits).
  NoGradGuard no_grad;
  for (GradBucket& bucket : buckets_) {
    bucket.pending = bucket.params.size();
    exchange_->finish(bucket);
    bucket.work.reset();
  }
  exchange_->finish_backward();
  ready_.assign(params_.size(), false);
  next_to_launch_ = 0;
  if (timing_) finished_timing_ = std::move(timing_);
  if (options_.rebuild_buckets && !rebuilt_) rebuild_from_observed_order();
}

// Rank 0's observed order decides: each rank may see a slightly different order (e.g. ties broken by
// timing), and buckets must be identical everywhere.
void DistributedDataParallel::rebuild_from_observed_order() {
  rebuilt_ = true;
  std::vector<size_t> order = ready_order_;
  // Parameters never seen ready (unused this time) go last, in reverse registration order.
  std::vector<bool> seen(params_.size(), false);
  for (size_t i : order) seen[i] = true;
  for (size_t i = params_.size(); i-- > 0;) {
    if (!seen[i]) order.push_back(i);
  }
  std::vector<int64_t> as_int(order.begin(), order.end());
  Tensor shared = from_vector(as_int, {static_cast<int64_t>(as_int.size())}, TensorOptions{}.with_dtype(DType::Int64));
  group_->broadcast(shared, 0)->wait();
  std::vector<int64_t> agreed = shared.to_vector<int64_t>();
  std::vector<size_t> rank0_order(agreed.begin(), agreed.end());
  build_buckets(rank0_order);
  ready_order_.clear();
}

std::vector<BucketTiming> DistributedDataParallel::last_timings() {
  std::vector<BucketTiming> out;
  if (!finished_timing_) return out;
  finished_timing_->backward_end->synchronize();
  for (auto& bucket : finished_timing_->buckets) {
    bucket.end.synchronize();
    out.push_back({bucket.index, finished_timing_->start.elapsed_ms(bucket.launch),
                   finished_timing_->start.elapsed_ms(bucket.end)});
  }
  backward_end_ms_ = finished_timing_->start.elapsed_ms(*finished_timing_->backward_end);
  return out;
}

}  // namespace dpt::dist
