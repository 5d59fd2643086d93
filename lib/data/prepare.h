// data_prepare(): plain text or SFT JSONL -> tokenized TokenData -> a token shard.
// Backs `dtrain data prepare`.
#pragma once

#include "data/shard.h"
#include "data/sft.h"
#include "data/tokenizer.h"

#include <string>
#include <string_view>

namespace dtrain::data {

// TEXT: a UTF-8 text file. Documents are separated by one or more blank lines
// (DataPrepareOptions::text_line_per_doc = false, the default) or are single lines
// (true). A document keeps its inner newlines, loses the separating ones, and is
// followed by eos (when the tokenizer has one). No mask is stored: every token trains.
// ALPACA / CHAT / SFT: SFT JSONL (data/sft.h), rendered with the template; the shard holds
// the response mask and one document per record.
// SFT: either SFT form, decided per line (a line with "messages" is chat).
// PAIRWISE: preference JSONL (data/pairwise.h), alpaca- or sharegpt-shaped per line; each
// record becomes two documents, chosen then rejected, and the data is pairwise
// (TokenData::pairwise, the shard's pairwise flag).
enum class DataFormat { TEXT, ALPACA, CHAT, SFT, PAIRWISE };

// "text" | "alpaca" | "chat" | "sft" | "pairwise"; ConfigError otherwise.
DataFormat data_format_parse(std::string_view name);

// What data.format a file holds when the config does not say, from its first bytes and
// records: "tokens" (a token shard, or a directory of them), "pairwise" (JSON records with
// chosen and rejected), "alpaca" (JSON records with instruction/output), "chat" (JSON
// records with messages or conversations), "sft" (both kinds) or "text" (anything else
// that is UTF-8 text). Preference records mixed with SFT ones are a ConfigError. `evidence` says why, for the dry
// run and the ranks' log. ConfigError naming the file when it cannot tell (JSON records
// of neither kind, binary data) and saying to set data.format.
struct DataFormatGuess {
  std::string name;
  std::string evidence;
};
DataFormatGuess data_format_detect(const std::string& path);

struct DataPrepareOptions {
  std::string sft_template = "plain";  // a data/chat_template.h name, or auto (from the tokenizer's directory)
  bool train_on_prompt = false;        // SFT: every token trains, not only the assistant turns
  bool add_bos = false;                // prepend bos to every document
  bool text_line_per_doc = false;      // TEXT: one document per line
  // Tokenizing threads (0: the machine's hardware concurrency). The result does not
  // depend on it: documents keep their input order.
  unsigned threads = 1;
  // The input is read in chunks of about this many bytes, cut after a whole record (a
  // line; TEXT paragraphs: a blank line); a record longer than this makes its chunk longer.
  size_t chunk_bytes = size_t{1} << 20;
  // data_prepare: LLaMA-Factory datasets, comma-separated names of dataset_info.json
  // entries (data/llamafactory.h); the input is then their dataset_dir (or its
  // dataset_info.json) and the format is not used. Concatenated in order, streamed.
  std::string dataset;
  // data_prepare: log a progress line (bytes read of the total, documents, tokens, MB/s)
  // at most once a second.
  bool progress = false;
  // data_prepare: an existing OUTPUT that is not a token shard may be replaced (--force);
  // never one of the files the prepare reads.
  bool force = false;
};

struct DataPrepareStats {
  size_t documents = 0;
  bool pairwise = false;  // documents are (chosen, rejected) pairs: documents / 2 of them
  size_t tokens = 0;
  size_t trained_tokens = 0;  // tokens whose mask is true
  size_t input_bytes = 0;
  double seconds = 0;  // wall time of tokenizing and writing
  unsigned threads = 1;
};

// Tokenizes `input` into memory.
TokenData data_tokenize(const std::string& input, DataFormat format, const Tokenizer& tokenizer,
                        const DataPrepareOptions& options = {});

// Renders SFT records (e.g. LLaMA-Factory's, data/llamafactory.h) into memory; `name`
// labels the data in shard metadata and errors.
TokenData data_tokenize_records(const std::vector<SftRecord>& records, const std::string& name,
                                const Tokenizer& tokenizer, const DataPrepareOptions& options = {});
// The same for preference pairs (data/pairwise.h's pair_render): pairwise data, each pair
// two documents (chosen, rejected).
TokenData data_tokenize_pairs(const std::vector<PairRecord>& records, const std::string& name,
                              const Tokenizer& tokenizer, const DataPrepareOptions& options = {});

// Tokenizes `input` with the tokenizer named by tokenizer_spec ("byte" or a
// tokenizer.json path) and writes the shard `output` as it goes (data/shard_writer.h):
// memory stays bounded by the chunks in flight, whatever the input's size. Refuses (UsageError)
// an output that is the input, a directory or an existing non-regular file; any failure
// leaves no `output`.tmp.
DataPrepareStats data_prepare(const std::string& input, DataFormat format, const std::string& tokenizer_spec,
                              const std::string& output, const DataPrepareOptions& options = {});

}  // namespace dtrain::data
