// The config schema: one row per key (YAML path, type, default, bounds, env override, help,
// and where its value lives in TrainConfig), the DeepSpeed keys dtrain accepts without
// acting on them, and the typo distance used for "did you mean" suggestions.
#pragma once

#include "config/train_config.h"

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace dtrain::config {

enum class KeyType { BOOL, INT, FLOAT, STRING, ENUM, STRING_LIST, FLOAT_PAIR, STRING_MAP };

// The width an INT key's value is stored in where it is used. TrainConfig holds int64_t,
// but the model, trainer and launcher narrow most keys to int: a value is range-checked
// against this width when it is converted, so nothing downstream can wrap.
enum class IntWidth { I32, I64 };

// Where a key's value lives; optional<> fields are keys without a plain default.
using FieldRef = std::variant<bool*, int64_t*, double*, std::string*, std::vector<std::string>*, std::array<double, 2>*,
                              std::map<std::string, std::string>*, std::optional<bool>*, std::optional<int64_t>*,
                              std::optional<double>*, std::optional<std::string>*>;

struct KeySpec {
  const char* path;  // "zero_optimization.stage"
  KeyType type;
  FieldRef (*field)(TrainConfig&);
  const char* help;
  std::vector<std::string> allowed = {};  // ENUM values
  std::optional<double> min = {};         // numeric bounds (inclusive unless min_exclusive)
  std::optional<double> max = {};
  bool min_exclusive = false;
  const char* env = nullptr;       // env override name
  const char* derived = nullptr;   // for keys without a plain default: how the value is found
  IntWidth width = IntWidth::I32;  // INT keys: the storage width the value must fit
};

// The integers an INT key accepts: its bounds intersected with its storage width.
struct IntRange {
  int64_t lo, hi;
};
IntRange key_int_range(const KeySpec& spec);

// All keys, grouped so that each section's keys are contiguous (config_to_yaml relies on it).
const std::vector<KeySpec>& schema_keys();

// The environment knobs that have no YAML key: each is read where it acts, by code below
// config in the layers or before any config exists (the log level when the process starts,
// the CPU ops' pool when it is first used, a rank's env printout). They are declared here so
// that --help-config lists them and every config load (launcher, worker, bench) refuses a bad
// value naming the variable. A row's path and env are the variable's name; it has no field
// (the value is checked, not stored) and its default is the `derived` text.
const std::vector<KeySpec>& schema_env_knobs();
const KeySpec* schema_find(std::string_view path);
// True when path is a section (a proper prefix of some key path, e.g. "cluster.ssh").
bool schema_is_section(std::string_view path);
// Names directly under section ("" = top level): keys and subsections.
std::vector<std::string> schema_children(std::string_view section);

// DeepSpeed keys (full paths) accepted with one warning and otherwise ignored.
const std::vector<std::string>& schema_ignored_keys();
bool schema_is_ignored(std::string_view path);

// The dtrain key for a name LLaMA-Factory, the HF Trainer or PEFT spell differently
// (learning_rate, lora_rank, per_device_train_batch_size, lora.rank), looked up by the
// full path and then by the last name; nullptr when the name is none of theirs. A text
// starting with '-' is advice for a name dtrain has no key for.
const char* schema_foreign_spelling(std::string_view path);

// Optimal-string-alignment Damerau-Levenshtein distance.
size_t key_distance(std::string_view a, std::string_view b);
// The closest candidate within typo distance of key (<= 2, <= 1 when either is shorter
// than 5 characters), or "" when none is.
std::string key_suggest(std::string_view key, const std::vector<std::string>& candidates);

std::string key_type_name(const KeySpec& spec);     // "integer >= 1", "one of: a, b", ...
std::string key_default_text(const KeySpec& spec);  // the default as YAML, or the derived rule

}  // namespace dtrain::config
