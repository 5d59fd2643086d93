// `dtrain export` as one call: which model a run directory exports (its final/, else its
// latest complete checkpoint, or with init_weights the config's initial model), the output
// rule for the directory it writes, and the one-line report of what was written.
#pragma once

#include "train/hf_export.h"

#include <string>

namespace dtrain::train {

struct ExportRunOptions {
  std::string run_dir;
  std::string out_dir;        ///< "" = <run_dir>/export
  bool init_weights = false;  ///< the config's initial model instead of the trained one
  HfExportFlags flags;        ///< each overriding its export.* key when given
};

/// Exports the run as Hugging Face files into the checked output directory (core's output
/// rule: never what the export reads, never a user's directory without an export's marker):
/// final/ when it holds the finished model (but the latest checkpoint's fp32 masters when
/// --dtype fp32 asks for them and final/ was written rounded), else the latest complete
/// checkpoint, streamed tensor by tensor. Prints "export: <what> -> <dir>: <files>" on
/// stdout, and on stderr why it took a checkpoint. UsageError / ConfigError / IoError /
/// CheckpointError as the export's parts raise them.
void export_run(const ExportRunOptions& o);

}  // namespace dtrain::train
