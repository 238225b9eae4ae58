#pragma once
// logging.csv: the metrics as one CSV table (metrics.csv beside the metrics file), for spreadsheets and
// pandas.read_csv. One row per record, train and eval alike, with the columns
//   type,step,loss,lr,grad_norm,step_ms,throughput,throughput_per_gpu,unit,mfu,elapsed_s,skipped,
//   loss_scale,val_loss,best_val_loss,best_step,val_perplexity
// and empty cells where a record has no such value (eval rows have no loss, mfu is empty when not
// measured, loss_scale without fp16, val_perplexity for models that are not language models). Numbers
// are written in their shortest exact form; non-finite ones as nan, inf, -inf.
#include <cstdint>
#include <memory>
#include <string>

#include "metrics_log.h"

namespace dpt::train {

constexpr const char* kMetricsCsvHeader =
    "type,step,loss,lr,grad_norm,step_ms,throughput,throughput_per_gpu,unit,mfu,elapsed_s,skipped,loss_scale,"
    "val_loss,best_val_loss,best_step,val_perplexity,val_accuracy";

// Rows of steps after `keep_through_step` (> 0 when resuming) are dropped, as in the JSONL file.
std::unique_ptr<MetricsSink> make_csv_sink(const std::string& path, int64_t keep_through_step);

}  // namespace dpt::train
