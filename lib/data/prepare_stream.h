// The tokenizing pass behind data_tokenize() and data_prepare(): reads the input in
// bounded chunks cut at record boundaries, tokenizes them on a small pool of threads and
// hands the results to a sink in input order, so the output does not depend on the
// number of threads.
#pragma once

#include "data/llamafactory.h"
#include "data/prepare.h"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace dtrain::data {

// The documents of one chunk, laid end to end.
struct TokenPiece {
  std::vector<int32_t> tokens;
  std::vector<uint8_t> mask;       // empty for TEXT, else tokens.size()
  std::vector<size_t> doc_tokens;  // each document's token count (none is 0)
  size_t input_end = 0;            // the input's byte offset after this chunk
};

// Calls sink(piece) for each chunk of `input`, in input order; at most
// 2 * options.threads chunks (input and results) are held at once. A malformed record is
// the ConfigError of the single-threaded parser (file, line, field), raised after the
// pieces before it reached the sink.
void data_tokenize_stream(const std::string& input, DataFormat format, const Tokenizer& tokenizer,
                          const DataPrepareOptions& options, const std::function<void(const TokenPiece&)>& sink);

// The records of LLaMA-Factory datasets (data/llamafactory.h's entries), one dataset after
// the other (as llamafactory_load without mix weights), rendered with options.sft_template;
// a "ranking": true entry's records as pairs (two documents each, data/pairwise.h).
// .jsonl files stream as above; a .json array is read whole (one JSON value), its records
// tokenized in chunks. TokenPiece::input_end counts the bytes of the datasets so far.
void data_tokenize_stream_llamafactory(const std::vector<LlamaFactoryEntry>& entries, const Tokenizer& tokenizer,
                                       const DataPrepareOptions& options,
                                       const std::function<void(const TokenPiece&)>& sink);

// options.threads, with 0 read as the machine's hardware concurrency (at least 1).
unsigned data_prepare_threads(const DataPrepareOptions& options);

}  // namespace dtrain::data
