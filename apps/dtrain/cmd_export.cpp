// `dtrain export RUN_DIR [-o DIR] [--init] [--dtype D] [--max-shard-size S] [--merge-lora]`:
// the run's final/ model, else its latest complete checkpoint (any world size and ZeRO
// stage, streamed tensor by tensor), else with --init the config's initial model, written
// as Hugging Face files (the config's export section, the flags overriding it).
#include "commands.h"

#include "config/train_config.h"
#include "core/check.h"
#include "data/tokenizer.h"
#include "train/checkpoint_export.h"
#include "train/hf_export.h"
#include "train/model_factory.h"

#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>

namespace dtrain::cli {

namespace {

// What an export wrote, for the one-line report.
std::string written(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::string out;
  int shards = 0;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("model-", 0) == 0 && e.path().extension() == ".safetensors") ++shards;
  }
  out = shards > 0 ? fmt::format("{} shards + model.safetensors.index.json", shards) : "model.safetensors";
  out += ", config.json";
  if (fs::exists(fs::path(dir) / "adapter_config.json", ec)) out += ", adapter_model.safetensors, adapter_config.json";
  if (fs::exists(fs::path(dir) / "merged" / "config.json", ec)) out += ", merged/ (the adapters merged)";
  return out;
}

}  // namespace

int run_export(const std::string& run_dir, const std::string& out_dir, bool init_weights,
               const train::HfExportFlags& flags) {
  namespace fs = std::filesystem;
  const std::string dir = out_dir.empty() ? (fs::path(run_dir) / "export").string() : out_dir;
  const fs::path final_dir = fs::path(run_dir) / "final";
  std::error_code ec;
  bool use_final = fs::exists(final_dir / "config.json", ec);
  if (use_final && !init_weights && flags.dtype == "fp32" &&
      model::hf_config_read((final_dir / "config.json").string()).torch_dtype != "float32" &&
      fs::exists(fs::path(run_dir) / "checkpoints" / "latest", ec)) {
    // final/ holds rounded weights: the fp32 masters are in the last checkpoint.
    std::fprintf(stderr, "export: %s is not fp32; exporting the fp32 masters of the latest checkpoint\n",
                 final_dir.c_str());
    use_final = false;
  }
  if (init_weights || use_final) {
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
    train::HfExportOptions opts = train::hf_export_options(cfg ? *cfg : config::TrainConfig{}, flags);
    if (opts.extra_files.empty() && !init_weights) {
      config::TrainConfig from_final;  // the tokenizer files the trainer copied into final/
      from_final.model.init_from = final_dir.string();
      opts.extra_files = train::hf_tokenizer_files(from_final);
    }
    const auto tokenizer = data::tokenizer_load(cfg ? cfg->data.tokenizer : "byte");
    opts.bos_id = tokenizer->bos_id();
    opts.eos_id = tokenizer->eos_id();
    train::model_export_hf(*m, dir, opts);
    std::printf("export: %s -> %s: %s\n", what.c_str(), dir.c_str(), written(dir).c_str());
    std::fflush(stdout);
    return 0;
  }
  const train::CheckpointExportResult r = train::checkpoint_export_hf(run_dir, dir, flags);
  for (const auto& why : r.skipped) std::printf("export: skipped a damaged checkpoint: %s\n", why.c_str());
  if (!fs::exists(final_dir / "config.json", ec))
    std::fprintf(stderr, "export: %s has no final/ model: exporting its latest complete checkpoint\n", run_dir.c_str());
  std::printf("export: %s (step %lld, saved at world size %d, ZeRO stage %d) -> %s: %s\n", r.checkpoint_dir.c_str(),
              static_cast<long long>(r.step), r.saved_world_size, r.saved_stage, dir.c_str(), written(dir).c_str());
  std::fflush(stdout);
  return 0;
}

}  // namespace dtrain::cli
