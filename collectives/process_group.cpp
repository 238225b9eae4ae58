#include "collectives/process_group.h"

#include <algorithm>
#include <cstdlib>

#include "core/factory.h"
#include "core/flags.h"
#include "rendezvous/socket.h"

namespace dpt::dist {
namespace {

void check_tensor(const Tensor& t, const char* op, const char* role) {
  DPT_CHECK(t.defined(), "{}: the {} tensor is undefined", op, role);
  DPT_CHECK(t.is_contiguous(), "{}: the {} tensor must be contiguous, found shape {} with strides {}", op, role,
            fmt::join(t.shape(), "x"), fmt::join(t.strides(), ","));
}

// An operation with an output and an input tensor: both well-formed, of one dtype, on one device.
void check_output_and_input(const Tensor& output, const Tensor& input, const char* op) {
  check_tensor(output, op, "output");
  check_tensor(input, op, "input");
  DPT_CHECK(output.dtype() == input.dtype(), "{}: output dtype {} differs from input dtype {}", op,
            dtype_name(output.dtype()), dtype_name(input.dtype()));
  DPT_CHECK(output.device() == input.device(), "{}: output on {} but input on {}", op, output.device().str(),
            input.device().str());
}

void check_reduce_op(DType dtype, ReduceOp op, const char* name) {
  DPT_CHECK(op != ReduceOp::Avg || is_floating(dtype), "{}: avg needs a floating-point tensor, found {}", name,
            dtype_name(dtype));
}

std::string tensor_detail(const Tensor& t) {
  return fmt::format("{} x {} on {}", t.numel(), dtype_name(t.dtype()), t.device().str());
}

}  // namespace

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Max: return "max";
    case ReduceOp::Min: return "min";
  }
  return "?";
}

ProcessGroup::ProcessGroup(std::shared_ptr<Store> store, int rank, int size, ProcessGroupOptions options,
                           std::string local_host)
    : store_(std::move(store)), rank_(rank), size_(size), options_(std::move(options)),
      local_host_(std::move(local_host)) {
  DPT_CHECK(size_ >= 1 && rank_ >= 0 && rank_ < size_, "process group: rank {} is outside a group of size {}",
            rank_, size_);
  DPT_CHECK(options_.backend == "auto" || options_.backend == "gloo" || options_.backend == "nccl",
            "process group: backend must be auto, gloo or nccl, found '{}'", options_.backend);
  if (flag_on(Flag::DebugCollectives)) options_.debug_collectives = true;
  if (local_host_.empty()) local_host_ = "127.0.0.1";
}

ProcessGroup::~ProcessGroup() = default;

Backend& ProcessGroup::backend_for(Device device) {
  std::lock_guard<std::mutex> lock(mutex_);
  bool use_nccl = options_.backend == "nccl" || (options_.backend == "auto" && device.is_cuda());
  BackendOptions bo;
  bo.timeout = options_.timeout;
  bo.setup_timeout = options_.store_timeout;
  bo.device = options_.cuda_device >= 0 ? options_.cuda_device : (device.is_cuda() ? device.index : -1);
  bo.local_host = local_host_;
  bo.copy_engines = options_.copy_engines;
  if (use_nccl) {
    DPT_CHECK(device.is_cuda(), "process group: the NCCL backend needs CUDA tensors, found a tensor on {}",
              device.str());
    if (!nccl_) nccl_ = make_nccl_backend(std::make_shared<PrefixStore>("nccl", store_), rank_, size_, bo);
    return *nccl_;
  }
  DPT_CHECK(device.is_cpu(), "process group: the Gloo backend needs CPU tensors, found a tensor on {} (use the "
            "nccl or auto backend for CUDA tensors)", device.str());
  if (!gloo_) gloo_ = make_gloo_backend(std::make_shared<PrefixStore>("gloo", store_), rank_, size_, bo);
  return *gloo_;
}

std::string ProcessGroup::backend_name(Device device) { return backend_for(device).name(); }

OpDesc ProcessGroup::next_op(const std::string& name, const std::string& detail, bool async_op) {
  std::lock_guard<std::mutex> lock(mutex_);
  OpDesc d;
  d.seq = ++seq_;
  d.name = name;
  d.description = fmt::format("{} #{} ({}) on rank {} of {}", name, d.seq, detail, rank_, size_);
  d.on_caller_stream = !async_op;
  return d;
}

void ProcessGroup::check_agreement(const OpDesc& desc, const std::string& fingerprint) {
  std::string base = "debug/" + std::to_string(desc.seq) + "/";
  store_->set(base + std::to_string(rank_), fingerprint);
  std::vector<std::string> keys;
  for (int r = 0; r < size_; ++r) keys.push_back(base + std::to_string(r));
  auto missing = store_->wait_for(keys, options_.store_timeout);
  if (!missing.empty()) {
    std::vector<int> ranks;
    for (const auto& k : missing) ranks.push_back(std::stoi(k.substr(base.size())));
    DPT_FAIL("collective check: rank(s) {} never reached collective #{} within {} ms (rank {} is at {}); they "
             "issued fewer collectives or are stuck",
             fmt::join(ranks, ", "), desc.seq, options_.store_timeout.count(), rank_, fingerprint);
  }
  std::string first = store_->get(keys[0]);
  for (int r = 1; r < size_; ++r) {
    std::string other = store_->get(keys[r]);
    if (other != first) {
      DPT_FAIL("collective mismatch at sequence number {}: rank 0 calls {} but rank {} calls {} (every rank must "
               "issue the same collectives in the same order)",
               desc.seq, first, r, other);
    }
  }
}

