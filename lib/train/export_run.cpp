// `dtrain export`'s choice of model (final/, a checkpoint or the initial model), its output
// rule and its report line, over hf_export (a model in memory) and checkpoint_export (a
// checkpoint streamed tensor by tensor).
#include "train/export_run.h"

#include "config/train_config.h"
#include "core/check.h"
#include "core/output_path.h"
#include "data/tokenizer.h"
#include "train/checkpoint_export.h"
#include "train/model_factory.h"

#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>

namespace dtrain::train {

namespace {

namespace fs = std::filesystem;

// What an export wrote, for the one-line report.
std::string written(const std::string& dir) {
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

// The output rule (core/output_path.h) for the export's directory: never what the export
// reads (the run directory, its final/ and checkpoints, the config's init_from, tokenizer
// and data), never a non-empty directory without an export's marker (a base model, a
// user's files). RUN_DIR/export, the default, is also taken when an older dtrain wrote it
// (nothing but export files in it).
std::string export_target(const std::string& run_dir, const std::string& out_dir) {
  OutputDirRule rule;
  rule.what = out_dir.empty() ? "export (RUN_DIR/export)" : "export -o";
  rule.marker = kHfExportMarker;
  rule.kind = kHfExportKind;
  const fs::path run(run_dir);
  rule.inputs = {run_dir, (run / "final").string(), (run / "checkpoints").string()};
  std::error_code ec;
  const fs::path cfg_path = run / "config.yaml";
  if (fs::is_regular_file(cfg_path, ec)) {
    try {
      const config::TrainConfig cfg = config::config_load_file(cfg_path.string()).cfg;
      for (const std::string& p : {cfg.model.init_from, cfg.data.tokenizer, cfg.data.train, cfg.data.valid})
        if (!p.empty() && p != "byte") rule.inputs.push_back(p);
    } catch (const std::exception&) {
      // The export itself reports a config it cannot read; the rule still holds for the rest.
    }
  }
  if (out_dir.empty())
    rule.legacy_own = [](const std::string& d) {
      std::error_code e;
      bool any = false;
      for (const auto& x : fs::directory_iterator(d, e)) {
        if (!hf_export_owned_name(x.path().filename().string())) return false;
        any = true;
      }
      return any && !e;
    };
  return output_dir_check(out_dir.empty() ? (run / "export").string() : out_dir, rule).target;
}

// final/ is taken unless --dtype fp32 asks for weights it holds rounded while the last
// checkpoint has the fp32 masters (said on stderr).
bool final_is_taken(const ExportRunOptions& o, const fs::path& final_dir) {
  std::error_code ec;
  const bool use_final = fs::exists(final_dir / "config.json", ec);
  if (use_final && !o.init_weights && o.flags.dtype == "fp32" &&
      model::hf_config_read((final_dir / "config.json").string()).torch_dtype != "float32" &&
      fs::exists(fs::path(o.run_dir) / "checkpoints" / "latest", ec)) {
    std::fprintf(stderr, "export: %s is not fp32; exporting the fp32 masters of the latest checkpoint\n",
                 final_dir.c_str());
    return false;
  }
  return use_final;
}

// A model built in memory: the config's initial one (init_weights) or final/'s.
void export_model(const ExportRunOptions& o, const HfExportFlags& flags, const fs::path& final_dir,
                  const std::string& dir) {
  const fs::path cfg_path = fs::path(o.run_dir) / "config.yaml";
  std::unique_ptr<model::Model> m;
  std::string what;
  std::optional<config::TrainConfig> cfg;
  std::error_code ec;
  if (fs::exists(cfg_path, ec)) cfg = config::config_load_file(cfg_path.string()).cfg;
  if (o.init_weights) {
    DT_ENFORCE(cfg.has_value(), UsageError, "export --init: {} has no config.yaml to build the initial model from",
               o.run_dir);
    m = model_create(*cfg);
    what = cfg->model.init_from.empty() ? fmt::format("initial weights (seed {})", cfg->training.seed)
                                        : "initial weights (" + cfg->model.init_from + ")";
  } else {
    m = model_load_hf_dir(final_dir.string());
    what = final_dir.string() + " (the finished run's model)";
  }
  HfExportOptions opts = hf_export_options(cfg ? *cfg : config::TrainConfig{}, flags);
  if (opts.extra_files.empty() && !o.init_weights) {
    config::TrainConfig from_final;  // the tokenizer files the trainer copied into final/
    from_final.model.init_from = final_dir.string();
    opts.extra_files = hf_tokenizer_files(from_final);
  }
  const auto tokenizer = data::tokenizer_load(cfg ? cfg->data.tokenizer : "byte");
  opts.bos_id = tokenizer->bos_id();
  opts.eos_id = tokenizer->eos_id();
  model_export_hf(*m, dir, opts);
  std::printf("export: %s -> %s: %s\n", what.c_str(), dir.c_str(), written(dir).c_str());
  std::fflush(stdout);
}

void export_checkpoint(const ExportRunOptions& o, const HfExportFlags& flags, const fs::path& final_dir,
                       const std::string& dir) {
  const CheckpointExportResult r = checkpoint_export_hf(o.run_dir, dir, flags);
  for (const auto& why : r.skipped) std::printf("export: skipped a damaged checkpoint: %s\n", why.c_str());
  std::error_code ec;
  if (!fs::exists(final_dir / "config.json", ec))
    std::fprintf(stderr, "export: %s has no final/ model: exporting its latest complete checkpoint\n",
                 o.run_dir.c_str());
  std::printf("export: %s (step %lld, saved at world size %d, ZeRO stage %d) -> %s: %s\n", r.checkpoint_dir.c_str(),
              static_cast<long long>(r.step), r.saved_world_size, r.saved_stage, dir.c_str(), written(dir).c_str());
  std::fflush(stdout);
}

}  // namespace

void export_run(const ExportRunOptions& o) {
  const std::string dir = export_target(o.run_dir, o.out_dir);
  HfExportFlags flags = o.flags;
  flags.into_dir = true;
  const fs::path final_dir = fs::path(o.run_dir) / "final";
  if (o.init_weights || final_is_taken(o, final_dir)) export_model(o, flags, final_dir, dir);
  else export_checkpoint(o, flags, final_dir, dir);
}

}  // namespace dtrain::train
