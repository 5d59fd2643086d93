// Turning text files and SFT JSONL into token shards, streamed (data/prepare_stream.h).
#include "data/prepare.h"

#include "core/check.h"
#include "core/output_path.h"
#include "core/log.h"
#include "core/input_file.h"
#include "data/llamafactory.h"
#include "data/pairwise.h"
#include "data/prepare_stream.h"
#include "data/shard_writer.h"

#include <nlohmann/json.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

namespace dtrain::data {

DataFormat data_format_parse(std::string_view name) {
  if (name == "text") return DataFormat::TEXT;
  if (name == "alpaca") return DataFormat::ALPACA;
  if (name == "chat") return DataFormat::CHAT;
  if (name == "sft") return DataFormat::SFT;
  if (name == "pairwise") return DataFormat::PAIRWISE;
  DT_THROW(ConfigError, "unknown data format '{}' (use text, alpaca, chat, sft or pairwise)", name);
}

// ----------------------------------------------------------------------------
// data.format not given: the records say

namespace {

// The kind of one JSON object ("pairwise", "alpaca", "chat"), or "" when it is none.
std::string record_kind(const nlohmann::json& j) {
  if (!j.is_object()) return "";
  if (j.contains("chosen") && j.contains("rejected")) return "pairwise";
  if (j.contains("messages") || j.contains("conversations")) return "chat";
  if (j.contains("instruction") || (j.contains("output") && j.contains("input"))) return "alpaca";
  return "";
}

std::string keys_of(const nlohmann::json& j) {
  std::string out;
  if (!j.is_object()) return "not an object";
  for (auto it = j.begin(); it != j.end(); ++it) out += (out.empty() ? "" : ", ") + it.key();
  return out.empty() ? "no keys" : "keys " + out;
}

}  // namespace

DataFormatGuess data_format_detect(const std::string& path) {
  const std::string set_it = "set data.format (text, alpaca, chat, pairwise or tokens)";
  if (input_dir_problem(path).empty()) return {"tokens", "a directory (of token shards)"};
  InputFile f = input_file_open(path, "data file");
  std::string head(64 * 1024, '\0');
  ssize_t got = 0;
  while (got < static_cast<ssize_t>(head.size())) {
    const ssize_t n = ::pread(f.fd(), head.data() + got, head.size() - static_cast<size_t>(got), got);
    if (n <= 0) break;
    got += n;
  }
  head.resize(static_cast<size_t>(std::max<ssize_t>(got, 0)));
  if (head.size() >= 8 && std::memcmp(head.data(), SHARD_MAGIC, 8) == 0) return {"tokens", "a dtrain token shard"};
  if (head.find('\0') != std::string::npos)
    DT_THROW(ConfigError,
             "data file '{}': binary data, neither a token shard nor text, so its format cannot be told: {}", path,
             set_it);
  const size_t first = head.find_first_not_of(" \t\r\n");
  if (first == std::string::npos || (head[first] != '{' && head[first] != '['))
    return {"text", "its first line is not a JSON record"};
  // JSON: the first complete lines are records (JSONL); a .json array is judged by the keys
  // its first records' text names.
  std::set<std::string> kinds;
  std::string unknown;
  if (head[first] == '{') {
    const bool whole = head.size() == f.size();
    size_t at = first, records = 0;
    while (records < 16 && at < head.size()) {
      size_t end = head.find('\n', at);
      if (end == std::string::npos) {
        if (!whole) break;  // a record cut by the 64 KiB read
        end = head.size();
      }
      const std::string line = head.substr(at, end - at);
      at = end + 1;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_discarded()) {
        unknown = "a line that is not one JSON record";
        break;
      }
      const std::string k = record_kind(j);
      if (k.empty()) {
        unknown = "a record with " + keys_of(j);
        break;
      }
      kinds.insert(k);
      ++records;
    }
  } else {
    const bool chat =
        head.find("\"messages\"") != std::string::npos || head.find("\"conversations\"") != std::string::npos;
    const bool alpaca = head.find("\"instruction\"") != std::string::npos;
    const bool pairwise =
        head.find("\"chosen\"") != std::string::npos && head.find("\"rejected\"") != std::string::npos;
    if (pairwise) kinds.insert("pairwise");
    else if (chat) kinds.insert("chat");
    if (!pairwise && alpaca) kinds.insert("alpaca");
    if (kinds.empty()) unknown = "a JSON array whose records name neither instruction nor messages";
  }
  if (!unknown.empty() || kinds.empty())
    DT_THROW(ConfigError,
             "data file '{}' holds JSON, but not records dtrain can tell the format of ({}): alpaca records have "
             "instruction/input/output, chat records messages; {} (data.format text would train the JSON "
             "itself as plain text)",
             path, unknown.empty() ? "no complete record in its first 64 KiB" : unknown, set_it);
  if (kinds.count("pairwise") && kinds.size() > 1)
    DT_THROW(ConfigError,
             "data file '{}' mixes preference records (chosen/rejected) with SFT records ({}); one file holds one "
             "kind: split it",
             path, *kinds.begin() == "pairwise" ? *kinds.rbegin() : *kinds.begin());
  if (kinds.count("pairwise")) return {"pairwise", "its records have chosen/rejected"};
  if (kinds.size() == 2) return {"sft", "its records are alpaca (instruction/output) and chat (messages)"};
  if (*kinds.begin() == "chat") return {"chat", "its records have messages"};
  return {"alpaca", "its records have instruction/input/output"};
}