std::shared_ptr<Work> ProcessGroup::allreduce(const Tensor& tensor, ReduceOp op, bool async_op) {
  check_tensor(tensor, "allreduce", "input");
  check_reduce_op(tensor.dtype(), op, "allreduce");
  auto desc = next_op("allreduce", fmt::format("{}, {}", reduce_op_name(op), tensor_detail(tensor)), async_op);
  if (options_.debug_collectives)
    check_agreement(desc, fmt::format("allreduce({}) of {} x {}", reduce_op_name(op), tensor.numel(),
                                      dtype_name(tensor.dtype())));
  return backend_for(tensor.device()).allreduce({tensor}, op, desc);
}

std::shared_ptr<Work> ProcessGroup::allreduce_coalesced(const std::vector<Tensor>& tensors, ReduceOp op) {
  DPT_CHECK(!tensors.empty(), "allreduce_coalesced: no tensors given");
  int64_t total = 0;
  for (const auto& t : tensors) {
    check_tensor(t, "allreduce_coalesced", "input");
    check_reduce_op(t.dtype(), op, "allreduce_coalesced");
    DPT_CHECK(t.device() == tensors[0].device(), "allreduce_coalesced: tensors must share one device, found {} and {}",
              tensors[0].device().str(), t.device().str());
    total += t.numel();
  }
  auto desc = next_op("allreduce_coalesced", fmt::format("{}, {} tensors, {} elements on {}", reduce_op_name(op),
                                                         tensors.size(), total, tensors[0].device().str()));
  if (options_.debug_collectives) {
    std::string fp = fmt::format("allreduce_coalesced({}) of {} tensors:", reduce_op_name(op), tensors.size());
    for (const auto& t : tensors) fp += fmt::format(" {}x{}", t.numel(), dtype_name(t.dtype()));
    check_agreement(desc, fp);
  }
  return backend_for(tensors[0].device()).allreduce(tensors, op, desc);
}

std::shared_ptr<Work> ProcessGroup::broadcast(const Tensor& tensor, int root, bool async_op) {
  check_tensor(tensor, "broadcast", "input");
  DPT_CHECK(root >= 0 && root < size_, "broadcast: root {} is outside the group of size {}", root, size_);
  auto desc = next_op("broadcast", fmt::format("root {}, {}", root, tensor_detail(tensor)), async_op);
  if (options_.debug_collectives)
    check_agreement(desc, fmt::format("broadcast(root {}) of {} x {}", root, tensor.numel(), dtype_name(tensor.dtype())));
  return backend_for(tensor.device()).broadcast(tensor, root, desc);
}

std::shared_ptr<Work> ProcessGroup::allgather(const Tensor& output, const Tensor& input, bool async_op) {
  check_output_and_input(output, input, "allgather");
  DPT_CHECK(output.numel() == input.numel() * size_,
            "allgather: output must hold {} ranks x {} elements = {}, found {}", size_, input.numel(),
            input.numel() * size_, output.numel());
  auto desc = next_op("allgather", tensor_detail(input) + " per rank", async_op);
  if (options_.debug_collectives)
    check_agreement(desc, fmt::format("allgather of {} x {}", input.numel(), dtype_name(input.dtype())));
  return backend_for(input.device()).allgather(output, input, desc);
}

std::shared_ptr<Work> ProcessGroup::reduce_scatter(const Tensor& output, const Tensor& input, ReduceOp op,
                                                   bool async_op) {
  check_output_and_input(output, input, "reduce_scatter");
  check_reduce_op(input.dtype(), op, "reduce_scatter");
  DPT_CHECK(input.numel() == output.numel() * size_,
            "reduce_scatter: input must hold {} ranks x {} elements = {}, found {}", size_, output.numel(),
            output.numel() * size_, input.numel());
  auto desc =
      next_op("reduce_scatter", fmt::format("{}, {} per rank", reduce_op_name(op), tensor_detail(output)), async_op);
  if (options_.debug_collectives)
    check_agreement(desc, fmt::format("reduce_scatter({}) of {} x {}", reduce_op_name(op), output.numel(),
                                      dtype_name(output.dtype())));
  return backend_for(input.device()).reduce_scatter(output, input, op, desc);
}

std::shared_ptr<Work> ProcessGroup::send(const Tensor& tensor, int dst, int tag) {
  check_tensor(tensor, "send", "input");
  DPT_CHECK(dst >= 0 && dst < size_ && dst != rank_, "send: destination {} must be another rank of [0, {})", dst,
            size_);
  DPT_CHECK(tag >= 0, "send: tag must be >= 0, found {}", tag);
  // Point-to-point operations take no part in the collective sequence (only two ranks see them).
  OpDesc desc{0, "send", fmt::format("send to rank {} tag {} ({}) from rank {}", dst, tag, tensor_detail(tensor),
                                     rank_)};
  return backend_for(tensor.device()).send(tensor, dst, tag, desc);
}

