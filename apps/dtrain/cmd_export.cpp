// `dtrain export RUN_DIR [-o DIR] [--init]`: the run's final/ model, else its latest
// complete checkpoint (any world size and ZeRO stage, rebuilt in this one process), else
// with --init the config's initial model, written as Hugging Face files.
#include "commands.h"

#include "config/train_config.h"
#include "core/check.h"
#include "data/tokenizer.h"
#include "train/checkpoint_export.h"
#include "train/model_factory.h"

#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>

namespace dtrain::cli {

int run_export(const std::string& run_dir, const std::string& out_dir, bool init_weights) {
  namespace fs = std::filesystem;
  const std::string dir = out_dir.empty() ? (fs::path(run_dir) / "export").string() : out_dir;
  const fs::path final_dir = fs::path(run_dir) / "final";
  std::error_code ec;
  if (init_weights || fs::exists(final_dir / "config.json", ec)) {
    const fs::path cfg_path = fs::path(run_dir) / "config.yaml";
    std::unique_ptr<model::Model> m;
    std::string what;
    std::optional<config::TrainConfig> cfg;
    if (fs::exists(cfg_path, ec)) cfg = config::config_load_file(cfg_path.string()).cfg;
    if (init_weights) {
      DT_ENFORCE(cfg.has_value(), UsageError, "export --init: {} has no config.yaml to build the initial model from",
                 run_dir);
      m = train::model_create(*cfg);
      what = cfg->model.init_from.empty() ? fmt::format("initial weights (seed {})", cfg->training.seed)
                                          : "initial weights (" + cfg->model.init_from + ")";
    } else {
      m = train::model_load_hf_dir(final_dir.string());
      what = final_dir.string() + " (the finished run's model)";
    }
    const auto tokenizer = data::tokenizer_load(cfg ? cfg->data.tokenizer : "byte");
    train::model_export_hf(*m, dir, tokenizer->bos_id(), tokenizer->eos_id());
    std::printf("export: %s -> %s: model.safetensors, config.json%s\n", what.c_str(), dir.c_str(),
                m->lora_on() ? ", adapter_model.safetensors, adapter_config.json" : "");
    std::fflush(stdout);
    return 0;
  }
  const train::CheckpointExportResult r = train::checkpoint_export_hf(run_dir, dir);
  for (const auto& why : r.skipped) std::printf("export: skipped a damaged checkpoint: %s\n", why.c_str());
  std::fprintf(stderr, "export: %s has no final/ model: exporting its latest complete checkpoint\n", run_dir.c_str());
  std::printf("export: %s (step %lld, saved at world size %d, ZeRO stage %d) -> %s: model.safetensors, config.json%s\n",
              r.checkpoint_dir.c_str(), static_cast<long long>(r.step), r.saved_world_size, r.saved_stage, dir.c_str(),
              r.lora ? ", adapter_model.safetensors, adapter_config.json" : "");
  std::fflush(stdout);
  return 0;
}

}  // namespace dtrain::cli
