// Internal to the config module: where each key's value came from (for error messages)
// and the derive/validate pass the loader runs after filling TrainConfig.
#pragma once

#include "config/schema.h"
#include "config/train_config.h"

#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace dtrain::config {

struct Origins {
  std::string source;                                     // file name
  std::map<std::string, std::string, std::less<>> where;  // key path -> "file:3:1", "--set k=v", "env X=v"
  std::set<std::string, std::less<>> given;               // keys with a real value (not null, not "auto")
  std::set<std::string, std::less<>> given_by_user;       // given in the file or by --set (not env)
  std::set<std::string, std::less<>> sections_seen;       // sections present in the file or --set

  // "file:line:col" of the key's value, or the source name when the key was not given.
  std::string at(std::string_view path) const {
    auto it = where.find(path);
    return it == where.end() ? source : it->second;
  }
};

// Fills derived values (n_kv_head, d_ff, output_dir, ...) and checks relations between keys;
// appends warnings. Throws ConfigError naming the key and its origin.
// Notes (a default taken from model.init_from) go to *notes when given.
void config_derive_validate(TrainConfig& cfg, const Origins& origins, std::vector<std::string>& warnings,
                            std::vector<std::string>* notes = nullptr);

// Converts text as --set or an env override would (YAML for typed keys) and stores it in
// spec's field of cfg: the single conversion every value of every source goes through.
// False when text means "not given"; ConfigError (starting with origin) when it is invalid.
bool config_apply_text(TrainConfig& cfg, const KeySpec& spec, const std::string& text, const std::string& origin);

// Whether scheduler.params.<param> belongs to the scheduler type (DeepSpeed's signatures).
bool scheduler_param_applies(const std::optional<std::string>& type, std::string_view param);

// Whether lora.target_modules name is a projection of the architecture.
const std::vector<std::string>& lora_modules_for(std::string_view architecture);

}  // namespace dtrain::config