namespace {

// Empty token data named `name`, with the tokenizer's vocabulary and special ids.
TokenData token_data_empty(const std::string& name, const Tokenizer& tokenizer, bool pairwise) {
  TokenData data;
  data.name = name;
  data.vocab_size = tokenizer.vocab_size();
  data.eos_id = tokenizer.eos_id();
  data.pad_id = tokenizer.pad_id();
  data.pairwise = pairwise;
  return data;
}

}  // namespace

TokenData data_tokenize(const std::string& input, DataFormat format, const Tokenizer& tokenizer,
                        const DataPrepareOptions& options) {
  TokenData data = token_data_empty(input, tokenizer, format == DataFormat::PAIRWISE);
  data_tokenize_stream(input, format, tokenizer, options, [&](const TokenPiece& p) {
    size_t at = data.tokens.size();
    for (size_t len : p.doc_tokens) {
      data.doc_starts.push_back(at);
      at += len;
    }
    data.tokens.insert(data.tokens.end(), p.tokens.begin(), p.tokens.end());
    data.mask.insert(data.mask.end(), p.mask.begin(), p.mask.end());
  });
  DT_ENFORCE(!data.tokens.empty(), ConfigError, "'{}' holds no documents: nothing to tokenize", input);
  return data;
}

TokenData data_tokenize_records(const std::vector<SftRecord>& records, const std::string& name,
                                const Tokenizer& tokenizer, const DataPrepareOptions& options) {
  TokenData data = token_data_empty(name, tokenizer, false);
  const SftTemplate tmpl = sft_template_parse(options.sft_template, &tokenizer);
  for (const SftRecord& rec : records) {
    SftTokens t = sft_render(rec, tokenizer, tmpl, options.add_bos, options.train_on_prompt);
    data.append(t.tokens, t.mask);
  }
  DT_ENFORCE(!data.tokens.empty(), ConfigError, "'{}' holds no records: nothing to tokenize", name);
  return data;
}

TokenData data_tokenize_pairs(const std::vector<PairRecord>& records, const std::string& name,
                              const Tokenizer& tokenizer, const DataPrepareOptions& options) {
  TokenData data = token_data_empty(name, tokenizer, true);
  const SftTemplate tmpl = sft_template_parse(options.sft_template, &tokenizer);
  for (const PairRecord& rec : records) {
    const PairTokens t = pair_render(rec, tokenizer, tmpl, options.add_bos, options.train_on_prompt);
    data.append(t.chosen.tokens, t.chosen.mask);
    data.append(t.rejected.tokens, t.rejected.mask);
  }
  DT_ENFORCE(!data.tokens.empty(), ConfigError, "'{}' holds no records: nothing to tokenize", name);
  return data;
}

namespace {

// The files a prepare reads besides INPUT: a LLaMA-Factory dataset_info.json and the
// tokenizer's files (the template `auto` reads tokenizer_config.json / chat_template.jinja
// beside tokenizer.json).
void reads_add(std::vector<std::string>& inputs, const std::string& input, const std::string& tokenizer_spec,
               bool dataset) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (dataset) inputs.push_back(fs::is_directory(input, ec) ? (fs::path(input) / "dataset_info.json").string() : input);
  if (tokenizer_spec.empty() || tokenizer_spec == "byte") return;
  inputs.push_back(tokenizer_spec);
  const fs::path dir =
      fs::is_directory(tokenizer_spec, ec) ? fs::path(tokenizer_spec) : fs::path(tokenizer_spec).parent_path();
  for (const char* n : {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "chat_template.json",
                        "special_tokens_map.json", "tokenizer.model", "generation_config.json"})
    inputs.push_back((dir.empty() ? fs::path(n) : dir / n).string());
}

