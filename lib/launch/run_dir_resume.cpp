// A resume's inputs from its run directory (run_dir_resume_inputs) and the --set rules of
// a resumed config (resume_sets: the schedule's end follows max_steps, every change said).
#include "launch/run_dir_resume.h"

#include "config/train_config.h"
#include "core/check.h"
#include "core/input_file.h"
#include "core/log.h"

#include <filesystem>
#include <map>
#include <string_view>

namespace dtrain::launch {

namespace {

// `dtrain resume RUN --set k=v` changes the saved config: each key that changes is said,
// old and new value. The saved config holds the schedule's end explicitly (derived from
// max_steps when the job was launched), so a new training.max_steps moves the end with it
// when the end was max_steps, and is said when the config gave the end its own value.
void resume_sets(ResumeInputs& o) {
  const config::TrainConfig before = config::config_load_file(o.config, {}).cfg;
  config::LoadedConfig after = config::config_load_file(o.config, o.sets);
  auto set_given = [&](std::string_view key) {
    for (const std::string& s : o.sets)
      if (s.rfind(std::string(key) + "=", 0) == 0) return true;
    return false;
  };
  const auto& sb = before.scheduler;
  const auto steps_before = before.training.max_steps, steps_after = after.cfg.training.max_steps;
  if (steps_after && steps_before != steps_after && sb.total_num_steps &&
      !set_given("scheduler.params.total_num_steps") && sb.type && *sb.type != "WarmupLR") {
    if (steps_before && *sb.total_num_steps == *steps_before) {
      o.sets.push_back(fmt::format("scheduler.params.total_num_steps={}", *steps_after));
      after = config::config_load_file(o.config, o.sets);
    } else {
      log_warn(
          "resume: training.max_steps is now {}, but the schedule still ends at step {} "
          "(scheduler.params.total_num_steps in {}); add --set scheduler.params.total_num_steps={} to end it "
          "with the run",
          *steps_after, *sb.total_num_steps, o.config, *steps_after);
    }
  }
  const auto old_values = config::config_key_values(before);
  const std::map<std::string, std::string> old_map(old_values.begin(), old_values.end());
  std::vector<std::string> changed;
  for (const auto& [key, value] : config::config_key_values(after.cfg)) {
    auto it = old_map.find(key);
    const std::string was = it == old_map.end() ? "(not set)" : it->second;
    if (was != value) changed.push_back(fmt::format("{}: {} -> {}", key, was, value));
  }
  if (changed.empty()) log_info("resume: --set changes nothing in {}", o.config);
  for (const std::string& c : changed) log_info("resume: {}", c);
}

}  // namespace

ResumeInputs run_dir_resume_inputs(ResumeInputs o) {
  namespace fs = std::filesystem;
  const fs::path dir(o.run_dir);
  if (o.config.empty()) {
    DT_ENFORCE(input_present((dir / "config.yaml").string(), "run directory file"), UsageError,
               "{} has no config.yaml: is it a dtrain run directory? (pass --config to resume with another config)",
               o.run_dir);
    o.config = (dir / "config.yaml").string();
  }
  if (o.hostfile.empty() && input_present((dir / "hostfile").string(), "run directory file"))
    o.hostfile = (dir / "hostfile").string();
  // A run launched before data.neat_packing existed packed the token stream into windows;
  // its config.yaml does not say so (launches since write the resolved value), and its
  // checkpoints' data position counts those windows: it keeps them.
  if (o.config == (dir / "config.yaml").string() &&
      !config::config_load_file(o.config, {}).cfg.data.neat_packing.has_value()) {
    log_info(
        "{}: the run was launched before data.neat_packing existed: it keeps packing its data as then "
        "(data.neat_packing: false)",
        o.config);
    o.sets.insert(o.sets.begin(), "data.neat_packing=false");
  }
  if (!o.sets.empty()) resume_sets(o);
  return o;
}

}  // namespace dtrain::launch
