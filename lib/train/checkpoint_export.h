// Offline export of a run's latest complete checkpoint to Hugging Face files in one
// process: the sharded fp32 masters of any world size and ZeRO stage are resharded onto
// a single rank (checkpoint_model_load), or streamed tensor by tensor into Hugging Face
// files (checkpoint_export_hf).
#pragma once

#include "config/train_config.h"
#include "model/model.h"
#include "train/hf_export.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace dtrain::train {

struct CheckpointExportResult {
  std::string checkpoint_dir;  ///< the checkpoint exported
  int64_t step = 0;
  int saved_world_size = 0;
  int saved_stage = 0;
  bool lora = false;  ///< adapter_model.safetensors + adapter_config.json were written too
  /// Newer checkpoints that were unusable and skipped, one line each naming the bad file.
  std::vector<std::string> skipped;
};

/// The model of a run's latest complete checkpoint, rebuilt in this process.
struct CheckpointModel {
  std::unique_ptr<model::Model> model;  ///< fp32, the checkpoint's master weights
  config::TrainConfig cfg;              ///< the config it was trained with
  CheckpointExportResult info;          ///< which checkpoint (out_dir fields unused)
};

/// Loads the checkpoint <run_dir>/checkpoints/latest names (or, when it is damaged, the
/// newest older complete one) into a model rebuilt from the config saved in its manifest
/// (else <run_dir>/config.yaml). Only reads the run. A `latest` that is not a plain
/// "step<N>" name (one pointing outside the run directory) is never opened.
/// CheckpointError when the run has no usable checkpoint (the message names --init,
/// the one way to get initial weights), ConfigError when the config cannot be read.
CheckpointModel checkpoint_model_load(const std::string& run_dir);

/// Exports the checkpoint <run_dir>/checkpoints/latest names (or, when it is damaged,
/// the newest older complete one) to out_dir ("" = <run_dir>/export) with hf_export_write:
/// the config's export section (flags override it) decides dtype, shards and the merged
/// model; under LoRA the adapter as adapter_model.safetensors + adapter_config.json. No
/// model is built: the layouts come from the config saved in the checkpoint's manifest
/// (else <run_dir>/config.yaml) and each tensor is read from the checkpoint's shards as it
/// is written, so the process holds one tensor (and its adapters), not the model.
/// CheckpointError when the run dir has no (usable) checkpoint, ConfigError / UsageError
/// for a bad export setting, IoError when the config, its tokenizer or the output cannot
/// be read or written.
CheckpointExportResult checkpoint_export_hf(const std::string& run_dir, const std::string& out_dir = "",
                                            const HfExportFlags& flags = {});

}  // namespace dtrain::train