// The output rule (core/output_path.h): never an input (another name of it included), never
// a directory, device or FIFO, and an existing file only when it is a token shard (an
// earlier prepare's) or with --force. Returns the file to write (through a symlink).
OutputFile output_check(const std::string& output, const std::vector<std::string>& inputs, bool force) {
  OutputRule rule;
  rule.what = "data prepare: OUTPUT";
  rule.inputs = inputs;
  rule.own = [](const std::string& target) {
    char magic[8] = {};
    std::ifstream in(target, std::ios::binary);
    in.read(magic, sizeof magic);
    return in.gcount() == 8 && std::memcmp(magic, "DTRAINTK", 8) == 0;
  };
  rule.own_kind = "a dtrain token shard";
  rule.force = force;
  return output_file_check(output, rule);
}

}  // namespace

DataPrepareStats data_prepare(const std::string& input, DataFormat format, const std::string& tokenizer_spec,
                              const std::string& output, const DataPrepareOptions& options) {
  // LLaMA-Factory: input is the dataset_dir; the datasets' files are the inputs to protect.
  std::vector<LlamaFactoryEntry> entries;
  std::vector<std::string> inputs{input};
  if (!options.dataset.empty()) {
    entries = llamafactory_entries(input, options.dataset);
    for (const LlamaFactoryEntry& e : entries) inputs.push_back(e.file);
  }
  std::vector<std::string> reads = inputs;
  reads_add(reads, input, tokenizer_spec, !options.dataset.empty());
  const OutputFile target = output_check(output, reads, options.force);
  std::unique_ptr<Tokenizer> tok = tokenizer_load(tokenizer_spec);
  const auto t0 = std::chrono::steady_clock::now();
  auto last = t0;
  size_t total = 0;
  for (size_t i = entries.empty() ? 0 : 1; i < inputs.size(); ++i) {
    struct stat st {};
    if (::stat(inputs[i].c_str(), &st) == 0) total += static_cast<size_t>(st.st_size);
  }
  // The input's own problems (missing, a directory) before the output is created.
  if (entries.empty())
    input_file_check(input, format == DataFormat::TEXT       ? "text data"
                            : format == DataFormat::PAIRWISE ? "pairwise data"
                                                             : "SFT data");
  const bool pairwise = entries.empty() ? format == DataFormat::PAIRWISE : entries[0].ranking;
  // Leaves no file behind unless finish() completes, whichever step throws.
  ShardWriter out(target.target, tok->vocab_size(), tok->eos_id(), tok->pad_id(),
                  !entries.empty() || format != DataFormat::TEXT, pairwise);
  size_t done = 0;
  auto sink = [&](const TokenPiece& p) {
    const int32_t* t = p.tokens.data();
    const uint8_t* m = p.mask.empty() ? nullptr : p.mask.data();
    for (size_t len : p.doc_tokens) {
      out.append(t, m, len);
      t += len;
      if (m) m += len;
    }
    done = p.input_end;
    const auto now = std::chrono::steady_clock::now();
    if (options.progress && now - last >= std::chrono::seconds(1)) {
      last = now;
      const double secs = std::chrono::duration<double>(now - t0).count();
      log_info("data prepare: {:.1f} of {:.1f} MB read ({:.0f}%), {} documents, {} tokens, {:.1f} MB/s", done / 1e6,
               total / 1e6, total ? 100.0 * static_cast<double>(done) / static_cast<double>(total) : 100.0,
               out.documents(), out.tokens(), done / 1e6 / secs);
    }
  };
  if (entries.empty()) data_tokenize_stream(input, format, *tok, options, sink);
  else data_tokenize_stream_llamafactory(entries, *tok, options, sink);
  DT_ENFORCE(out.tokens() > 0, ConfigError, "'{}' holds no documents: nothing to tokenize", input);
  out.finish();
  if (target.exists) ::chmod(target.target.c_str(), static_cast<mode_t>(target.mode));  // the replaced file's mode
  DataPrepareStats s;
  s.documents = out.documents();
  s.pairwise = pairwise;
  s.tokens = out.tokens();
  s.trained_tokens = out.trained_tokens();
  s.input_bytes = done;
  s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  s.threads = data_prepare_threads(options);
  const std::string what = entries.empty() ? input : input + " [" + options.dataset + "]";
  log_info(
      "data prepare: {} -> {} ({} documents{}, {} tokens, {} trained, tokenizer {}; {:.1f} MB in {:.1f} s, {:.1f} MB/s, "
      "{:.0f} tokens/s, {} threads)",
      what, output, s.documents, pairwise ? fmt::format(" = {} pairs", s.documents / 2) : std::string(), s.tokens,
      s.trained_tokens, tok->name(), s.input_bytes / 1e6, s.seconds, s.input_bytes / 1e6 / std::max(s.seconds, 1e-9),
      static_cast<double>(s.tokens) / std::max(s.seconds, 1e-9), s.threads);
  return s;
}

}  // namespace dtrain::data
