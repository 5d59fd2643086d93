// The trainer's progress as one typed record (step, loss, lr, rates, per-rank times and the
// step's named extra metrics) and its three written forms: the record line rank 0 sends
// the launcher (one prefixed JSON line on stdout), the human progress line of rank logs
// and terminals, and the named metrics' place in metrics.jsonl. One writer and one reader
// of each, here.
#pragma once

#include "report/straggler.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dtrain::report {

/// Named extra metrics of a step, in the order the step produced them
/// ("rewards/accuracies", "logps/chosen", ... as TRL and LLaMA-Factory name them).
using NamedMetrics = std::vector<std::pair<std::string, double>>;

/// What rank 0 reports every steps_per_print steps.
struct ProgressRecord {
  int64_t step = 0;
  int64_t total_steps = 0;
  double loss = 0.0;  ///< the step's loss
  double lr = 0.0;
  double grad_norm = 0.0;
  double loss_scale = 1.0;
  double tokens_per_s = 0.0;  ///< over the print interval
  double step_time_s = 0.0;   ///< mean seconds per step over the print interval
  bool skipped = false;       ///< the step was skipped (fp16 overflow)
  /// Several ranks only (< 0 otherwise): bytes rank 0 sent per step and seconds per
  /// step the ZeRO engine's collectives ran, over the print interval.
  double comm_bytes_per_step = -1.0;
  double comm_s_per_step = -1.0;
  /// Several ranks only (empty otherwise): every rank's compute time and wait in
  /// collectives per step (ms; index = rank), for the straggler check.
  RankTimes times;
  /// The interval's mean of each named extra metric (empty for SFT).
  NamedMetrics metrics;
};

// ----------------------------------------------------------------------------
// The record line: what rank 0 prints for the launcher under `dtrain launch`

/// Every record line starts with this, then one JSON object: {"v": 1, "step", "total_steps",
/// "loss", "lr", "grad_norm", "loss_scale", "tokens_per_s", "step_time", "skipped" and,
/// where present, "comm_bytes_sent", "comm_seconds", "rank_compute_ms", "rank_comm_ms",
/// "metrics" (an object, in the step's order)}. A non-finite number is written as the
/// string "nan", "inf" or "-inf", so the record round-trips exactly.
inline constexpr std::string_view kProgressRecordPrefix = "dtrain-progress ";
inline constexpr int kProgressRecordVersion = 1;

/// The record line (without '\n').
std::string progress_record_line(const ProgressRecord& r);

/// Reads a record line. nullopt with *error empty: not a record line (no prefix); nullopt
/// with *error set: a record line that cannot be read (bad JSON, another version, a
/// missing or mistyped field, a bad metric name), *error saying what. Never throws.
/// Fields it does not know are ignored; step, total_steps and loss are required.
std::optional<ProgressRecord> progress_record_parse(std::string_view line, std::string* error);

// ----------------------------------------------------------------------------
// The human line: rank logs (logs/rank0.log), `dtrain run`'s output, plain terminals

/// "step 40/200 | loss 2.3141 | lr 3.0e-04 | grad_norm 0.812 | loss_scale 65536 |
/// tokens/s 18234 | 0.45 s/step[ | sent 0.274 MB/step | comm 19.4 ms/step][ | NAME VALUE
/// ...][ | skipped (fp16 overflow)]", each named metric as "| rewards/accuracies 0.9333".
std::string progress_line(const ProgressRecord& r);

/// The live view's short form of the named metrics: "acc 0.933 margin 1.2 chosen 0.512"
/// (TRL's rewards/accuracies, rewards/margins, rewards/chosen ... abbreviated, any other
/// name as it is; 3 significant digits). "" for none.
std::string progress_metrics_compact(const NamedMetrics& metrics);

// ----------------------------------------------------------------------------
// Named metrics in metrics.jsonl and elsewhere

/// Why `name` cannot name a metric ("" when it can): empty, longer than 64 bytes, or
/// holding a byte outside printable ASCII or a space, '|' or '"' (it is written into lines
/// and TensorBoard tags as it is).
std::string progress_metric_name_problem(std::string_view name);

/// Adds the named metrics to a metrics.jsonl training record: each as a top-level key
/// under its name (as TRL's log history holds them; non-finite as null, as the record's
/// other numbers), and "extra_metrics": their names in order. Nothing for none.
/// InternalError for a bad name (progress_metric_name_problem) or a name the record
/// already has (a built-in field such as "loss", or a duplicate).
void metrics_record_put(nlohmann::json& record, const NamedMetrics& metrics);

/// The named metrics of a metrics.jsonl record, in order (none for a record without
/// "extra_metrics", as every record of runs before them): a listed name whose value is
/// null or missing reads as NaN; a malformed "extra_metrics" (not a list of names) reads
/// as none. Never throws.
NamedMetrics metrics_record_get(const nlohmann::json& record);

}  // namespace dtrain::report
