#pragma once
// logging.tensorboard: the metrics as TensorBoard scalars, in an event file (tfevents.h) beside the
// metrics file, so `tensorboard --logdir runs` shows every run under its directory's name. Tags:
//   train/loss, train/lr, train/grad_norm, train/throughput (units/s, all ranks), train/step_ms,
//   train/mfu (when measured), train/loss_scale (fp16); val/loss, val/perplexity (language models).
// Each process start writes a new file, events.out.tfevents.<unix seconds>.<host>.<pid>, that begins
// with a SessionLog START at the step after `keep_through_step`: TensorBoard then drops what earlier files
// hold from that step on (the steps an interrupted run logged after its last checkpoint, or all of an
// earlier run in the same directory when this one starts over).
#include <cstdint>
#include <memory>
#include <string>

#include "metrics_log.h"

namespace dpt::train {

std::unique_ptr<MetricsSink> make_tensorboard_sink(const std::string& dir, int64_t keep_through_step);

}  // namespace dpt::train
