// Turning text files and SFT JSONL into token shards.
#include "data/prepare.h"

#include "core/check.h"
#include "core/log.h"
#include "data/input_file.h"

#include <filesystem>
#include <fstream>
#include <sstream>

namespace dtrain::data {

DataFormat data_format_parse(std::string_view name) {
  if (name == "text") return DataFormat::TEXT;
  if (name == "alpaca") return DataFormat::ALPACA;
  if (name == "chat") return DataFormat::CHAT;
  if (name == "sft") return DataFormat::SFT;
  DT_THROW(ConfigError, "unknown data format '{}' (use text, alpaca, chat or sft)", name);
}

namespace {

std::vector<std::string> text_documents(const std::string& path, bool line_per_doc) {
  input_file_check(path, "text data");
  std::ifstream in(path, std::ios::binary);
  DT_ENFORCE(in.good(), IoError, "cannot open text data '{}': check the path", path);
  std::vector<std::string> docs;
  std::string line, cur;
  auto flush = [&] {
    if (!cur.empty()) docs.push_back(std::move(cur));
    cur.clear();
  };
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    bool blank = line.find_first_not_of(" \t") == std::string::npos;
    if (line_per_doc) {
      if (!blank) docs.push_back(line);
      continue;
    }
    if (blank) {
      flush();
      continue;
    }
    if (!cur.empty()) cur.push_back('\n');
    cur += line;
  }
  DT_ENFORCE(!in.bad(), IoError, "error reading text data '{}'", path);
  flush();
  return docs;
}

}  // namespace

TokenData data_tokenize(const std::string& input, DataFormat format, const Tokenizer& tokenizer,
                        const DataPrepareOptions& options) {
  TokenData data;
  data.name = input;
  data.vocab_size = tokenizer.vocab_size();
  data.eos_id = tokenizer.eos_id();
  data.pad_id = tokenizer.pad_id();
  if (format == DataFormat::TEXT) {
    for (const std::string& doc : text_documents(input, options.text_line_per_doc)) {
      std::vector<int32_t> ids;
      if (options.add_bos && tokenizer.bos_id() >= 0) ids.push_back(tokenizer.bos_id());
      std::vector<int32_t> body = tokenizer.encode_ordinary(doc);
      ids.insert(ids.end(), body.begin(), body.end());
      if (tokenizer.eos_id() >= 0) ids.push_back(tokenizer.eos_id());
      data.append(ids);
    }
  } else {
    const SftFormat f = format == DataFormat::CHAT     ? SftFormat::CHAT
                        : format == DataFormat::ALPACA ? SftFormat::ALPACA
                                                       : SftFormat::AUTO;
    const SftTemplate tmpl = sft_template_parse(options.sft_template, &tokenizer);
    for (const SftRecord& rec : sft_load_jsonl(input, f)) {
      SftTokens t = sft_render(rec, tokenizer, tmpl, options.add_bos, options.train_on_prompt);
      data.append(t.tokens, t.mask);
    }
  }
  DT_ENFORCE(!data.tokens.empty(), ConfigError, "'{}' holds no documents: nothing to tokenize", input);
  return data;
}

TokenData data_tokenize_records(const std::vector<SftRecord>& records, const std::string& name,
                                const Tokenizer& tokenizer, const DataPrepareOptions& options) {
  TokenData data;
  data.name = name;
  data.vocab_size = tokenizer.vocab_size();
  data.eos_id = tokenizer.eos_id();
  data.pad_id = tokenizer.pad_id();
  const SftTemplate tmpl = sft_template_parse(options.sft_template, &tokenizer);
  for (const SftRecord& rec : records) {
    SftTokens t = sft_render(rec, tokenizer, tmpl, options.add_bos, options.train_on_prompt);
    data.append(t.tokens, t.mask);
  }
  DT_ENFORCE(!data.tokens.empty(), ConfigError, "'{}' holds no records: nothing to tokenize", name);
  return data;
}

DataPrepareStats data_prepare(const std::string& input, DataFormat format, const std::string& tokenizer_spec,
                              const std::string& output, const DataPrepareOptions& options) {
  // The output replaces whatever file it names: never the input (the same path, or another
  // name of the same file), never a directory, and never anything but a regular file (the
  // rename would put a shard in place of a device node such as /dev/null, or a FIFO).
  {
    namespace fs = std::filesystem;
    std::error_code ec;
    DT_ENFORCE(!output.empty(), UsageError, "data prepare: OUTPUT is empty: give the token shard's file name");
    DT_ENFORCE(!fs::is_directory(output, ec), UsageError,
               "data prepare: OUTPUT '{}' is a directory: give the token shard's file name, e.g. {}/data.bin", output,
               output);
    const fs::file_status st = fs::status(output, ec);
    DT_ENFORCE(!fs::exists(st) || fs::is_regular_file(st), UsageError,
               "data prepare: OUTPUT '{}' exists and is not a regular file (a device, FIFO or socket): writing the "
               "shard would replace it; give the token shard's file name, e.g. {}.bin",
               output, input);
    std::error_code eq_ec;
    const bool same = fs::equivalent(input, output, eq_ec) ||
                      (!fs::exists(output, ec) && fs::weakly_canonical(input, ec) == fs::weakly_canonical(output, ec));
    DT_ENFORCE(!same, UsageError,
               "data prepare: OUTPUT '{}' is the INPUT file '{}': writing the shard would replace your data; give "
               "another output name, e.g. {}.bin",
               output, input, input);
  }
  std::unique_ptr<Tokenizer> tok = tokenizer_load(tokenizer_spec);
  TokenData data = data_tokenize(input, format, *tok, options);
  shard_write(output, data);
  DataPrepareStats s;
  s.documents = data.doc_starts.size();
  s.tokens = data.tokens.size();
  s.trained_tokens = data.mask.empty() ? data.tokens.size() : 0;
  for (uint8_t m : data.mask) s.trained_tokens += m;
  log_info("data prepare: {} -> {} ({} documents, {} tokens, {} trained, tokenizer {})", input, output, s.documents,
           s.tokens, s.trained_tokens, tok->name());
  return s;
}

}  // namespace dtrain::data
