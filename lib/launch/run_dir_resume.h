// What `dtrain resume RUN_DIR` takes from a run directory: its saved config.yaml and
// hostfile (unless given), the directory itself as the output, and the --set changes the
// saved config needs (a pre-neat_packing run keeps packing; a new max_steps moves the
// schedule's end with it), each change said in the log.
#pragma once

#include <string>
#include <vector>

namespace dtrain::launch {

struct ResumeInputs {
  std::string run_dir;
  std::string config;             ///< "" = <run_dir>/config.yaml
  std::string hostfile;           ///< "" = <run_dir>/hostfile when it exists
  std::vector<std::string> sets;  ///< --set key=value, in order
};

/// The inputs filled from the run directory: config and hostfile as above, sets with what
/// the saved config needs first (data.neat_packing=false for a run launched before that key
/// existed) and scheduler.params.total_num_steps after a new training.max_steps when the
/// schedule ended at max_steps. Logs every key the sets change (old -> new), or that they
/// change nothing. UsageError when the run directory has no config.yaml and none is given.
ResumeInputs run_dir_resume_inputs(ResumeInputs in);

}  // namespace dtrain::launch
