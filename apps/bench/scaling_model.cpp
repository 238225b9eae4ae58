#include "scaling_model.h"

#include <algorithm>

namespace dpt::bench {

ScalingModel ScalingModel::fit(double compute_ms, double grad_bytes, int gpus, double step_ms, double comm_ms,
                               double exposed_ms) {
  ScalingModel m;
  m.compute_ms = compute_ms;
  m.grad_bytes = grad_bytes;
  if (gpus <= 1 || comm_ms <= 0) return m;
  const double excess_ms = step_ms - compute_ms;  // what the extra GPUs cost this step
  if (comm_ms <= step_ms) {
    const double n = gpus;
    const double transfer_ms = std::max(comm_ms - 2.0 * (n - 1) * m.alpha_us * 1e-3, 1e-3);
    m.beta_gbps = 2.0 * (n - 1) / n * grad_bytes / (transfer_ms * 1e-3) / 1e9;
    m.beta_fitted = true;
    exposed_ms = std::min(exposed_ms, comm_ms);
  } else {
    // Not a transfer time (scaling_model.h): the model's own AllReduce time stands in for it, all of it
    // exposed until the step says otherwise.
    comm_ms = m.allreduce_ms(gpus);
    exposed_ms = comm_ms;
  }
  m.hidden_ms = comm_ms - exposed_ms;
  m.interference_ms = excess_ms - exposed_ms;
  if (m.interference_ms < 0) {  // communication hidden behind the update as well (scaling_model.h)
    m.hidden_ms -= m.interference_ms;
    m.interference_ms = 0;
  }
  return m;
}

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
  if (gpus <= 1) return compute_ms;  // hidden_ms and interference_ms >= 0: never below this
  return compute_ms + std::max(0.0, allreduce_ms(gpus) - hidden_ms) + interference_ms;
}

}  // namespace dpt::bench
