#include "distributed/ddp.h"

#include <algorithm>
#include <numeric>
#include <sstream>

#include "core/autograd.h"
#include "core/error.h"
#include "core/factory.h"
#include "core/kernels.h"
#include "core/ops.h"
#ifdef DPT_HAVE_CUDA
#include "core/cuda/stream.h"
#include "distributed/block_average.h"
#endif

namespace dpt::dist {

// CUDA events of one synchronised backward: a start mark, one launch/end pair per bucket, and the
// end of backward. The end event of a bucket is recorded on a side stream that only waits for that
// bucket's AllReduce, so it fires when the communication finished, whatever compute is doing.
struct DistributedDataParallel::TimingState {
#ifdef DPT_HAVE_CUDA
  std::unique_ptr<cuda::CudaEvent> start;
  std::unique_ptr<cuda::CudaEvent> backward_end;  // compute stream, before it waits for communication
  std::vector<std::pair<size_t, std::pair<cuda::CudaEvent, cuda::CudaEvent>>> buckets;
  cudaStream_t probe_stream = nullptr;
  ~TimingState() {
    cuda::destroy_stream(probe_stream);
  }
#endif
};

// The side stream of HookTiming::WhenReduced.
struct DistributedDataParallel::UpdateStream {
#ifdef DPT_HAVE_CUDA
  cudaStream_t stream = nullptr;
  explicit UpdateStream(int device) : stream(cuda::create_stream(device)) {}
  ~UpdateStream() { cuda::destroy_stream(stream); }
#endif
};

namespace {

std::string describe_params(const NamedTensors& params) {
  std::ostringstream os;
  for (const auto& [name, t] : params) os << name << ' ' << shape_str(t.shape()) << ' ' << dtype_name(t.dtype()) << '\n';
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
        problem = fmt::format("rank {} has a different model than rank 0: parameter #{} is '{}' on rank 0 but "
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

const char* DistributedDataParallel::exchange_name() const {
  if (ce_group_) return "nccl (copy engines)";
  return params_.empty() || !params_.front().second.device().is_cuda() ? "gloo" : "nccl";
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
  std::vector<BucketSpec> specs = assign_buckets(tensors, order, cap_bytes(options_.first_bucket_mb),
                                                 cap_bytes(options_.bucket_cap_mb));
  if (sharded_) {
    build_sharded_buckets(specs);
    return;
  }

  std::vector<GradBucket> buckets;
  first_bucket_of_.assign(params_.size(), 0);
  last_bucket_of_.assign(params_.size(), 0);
  grad_offset_.assign(params_.size(), 0);
  for (size_t b = 0; b < specs.size(); ++b) {
    GradBucket bucket;
    bucket.params = specs[b].params;
    int64_t total = 0;
    for (size_t i : bucket.params) {
      bucket.offsets.push_back(total);
      grad_offset_[i] = total;
      total += tensors[i].numel();
    }
    const Tensor& first = tensors[bucket.params.front()];
    bucket.buffer = zeros({total}, first.options());
    if (options_.comm_dtype && *options_.comm_dtype != first.dtype()) {
      bucket.comm_buffer = zeros({total}, first.options().with_dtype(*options_.comm_dtype));
    }
    for (size_t i : bucket.params) first_bucket_of_[i] = last_bucket_of_[i] = b;
    bucket.pending = bucket.params.size();
    buckets.push_back(std::move(bucket));
  }
  buckets_ = std::move(buckets);
  // Gradients already accumulated (a rebuild mid-run) move into the new buckets.
  for (size_t i = 0; i < params_.size(); ++i) bind_grad_to_bucket(i);
  ready_.assign(params_.size(), false);
  next_to_launch_ = 0;
}

// The sharded layout: every gradient in one flat buffer, in the order of `specs` (the buckets
// assign_buckets would make), and the parameters moved (same handles, new storage: nn::replace_data) into
// a second flat buffer laid out alike, so updated blocks can be all-gathered in place. Buckets are
// consecutive ranges of the two, cut where `specs` ends a bucket, and inside a parameter larger than the
// cap every cap's worth, so a large parameter's update and all-gather start on its first part while the
// rest is still reduced. Every cut lies on a multiple of the world size: each rank owns an equal block of
// every bucket, and a parameter may straddle two buckets by a few elements (its gradient and parameter
// stay one view each). The total is padded to a multiple of the world size; the padding is never a
// gradient and stays zero on every rank, so its reduced value is zero too.
void DistributedDataParallel::build_sharded_buckets(const std::vector<BucketSpec>& specs) {
  if (params_.empty()) return;
  const Tensor& first = params_.front().second;
  first_bucket_of_.assign(params_.size(), 0);
  last_bucket_of_.assign(params_.size(), 0);
  grad_offset_.assign(params_.size(), 0);
  // 1. The flat order (specs' order), each gradient's offset in it, and where buckets may end.
  std::vector<size_t> order;
  std::vector<int64_t> cuts;  // before rounding to the world size
  const int64_t cap =
      std::max<int64_t>(1, static_cast<int64_t>(cap_bytes(options_.bucket_cap_mb) / dtype_size(first.dtype())));
  int64_t total = 0;
  for (const auto& spec : specs) {
    for (size_t i : spec.params) {
      const Tensor& p = params_[i].second;
      DPT_CHECK(p.numel() > 0, "DistributedDataParallel::shard_buckets: parameter '{}' has no elements",
                params_[i].first);
      DPT_CHECK(p.dtype() == first.dtype() && p.device() == first.device(),
                "DistributedDataParallel::shard_buckets: parameter '{}' is {} on {}, but '{}' is {} on {}; sharded "
                "buckets need one dtype and device",
                params_[i].first, dtype_name(p.dtype()), p.device().str(), params_.front().first,
                dtype_name(first.dtype()), first.device().str());
      grad_offset_[i] = total;
      for (int64_t part = cap; part < p.numel(); part += cap) cuts.push_back(total + part);
      total += p.numel();
      order.push_back(i);
    }
    cuts.push_back(total);
  }
  // 2. The two flat buffers, the parameters moved into theirs. Copy engines: cuts on multiples of 64 elements
  // a rank, so every block starts 16-byte aligned for the averaging kernel; the buffers in symmetric memory.
  const int64_t world = group_->size();
  const bool copy_engines = options_.copy_engines && first.device().is_cuda();
  const int64_t granule = copy_engines ? world * 64 : world;
  auto round_up = [granule](int64_t n) { return (n + granule - 1) / granule * granule; };
  const int64_t padded = round_up(total);
#ifdef DPT_HAVE_CUDA
  DPT_CHECK(!copy_engines || world <= kMaxAveragedRanks,
            "DistributedDataParallel: copy_engines averages at most {} ranks (one host's GPUs), the group has {}",
            kMaxAveragedRanks, world);
#endif
  if (copy_engines && !ce_group_) {
    ProcessGroupOptions ce_options = group_->options();
    ce_options.copy_engines = true;
    ce_group_ = group_->duplicate(ce_options);
  }
  auto flat_zeros = [&] { return copy_engines ? ce_group_->symmetric_zeros(padded, first.options())
                                              : zeros({padded}, first.options()); };
  sharded_grads_ = flat_zeros();
  Tensor values = flat_zeros();
  sharded_params_ = values;
  // The all-to-alls' receive buffer: world blocks per bucket, laid out like the gradients.
  const Tensor received = copy_engines ? flat_zeros() : Tensor();
  for (size_t i : order) {
    const Tensor& p = params_[i].second;
    Tensor slot = values.slice(grad_offset_[i], grad_offset_[i] + p.numel()).reshape(p.shape());
    slot.copy_(p);
    nn::replace_data(p, slot);
  }
  // 3. Buckets between consecutive cuts, each listing every parameter it overlaps.
  std::vector<GradBucket> buckets;
  int64_t begin = 0;
  size_t next = 0;  // first parameter (in flat order) that may overlap the next bucket
  for (int64_t cut : cuts) {
    const int64_t end = std::min(round_up(cut), padded);
    if (end <= begin) continue;
    GradBucket bucket;
    bucket.buffer = sharded_grads_.slice(begin, end);
    bucket.param_buffer = values.slice(begin, end);
    if (copy_engines) bucket.received = received.slice(begin, end);
    while (next < order.size() && grad_offset_[order[next]] + params_[order[next]].second.numel() <= begin) ++next;
    for (size_t k = next; k < order.size() && grad_offset_[order[k]] < end; ++k) {
      const size_t i = order[k];
      bucket.params.push_back(i);
      bucket.offsets.push_back(grad_offset_[i] - begin);  // negative for a parameter begun in an earlier bucket
      if (grad_offset_[i] >= begin) first_bucket_of_[i] = buckets.size();
      last_bucket_of_[i] = buckets.size();
    }
    bucket.pending = bucket.params.size();
    buckets.push_back(std::move(bucket));
    begin = end;
  }
  buckets_ = std::move(buckets);
  for (size_t i = 0; i < params_.size(); ++i) bind_grad_to_bucket(i);
  ready_.assign(params_.size(), false);
  next_to_launch_ = 0;
}

void DistributedDataParallel::shard_buckets() {
  DPT_CHECK(!in_backward_, "DistributedDataParallel::shard_buckets: called during backward");
  DPT_CHECK(!options_.comm_dtype || *options_.comm_dtype == params_.front().second.dtype(),
            "DistributedDataParallel::shard_buckets: comm_dtype is not supported with sharded buckets");
  if (sharded_) return;
  sharded_ = true;
  rebuilt_ = true;  // the layout is frozen from here on
  ready_order_.clear();
  std::vector<size_t> order;
  for (const auto& b : buckets_) order.insert(order.end(), b.params.begin(), b.params.end());
  build_buckets(order);
}

Tensor DistributedDataParallel::bucket_view(size_t param_index) const {
  const Tensor& buffer = sharded_ ? sharded_grads_ : buckets_[first_bucket_of_[param_index]].buffer;
  const Tensor& p = params_[param_index].second;
  const int64_t offset = grad_offset_[param_index];
  return buffer.slice(offset, offset + p.numel()).reshape(p.shape());
}

// The communicated buffer must be the one the optimizer reads: a gradient replaced behind our back
// (zero_grad(set_to_none), user code) is copied into the bucket, a missing one becomes zeros there.
void DistributedDataParallel::bind_grad_to_bucket(size_t param_index) {
  const Tensor& p = params_[param_index].second;
  Tensor view = bucket_view(param_index);
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
#ifdef DPT_HAVE_CUDA
    if (record_timing_ && params_[0].second.device().is_cuda()) {
      timing_ = std::make_unique<TimingState>();
      timing_->start = std::make_unique<cuda::CudaEvent>(true);
      timing_->start->record();
      timing_->probe_stream = cuda::create_stream(params_[0].second.device().index);
    }
#endif
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
  // Averaging. NCCL (CUDA buckets): ncclAvg scales by 1/world inside the reduction kernel, so the
  // bucket is not read and written once more on the compute stream. Gloo: pre-scale by 1/world, then
  // sum. Both are exact for power-of-two worlds and keep bf16 sums in range.
  const bool nccl_average = bucket.buffer.device().is_cuda();
  if (!nccl_average) kernels::unary(kernels::UnaryOp::Scale, bucket.buffer, bucket.buffer, 1.0 / group_->size());
  Tensor payload = bucket.buffer;
  if (bucket.comm_buffer.defined()) {
    bucket.comm_buffer.copy_(bucket.buffer);
    payload = bucket.comm_buffer;
  }
#ifdef DPT_HAVE_CUDA
  std::unique_ptr<cuda::CudaEvent> launch_event;
  if (timing_) {
    launch_event = std::make_unique<cuda::CudaEvent>(true);
    launch_event->record();
  }
#endif
  const ReduceOp op = nccl_average ? ReduceOp::Avg : ReduceOp::Sum;
  const size_t index = static_cast<size_t>(&bucket - buckets_.data());
  if (sharded_) {
    // In place: this rank's block of the bucket receives the average of every rank's block (NCCL and our
    // Gloo backend both accept the output inside the input at offset rank * block).
    const int64_t block = payload.numel() / group_->size();
    const int64_t mine = group_->rank() * block;
    if (bucket.received.defined()) {
      // Every rank's block r lands in rank r's receive buffer; take_reduced() averages them after `work`.
      bucket.work = ce_group_->alltoall(bucket.received, payload);
    } else {
      bucket.work = group_->reduce_scatter(payload.slice(mine, mine + block), payload, op);
    }
  } else {
    bucket.work = group_->allreduce(payload, op);
  }
#ifdef DPT_HAVE_CUDA
  if (timing_) {
    cuda::CudaEvent end_event(true);
    {
      cuda::StreamGuard on_probe(timing_->probe_stream);
      bucket.work->wait();  // the probe stream (only) waits for the AllReduce
      end_event.record(timing_->probe_stream);
    }
    timing_->buckets.emplace_back(index, std::make_pair(std::move(*launch_event), std::move(end_event)));
  }
#endif
  if (bucket_hook_ && hook_timing_ == HookTiming::WhenReduced && bucket.buffer.device().is_cuda()) {
    run_hook_when_reduced(index, bucket);
  }
}

// The current stream waits for the bucket's exchange, then makes its result the bucket's gradients.
void DistributedDataParallel::take_reduced(GradBucket& bucket) {
  bucket.work->wait();
  average_received(bucket);
  if (bucket.comm_buffer.defined()) bucket.buffer.copy_(bucket.comm_buffer);
}

// On the stream that just waited for the bucket's all-to-all: this rank's block of the bucket becomes the
// mean of every rank's copy of it, summed in rank order in float32 (the same on every rank, and for two
// ranks the correctly rounded mean, as ncclAvg gives).
void DistributedDataParallel::average_received(GradBucket& bucket) {
  if (!bucket.received.defined()) return;
#ifdef DPT_HAVE_CUDA
  const int world = group_->size();
  const int64_t block = bucket.buffer.numel() / world;
  const size_t bytes = static_cast<size_t>(block) * dtype_size(bucket.buffer.dtype());
  std::vector<const void*> copies;
  for (int r = 0; r < world; ++r) copies.push_back(static_cast<const char*>(bucket.received.data_ptr()) + r * bytes);
  void* mine = static_cast<char*>(bucket.buffer.data_ptr()) + group_->rank() * bytes;
  block_average(mine, copies, block, bucket.buffer.dtype(), cuda::current_stream(bucket.buffer.device().index));
#endif
}

std::vector<Tensor> DistributedDataParallel::bucket_params(const GradBucket& bucket) const {
  std::vector<Tensor> params;
  for (size_t i : bucket.params) params.push_back(params_[i].second);
  return params;
}

// Stream order: update stream waits for the bucket's AllReduce, then runs the hook's kernels; the
// compute stream joins the update stream in finish_backward, before anything reads the parameters.
void DistributedDataParallel::run_hook_when_reduced(size_t index, GradBucket& bucket) {
#ifdef DPT_HAVE_CUDA
  const int device = bucket.buffer.device().index;
  if (!update_stream_) update_stream_ = std::make_unique<UpdateStream>(device);
  cuda::StreamGuard on_updates(update_stream_->stream, device);  // the form allowed during graph capture
  take_reduced(bucket);
  bucket_hook_(index, bucket_params(bucket));
  bucket.hooked = true;
#else
  (void)index;
  (void)bucket;
#endif
}

void DistributedDataParallel::finish_backward() {
  if (!in_backward_) return;  // a backward that reached none of our parameters, or inside no_sync
  in_backward_ = false;
#ifdef DPT_HAVE_CUDA
  if (timing_) {
    timing_->backward_end = std::make_unique<cuda::CudaEvent>(true);
    timing_->backward_end->record();
  }
#endif
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
    for (auto& b : buckets_) {
      b.pending = b.params.size();
      b.hooked = false;
    }
    ready_.assign(params_.size(), false);
    next_to_launch_ = 0;
    DPT_FAIL("DistributedDataParallel: {} parameter(s) received no gradient in this backward ({}); construct "
             "DDP with find_unused_parameters = true if the model skips parameters",
             unused.size(), names);
  }
  launch_ready_buckets();

  // The compute stream waits on every AllReduce (CUDA: event waits; Gloo: the host waits).
  NoGradGuard no_grad;
  bool joined_updates = false;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    GradBucket& bucket = buckets_[b];
    bucket.pending = bucket.params.size();
    if (bucket.hooked) {  // waited for, and its hook ran, on the update stream (joined below)
      bucket.hooked = false;
      bucket.work.reset();
      joined_updates = true;
      continue;
    }
    take_reduced(bucket);
    bucket.work.reset();
    if (bucket_hook_) bucket_hook_(b, bucket_params(bucket));
  }
#ifdef DPT_HAVE_CUDA
  if (joined_updates) {
    cuda::CudaEvent updates_done(false, buckets_.front().buffer.device().index);
    updates_done.record(update_stream_->stream);
    updates_done.wait();
  }
#endif
  (void)joined_updates;
  ready_.assign(params_.size(), false);
  next_to_launch_ = 0;
#ifdef DPT_HAVE_CUDA
  if (timing_) finished_timing_ = std::move(timing_);
#endif
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

std::vector<std::vector<std::string>> DistributedDataParallel::bucket_layout() const {
  std::vector<std::vector<std::string>> layout;
  for (const auto& b : buckets_) {
    layout.emplace_back();
    for (size_t i : b.params) layout.back().push_back(params_[i].first);
  }
  return layout;
}

std::vector<BucketTiming> DistributedDataParallel::last_timings() {
  std::vector<BucketTiming> out;
#ifdef DPT_HAVE_CUDA
  if (!finished_timing_) return out;
  finished_timing_->backward_end->synchronize();
  for (auto& [index, events] : finished_timing_->buckets) {
    events.second.synchronize();
    out.push_back({index, finished_timing_->start->elapsed_ms(events.first),
                   finished_timing_->start->elapsed_ms(events.second)});
  }
  backward_end_ms_ = finished_timing_->start->elapsed_ms(*finished_timing_->backward_end);
#endif
  return out;
}

}  // namespace dpt::dist
