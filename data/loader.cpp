#include "data/loader.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>
#include <typeinfo>
#include <vector>

#include "core/cuda_runtime.h"
#include "core/error.h"
#include "core/factory.h"
#include "core/kernels.h"
#include "data/tensor_dataset.h"

#ifdef DPT_HAVE_CUDA
#include "core/cuda/check.h"
#include "core/cuda/stream.h"
#endif

namespace dpt::data {

namespace {

// A batch as the worker prepared it: host tensors, or (CUDA) the pinned slot holding its bytes.
struct Prepared {
  LoaderPosition position;
  Batch host;
  int slot = -1;
  std::exception_ptr error;
};

// The sampler indices of batch `batch` of an epoch whose visiting order is `order`.
std::vector<int64_t> batch_indices(const std::vector<int64_t>& order, int64_t batch, int64_t batch_size) {
  const auto begin = static_cast<size_t>(batch * batch_size);
  const size_t end = std::min(order.size(), begin + static_cast<size_t>(batch_size));
  return {order.begin() + static_cast<std::ptrdiff_t>(begin), order.begin() + static_cast<std::ptrdiff_t>(end)};
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Device stage: pinned buffers, the copy stream and per-slot events.
struct Loader::DeviceStage {
#ifdef DPT_HAVE_CUDA
  struct Slot {
    void* input = nullptr;
    void* target = nullptr;
    size_t input_capacity = 0;
    size_t target_capacity = 0;
    Shape input_shape, target_shape;
    DType input_dtype = DType::Float32, target_dtype = DType::Float32;
    std::unique_ptr<cuda::CudaEvent> allocated;  // recorded on the consumer stream after allocation
    std::unique_ptr<cuda::CudaEvent> copy_done;  // recorded on the copy stream after the H2D copy
  };
  struct InFlight {
    LoaderPosition position;
    Batch device;
    int slot = -1;
    std::exception_ptr error;
  };

  DeviceStage(int device, int num_slots) : device_(device), slots_(static_cast<size_t>(num_slots)) {
    cuda::DeviceGuard guard(device);
    copy_stream_ = cuda::create_stream(device, 0);
    for (Slot& s : slots_) {
      s.allocated = std::make_unique<cuda::CudaEvent>(false, device);
      s.copy_done = std::make_unique<cuda::CudaEvent>(false, device);
    }
  }

  ~DeviceStage() {
    cudaStreamSynchronize(copy_stream_);  // no pinned buffer or device batch may be freed under a running copy
    ahead_.reset();
    for (Slot& s : slots_) {
      cuda::free_pinned(s.input);
      cuda::free_pinned(s.target);
    }
    cuda::destroy_stream(copy_stream_);
  }

  int num_slots() const { return static_cast<int>(slots_.size()); }

  static void reserve(void*& buffer, size_t& capacity, size_t nbytes) {
    if (nbytes <= capacity) return;
    cuda::free_pinned(buffer);
    buffer = nullptr;
    capacity = 0;
    buffer = cuda::allocate_pinned(nbytes);
    capacity = nbytes;
  }

  // Worker thread: copy a host batch into pinned slot `slot` once its previous copy has finished.
  void fill(int slot, const Batch& host) {
    Slot& s = slots_[static_cast<size_t>(slot)];
    s.copy_done->synchronize();  // step 4 of the ordering in loader.h
    reserve(s.input, s.input_capacity, host.input.nbytes());
    reserve(s.target, s.target_capacity, host.target.nbytes());
    std::memcpy(s.input, host.input.data_ptr(), host.input.nbytes());
    std::memcpy(s.target, host.target.data_ptr(), host.target.nbytes());
    s.input_shape = host.input.shape();
    s.target_shape = host.target.shape();
    s.input_dtype = host.input.dtype();
    s.target_dtype = host.target.dtype();
  }

  // Consumer thread: steps 1 and 2 of the ordering in loader.h.
  InFlight issue(const Prepared& p) {
    if (p.error) return {p.position, {}, -1, p.error};
    Slot& s = slots_[static_cast<size_t>(p.slot)];
    const TensorOptions on_device = TensorOptions{}.with_device(Device::cuda(device_));
    Tensor input = Tensor::empty(s.input_shape, on_device.with_dtype(s.input_dtype));
    Tensor target = Tensor::empty(s.target_shape, on_device.with_dtype(s.target_dtype));
    s.allocated->record(cuda::current_stream(device_));
    s.allocated->wait(copy_stream_);
    DPT_CUDA_CHECK(cudaMemcpyAsync(input.data_ptr(), s.input, input.nbytes(), cudaMemcpyHostToDevice, copy_stream_));
    DPT_CUDA_CHECK(cudaMemcpyAsync(target.data_ptr(), s.target, target.nbytes(), cudaMemcpyHostToDevice, copy_stream_));
    s.copy_done->record(copy_stream_);
    return {p.position, {input, target}, p.slot, nullptr};
  }

  // Consumer thread: step 3 — the consumer's stream waits for the copy, the host does not.
  void make_current_stream_wait(int slot) {
    slots_[static_cast<size_t>(slot)].copy_done->wait(cuda::current_stream(device_));
  }

  // Discards the batch copied ahead. Its device memory returns to the pool on the consumer's stream,
  // so that stream first waits for the copy still writing into it.
  void drop_ahead() {
    if (ahead_ && ahead_->slot >= 0 && !ahead_->error) make_current_stream_wait(ahead_->slot);
    ahead_.reset();
  }

  int device_;
  std::vector<Slot> slots_;
  cudaStream_t copy_stream_ = nullptr;
  std::optional<InFlight> ahead_;  // the batch whose copy was issued one step early
#endif
};

// ---------------------------------------------------------------------------------------------
// Resident: the dataset's tensors on the device, and the visiting order of the epoch being served.
struct Loader::Resident {
  Tensor inputs;
  Tensor targets;
  Tensor order;  // int64 sampler indices of epoch `order_epoch`, on the device
  int64_t order_epoch = -1;
#ifdef DPT_HAVE_CUDA
  // The order goes up from page-locked memory on the consumer's stream, so the host never waits for the
  // steps queued before it (a copy from pageable memory would). The buffer is refilled only after the
  // previous epoch's copy out of it has finished, which it has long done by then.
  void* staging = nullptr;
  size_t staging_bytes = 0;
  std::unique_ptr<cuda::CudaEvent> uploaded;

  // The next batch is gathered one step ahead on a stream of its own, beside the step that uses the
  // current one, so the consumer's stream only waits for it. Ordering, as the copy stream's (loader.h):
  // its tensors are allocated on the consumer's stream and `allocated` recorded there makes the gather
  // stream wait; `gathered` makes the consumer's stream wait when the batch is handed out or dropped
  // (its memory returns to the pool on that stream). `rows` keeps the epoch order it reads alive.
  struct Ahead {
    LoaderPosition position;
    Batch batch;
    Tensor rows;
  };
  cudaStream_t gather_stream = nullptr;
  std::unique_ptr<cuda::CudaEvent> allocated;
  std::unique_ptr<cuda::CudaEvent> gathered;
  std::optional<Ahead> ahead;

  explicit Resident(int device)
      : uploaded(std::make_unique<cuda::CudaEvent>(false, device)),
        gather_stream(cuda::create_stream(device, 0)),
        allocated(std::make_unique<cuda::CudaEvent>(false, device)),
        gathered(std::make_unique<cuda::CudaEvent>(false, device)) {}
  ~Resident() {
    uploaded->synchronize();  // no pinned buffer may be freed under a running copy
    gathered->synchronize();  // nor the batch gathered ahead under its gather
    cuda::free_pinned(staging);
    ahead.reset();
    cuda::destroy_stream(gather_stream);
  }

  // The batch gathered ahead when it is the one at `position` (the consumer's stream waits for it), else
  // nothing; a batch gathered ahead for another position is dropped.
  std::optional<Batch> take_ahead(LoaderPosition position) {
    std::optional<Batch> batch;
    if (ahead && ahead->position == position) batch = std::move(ahead->batch);
    drop_ahead();
    return batch;
  }

  void drop_ahead() {
    if (!ahead) return;
    gathered->wait(cuda::current_stream());
    ahead.reset();
  }

  // `values` as an int64 tensor on `device`, ordered on the current stream like any kernel there.
  Tensor upload(const std::vector<int64_t>& values, Device device) {
    const size_t nbytes = values.size() * sizeof(int64_t);
    Tensor out = Tensor::empty({static_cast<int64_t>(values.size())},
                               TensorOptions{}.with_dtype(DType::Int64).with_device(device));
    if (nbytes == 0) return out;
    uploaded->synchronize();
    DeviceStage::reserve(staging, staging_bytes, nbytes);
    std::memcpy(staging, values.data(), nbytes);
    cuda::DeviceGuard guard(device.index);
    cudaStream_t stream = cuda::current_stream(device.index);
    DPT_CUDA_CHECK(cudaMemcpyAsync(out.data_ptr(), staging, nbytes, cudaMemcpyHostToDevice, stream));
    uploaded->record(stream);
    return out;
  }
#endif
};

// ---------------------------------------------------------------------------------------------
// Worker: the background thread and the queue of prepared batches.
struct Loader::Worker {
  std::mutex mutex;
  std::condition_variable changed;
  std::deque<Prepared> ready;
  std::deque<int> free_slots;
  bool stop = false;
  std::thread thread;

  Prepared pop() {
    std::unique_lock<std::mutex> lock(mutex);
    changed.wait(lock, [&] { return !ready.empty(); });
    Prepared p = std::move(ready.front());
    ready.pop_front();
    changed.notify_all();
    return p;
  }

  void release_slot(int slot) {
    if (slot < 0) return;
    {
      std::lock_guard<std::mutex> lock(mutex);
      free_slots.push_back(slot);
    }
    changed.notify_all();
  }
};

Loader::Loader(std::shared_ptr<const Dataset> dataset, std::shared_ptr<const Sampler> sampler, LoaderOptions options)
    : dataset_(std::move(dataset)), sampler_(std::move(sampler)), options_(options) {
  DPT_CHECK(dataset_ && sampler_, "Loader: needs a dataset and a sampler");
  DPT_CHECK(options_.batch_size > 0, "Loader: batch_size must be > 0, got {}", options_.batch_size);
  DPT_CHECK(options_.prefetch >= 0, "Loader: prefetch must be >= 0, got {}", options_.prefetch);
  const int64_t per_epoch = sampler_->size();
  batches_per_epoch_ = options_.drop_last ? per_epoch / options_.batch_size
                                          : (per_epoch + options_.batch_size - 1) / options_.batch_size;
  DPT_CHECK(batches_per_epoch_ > 0,
            "Loader: batch size {} is larger than the {} examples this process visits per epoch ({}, {} examples "
            "in all); lower the batch size or use more data",
            options_.batch_size, per_epoch, dataset_->describe(), dataset_->size());
  if (options_.device.is_cuda()) {
#ifdef DPT_HAVE_CUDA
    // A plain TensorDataset only: a subclass may form its batches otherwise than by taking rows.
    const Dataset& dataset = *dataset_;
    const auto* tensors =
        typeid(dataset) == typeid(TensorDataset) ? static_cast<const TensorDataset*>(&dataset) : nullptr;
    if (tensors &&
        static_cast<int64_t>(tensors->inputs().nbytes() + tensors->targets().nbytes()) <= options_.resident_bytes) {
      resident_ = std::make_unique<Resident>(options_.device.index);
      resident_->inputs = tensors->inputs().to(options_.device);
      resident_->targets = tensors->targets().to(options_.device);
      return;  // nothing to prepare ahead
    }
    // Slots: `prefetch` queued + one being filled + one whose copy was issued ahead.
    stage_ = std::make_unique<DeviceStage>(options_.device.index, options_.prefetch + 2);
#else
    DPT_FAIL("Loader: device {} requested but this dptrain was built without CUDA", options_.device.str());
#endif
  }
  start_worker(position_);
}

Loader::~Loader() {
  stop_worker();
  stage_.reset();
}

LoaderPosition Loader::advance(LoaderPosition p) const {
  return p.batch + 1 < batches_per_epoch_ ? LoaderPosition{p.epoch, p.batch + 1} : LoaderPosition{p.epoch + 1, 0};
}

Batch Loader::host_batch(LoaderPosition position) const {
  DPT_CHECK(position.epoch >= 0 && position.batch >= 0 && position.batch < batches_per_epoch_,
            "Loader: position (epoch {}, batch {}) is outside an epoch of {} batches", position.epoch, position.batch,
            batches_per_epoch_);
  return dataset_->get_batch(
      batch_indices(sampler_->epoch_indices(position.epoch), position.batch, options_.batch_size), position.epoch);
}

void Loader::start_worker(LoaderPosition from) {
  if (options_.prefetch == 0 || resident_) return;
  worker_ = std::make_unique<Worker>();
#ifdef DPT_HAVE_CUDA
  if (stage_) {
    for (int s = 0; s < stage_->num_slots(); ++s) worker_->free_slots.push_back(s);
  }
#endif
  Worker* w = worker_.get();
  w->thread = std::thread([this, w, from] {
    LoaderPosition pos = from;
    std::vector<int64_t> order;
    int64_t order_epoch = -1;
    const bool staged = stage_ != nullptr;
    while (true) {
      int slot = -1;
      {
        std::unique_lock<std::mutex> lock(w->mutex);
        w->changed.wait(lock, [&] {
          return w->stop ||
                 (static_cast<int>(w->ready.size()) < options_.prefetch && (!staged || !w->free_slots.empty()));
        });
        if (w->stop) return;
        if (staged) {
          slot = w->free_slots.front();
          w->free_slots.pop_front();
        }
      }
      Prepared item{pos, {}, slot, nullptr};
      try {
        if (order_epoch != pos.epoch) {
          order = sampler_->epoch_indices(pos.epoch);
          order_epoch = pos.epoch;
        }
        item.host = dataset_->get_batch(batch_indices(order, pos.batch, options_.batch_size), pos.epoch);
#ifdef DPT_HAVE_CUDA
        if (staged) {
          stage_->fill(slot, item.host);
          item.host = {};  // the pinned slot holds the bytes now
        }
#endif
      } catch (...) {
        item.error = std::current_exception();
      }
      const bool failed = item.error != nullptr;
      {
        std::lock_guard<std::mutex> lock(w->mutex);
        w->ready.push_back(std::move(item));
      }
      w->changed.notify_all();
      if (failed) return;  // the consumer rethrows; nothing after a failure is produced
      pos = advance(pos);
    }
  });
}

void Loader::stop_worker() {
#ifdef DPT_HAVE_CUDA
  if (stage_) stage_->drop_ahead();
  if (resident_) resident_->drop_ahead();
#endif
  if (!worker_) return;
  {
    std::lock_guard<std::mutex> lock(worker_->mutex);
    worker_->stop = true;
  }
  worker_->changed.notify_all();
  if (worker_->thread.joinable()) worker_->thread.join();
  worker_.reset();
}

void Loader::set_position(LoaderPosition position) {
  DPT_CHECK(position.epoch >= 0 && position.batch >= 0 && position.batch < batches_per_epoch_,
            "Loader: cannot resume at (epoch {}, batch {}): an epoch has {} batches (was the batch size or world "
            "size changed?)",
            position.epoch, position.batch, batches_per_epoch_);
  stop_worker();
  position_ = position;
  start_worker(position_);
}

Tensor Loader::resident_rows(LoaderPosition p) {
  if (resident_->order_epoch != p.epoch) {
#ifdef DPT_HAVE_CUDA
    resident_->order = resident_->upload(sampler_->epoch_indices(p.epoch), options_.device);
    resident_->order_epoch = p.epoch;
#endif
  }
  const int64_t begin = p.batch * options_.batch_size;
  return resident_->order.slice(begin, std::min(resident_->order.size(0), begin + options_.batch_size));
}

Batch Loader::resident_batch(const Tensor& rows) const {
  const auto empty = [&](const Tensor& source) {
    Shape shape = source.shape();
    shape[0] = rows.size(0);
    return Tensor::empty(shape, TensorOptions{}.with_dtype(source.dtype()).with_device(options_.device));
  };
  return {empty(resident_->inputs), empty(resident_->targets)};
}

void Loader::gather_resident(const Tensor& rows, const Batch& into) const {
  kernels::gather_rows(resident_->inputs, rows, into.input);
  kernels::gather_rows(resident_->targets, rows, into.target);
}

Batch Loader::resident_next() {
  const LoaderPosition p = position_;
  position_ = advance(p);
  const auto gather_now = [this](LoaderPosition at) {
    const Tensor rows = resident_rows(at);
    Batch batch = resident_batch(rows);
    gather_resident(rows, batch);
    return batch;
  };
#ifdef DPT_HAVE_CUDA
  Resident& r = *resident_;
  std::optional<Batch> ahead = r.take_ahead(p);
  Batch batch = ahead ? std::move(*ahead) : gather_now(p);
  const Tensor rows = resident_rows(position_);
  Batch next = resident_batch(rows);
  r.allocated->record();
  {
    cuda::StreamGuard on_gather_stream(r.gather_stream);
    r.allocated->wait(r.gather_stream);
    gather_resident(rows, next);
    r.gathered->record(r.gather_stream);
  }
  r.ahead = Resident::Ahead{position_, std::move(next), rows};
  return batch;
#else
  return gather_now(p);
#endif
}

Batch Loader::next() {
  if (resident_) return resident_next();
  if (!worker_) {  // prefetch 0: everything on the calling thread
    Batch b = host_batch(position_);
    position_ = advance(position_);
    if (options_.device.is_cuda()) return {b.input.to(options_.device), b.target.to(options_.device)};
    return b;
  }
#ifdef DPT_HAVE_CUDA
  if (stage_) {
    auto& ahead = stage_->ahead_;
    if (!ahead) {
      Prepared p = worker_->pop();
      ahead = stage_->issue(p);
      worker_->release_slot(p.slot);
    }
    DeviceStage::InFlight current = std::move(*ahead);
    ahead.reset();
    if (current.error) std::rethrow_exception(current.error);
    stage_->make_current_stream_wait(current.slot);
    position_ = advance(current.position);
    // Issue the following batch's copy now, so it overlaps the step that consumes `current`.
    Prepared p = worker_->pop();
    ahead = stage_->issue(p);
    worker_->release_slot(p.slot);
    return current.device;
  }
#endif
  Prepared p = worker_->pop();
  if (p.error) std::rethrow_exception(p.error);
  position_ = advance(p.position);
  return p.host;
}

}  // namespace dpt::data