std::shared_ptr<Work> ProcessGroup::recv(const Tensor& tensor, int src, int tag) {
  check_tensor(tensor, "recv", "output");
  DPT_CHECK(src >= 0 && src < size_ && src != rank_, "recv: source {} must be another rank of [0, {})", src, size_);
  DPT_CHECK(tag >= 0, "recv: tag must be >= 0, found {}", tag);
  OpDesc desc{0, "recv", fmt::format("recv from rank {} tag {} ({}) on rank {}", src, tag, tensor_detail(tensor),
                                     rank_)};
  return backend_for(tensor.device()).recv(tensor, src, tag, desc);
}

std::shared_ptr<Work> ProcessGroup::barrier() {
  Device device = Device::cpu();
  if (options_.backend == "nccl") device = Device::cuda(options_.cuda_device >= 0 ? options_.cuda_device : 0);
  auto desc = next_op("barrier", "all ranks");
  if (options_.debug_collectives) check_agreement(desc, "barrier");
  return backend_for(device).barrier(desc);
}

std::shared_ptr<Work> ProcessGroup::alltoall(const Tensor& output, const Tensor& input, bool async_op) {
  check_output_and_input(output, input, "alltoall");
  DPT_CHECK(output.numel() == input.numel() && input.numel() % size_ == 0,
            "alltoall: input and output must hold {} equal blocks each, found {} and {} elements", size_,
            input.numel(), output.numel());
  auto desc = next_op("alltoall", fmt::format("{} per rank", tensor_detail(output)), async_op);
  if (options_.debug_collectives)
    check_agreement(desc, fmt::format("alltoall of {} x {}", input.numel(), dtype_name(input.dtype())));
  return backend_for(input.device()).alltoall(output, input, desc);
}

Tensor ProcessGroup::symmetric_zeros(int64_t numel, const TensorOptions& options) {
  DPT_CHECK(numel > 0, "symmetric_zeros: {} elements", numel);
  return backend_for(options.device).symmetric_zeros(numel, options);
}

void ProcessGroup::register_symmetric(const Tensor& tensor) {
  check_tensor(tensor, "register_symmetric", "tensor");
  backend_for(tensor.device()).register_symmetric(tensor);
}

std::shared_ptr<Work> Backend::alltoall(const Tensor&, const Tensor&, const OpDesc& desc) {
  DPT_FAIL("{}: the {} backend has no alltoall (NCCL only)", desc.description, name());
}

Tensor Backend::symmetric_zeros(int64_t numel, const TensorOptions& options) { return zeros({numel}, options); }

void Backend::register_symmetric(const Tensor&) {}

std::shared_ptr<ProcessGroup> ProcessGroup::new_group(std::vector<int> ranks) {
  return new_group(std::move(ranks), options_);
}

std::shared_ptr<ProcessGroup> ProcessGroup::new_group(std::vector<int> ranks, ProcessGroupOptions options) {
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  DPT_CHECK(!ranks.empty(), "new_group: the rank list is empty");
  for (int r : ranks)
    DPT_CHECK(r >= 0 && r < size_, "new_group: rank {} is outside the parent group of size {}", r, size_);
  uint64_t id;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    id = groups_created_++;  // same on every rank because every rank calls new_group in the same order
  }
  auto it = std::find(ranks.begin(), ranks.end(), rank_);
  if (it == ranks.end()) return nullptr;
  int sub_rank = static_cast<int>(it - ranks.begin());
  int sub_size = static_cast<int>(ranks.size());
  auto sub_store = std::make_shared<PrefixStore>("group" + std::to_string(id), store_, sub_rank, sub_size);
  return std::make_shared<ProcessGroup>(sub_store, sub_rank, sub_size, std::move(options), local_host_);
}

std::shared_ptr<ProcessGroup> ProcessGroup::duplicate(ProcessGroupOptions options) {
  std::vector<int> everyone(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r) everyone[static_cast<size_t>(r)] = r;
  return new_group(std::move(everyone), std::move(options));
}

std::shared_ptr<ProcessGroup> init_process_group(const DistEnv& env, ProcessGroupOptions options) {
  auto tcp = std::make_shared<TcpStore>(tcp_store_options(env, options.store_timeout));
  // Keys of a restarted group must not meet the keys of the attempt before it.
  auto store = std::make_shared<PrefixStore>("attempt" + std::to_string(env.restart_count), tcp, env.rank,
                                             env.world_size);
  store->barrier("init_process_group");
  std::string local_host = net::local_address_towards(env.master_addr);
  return std::make_shared<ProcessGroup>(store, env.rank, env.world_size, std::move(options), local_host);
}

std::shared_ptr<ProcessGroup> init_process_group(ProcessGroupOptions options) {
  return init_process_group(read_dist_env(), std::move(options));
}

}  // namespace dpt::dist
