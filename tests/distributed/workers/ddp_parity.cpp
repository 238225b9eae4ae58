// Worker of the DDP parity tests (tests/distributed/ddp_test.cpp), started by dpt-run on every rank.
//
//   dpt_test_ddp_parity <model> <mode> <device> [nccl | ce_collectives]
//   model: mlp | gpt;  device: cpu | cuda (cuda: one GPU per rank)
//   mode:  default | tiny | one | layouts | nosync | unused | bf16comm | mismatch | overlap | zero | zerotiny
//          | zerobf16 | overlapstream | graph | zerograph | gathered | gatheredbf16
//          | gatheredgraph | gatheredtwice | zerostream | zerostreambf16 | zerostreamgraph | shardlayout
//          | zerostep | zerosteptiny | zerostepsmall | zerostepbf16 | zerounused | gatheredstep | gatheredstepbf16
//          | customexchange
//   The last argument: nccl (the default) or ce_collectives for DDPOptions::copy_engines (a sharded
//   optimizer's collectives on the copy engines).
//
// Every rank trains two copies of the same model from the same seed for 5 AdamW steps: a reference on
// the whole global batch (N ranks x b rows), as one process would, and a DDP replica on its own slice
// [rank*b, (rank+1)*b). After every step the replica must match the reference (float32: within 1e-6
// relative per tensor). Exit code 0 when every check holds; the first failure is printed.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <string>

#include "collectives/process_group.h"
#include "core/autograd.h"
#include "core/cuda_runtime.h"
#include "core/error.h"
#include "core/factory.h"
#include "core/ops.h"
#include "distributed/allreduce_exchange.h"
#include "distributed/ddp.h"
#include "distributed/gathered_linear_zero.h"
#include "distributed/overlapped_optimizer.h"
#include "distributed/sharded_exchange.h"
#include "distributed/zero_optimizer.h"
#include "layers/gpt.h"
#include "layers/losses.h"
#include "layers/mlp.h"
#include "optim/adam.h"
#include "optim/grad_clip.h"
#include "optim/mixed_precision.h"

using namespace dpt;

