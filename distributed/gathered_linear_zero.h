#pragma once
// ZeRO-1 for models made of Linear layers, with the weight gradients formed from all-gathered layer
// inputs and output gradients instead of reduced: no gradient is ever reduce-scattered or all-reduced.
//
// The averaged gradient of a Linear over the global batch (N ranks x m rows) is
//   dW = 1/N sum_k dpre_k^T x_k = 1/N dpre_all^T x_all,   db = 1/N colsum(dpre_all),
// one GEMM over the ranks' stacked rows. Rank r owns rows R_r = [r n/N, (r+1) n/N) of every W [n, in],
// keeps AdamW state for those rows only (ZeRO stage 1), and forms dW[R_r] from x_all and the columns R_r
// of dpre_all. A bias is small and dpre_all is on every rank: every rank forms the whole db and updates
// the whole bias (replicated state, identical results), so no bias is ever gathered. A layer costs x
// (m x in) and dpre (m x n) sent per rank instead of its share of the gradient (n x in / N in a
// reduce-scatter): for a 4096 x 4096 layer at 512 rows a rank sends half the bytes of ZeRO's
// reduce-scatter (a quarter of an AllReduce's), and the x half of them in forward. The updated weight rows
// are then all-gathered into every rank's parameters.
//
// The inputs: on two ranks each layer's rows are gathered as its forward runs. On more ranks every layer's
// rows go in one gather once the last layer has run forward: on the copy engines each collective also
// synchronises every rank with every other twice, and with three or more peers one gather a layer spends
// more on that than it wins by moving rows beside the forward; with one peer it is the other way round
// (docs/performance.md, "Fewer, ordered gathers").
//
// Per step (each Linear's op is a SplitLinear, split_linear.h, installed as nn::Linear::op, whose sink
// calls on_input in forward and on_output_grad in backward):
//   comm stream A:   AG x_1 .. AG x_L (forward) ........ AG dpre_L .. AG dpre_{L-1} .. AG dpre_1
//   update stream:                                        dW_L db_L AdamW_L | dW_{L-1} ... | dW_1 ...
//   comm stream B:                                                  AG W_L | AG W_{L-1} ... | AG W_1
//   compute stream:  forward ......... backward (dx only) ............................. | wait(all)
// A layer's update is queued only once backward has queued every kernel that reads its W (the next
// layer's gradient, or the end of backward), behind an event on the compute stream. The parameter
// all-gathers use a second communicator (their own stream) so the next layer's dpre gather never
// queues behind an update. The compute stream waits for the update stream and every all-gather at the
// end of backward: after loss.backward() the step is done, as with ZeroOptimizer.
//
// UpdateTiming::WhenReduced (update_timing.h; the default) updates as described above. UpdateTiming::OnStep
// leaves the update to step(), as ZeroOptimizer's mode of that name does: backward forms the
// gradients of this rank's rows (dW_l, db_l on the update stream) and stops there, and the trainer then
// decides the step (grad_sum_of_squares, the inner optimizer's gate). step() updates every layer's pieces
// in forward order and all-gathers each weight as soon as it is updated, without waiting: the next
// forward waits for each layer's gather just before it reads that weight (in the layer's op), so the
// updates and gathers of later layers run beside the forward of earlier ones:
//   compute stream:  decision | wait(AG W_1) fwd_1 | wait(AG W_2) fwd_2 ...
//   update stream:             update_1 .. update_L
//   comm stream A:                AG W_1 .. AG W_L     AG x_1 .. AG x_L (forward) .. AG dpre_L ..
// The wait is on one event per layer, recorded after its gather on every step (a captured forward waits on
// it through an event-wait node: each replay waits for the last eager step's gather), and the gather is
// ordered after the layer's update, so the event also covers the update's writes (weight rows, bias,
// masters, moments). Anything else that reads them after step() calls wait_for_parameters() first (this
// class's own collectives do); the next backward forms gradients on the update stream, behind the updates.
// Nothing queues behind an update in this mode, so every gather goes through the one row communicator, in
// issue order: the weights (step()), then the inputs (forward), then the output gradients (backward). Run
// side by side on two communicators they share the links, and the forward waits longer for the weights
// it needs first while the inputs, needed only in backward, move beside them.
//
// Each weight element is updated by exactly one rank, each bias element by every rank alike, from the
// averaged gradient, so parameters equal those of DDP + the full optimizer up to the order of the sums.
// Limits: every parameter DDP holds must be a Linear's weight or bias; out_features divisible by the
// world size; each Linear used once per forward and every forward followed by its backward (x is
// gathered in forward; evaluate under NoGradGuard); the model on its device and in its compute dtype
// before construction (the layers' parameter tensors are taken then); no no_sync accumulation;
// gradient clipping only under OnStep; float32 masters of mixed precision stay whole on every
// rank (only the rows this rank owns are updated there: gather_targets() makes them whole). The step
// (WhenReduced) or its backward (OnStep) can be captured in a CUDA graph after an eager step (count the
// inner AdamW's steps on the device when the graph holds updates). Works on Gloo (CPU) and NCCL.
//
// DDPOptions::copy_engines (CUDA, the GPUs of one host): every all-gather moves by the copy engines instead
// of NCCL kernels (collectives/process_group.h), so backward's GEMMs and the updates keep every SM and the
// gathers do not wait for SMs to free up. The copy engines move bytes only between symmetric windows: the
// weights move into one window at construction (the same tensors, new storage), the gathered rows are
// allocated in windows, and each rank's rows are copied into their slot before an in-place gather.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/device_stream.h"
#include "core/ops.h"
#include "distributed/ddp.h"
#include "distributed/shard_pieces.h"
#include "distributed/sharded_optimizer.h"
#include "distributed/update_timing.h"
#include "optim/optimizer.h"

