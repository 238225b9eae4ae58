#include "distributed/data_parallel.h"

#include "core/error.h"
#include "distributed/gathered_linear_zero.h"
#include "distributed/overlapped_optimizer.h"
#include "distributed/zero_optimizer.h"

namespace dpt::dist {

DataParallel wrap_data_parallel(std::shared_ptr<nn::Module> model, std::shared_ptr<ProcessGroup> group,
                                const DataParallelOptions& options, optim::Optimizer* optimizer,
                                const std::vector<optim::ParamGroup>& groups, const ShardPieces::Factory& make_shard) {
  DataParallel out;
  out.ddp = std::make_unique<DistributedDataParallel>(std::move(model), std::move(group), options.ddp);
  switch (options.sharding) {
    case Sharding::Zero:
      out.sharded = std::make_unique<ZeroOptimizer>(*out.ddp, groups, make_shard, options.timing);
      break;
    case Sharding::GatheredGrads:
      out.sharded = std::make_unique<GatheredLinearZero>(*out.ddp, groups, make_shard, options.timing);
      break;
    case Sharding::None:
      if (options.timing == UpdateTiming::OnStep) break;
      DPT_CHECK(optimizer != nullptr, "wrap_data_parallel: an update inside backward needs the optimizer");
      step_in_backward(*out.ddp, *optimizer, options.timing);
      break;
  }
  return out;
}

}  // namespace dpt::dist
