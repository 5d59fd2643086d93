// `dtrain export RUN_DIR [-o DIR]`: the run's latest complete checkpoint (any world size
// and ZeRO stage) rebuilt in this one process and written as Hugging Face files.
#include "commands.h"

#include "train/checkpoint_export.h"

#include <cstdio>
#include <filesystem>

namespace dtrain::cli {

int run_export(const std::string& run_dir, const std::string& out_dir) {
  const std::string dir = out_dir.empty() ? (std::filesystem::path(run_dir) / "export").string() : out_dir;
  const train::CheckpointExportResult r = train::checkpoint_export_hf(run_dir, dir);
  for (const auto& why : r.skipped) std::printf("export: skipped a damaged checkpoint: %s\n", why.c_str());
  std::printf("export: %s (step %lld, saved at world size %d, ZeRO stage %d) -> %s: model.safetensors, config.json%s\n",
              r.checkpoint_dir.c_str(), static_cast<long long>(r.step), r.saved_world_size, r.saved_stage, dir.c_str(),
              r.lora ? ", adapter_model.safetensors, adapter_config.json" : "");
  std::fflush(stdout);
  return 0;
}

}  // namespace dtrain::cli
