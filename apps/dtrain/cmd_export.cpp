// `dtrain export RUN_DIR [-o DIR] [--init] [--dtype D] [--max-shard-size S] [--merge-lora]`:
// the run's final/ model, else its latest complete checkpoint, else with --init the
// config's initial model, written as Hugging Face files (train::export_run decides which).
#include "commands.h"

#include "train/export_run.h"

namespace dtrain::cli {

int run_export(const std::string& run_dir, const std::string& out_dir, bool init_weights,
               const train::HfExportFlags& flags) {
  train::export_run({.run_dir = run_dir, .out_dir = out_dir, .init_weights = init_weights, .flags = flags});
  return 0;
}

}  // namespace dtrain::cli
