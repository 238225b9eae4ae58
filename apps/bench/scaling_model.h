#pragma once
// Step-time model for weak-scaling data parallelism.
//
//   T(N) = T_compute + exposed(N) + interference,   exposed(N) = max(0, T_allreduce(N) - hidden)
//   T_allreduce(N) = 2 (N-1) alpha + 2 (N-1)/N * bytes / beta          (ring AllReduce)
//
// `interference` (N > 1 only, never negative) is what a step loses beyond exposed communication: kernels
// slowed by NCCL's kernels sharing the SMs and memory, the end-of-backward waits. Without it the model
// underestimates small models' multi-GPU steps. `hidden` is the communication that overlaps compute.
//
// Fitted at the largest measured N so that the model reproduces that step: hidden = communication - exposed,
// interference = step - compute - exposed. A step can grow by less than its exposed communication (with the
// optimizer inside backward, the update the 1-GPU step runs after backward runs while later buckets
// communicate): that update hides communication too, so the shortfall is added to `hidden`, not kept as a
// negative interference, which would predict steps faster than one GPU's at smaller N.
//
// The bus bandwidth beta is fitted from the measured communication time less the latency term, when that
// time is a transfer time. A sum of bucket spans longer than the whole step is not: it counts spans that ran
// at once or waited on something else (updates, peers), or it was timed on an eager step beside a replayed
// one (dpt-bench times its collectives on one eager step); it would give a bandwidth far below the link's.
// Then beta keeps its default and the step is reproduced through `hidden` and `interference` alone. Nodes
// joined by a slower network use the network's beta for the inter-node part (hierarchical: NVLink within a
// node, network across). So the model's step never falls below one GPU's and never shrinks as N grows.
#include <cstdint>

namespace dpt::bench {

struct ScalingModel {
  double compute_ms = 0;     // 1-GPU step time
  double hidden_ms = 0;      // communication that backward can hide
  double interference_ms = 0;  // per-step cost beyond exposed communication, >= 0
  double alpha_us = 5;       // per ring step
  double beta_gbps = 300;    // intra-node bus bandwidth, GB/s (NVLink class unless fitted)
  bool beta_fitted = false;  // beta comes from the measured communication time
  double inter_node_gbps = 25;  // e.g. 200 Gb/s InfiniBand
  int gpus_per_node = 8;
  double grad_bytes = 0;

  // Fitted to one multi-GPU measurement (step, communication and exposed communication times at `gpus`)
  // and the 1-GPU step: reproduces that measurement exactly (a multi-GPU step faster than one GPU's, noise,
  // is predicted at one GPU's).
  static ScalingModel fit(double compute_ms, double grad_bytes, int gpus, double step_ms, double comm_ms,
                          double exposed_ms);

  double allreduce_ms(int gpus) const;
  double step_ms(int gpus) const;
  double efficiency(int gpus) const { return compute_ms / step_ms(gpus); }
};

}  // namespace dpt::bench
