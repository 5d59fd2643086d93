// checkpoint_model_load: config of the checkpoint -> model -> single-rank stage-0 fp32
// engine -> checkpoint_load (reshards from any saved partition). checkpoint_export_hf
// needs no model: the layouts of the config and the checkpoint's masters read tensor by
// tensor (CheckpointMasters) go straight into the Hugging Face files.
#include "train/checkpoint_export.h"

#include "config/train_config.h"
#include "core/check.h"
#include "core/input_file.h"
#include "data/tokenizer.h"
#include "train/checkpoint.h"
#include "train/hf_export.h"
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

// A checkpoint's small file (`latest`, a manifest) through the input rule, "" when it
// cannot be read: checkpoint_load then names what is wrong with it and falls back.
std::string text_read(const fs::path& p) {
  std::string why;
  InputFile f = input_file_try_open(p.string(), kInputMetaMaxBytes, &why);
  if (!why.empty()) return {};
  try {
    return f.read_all("checkpoint file", kInputMetaMaxBytes);
  } catch (const Error&) {
    return {};
  }
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
  DT_ENFORCE(input_present(cpath.string(), "run directory file"), CheckpointError,
             "{}: no checkpoint manifest with a config and no config.yaml: is it a dtrain run directory?",
             run_dir.string());
  return config::config_load_file(cpath.string()).cfg;
}

}  // namespace

CheckpointModel checkpoint_model_load(const std::string& run_dir) {
  input_dir_check(run_dir, "run directory");
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
  engine.weights().materialize();
  cm.info.checkpoint_dir = ck.dir;
  cm.info.step = ck.state.step;
  cm.info.saved_world_size = ck.saved_world_size;
  cm.info.saved_stage = ck.saved_stage;
  cm.info.lora = cm.model->lora_on();
  cm.info.skipped = ck.skipped;
  return cm;
}

CheckpointExportResult checkpoint_export_hf(const std::string& run_dir, const std::string& out_dir,
                                            const HfExportFlags& flags) {
  input_dir_check(run_dir, "run directory");
  const config::TrainConfig cfg = export_config(run_dir);
  HfExportOptions opts = hf_export_options(cfg, flags);
  HfExportSource src;
  src.config = model_config_from(cfg);
  src.base = model::layout_build(src.config);
  const bool lora = cfg.lora.enabled();
  if (lora) {
    src.lora_config = lora_config_from(cfg, src.config);
    src.lora = model::lora_layout_build(src.config, src.lora_config);
  }
  std::vector<std::pair<model::BufferLayout, bool>> buffers;
  for (const auto& b : src.base) buffers.emplace_back(b, !lora);
  for (const auto& b : src.lora) buffers.emplace_back(b, true);
  CheckpointMasters masters(run_dir, buffers);
  src.read = [&masters](size_t b, size_t lo, size_t hi, float* dst) { masters.read(b, lo, hi, dst); };
  const auto tokenizer = data::tokenizer_load(cfg.data.tokenizer);
  opts.bos_id = tokenizer->bos_id();
  opts.eos_id = tokenizer->eos_id();
  hf_export_write(src, out_dir.empty() ? (fs::path(run_dir) / "export").string() : out_dir, opts);
  const CheckpointLoadResult& ck = masters.result();
  CheckpointExportResult info;
  info.checkpoint_dir = ck.dir;
  info.step = ck.state.step;
  info.saved_world_size = ck.saved_world_size;
  info.saved_stage = ck.saved_stage;
  info.lora = lora;
  info.skipped = ck.skipped;
  return info;
}

}  // namespace dtrain::train
