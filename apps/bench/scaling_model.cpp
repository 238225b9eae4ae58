#include "scaling_model.h"

#include <algorithm>

namespace dpt::bench {

double ScalingModel::allreduce_ms(int gpus) const {
  if (gpus <= 1) return 0;
  double n = gpus;
  int nodes = (gpus + gpus_per_node - 1) / gpus_per_node;
  // Within a node: ring over NVLink. Across nodes: the bytes each node exchanges cross the network once
  // more per ring step (hierarchical reduce-scatter / all-gather), at the network's bandwidth.
  double intra = 2.0 * (n - 1) * alpha_us * 1e-3 + 2.0 * (n - 1) / n * grad_bytes / (beta_gbps * 1e9) * 1e3;
  double inter = 0;
  if (nodes > 1) {
    double m = nodes;
    inter = 2.0 * (m - 1) / m * grad_bytes / (inter_node_gbps * 1e9) * 1e3;
  }
  return intra + inter;
}

double ScalingModel::step_ms(int gpus) const {
  return compute_ms + std::max(0.0, allreduce_ms(gpus) - hidden_ms);
}

}  // namespace dpt::bench
