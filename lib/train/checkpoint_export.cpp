// checkpoint_export_hf: config of the checkpoint -> model -> single-rank stage-0 fp32
// engine -> checkpoint_load (reshards from any saved partition) -> model_export_hf.
#include "train/checkpoint_export.h"

#include "config/train_config.h"
#include "core/check.h"
#include "data/tokenizer.h"
#include "train/checkpoint.h"
#include "train/model_factory.h"
#include "train/zero_engine.h"

#include <nlohmann/json.hpp>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace dtrain::train {

namespace fs = std::filesystem;

namespace {

std::string text_read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) return {};
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The config to rebuild the model from: the one saved with the checkpoint `latest`
// names (exactly what was trained), else the run dir's config.yaml. The model layout is
// the same in every checkpoint of a run (checkpoint_load verifies it).
config::TrainConfig export_config(const fs::path& run_dir) {
  const fs::path root = run_dir / "checkpoints";
  std::string latest = text_read(root / "latest");
  while (!latest.empty() && std::isspace(static_cast<unsigned char>(latest.back()))) latest.pop_back();
  // Only a plain step<N> name: "../elsewhere" or an absolute path must not make us open a
  // manifest outside the run (checkpoint_load then skips it and names it).
  const bool plain = latest.size() > 4 && latest.rfind("step", 0) == 0 &&
                     latest.find_first_not_of("0123456789", 4) == std::string::npos;
  if (plain) {
    const fs::path mpath = root / latest / "manifest.json";
    const nlohmann::json man = nlohmann::json::parse(text_read(mpath), nullptr, false);
    if (man.is_object() && man.contains("config_yaml") && man.at("config_yaml").is_string() &&
        !man.at("config_yaml").get<std::string>().empty())
      return config::config_load_string(man.at("config_yaml").get<std::string>(), mpath.string() + " (config_yaml)")
          .cfg;
  }
  const fs::path cpath = run_dir / "config.yaml";
  DT_ENFORCE(fs::exists(cpath), CheckpointError,
             "{}: no checkpoint manifest with a config and no config.yaml: is it a dtrain run directory?",
             run_dir.string());
  return config::config_load_file(cpath.string()).cfg;
}

}  // namespace

CheckpointModel checkpoint_model_load(const std::string& run_dir) {
  DT_ENFORCE(fs::is_directory(run_dir), IoError, "{}: not a directory (pass a dtrain run directory)", run_dir);
  CheckpointModel cm;
  cm.cfg = export_config(run_dir);
  cm.model = model_create(cm.cfg);
  // One rank at stage 0 in fp32: every buffer is resident and its master IS the model's
  // buffer, so the load reassembles the full fp32 weights from any saved partition.
  ZeroOptions opts = zero_options_from(cm.cfg);
  opts.stage = 0;
  opts.compute_dtype = DType::F32;
  opts.overlap_comm = false;
  ZeroEngine engine(*cm.model, nullptr, opts);
  // Only reads the run: a damaged checkpoint is skipped but left where it is.
  const CheckpointLoadResult ck = checkpoint_load(run_dir, engine.checkpoint_view(), false);
  std::string tried;
  for (const auto& s : ck.skipped) tried += "\n  " + s;
  DT_ENFORCE(ck.loaded, CheckpointError,
             "{}: no final/ model and no complete checkpoint under {}/checkpoints{}{}; pass --init to use the config's "
             "initial weights instead",
             run_dir, run_dir, tried.empty() ? "" : "; skipped:", tried);
  engine.params_materialize();
  cm.info.checkpoint_dir = ck.dir;
  cm.info.step = ck.state.step;
  cm.info.saved_world_size = ck.saved_world_size;
  cm.info.saved_stage = ck.saved_stage;
  cm.info.lora = cm.model->lora_on();
  cm.info.skipped = ck.skipped;
  return cm;
}

CheckpointExportResult checkpoint_export_hf(const std::string& run_dir, const std::string& out_dir) {
  CheckpointModel cm = checkpoint_model_load(run_dir);
  const auto tokenizer = data::tokenizer_load(cm.cfg.data.tokenizer);
  const std::string dir = out_dir.empty() ? (fs::path(run_dir) / "export").string() : out_dir;
  model_export_hf(*cm.model, dir, tokenizer->bos_id(), tokenizer->eos_id());
  return cm.info;
}

}  // namespace dtrain::train