namespace {

constexpr int64_t kPerRankBatch = 4;
constexpr int kSteps = 5;

struct Setup {
  std::string model_kind;
  Device device;
  int rank = 0;
  int world = 1;
};

std::shared_ptr<nn::Module> make_model(const Setup& s, int64_t mlp_hidden = 16) {
  Generator gen(1234);
  std::shared_ptr<nn::Module> m;
  if (s.model_kind == "gpt") {
    nn::GPTConfig c;
    c.vocab_size = 32;
    c.block_size = 8;
    c.n_layer = 2;
    c.n_head = 2;
    c.n_embd = 16;
    m = std::make_shared<nn::GPT>(c, gen);
  } else {
    m = std::make_shared<nn::MLP>(std::vector<int64_t>{8, mlp_hidden, mlp_hidden, 4}, "relu", gen);
  }
  m->to(s.device);
  return m;
}

// The global batch of step `step`: identical on every rank.
std::pair<Tensor, Tensor> global_batch(const Setup& s, int step) {
  Generator gen(1000 + step);
  int64_t rows = kPerRankBatch * s.world;
  TensorOptions opts = TensorOptions{}.with_device(s.device);
  if (s.model_kind == "gpt") {
    Tensor idx = randint({rows, 8}, 0, 32, gen, opts.with_dtype(DType::Int64));
    Tensor tgt = randint({rows, 8}, 0, 32, gen, opts.with_dtype(DType::Int64));
    return {idx, tgt};
  }
  return {randn({rows, 8}, gen, opts), randint({rows}, 0, 4, gen, opts.with_dtype(DType::Int64))};
}

Tensor loss_of(const Setup& s, nn::Module& m, const Tensor& x, const Tensor& y) {
  if (s.model_kind == "gpt") return static_cast<nn::GPT&>(m).loss(x, y);
  return nn::cross_entropy_loss(m.forward(x), y);
}

// Backward of this rank's rows of the global batch (x, y).
void backward_on_my_rows(const Setup& s, nn::Module& m, const Tensor& x, const Tensor& y) {
  const int64_t begin = s.rank * kPerRankBatch;
  loss_of(s, m, x.slice(begin, begin + kPerRankBatch), y.slice(begin, begin + kPerRankBatch)).backward();
}

// One step of the single-process reference on the whole global batch.
void reference_step(const Setup& s, nn::Module& reference, optim::Optimizer& opt, const Tensor& x, const Tensor& y) {
  opt.zero_grad();
  loss_of(s, reference, x, y).backward();
  opt.step();
}

optim::AdamOptions adam_options() {
  optim::AdamOptions o;
  o.lr = 1e-2;
  o.weight_decay = 0.01;
  // The key bias of attention has an exactly-zero gradient in exact arithmetic (softmax ignores a
  // per-row constant), so its float32 gradient is pure rounding noise that Adam rescales by 1/eps.
  // A larger eps bounds that amplification; every other parameter sees ordinary AdamW.
  o.eps = 1e-6;
  return o;
}

std::unique_ptr<optim::AdamW> make_optimizer(nn::Module& m) {
  return std::make_unique<optim::AdamW>(m.named_parameters(), adam_options());
}

std::unique_ptr<optim::Optimizer> make_adamw(std::vector<optim::ParamGroup> groups) {
  return std::make_unique<optim::AdamW>(std::move(groups), adam_options());
}

double relative_difference(const Tensor& a, const Tensor& b) {
  auto va = a.to_vector<double>(), vb = b.to_vector<double>();
  double num = 0, den = 0;
  for (size_t i = 0; i < va.size(); ++i) {
    num += (va[i] - vb[i]) * (va[i] - vb[i]);
    den += vb[i] * vb[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}

// Every entry of `want` is in `got` with as many elements; all entries as one vector must be within `tol`
// relative, each tensor within 100 * tol. Adam's first steps are close to sign descent, so a tensor whose
// gradients are tiny (the attention key bias, see make_optimizer) turns float32 rounding differences in
// the gradient into visible differences in its update; the model as a whole stays within `tol`.
bool compare_named(const NamedTensors& got, const NamedTensors& want, double tol, const std::string& what, int rank) {
  std::map<std::string, Tensor> by_name(got.begin(), got.end());
  double num = 0, den = 0;
  for (const auto& [name, w] : want) {
    auto it = by_name.find(name);
    if (it == by_name.end() || it->second.numel() != w.numel()) {
      std::fprintf(stderr, "rank %d: %s: '%s' is missing or of another size\n", rank, what.c_str(), name.c_str());
      return false;
    }
    auto va = it->second.to_vector<double>(), vb = w.to_vector<double>();
    double tn = 0, td = 0;
    for (size_t j = 0; j < va.size(); ++j) {
      tn += (va[j] - vb[j]) * (va[j] - vb[j]);
      td += vb[j] * vb[j];
    }
    num += tn;
    den += td;
    const double d = std::sqrt(tn) / std::max(std::sqrt(td), 1e-30);
    if (!(d <= 100 * tol)) {
      std::fprintf(stderr, "rank %d: %s: '%s' differs by %.3g relative (tolerance %.1g)\n", rank, what.c_str(),
                   name.c_str(), d, 100 * tol);
      return false;
    }
  }
  const double d = std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
  if (!(d <= tol)) {
    std::fprintf(stderr, "rank %d: %s: differ by %.3g relative (tolerance %.1g)\n", rank, what.c_str(), d, tol);
    return false;
  }
  return true;
}

// The parameters of `got` against those of `want`, as compare_named() compares tensors.
bool compare(const nn::Module& got, const nn::Module& want, double tol, const std::string& what, int rank) {
  return compare_named(got.named_parameters(), want.named_parameters(), tol, what, rank);
}

// How the replica's optimizer steps: after backward; inside backward bucket by bucket
// (distributed/overlapped_optimizer.h); or sharded, ZeRO-1 (distributed/zero_optimizer.h), or ZeRO-1 with
// the Linear gradients formed from gathered inputs (distributed/gathered_linear_zero.h). kZeroWhenReduced:
// ZeRO-1 with each bucket's update and all-gather during backward (the update stream, a second communicator).
enum class Stepping {
  kAfterBackward,
  kInBackward,
  kInBackwardWhenReduced,
  kZero,
  kZeroWhenReduced,
  kZeroOnStep,
  kGathered,
  kGatheredOnStep
};

// A sharded optimizer stepped by the caller (UpdateTiming::OnStep): ZeRO-1 or gathered-input gradients.
std::unique_ptr<dist::ShardedOptimizer> make_on_step(dist::DistributedDataParallel& ddp,
                                                     const std::vector<optim::ParamGroup>& groups, Stepping stepping) {
  if (stepping == Stepping::kGatheredOnStep)
    return std::make_unique<dist::GatheredLinearZero>(ddp, groups, make_adamw, dist::UpdateTiming::OnStep);
  return std::make_unique<dist::ZeroOptimizer>(ddp, groups, make_adamw, dist::UpdateTiming::OnStep);
}

std::unique_ptr<dist::ZeroOptimizer> make_zero(dist::DistributedDataParallel& ddp,
                                               const std::vector<optim::ParamGroup>& groups,
                                               const dist::ZeroOptimizer::Factory& make, Stepping stepping) {
  using dist::UpdateTiming;
  return std::make_unique<dist::ZeroOptimizer>(ddp, groups, make,
                                               stepping == Stepping::kZeroWhenReduced ? UpdateTiming::WhenReduced
                                               : stepping == Stepping::kZeroOnStep    ? UpdateTiming::OnStep
                                                                                      : UpdateTiming::AtBackwardEnd);
}

// One DDP replica next to the single-process reference, for kSteps steps.
bool run_parity(const Setup& s, std::shared_ptr<dist::ProcessGroup> pg, dist::DDPOptions options, int micro_batches,
                double tol, const std::string& label, Stepping stepping = Stepping::kAfterBackward) {
  auto reference = make_model(s);
  auto replica = make_model(s);
  auto ref_opt = make_optimizer(*reference);
  auto rep_opt = make_optimizer(*replica);
  dist::DistributedDataParallel ddp(replica, pg, options);
  std::unique_ptr<dist::ZeroOptimizer> zero;
  if (stepping == Stepping::kInBackward) dist::step_in_backward(ddp, *rep_opt);
  if (stepping == Stepping::kInBackwardWhenReduced) {
    dist::step_in_backward(ddp, *rep_opt, dist::UpdateTiming::WhenReduced);
  }
  if (stepping == Stepping::kZero || stepping == Stepping::kZeroWhenReduced) {
    zero = make_zero(ddp, rep_opt->param_groups(), make_adamw, stepping);
    rep_opt.reset();
  }
  std::unique_ptr<dist::GatheredLinearZero> gathered;
  if (stepping == Stepping::kGathered) {
    gathered = std::make_unique<dist::GatheredLinearZero>(ddp, rep_opt->param_groups(), make_adamw);
    rep_opt.reset();
  }
  for (int step = 0; step < kSteps; ++step) {
    auto [x, y] = global_batch(s, step);
    reference_step(s, *reference, *ref_opt, x, y);

    replica->zero_grad();
    int64_t per_micro = kPerRankBatch / micro_batches;
    for (int k = 0; k < micro_batches; ++k) {
      int64_t begin = s.rank * kPerRankBatch + k * per_micro;
      Tensor loss = mul(loss_of(s, *replica, x.slice(begin, begin + per_micro), y.slice(begin, begin + per_micro)),
                        1.0 / micro_batches);
      if (k + 1 < micro_batches) {
        auto guard = ddp.no_sync();
        loss.backward();
      } else {
        loss.backward();
      }
    }
    if (stepping == Stepping::kAfterBackward) rep_opt->step();
    if (!compare(*replica, *reference, tol, label + " step " + std::to_string(step), s.rank)) return false;
  }
  return true;
}

// The replica's step (forward, backward with the buckets' AllReduces on the comm stream, AdamW with
// its step counted on the device) captured once in a CUDA graph and replayed, each step's slice of
// the batch copied into the graph's input buffers first, as a trainer would. Two eager steps come
// first: the bucket rebuild after the first backward must not happen inside the capture. Every replay
// must keep the replica on the single-process reference, so a replay that skipped its AllReduces (or
// reran the captured batch) fails. With Stepping::kZero the graph holds ZeRO-1's reduce-scatters, the
// sharded AdamW and the parameter all-gathers instead (the step happens inside backward).
bool run_graph(const Setup& s, std::shared_ptr<dist::ProcessGroup> pg, dist::DDPOptions options,
               Stepping stepping = Stepping::kAfterBackward) {
  auto reference = make_model(s);
  auto replica = make_model(s);
  auto ref_opt = make_optimizer(*reference);
  auto rep_opt = make_optimizer(*replica);
  dist::DistributedDataParallel ddp(replica, pg, options);
  std::unique_ptr<dist::ZeroOptimizer> zero;
  std::unique_ptr<dist::GatheredLinearZero> gathered;
  auto make_counting_adamw = [](std::vector<optim::ParamGroup> g) -> std::unique_ptr<optim::Optimizer> {
    auto adamw = std::make_unique<optim::AdamW>(std::move(g), adam_options());
    adamw->count_steps_on_device();
    return adamw;
  };
  if (stepping == Stepping::kZero || stepping == Stepping::kZeroWhenReduced) {
    zero = make_zero(ddp, rep_opt->param_groups(), make_counting_adamw, stepping);
    rep_opt.reset();
  } else if (stepping == Stepping::kGathered) {
    gathered = std::make_unique<dist::GatheredLinearZero>(ddp, rep_opt->param_groups(), make_counting_adamw);
    rep_opt.reset();
  } else {
    rep_opt->count_steps_on_device();
  }
  Tensor x_in, y_in;  // the graph reads its batch from here
  auto replica_step = [&] {
    replica->zero_grad();
    loss_of(s, *replica, x_in, y_in).backward();
    if (rep_opt) rep_opt->step();
  };
  std::unique_ptr<cuda::CudaGraph> graph;
  constexpr int kEagerSteps = 2;
  for (int step = 0; step < kEagerSteps + kSteps; ++step) {
    auto [x, y] = global_batch(s, step);
    reference_step(s, *reference, *ref_opt, x, y);

    const int64_t begin = s.rank * kPerRankBatch;
    Tensor x_mine = x.slice(begin, begin + kPerRankBatch), y_mine = y.slice(begin, begin + kPerRankBatch);
    if (!x_in.defined()) {
      x_in = empty_like(x_mine);
      y_in = empty_like(y_mine);
    }
    x_in.copy_(x_mine);
    y_in.copy_(y_mine);
    if (step < kEagerSteps) {
      replica_step();
    } else {
      if (!graph) {
        graph = std::make_unique<cuda::CudaGraph>();
        graph->capture(replica_step);  // recorded, not run
      }
      graph->replay();
    }
    if (!compare(*replica, *reference, 1e-6, "CUDA graph replay, step " + std::to_string(step), s.rank)) return false;
  }
  return true;
}

// ZeRO-1 under bf16 mixed precision: DDP's parameters are bf16 compute twins of float32 masters, and
// the sharded AdamW writes both. Reference: one process, the same mixed precision with the fused update
// (optim::MixedPrecision::fuse_with) on the global batch. bf16 activations round differently for a
// different batch split, hence the bf16 tolerance.
bool run_zero_bf16(const Setup& s, std::shared_ptr<dist::ProcessGroup> pg, dist::DDPOptions options,
                   Stepping stepping = Stepping::kZero) {
  auto reference = make_model(s);
  auto replica = make_model(s);
  optim::MixedPrecision ref_mp(reference->named_parameters(), DType::BFloat16);
  optim::AdamW ref_opt(ref_mp.master_params(), adam_options());
  ref_mp.fuse_with(ref_opt);
  optim::MixedPrecision rep_mp(replica->named_parameters(), DType::BFloat16);
  dist::DistributedDataParallel ddp(replica, pg, options);
  optim::ParamGroup all{rep_mp.master_params(), adam_options().weight_decay, 1.0};
  std::unique_ptr<dist::ZeroOptimizer> zero;
  std::unique_ptr<dist::GatheredLinearZero> gathered;
  std::unique_ptr<dist::ShardedOptimizer> sharded;
  const bool on_step = stepping == Stepping::kZeroOnStep || stepping == Stepping::kGatheredOnStep;
  if (on_step) {
    sharded = make_on_step(ddp, std::vector<optim::ParamGroup>{all}, stepping);
  } else if (stepping == Stepping::kGathered) {
    gathered = std::make_unique<dist::GatheredLinearZero>(ddp, std::vector<optim::ParamGroup>{all}, make_adamw);
  } else {
    zero = make_zero(ddp, std::vector<optim::ParamGroup>{all}, make_adamw, stepping);
  }
  for (int step = 0; step < kSteps; ++step) {
    auto [x_global, y] = global_batch(s, step);
    Tensor x = s.model_kind == "gpt" ? x_global : x_global.to(DType::BFloat16);  // token ids stay integers
    reference->zero_grad();  // the bf16 model's gradients: the fused update reads them there
    loss_of(s, *reference, x, y).backward();
    ref_opt.step();
    replica->zero_grad();
    backward_on_my_rows(s, *replica, x, y);
    if (on_step) {
      sharded->step();
      sharded->wait_for_parameters();  // compare reads the weights directly, not through a forward
    }
    if (!compare(*replica, *reference, 2e-2, "ZeRO-1 bf16 step " + std::to_string(step), s.rank)) return false;
  }
  // The float32 masters are current only where this rank updates them until gathered.
  if (on_step) {
    sharded->gather_targets();
    if (!compare_named(rep_mp.master_params(), ref_mp.master_params(), 2e-2, "gathered masters", s.rank)) return false;
  }
  return true;
}

// Misuse of GatheredLinearZero: a second forward before the backward (the first one's inputs are already
// on their way to the other ranks) is an error on every rank naming the layer, not a hang or a wrong step.
bool run_gathered_twice(const Setup& s, std::shared_ptr<dist::ProcessGroup> pg) {
  auto replica = make_model(s);
  auto opt = make_optimizer(*replica);
  dist::DistributedDataParallel ddp(replica, pg);
  dist::GatheredLinearZero gathered(ddp, opt->param_groups(), make_adamw);
  Tensor x = global_batch(s, 0).first.slice(s.rank * kPerRankBatch, (s.rank + 1) * kPerRankBatch);
  replica->forward(x);
  replica->forward(x);  // throws
  std::fprintf(stderr, "rank %d: a second forward before backward was accepted\n", s.rank);
  return false;
}

// Tiny buckets, one bucket and the default layout must give the same parameters.
bool run_layouts(const Setup& s, std::shared_ptr<dist::ProcessGroup> pg) {
  std::vector<std::shared_ptr<nn::Module>> models;
  std::vector<std::unique_ptr<optim::AdamW>> opts;
  std::vector<std::unique_ptr<dist::DistributedDataParallel>> ddps;
  for (double cap : {0.0001, 1000.0, 25.0}) {
    dist::DDPOptions o;
    o.bucket_cap_mb = cap;
    o.first_bucket_mb = cap == 25.0 ? 1.0 : cap;
    models.push_back(make_model(s));
    opts.push_back(make_optimizer(*models.back()));
    ddps.push_back(std::make_unique<dist::DistributedDataParallel>(models.back(), pg, o));
  }
  if (ddps[0]->num_buckets() <= 1 || ddps[1]->num_buckets() != 1) {
    std::fprintf(stderr, "rank %d: expected many tiny buckets and exactly one big one (got %zu and %zu)\n", s.rank,
                 ddps[0]->num_buckets(), ddps[1]->num_buckets());
    return false;
  }
  for (int step = 0; step < kSteps; ++step) {
    auto [x, y] = global_batch(s, step);
    for (size_t m = 0; m < models.size(); ++m) {
      opts[m]->zero_grad();
      backward_on_my_rows(s, *models[m], x, y);
      opts[m]->step();
    }
  }
  // Two ranks: a + b is the same sum whatever the chunking, so layouts agree exactly. More ranks may
  // associate differently per chunk: within float32 rounding.
  double tol = s.world == 2 ? 0.0 : 1e-6;
  return compare(*models[0], *models[2], tol, "tiny vs default buckets", s.rank) &&
         compare(*models[1], *models[2], tol, "one vs default bucket", s.rank);
}

// ZeRO-1 with the update on step() (UpdateTiming::OnStep), as a trainer runs it: backward reduce-scatters,
// the ranks' shares of the squared norm are summed, the clip factor goes to the inner optimizer's gate, step()
// updates and all-gathers. Against one process on the global batch with optim::clip_grad_norm and AdamW: the
// norms, the parameters and the optimizer state of whole parameters (full_state_dict()) agree; a second ZeRO
// replica resumed from the reference's plain state (load_full_state_dict()) takes the next step like the
// reference.
//
// Stepping::kGatheredOnStep: the same of GatheredLinearZero with UpdateTiming::OnStep (the biases' replicated
// state counted once in the norm and in full_state_dict()).
//
// What a trainer does after backward (apps/train/trainer.cpp), decided here on the host: returns the norm.
double clip_through_gate(dist::ShardedOptimizer& rep, dist::ProcessGroup& pg, double max_norm) {
  Tensor squares = rep.grad_sum_of_squares();
  pg.allreduce(squares, dist::ReduceOp::Sum)->wait();
  const double norm = std::sqrt(squares.item());
  const TensorOptions f64 = TensorOptions{}.with_dtype(DType::Float64).with_device(squares.device());
  rep.optimizer().set_gate(from_vector<double>({0.0, optim::clip_factor(norm, max_norm)}, {2}, f64));
  return norm;
}

// ZeRO-1's step order, known answer: a bucket is read first by the forward pass of the earliest GPT block
// any of its parameters belongs to, or before every block when one of them is outside the blocks (the
// embeddings, the final LayerNorm, an MLP's layers); buckets are updated in that order, ties in forward
// order (the reverse of bucket order).
bool check_step_order(const dist::ZeroOptimizer& zero, const dist::DistributedDataParallel& ddp, int rank) {
  auto first_reader = [&](size_t b) {
    int64_t reader = std::numeric_limits<int64_t>::max();
    for (size_t i : ddp.bucket(b).params) {
      const std::string& name = ddp.parameters()[i].first;
      const int64_t block = name.rfind("blocks.", 0) == 0 ? std::stoll(name.substr(7)) : -1;
      reader = std::min(reader, block);
    }
    return reader;
  };
  std::vector<size_t> want(ddp.num_buckets());
  for (size_t b = 0; b < want.size(); ++b) want[b] = b;
  std::sort(want.begin(), want.end(), [&](size_t a, size_t b) {
    return first_reader(a) != first_reader(b) ? first_reader(a) < first_reader(b) : a > b;
  });
  if (zero.step_order() == want) return true;
  std::fprintf(stderr, "rank %d: ZeRO-1's step order differs from the forward's reading order over %zu buckets\n", rank,
               want.size());
  return false;
}

bool run_zero_on_step(const Setup& s, std::shared_ptr<dist::ProcessGroup> pg, dist::DDPOptions options,
                      Stepping stepping = Stepping::kZeroOnStep) {
  constexpr double kMaxNorm = 0.5;  // below the first steps' norms: clipping is exercised
  auto reference = make_model(s);
  auto replica = make_model(s);
  auto ref_opt = make_optimizer(*reference);
  dist::DistributedDataParallel ddp(replica, pg, options);
  auto zero = make_on_step(ddp, make_optimizer(*replica)->param_groups(), stepping);
  if (const auto* z = dynamic_cast<const dist::ZeroOptimizer*>(zero.get()); z && !check_step_order(*z, ddp, s.rank))
    return false;
  // The parameters are compared after the last step only: before that, each step's gradient norm is what
  // shows that its forward waited for every gathered parameter by itself (no wait_for_parameters()).
  auto step_both = [&](nn::Module& rep_model, dist::ShardedOptimizer& rep, int step, const std::string& what,
                       bool last) {
    auto [x, y] = global_batch(s, step);
    ref_opt->zero_grad();
    loss_of(s, *reference, x, y).backward();
    const double want = optim::clip_grad_norm(reference->named_parameters(), kMaxNorm);
    ref_opt->step();
    rep_model.zero_grad();
    backward_on_my_rows(s, rep_model, x, y);
    const double got = clip_through_gate(rep, *pg, kMaxNorm);
    rep.step();
    if (!(std::abs(got - want) <= 1e-6 * want)) {
      std::fprintf(stderr, "rank %d: %s: gradient norm %.9g, one process %.9g\n", s.rank, what.c_str(), got, want);
      return false;
    }
    if (!last) return true;
    rep.wait_for_parameters();  // compare reads the parameters directly
    return compare(rep_model, *reference, 1e-6, what, s.rank);
  };
  for (int step = 0; step < kSteps; ++step) {
    if (!step_both(*replica, *zero, step, "sharded on step(), step " + std::to_string(step), step + 1 == kSteps))
      return false;
  }
  if (!compare_named(zero->full_state_dict(), ref_opt->state_dict(), 1e-5, "full_state_dict", s.rank)) return false;
  // Resume into a fresh replica from the reference's (plain, unsharded) state.
  auto resumed = make_model(s);
  {
    NoGradGuard no_grad;
    auto from = reference->named_parameters(), to = resumed->named_parameters();
    for (size_t i = 0; i < to.size(); ++i) to[i].second.copy_(from[i].second);
  }
  dist::DistributedDataParallel ddp2(resumed, pg, options);
  auto zero2 = make_on_step(ddp2, make_optimizer(*resumed)->param_groups(), stepping);
  zero2->load_full_state_dict(ref_opt->state_dict());
  return step_both(*resumed, *zero2, kSteps, "sharded, resumed from a plain optimizer state", true);
}

// Sharded buckets (ZeRO-1's layout): consecutive ranges of one flat gradient buffer (and of one flat
// parameter buffer), each a multiple of the world size long, with the largest parameter cut into a
// bucket per cap's worth of it; every gradient and parameter is still one view into those buffers.
bool run_shard_layout(const Setup& s, std::shared_ptr<dist::ProcessGroup> pg) {
  auto model = make_model(s);
  const NamedTensors params = model->named_parameters();
  int64_t largest = 0;
  for (const auto& [name, p] : params) largest = std::max(largest, p.numel());
  const int64_t cap_elems = largest * 2 / 7;  // the largest parameter needs 4 buckets
  dist::DDPOptions o;
  o.bucket_cap_mb = static_cast<double>(cap_elems * 4) / (1024.0 * 1024.0);
  dist::DistributedDataParallel ddp(model, pg, o);
  auto owned = std::make_unique<dist::ShardedExchange>(pg, static_cast<size_t>(cap_elems * 4), false);
  const dist::ShardedExchange& exchange = *owned;
  ddp.set_exchange(std::move(owned));
  auto fail = [&](const std::string& what) {
    std::fprintf(stderr, "rank %d: sharded layout: %s\n", s.rank, what.c_str());
    return false;
  };
  const auto* grads0 = static_cast<const char*>(ddp.bucket(0).buffer.data_ptr());
  const auto* values0 = static_cast<const char*>(exchange.param_buffer(0).data_ptr());
  int64_t flat = 0;  // elements before the bucket
  std::vector<int> buckets_of(ddp.parameters().size(), 0);
  for (size_t b = 0; b < ddp.num_buckets(); ++b) {
    const dist::GradBucket& bucket = ddp.bucket(b);
    const int64_t n = bucket.buffer.numel();
    if (n == 0 || n % s.world != 0 || exchange.param_buffer(b).numel() != n)
      return fail("bucket " + std::to_string(b) + " holds " + std::to_string(n) + " elements");
    if (bucket.buffer.data_ptr() != grads0 + flat * 4 || exchange.param_buffer(b).data_ptr() != values0 + flat * 4)
      return fail("bucket " + std::to_string(b) + " does not follow the one before it");
    for (size_t j = 0; j < bucket.params.size(); ++j) {
      const Tensor& p = ddp.parameters()[bucket.params[j]].second;
      const int64_t at = flat + bucket.offsets[j];  // the parameter's first element in the flat buffers
      if (p.data_ptr() != values0 + at * 4 || p.grad().data_ptr() != grads0 + at * 4)
        return fail("'" + ddp.parameters()[bucket.params[j]].first + "' is not a view at its offset");
      if (bucket.offsets[j] >= n || bucket.offsets[j] + p.numel() <= 0)
        return fail("'" + ddp.parameters()[bucket.params[j]].first + "' listed in a bucket it misses");
      ++buckets_of[bucket.params[j]];
    }
    flat += n;
  }
  for (size_t i = 0; i < buckets_of.size(); ++i) {
    const int64_t numel = ddp.parameters()[i].second.numel();
    if (numel == largest && buckets_of[i] < 4)
      return fail("the largest parameter lies in " + std::to_string(buckets_of[i]) + " buckets, expected 4 or more");
    if (buckets_of[i] == 0) return fail("'" + ddp.parameters()[i].first + "' is in no bucket");
  }
  return true;
}

// A parameter outside the forward pass: with find_unused_parameters the step completes (no hang) and
// its gradient is zero on every rank; the used parameters still match the reference.
bool run_unused(const Setup& s, std::shared_ptr<dist::ProcessGroup> pg) {
  auto model = make_model(s);
  Tensor unused = zeros({3, 3}, TensorOptions{}.with_device(s.device));
  unused.requires_grad_(true);
  NamedTensors params = model->named_parameters();
  params.insert(params.begin(), {"unused.weight", unused});
  dist::DDPOptions o;
  o.find_unused_parameters = true;
  dist::DistributedDataParallel ddp(params, model->named_buffers(), pg, o);
  auto reference = make_model(s);
  for (int step = 0; step < 2; ++step) {
    auto [x, y] = global_batch(s, step);
    reference->zero_grad();
    loss_of(s, *reference, x, y).backward();
    model->zero_grad();
    backward_on_my_rows(s, *model, x, y);
    if (!unused.grad().defined() || std::abs(sum(unused.grad()).item()) != 0.0) {
      std::fprintf(stderr, "rank %d: unused parameter's gradient should be zero\n", s.rank);
      return false;
    }
    auto got = model->named_parameters(), want = reference->named_parameters();
    for (size_t i = 0; i < got.size(); ++i) {
      double d = relative_difference(got[i].second.grad(), want[i].second.grad());
      if (!(d <= 1e-6)) {
        std::fprintf(stderr, "rank %d: gradient of %s differs by %.3g\n", s.rank, got[i].first.c_str(), d);
        return false;
      }
    }
  }
  return true;
}

// The same under ZeRO-1 with tiny buckets, so the unused parameter straddles buckets that also hold used
// ones: the step completes and the used parameters follow the one-process reference.
bool run_zero_unused(const Setup& s, std::shared_ptr<dist::ProcessGroup> pg) {
  auto model = make_model(s);
  Tensor unused = zeros({8, 8}, TensorOptions{}.with_device(s.device));  // 64 elements: several buckets
  unused.requires_grad_(true);
  NamedTensors params = model->named_parameters();
  params.insert(params.begin(), {"unused.weight", unused});
  dist::DDPOptions o;
  o.find_unused_parameters = true;
  o.bucket_cap_mb = o.first_bucket_mb = 0.0001;
  dist::DistributedDataParallel ddp(params, model->named_buffers(), pg, o);
  dist::ZeroOptimizer zero(ddp, optim::AdamW(params, adam_options()).param_groups(), make_adamw,
                           dist::UpdateTiming::OnStep);
  auto reference = make_model(s);
  auto ref_opt = make_optimizer(*reference);
  for (int step = 0; step < kSteps; ++step) {
    auto [x, y] = global_batch(s, step);
    reference_step(s, *reference, *ref_opt, x, y);
    model->zero_grad();
    backward_on_my_rows(s, *model, x, y);
    zero.step();
    zero.wait_for_parameters();  // compare reads the parameters directly
    if (!compare(*model, *reference, 1e-6, "ZeRO-1 with an unused parameter, step " + std::to_string(step), s.rank))
      return false;
  }
  return true;
}

// Rank 1 builds a wider model: construction must fail on every rank, naming the parameter.
bool run_mismatch(const Setup& s, std::shared_ptr<dist::ProcessGroup> pg) {
  auto model = make_model(s, s.rank == 1 ? 17 : 16);
  try {
    dist::DistributedDataParallel ddp(model, pg);
  } catch (const Error& e) {
    std::string msg = e.what();
    bool ok = msg.find("different model") != std::string::npos && msg.find("weight") != std::string::npos;
    std::fprintf(stderr, "rank %d: expected error: %s\n", s.rank, msg.c_str());
    return ok;
  }
  std::fprintf(stderr, "rank %d: a model mismatch was not detected\n", s.rank);
  return false;
}

// An exchange that records what DDP asks of it, around the default all-reduce.
class RecordingExchange : public dist::BucketExchange {
 public:
  RecordingExchange(std::shared_ptr<dist::ProcessGroup> pg, std::vector<std::string>& calls)
      : inner_(std::move(pg)), calls_(calls) {}
  dist::BucketLayout lay_out(const NamedTensors& params, const std::vector<dist::BucketSpec>& specs) override {
    calls_.push_back("layout");
    return inner_.lay_out(params, specs);
  }
  void launch(dist::GradBucket& bucket) override {
    calls_.push_back("launch " + std::to_string(bucket.index));
    inner_.launch(bucket);
  }
  void finish(dist::GradBucket& bucket) override {
    calls_.push_back("finish " + std::to_string(bucket.index));
    inner_.finish(bucket);
  }
  void finish_backward() override { calls_.push_back("end"); }
  std::string name() const override { return "recording " + inner_.name(); }

 private:
  dist::AllReduceExchange inner_;
  std::vector<std::string>& calls_;
};

// The extension point (distributed/bucket_exchange.h): DDP lays buckets out through the installed exchange,
// launches every bucket once in index order during backward, finishes them in index order after the last
// launch, calls nothing inside no_sync, and the averaged gradients the exchange leaves are the reference's.
bool run_custom_exchange(const Setup& s, std::shared_ptr<dist::ProcessGroup> pg) {
  auto reference = make_model(s);
  auto replica = make_model(s);
  dist::DDPOptions o;
  o.bucket_cap_mb = o.first_bucket_mb = 0.0001;  // a bucket per parameter or so: many to order
  o.rebuild_buckets = false;
  dist::DistributedDataParallel ddp(replica, pg, o);
  std::vector<std::string> calls;
  ddp.set_exchange(std::make_unique<RecordingExchange>(pg, calls));
  auto fail = [&](const std::string& what) {
    std::string seen;
    for (const auto& c : calls) seen += c + "; ";
    std::fprintf(stderr, "rank %d: custom exchange: %s (calls: %s)\n", s.rank, what.c_str(), seen.c_str());
    return false;
  };
  if (calls != std::vector<std::string>{"layout"}) return fail("set_exchange did not lay the buckets out once");
  if (ddp.exchange_name() != "recording gloo") return fail("exchange_name is " + ddp.exchange_name());
  const size_t n = ddp.num_buckets();
  if (n < 3) return fail("only " + std::to_string(n) + " buckets");
  std::vector<std::string> want;
  for (size_t b = 0; b < n; ++b) want.push_back("launch " + std::to_string(b));
  for (size_t b = 0; b < n; ++b) want.push_back("finish " + std::to_string(b));
  want.push_back("end");
  for (int step = 0; step < 2; ++step) {
    auto [x, y] = global_batch(s, step);
    calls.clear();
    replica->zero_grad();
    {
      auto guard = ddp.no_sync();
      backward_on_my_rows(s, *replica, x, y);
    }
    if (!calls.empty()) return fail("the exchange was called inside no_sync");
    replica->zero_grad();
    backward_on_my_rows(s, *replica, x, y);
    if (calls != want) return fail("step " + std::to_string(step) + ": buckets not launched, then finished, in order");
    reference->zero_grad();
    loss_of(s, *reference, x, y).backward();
    NamedTensors got, ref;
    for (const auto& [name, p] : replica->named_parameters()) got.emplace_back(name, p.grad());
    for (const auto& [name, p] : reference->named_parameters()) ref.emplace_back(name, p.grad());
    if (!compare_named(got, ref, 1e-6, "averaged gradients step " + std::to_string(step), s.rank)) return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4 && argc != 5) {
    std::fprintf(stderr, "usage: %s mlp|gpt MODE cpu|cuda [nccl|ce_collectives]\n", argv[0]);
    return 2;
  }
  try {
    auto pg = dist::init_process_group();
    Setup s;
    s.model_kind = argv[1];
    std::string mode = argv[2];
    s.rank = pg->rank();
    s.world = pg->size();
    s.device = std::string(argv[3]) == "cuda" ? Device::cuda(dist::read_dist_env().local_rank) : Device::cpu();
    if (s.device.is_cuda()) cuda::set_device(s.device.index);
    dist::DDPOptions o;
    // "ce_collectives": a sharded optimizer's collectives on the copy engines (DDPOptions::copy_engines).
    if (argc == 5 && std::string(argv[4]) == "ce_collectives") {
      o.copy_engines = true;
    } else if (argc == 5 && std::string(argv[4]) != "nccl") {
      std::fprintf(stderr, "unknown exchange %s (nccl or ce_collectives)\n", argv[4]);
      return 2;
    }
    bool ok = false;
    if (mode == "default") {
      ok = run_parity(s, pg, o, 1, 1e-6, "default buckets");
    } else if (mode == "tiny") {
      o.bucket_cap_mb = o.first_bucket_mb = 0.0001;
      ok = run_parity(s, pg, o, 1, 1e-6, "tiny buckets");
    } else if (mode == "one") {
      o.bucket_cap_mb = o.first_bucket_mb = 1000;
      ok = run_parity(s, pg, o, 1, 1e-6, "one bucket");
    } else if (mode == "layouts") {
      ok = run_layouts(s, pg);
    } else if (mode == "shardlayout") {
      ok = run_shard_layout(s, pg);
    } else if (mode == "nosync") {
      ok = run_parity(s, pg, o, 2, 1e-6, "no_sync accumulation over 2 micro-batches");
    } else if (mode == "bf16comm") {
      o.comm_dtype = DType::BFloat16;
      ok = run_parity(s, pg, o, 1, 2e-2, "bf16 communication");
    } else if (mode == "overlap") {
      // Many buckets, so the optimizer runs in many pieces, and accumulation: steps only on the last micro-batch.
      o.bucket_cap_mb = o.first_bucket_mb = 0.0001;
      ok = run_parity(s, pg, o, 2, 1e-6, "optimizer step per bucket inside backward", Stepping::kInBackward);
    } else if (mode == "overlapstream") {
      // The same, with each bucket's update on the update stream during backward (CUDA).
      o.bucket_cap_mb = o.first_bucket_mb = 0.0001;
      ok = run_parity(s, pg, o, 2, 1e-6, "optimizer step per bucket on the update stream",
                      Stepping::kInBackwardWhenReduced);
    } else if (mode == "zero") {
      // Default buckets (parameters cut across rank blocks mid-tensor) and accumulation.
      ok = run_parity(s, pg, o, 2, 1e-6, "ZeRO-1, default buckets", Stepping::kZero);
    } else if (mode == "zerotiny") {
      o.bucket_cap_mb = o.first_bucket_mb = 0.0001;
      ok = run_parity(s, pg, o, 1, 1e-6, "ZeRO-1, tiny buckets", Stepping::kZero);
    } else if (mode == "zerobf16") {
      ok = run_zero_bf16(s, pg, o);
    } else if (mode == "zerostream") {
      // Each bucket's update and all-gather during backward (CUDA; Gloo runs them at the end of backward).
      ok = run_parity(s, pg, o, 2, 1e-6, "ZeRO-1, updates on the update stream", Stepping::kZeroWhenReduced);
    } else if (mode == "zerostep") {
      ok = run_zero_on_step(s, pg, o);
    } else if (mode == "zerosteptiny") {
      o.bucket_cap_mb = o.first_bucket_mb = 0.0001;
      ok = run_zero_on_step(s, pg, o);
    } else if (mode == "zerostepsmall") {
      o.bucket_cap_mb = o.first_bucket_mb = 0.004;  // a few buckets per GPT block
      ok = run_zero_on_step(s, pg, o);
    } else if (mode == "zerostepbf16") {
      ok = run_zero_bf16(s, pg, o, Stepping::kZeroOnStep);
    } else if (mode == "zerostreambf16") {
      ok = run_zero_bf16(s, pg, o, Stepping::kZeroWhenReduced);
    } else if (mode == "unused") {
      ok = run_unused(s, pg);
    } else if (mode == "zerounused") {
      ok = run_zero_unused(s, pg);
    } else if (mode == "mismatch") {
      ok = run_mismatch(s, pg);
    } else if (mode == "graph") {
      ok = run_graph(s, pg, o);
    } else if (mode == "zerograph") {
      ok = run_graph(s, pg, o, Stepping::kZero);
    } else if (mode == "zerostreamgraph") {
      ok = run_graph(s, pg, o, Stepping::kZeroWhenReduced);
    } else if (mode == "gathered") {
      ok = run_parity(s, pg, o, 1, 1e-6, "ZeRO-1 with gathered-input gradients", Stepping::kGathered);
    } else if (mode == "gatheredbf16") {
      ok = run_zero_bf16(s, pg, o, Stepping::kGathered);
    } else if (mode == "gatheredgraph") {
      ok = run_graph(s, pg, o, Stepping::kGathered);
    } else if (mode == "gatheredstep") {
      ok = run_zero_on_step(s, pg, o, Stepping::kGatheredOnStep);
    } else if (mode == "gatheredstepbf16") {
      ok = run_zero_bf16(s, pg, o, Stepping::kGatheredOnStep);
    } else if (mode == "customexchange") {
      ok = run_custom_exchange(s, pg);
    } else if (mode == "gatheredtwice") {
      ok = run_gathered_twice(s, pg);
    } else {
      std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
      return 2;
    }
    if (ok) std::printf("rank %d: %s %s passed\n", s.rank, argv[1], mode.c_str());
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