namespace dpt::nn {
class Linear;
}

namespace dpt::dist {

class SplitLinear;

class GatheredLinearZero : public ShardedOptimizer {
 public:
  using Factory = ShardPieces::Factory;  // distributed/shard_pieces.h

  // `groups`: the parameters to update (DDP's own when float32, or the float32 masters of mixed
  // precision under the same names), as for ZeroOptimizer. `ddp` has already checked that every rank
  // holds the same model and broadcast rank 0's parameters; from here on its buckets stay idle. `when`:
  // WhenReduced or OnStep (AtBackwardEnd is an error: the updates run as the layers' gradients are formed).
  GatheredLinearZero(DistributedDataParallel& ddp, const std::vector<optim::ParamGroup>& groups, const Factory& make,
                     UpdateTiming when = UpdateTiming::WhenReduced);
  ~GatheredLinearZero() override;
  GatheredLinearZero(const GatheredLinearZero&) = delete;
  GatheredLinearZero& operator=(const GatheredLinearZero&) = delete;

  // Whether every Linear layer of `module` splits into `world` equal blocks of rows, as the constructor
  // requires: a caller that chooses this exchange by itself asks first.
  static bool shards_evenly(const std::shared_ptr<nn::Module>& module, int world);

  optim::Optimizer& optimizer() override { return *inner_; }
  int64_t sharded_elements() const { return sharded_elements_; }  // parameter elements this rank updates

  // OnStep only (distributed/sharded_optimizer.h): every rank's weight rows, and the biases (whole on
  // every rank) counted on rank 0.
  Tensor grad_sum_of_squares() override;
  void step() override;
  void wait_for_parameters() override;

  // Any mode (distributed/sharded_optimizer.h).
  void gather_targets() override;
  NamedTensors full_state_dict() override;
  void load_full_state_dict(const NamedTensors& full) override;

  // Called through the layers' sinks (split_linear.h).
  void on_input(size_t layer, const Tensor& x);
  void on_output_grad(size_t layer, const Tensor& dpre);

  // Opt-in CUDA event timing of the following steps (forward and backward), for benchmarks: each
  // collective from the moment its stream lets it start to its end (seen from a probe stream), and the
  // moment backward's compute and the updates have both finished. Not inside CUDA graph capture.
  struct Timing {
    float comm_ms = 0;     // time during which any of the step's collectives was running
    float exposed_ms = 0;  // of it, after backward's compute and the updates had finished
  };
  void set_record_timing(bool on) { record_timing_ = on; }
  Timing last_timing();  // of the last finished step; host-synchronises

 private:
  struct Layer;
  struct InputGroup;
  struct TimingState;
  // Issues one collective; with timing on, brackets it with events (see set_record_timing).
  std::shared_ptr<Work> collective(int communicator, const std::function<std::shared_ptr<Work>()>& issue);
  // CUDA: makes the update stream current, behind everything queued on the current stream so far (null
  // without an update stream, where the current stream stays).
  std::unique_ptr<SideStreamGuard> on_update_stream(const Device& device);
  void launch_update(size_t layer);
  void form_gradients(Layer& layer);
  void update_and_gather(Layer& layer);
  void finish_backward();
  Tensor forward(size_t layer, const Tensor& x, Activation act);  // installed as the layer's nn::Linear::op
  void move_weights_into_window(const std::vector<std::pair<std::string, nn::Linear*>>& linears);
  Tensor rows_buffer(int64_t rows, int64_t cols, const TensorOptions& options);
  std::shared_ptr<Work> gather_rows(const Tensor& all, const Tensor& mine);
  void gather_inputs(InputGroup& group);

  DistributedDataParallel& ddp_;
  UpdateTiming when_;
  ShardPieces shard_;                    // this rank's pieces, and whole tensors from every rank's
  std::shared_ptr<ProcessGroup> group_;  // DDP's group: checkpoints' whole tensors
  bool copy_engines_ = false;            // DDPOptions::copy_engines on CUDA (see the header)
  std::vector<Layer> layers_;
  // (Either order of release is safe for the gathered rows' symmetric windows: a communicator that registered
  // memory keeps its pages until it deregisters them, collectives/nccl_backend.cpp.)
  std::shared_ptr<ProcessGroup> row_group_;    // x and dpre all-gathers (DDP's group, or on the copy engines)
  std::shared_ptr<ProcessGroup> param_group_;  // parameter all-gathers: own communicator (WhenReduced) or row_group_
  std::unique_ptr<optim::Optimizer> inner_;
  // The stream the gradients and updates run on (CUDA), beside backward on the compute stream (the device's
  // highest stream priority for it measured no different).
  std::unique_ptr<SideStream> update_stream_;
  // Where each layer's `ready` event is recorded once its parameter gather has ended (OnStep).
  std::unique_ptr<SideStream> ready_stream_;
  bool record_timing_ = false;
  std::unique_ptr<TimingState> timing_, finished_timing_;
  std::vector<std::shared_ptr<Work>> param_gathers_;
  std::vector<InputGroup> input_groups_;       // every layer in exactly one
  std::vector<const SplitLinear*> split_ops_;  // every layer's op: the producers a layer's input may come from
  int64_t pending_ = -1;                       // the layer whose update waits until backward has read its weight
  bool in_backward_ = false;
  int64_t sharded_elements_ = 0;
  uint64_t callback_id_ = 0;
  std::shared_ptr<GatheredLinearZero*> alive_ = std::make_shared<GatheredLinearZero*>(this);
};

}  // namespace dpt::dist
