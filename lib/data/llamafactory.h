// LLaMA-Factory datasets as they are: a dataset_dir with its dataset_info.json, whose
// entries name local .json (an array of records) or .jsonl files in alpaca or sharegpt
// formatting, with their columns and tags mappings, read into SFT records, or for
// "ranking": true entries into preference pairs; several datasets concatenated or mixed
// by weight.
#pragma once

#include "data/sft_record.h"

#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace dtrain::data {

// True when `path` is a directory holding dataset_info.json, or a file named
// dataset_info.json: data.train then names LLaMA-Factory datasets (data.dataset).
bool llamafactory_is_dataset_dir(const std::string& path);

// The records of `names` (comma-separated dataset names of dataset_info.json in
// dataset_dir, which may also be the dataset_info.json path). Each entry needs a local
// file_name (hub / script / cloud entries are ConfigErrors saying so; ranking: true ones
// are read by llamafactory_load_pairs);
// formatting "alpaca" (default) or "sharegpt"; "columns" and "tags" as LLaMA-Factory's
// data/README.md documents them:
//  - alpaca: prompt (instruction), query (input, optional: joined to the prompt with "\n"),
//    response (output), system and history ([[user, answer], ...], every answer trained)
//    columns;
//  - sharegpt: the messages column (conversations) holds objects with role_tag (from) and
//    content_tag (value); role values user_tag (human), assistant_tag (gpt),
//    observation_tag (observation, rendered as a user turn), function_tag (function_call,
//    an assistant turn) and system_tag (system, only first; else the system column).
//    Turns must alternate user/observation and assistant/function, ending with an answer.
// `mix` empty: the datasets' records one after the other. Else one positive weight per
// dataset: the total record count stays the datasets' sum, and dataset i contributes
// round(total * w_i / sum w) of them (its records in order, repeated when it has fewer).
// Any malformed record is a ConfigError naming the file, the line the record starts on,
// the record's index and the field.
std::vector<SftRecord> llamafactory_load(const std::string& dataset_dir, const std::string& names,
                                         const std::vector<double>& mix = {});

// The pairs of "ranking": true datasets (LLaMA-Factory's preference data), as
// llamafactory_load reads SFT ones (mix, errors), with the chosen and rejected columns
// (default "chosen" and "rejected"):
//  - alpaca: the prompt as above (system, history, prompt + "\n" + query) and chosen /
//    rejected answer strings;
//  - sharegpt: the messages column's turns alternate as above but END WITH A USER turn
//    (human/observation); chosen and rejected are message objects whose role is
//    assistant_tag or function_tag.
std::vector<PairRecord> llamafactory_load_pairs(const std::string& dataset_dir, const std::string& names,
                                                const std::vector<double>& mix = {});

// True when the datasets `names` of dataset_dir are preference ("ranking": true) datasets;
// llamafactory_entries' errors, and a ConfigError when some are and some are not.
bool llamafactory_ranking(const std::string& dataset_dir, const std::string& names);

// ---------------------------------------------------------------------------
// Record by record (`dtrain data prepare --dataset`, which streams the files).

// One dataset_info.json entry, resolved: its file and its columns and tags.
struct LlamaFactoryEntry {
  std::string name;
  std::string file;  // dataset_dir / file_name
  bool sharegpt = false;
  bool ranking = false;  // "ranking": true: preference pairs (llamafactory_pair_record)
  // Not a dataset_info.json entry but a plain pairwise JSONL file (data.format pairwise,
  // data/pairwise.h): each record picks its shape (sharegpt with "conversations" and
  // from/value, sharegpt with "messages" and role/content/user/assistant/system, else
  // alpaca), with the default columns; errors name "file:line".
  bool plain = false;
  // columns
  std::string prompt = "instruction", query = "input", response = "output", history, messages = "conversations", system,
              tools, chosen = "chosen", rejected = "rejected";
  // tags
  std::string role = "from", content = "value", user = "human", assistant = "gpt", observation = "observation",
              function = "function_call", system_tag = "system";
};

// The entries of `names` (as llamafactory_load), checked, in order; each file is .json or
// .jsonl (ConfigError otherwise); all of them "ranking": true or none (ConfigError).
std::vector<LlamaFactoryEntry> llamafactory_entries(const std::string& dataset_dir, const std::string& names);

// Record `index` (0-based) of the entry, whose JSON text starts on line `line` of its file;
// the ConfigErrors of llamafactory_load.
SftRecord llamafactory_record(const LlamaFactoryEntry& entry, std::string_view text, size_t line, size_t index);
// The same for a ranking (or plain pairwise) entry's record: one preference pair.
PairRecord llamafactory_pair_record(const LlamaFactoryEntry& entry, std::string_view text, size_t line, size_t index);

// Calls fn(text, line) for each element of the JSON array `text` (a .json dataset's
// contents), with the line it starts on.
void llamafactory_json_elements(const std::string& text, const std::string& file,
                                const std::function<void(std::string_view, size_t)>& fn);

}  // namespace dtrain::data
