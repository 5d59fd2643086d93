// Hugging Face export at real size: save_pretrained's layout (one model.safetensors, or
// model-0000k-of-0000n.safetensors shards of at most max_shard_size + the index), bf16 or
// fp32, config.json, the PEFT adapter, a merged model on request and the tokenizer files,
// written tensor by tensor into a staging directory that replaces the old one whole.
#pragma once

#include "config/train_config.h"
#include "core/dtype.h"
#include "model/layout.h"
#include "model/lora.h"
#include "model/model.h"

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace dtrain::train {

struct HfExportOptions {
  DType dtype = DType::BF16;                ///< F32 or BF16 (config.json's torch_dtype says which)
  uint64_t max_shard_size = 5'000'000'000;  ///< save_pretrained's default "5GB"
  bool merge_lora = false;                  ///< LoRA: also the merged full model in <dir>/merged
  int bos_id = -1, eos_id = -1;             ///< into config.json when >= 0
  /// Files copied beside the weights (and into merged/): {source path, file name}.
  std::vector<std::pair<std::string, std::string>> extra_files;
  /// `dtrain export`: write into dir (created when missing) instead of replacing it, as
  /// the output rule asks of a user's directory (core/output_path.h: the caller checked
  /// dir with output_dir_check). A run's own final/ is replaced whole (the default).
  bool into_dir = false;
};

/// The file marking a directory an export wrote, and its kind (core/output_path.h): every
/// export writes it, listing its entries; `dtrain export` writes only into a directory
/// holding it, an empty one or a new one.
inline constexpr const char* kHfExportMarker = ".dtrain-export.json";
inline constexpr const char* kHfExportKind = "hf-export";
/// The names an export writes (or once wrote) in its directory: replaced, never carried
/// over from an older export (a stale model.safetensors beside new shards would win the load).
bool hf_export_owned_name(const std::string& name);

/// The config's export section (dtype, max_shard_size, merge_lora) and its tokenizer
/// files (hf_tokenizer_files). ConfigError naming the key for a bad value.
HfExportOptions hf_export_options(const config::TrainConfig& cfg);

/// `dtrain export`'s flags, each overriding its export.* key when given.
struct HfExportFlags {
  std::string dtype;           ///< --dtype: "" or bf16 / fp32
  std::string max_shard_size;  ///< --max-shard-size: "" or a size (byte_size_parse)
  bool merge_lora = false;     ///< --merge-lora (true overrides export.merge_lora: false)
  bool into_dir = false;       ///< HfExportOptions::into_dir (the export command's output rule)
};

/// hf_export_options with the flags applied; UsageError naming the flag and what it
/// accepts for a bad value.
HfExportOptions hf_export_options(const config::TrainConfig& cfg, const HfExportFlags& flags);

/// The tokenizer files to copy: those of model.init_from that exist (tokenizer.json,
/// tokenizer_config.json, special_tokens_map.json, generation_config.json,
/// tokenizer.model); else data.tokenizer's file (as tokenizer.json) or, for a directory,
/// those names inside it; none for the byte tokenizer.
std::vector<std::pair<std::string, std::string>> hf_tokenizer_files(const config::TrainConfig& cfg);

/// DType of an export.dtype / --dtype value ("bf16", "fp32"); false when unknown.
bool hf_export_dtype_parse(const std::string& s, DType* out);

/// How save_pretrained (huggingface_hub's split_state_dict_into_shards) groups tensors of
/// these byte sizes, in order: a tensor larger than max gets a shard of its own (placed
/// where it is met, before the shard being filled); otherwise shards are filled in order
/// and a new one starts when the next tensor would pass max. total_size = all bytes.
struct ShardPlan {
  std::vector<std::vector<size_t>> shards;  ///< indices into the sizes, per shard
  uint64_t total_size = 0;
};
ShardPlan shard_plan(const std::vector<uint64_t>& bytes, uint64_t max_shard_size);

/// Reads fp32 elements [lo, hi) of buffer b into dst: base buffers 0..base.size()-1 in
/// layout order, then the adapter buffers.
using BufferRead = std::function<void(size_t buffer, size_t lo, size_t hi, float* dst)>;

/// A model to export, described by its layouts and a reader: the export never needs the
/// whole model in memory, only one tensor at a time (and a tensor's adapters to merge).
struct HfExportSource {
  model::ModelConfig config;
  std::vector<model::BufferLayout> base;
  std::vector<model::BufferLayout> lora;  ///< empty without LoRA
  model::LoraConfig lora_config;
  BufferRead read;
};

/// The source reading a host fp32 model's own buffers (no copy of them).
HfExportSource hf_export_source(const model::Model& m);

/// Writes dir: the weights (model.safetensors, or the shards + model.safetensors.index.json
/// with {"metadata": {"total_size"}, "weight_map"} as transformers writes it, tensors in
/// the model's state_dict order), config.json (with torch_dtype), the extra files; under
/// LoRA adapter_model.safetensors (fp32, as before) + adapter_config.json, and with
/// merge_lora the merged model as a full HF directory in dir/merged, and the marker
/// (kHfExportMarker). Everything is written into <dir>.partial-<pid> first and then renamed
/// to dir (an older dir is replaced; files in it that the export does not own are carried
/// over), so an interrupted export leaves no directory a loader would take as complete;
/// with opts.into_dir, staged inside dir and moved into it entry by entry (dir itself
/// untouched). IoError on failure.
void hf_export_write(const HfExportSource& src, const std::string& dir, const HfExportOptions& opts);

/// hf_export_write of a host fp32 model.
void model_export_hf(const model::Model& m, const std::string& dir, const HfExportOptions& opts);

}  // namespace dtrain::train
