#pragma once
// Step-time model for weak-scaling data parallelism.
//
//   T(N) = T_compute + exposed(N) + interference,   exposed(N) = max(0, T_allreduce(N) - hidden)
//   T_allreduce(N) = 2 (N-1) alpha + 2 (N-1)/N * bytes / beta          (ring AllReduce)
//
// `interference` (N > 1 only) is what a step loses beyond exposed communication: kernels slowed by
// NCCL's kernels sharing the SMs and memory, the 1/world scaling pass, the end-of-backward waits. Without
// it the model underestimates small models' multi-GPU steps. It is fitted as measured step - compute -
// exposed at the largest measured N, and can be negative: with the optimizer inside backward the update
// the 1-GPU step runs after backward is spread over the buckets and runs while later buckets
// communicate, so a step can grow by less than its exposed communication. Clamped at zero, the fit
// would miss the very measurement it was fitted to.
// T_compute is the 1-GPU step time; `hidden` is the part of backward that communication can overlap
// with (measured: the communication time that was not exposed at the largest measured N, bounded by
// the backward time). alpha (per-step latency) and beta (bus bandwidth) come from the collective
// benchmark or from the measured communication time itself. Nodes joined by a slower network use the
// network's beta for the inter-node part (hierarchical: NVLink within a node, network across).
#include <cstdint>

namespace dpt::bench {

struct ScalingModel {
  double compute_ms = 0;     // 1-GPU step time
  double hidden_ms = 0;      // communication that backward can hide
  double interference_ms = 0;  // per-step cost (or, negative, gain) beyond exposed communication
  double alpha_us = 5;       // per ring step
  double beta_gbps = 300;    // intra-node bus bandwidth, GB/s
  double inter_node_gbps = 25;  // e.g. 200 Gb/s InfiniBand
  int gpus_per_node = 8;
  double grad_bytes = 0;

  // Fitted to one multi-GPU measurement (step, communication and exposed communication times at `gpus`)
  // and the 1-GPU step: reproduces that measurement exactly, by construction.
  static ScalingModel fit(double compute_ms, double grad_bytes, int gpus, double step_ms, double comm_ms,
                          double exposed_ms);

  double allreduce_ms(int gpus) const;
  double step_ms(int gpus) const;
  double efficiency(int gpus) const { return compute_ms / step_ms(gpus); }
};

}  // namespace dpt::bench
