// `dtrain status RUN_DIR`: prints whether the run is running, failed or finished, its
// progress, latest checkpoint, restarts with their causes and the nodes' heartbeats.
#include "commands.h"

#include "report/status.h"
#include "train/checkpoint.h"

#include <cstdio>

namespace dtrain::cli {

int run_status(const std::string& run_dir) {
  const std::string text = report::status_report(run_dir, train::checkpoint_problem);
  std::fwrite(text.data(), 1, text.size(), stdout);
  return 0;
}

}  // namespace dtrain::cli
