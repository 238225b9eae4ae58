#pragma once
// The one way dpt-train and dpt-bench wrap a model for data parallelism: DDP (ddp.h) and what updates
// behind it, a plain optimizer or a sharded one (ZeRO-1, zero_optimizer.h; gathered gradients,
// gathered_linear_zero.h), in the update timing asked for (update_timing.h).
#include <memory>
#include <vector>

#include "distributed/ddp.h"
#include "distributed/shard_pieces.h"
#include "distributed/sharded_optimizer.h"
#include "distributed/update_timing.h"
#include "optim/optimizer.h"

namespace dpt::dist {

enum class Sharding { None, Zero, GatheredGrads };

struct DataParallelOptions {
  DDPOptions ddp;
  Sharding sharding = Sharding::None;
  // OnStep: the caller steps, after backward (the plain optimizer, or DataParallel::sharded). Otherwise
  // the update runs inside backward: Sharding::None through step_in_backward (overlapped_optimizer.h).
  UpdateTiming timing = UpdateTiming::OnStep;
};

struct DataParallel {
  std::unique_ptr<DistributedDataParallel> ddp;
  std::unique_ptr<ShardedOptimizer> sharded;  // Sharding::Zero or GatheredGrads: this rank's shard
};

// `optimizer`: the plain optimizer (Sharding::None; needed unless timing is OnStep). `groups` and
// `make_shard`: the sharded optimizer's parameters and its inner optimizer over this rank's pieces
// (Sharding::Zero or GatheredGrads).
DataParallel wrap_data_parallel(std::shared_ptr<nn::Module> model, std::shared_ptr<ProcessGroup> group,
                                const DataParallelOptions& options, optim::Optimizer* optimizer,
                                const std::vector<optim::ParamGroup>& groups, const ShardPieces::Factory& make_shard);

}  // namespace dpt::dist
