// TokenDataset: fixed-length training samples (seq_len inputs + seq_len shifted
// targets, -100 where no loss is taken) cut from token shards or in-memory TokenData,
// by packing the token stream into windows or by padding one document per sample; and
// its pairwise form (preference data), whose samples are (chosen, rejected) pairs.
#pragma once

#include "data/shard.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace dtrain::data {

constexpr int32_t IGNORE_INDEX = -100;  // target value that takes no loss

// PACK: the documents of each shard, laid end to end, are cut into consecutive windows
//   of seq_len + 1 tokens that overlap by one (window i = tokens [i*L, i*L + L + 1)); a
//   partial last window is dropped and windows do not cross shards. Plain causal
//   packing: attention crosses document/record boundaries inside a window (each
//   document ends with eos, which marks the boundary), the usual pre-training stream.
// PACK with `isolate` (LLaMA-Factory's neat_packing): whole documents, each truncated
//   to seq_len + 1 tokens and kept only with a trained target as in PAD, are packed into
//   samples of at most seq_len + 1 tokens (best fit, longest first, within runs of
//   kPackRun documents of a shard, so the data keeps its rough order) and the rest is
//   padded; no document is cut. batch() also writes each position's document start
//   (doc_start, the layout ops/attention.h states; the padding is one more document) so
//   that the model keeps the documents apart (attention within a document, positions
//   counted from its start), and no target crosses documents: every document trains as
//   it would alone in PAD mode, with less padding.
// PAD: one document (SFT record) per sample, truncated to seq_len + 1 tokens and padded
//   (inputs = pad id, targets = -100). Documents left with no trained target token
//   (length 1, or the response cut off by truncation) are skipped, with a warning.
// In both modes target j is token j+1 of the window, or -100 when its mask is false.
// Pairwise data (TokenData::pairwise, a shard's pairwise flag) is PAD only: each sample
// is a pair of documents (chosen, rejected), each truncated and padded as above, and a
// pair where EITHER side is left with no trained target is skipped whole.
enum class SampleMode { PACK, PAD };

// Documents packed together at most (PACK with isolate): one run's bins are filled
// before the next run's documents are seen.
constexpr size_t kPackRun = 4096;

// data.neat_packing's default for data of a (resolved) data.format at `path`: whole
// examples kept apart for SFT records (alpaca, chat, LLaMA-Factory datasets) and token
// shards made of them (their header has a prompt mask); the stream cut into windows for
// plain text and unmasked token shards (pre-training streams, whose long documents whole
// packing would truncate). Reads a shard's header (a directory: its first file by name).
bool neat_packing_default(const std::string& format, const std::string& path);

struct DatasetOptions {
  int64_t seq_len = 0;  // tokens per sample (inputs); >= 1
  SampleMode mode = SampleMode::PACK;
  int32_t pad_id = -1;   // PAD input filler; -1: the shard's pad, else its eos, else 0
  bool isolate = false;  // PACK: packed documents do not see each other (see above)
};

struct Sample {
  std::vector<int32_t> inputs;     // seq_len
  std::vector<int32_t> targets;    // seq_len; IGNORE_INDEX where no loss
  std::vector<int32_t> doc_start;  // seq_len with doc_starts(), else empty
};

// One sample of a pairwise dataset.
struct Pair {
  Sample chosen, rejected;
};

class TokenDataset {
 public:
  // Opens (and verifies) every shard. ConfigError when the options are invalid, the
  // shards disagree on vocab_size or on being pairwise, pairwise data is asked to PACK,
  // or no sample can be made.
  TokenDataset(const std::vector<std::string>& shard_paths, const DatasetOptions& options);
  TokenDataset(TokenData data, const DatasetOptions& options);
  ~TokenDataset();
  TokenDataset(TokenDataset&&) noexcept;
  TokenDataset& operator=(TokenDataset&&) noexcept;

  // Samples: windows or documents, or for a pairwise dataset pairs.
  size_t size() const { return pairwise_ ? index_.size() / 2 : index_.size(); }
  int64_t seq_len() const { return options_.seq_len; }
  int32_t vocab_size() const { return vocab_size_; }
  // Documents (pairs, for a pairwise dataset) skipped for having no trained target.
  size_t skipped_documents() const { return skipped_; }
  // Documents kept but truncated to seq_len + 1 tokens (padded or whole-packed samples):
  // their tails, answers included, are not trained.
  size_t truncated_documents() const { return truncated_; }
  // Preference data: every sample is a (chosen, rejected) pair of rows.
  bool pairwise() const { return pairwise_; }
  // Rows one sample fills in a batch: 2 for a pairwise dataset, else 1.
  int rows_per_sample() const { return pairwise_ ? 2 : 1; }

  // Whether samples come with document starts: packed (PACK) with `isolate`.
  bool doc_starts() const { return options_.mode == SampleMode::PACK && options_.isolate; }

  // Fills inputs[0..seq_len) and targets[0..seq_len), and doc_start[0..seq_len) when given
  // (with doc_starts(); without it all zero: one document); index < size() (else
  // InternalError). A pairwise dataset has no single-row samples: InternalError (use pair()).
  void sample(size_t index, int32_t* inputs, int32_t* targets, int32_t* doc_start = nullptr) const;
  Sample sample(size_t index) const;
  // Both rows of pair `index` of a pairwise dataset (InternalError on another dataset).
  Pair pair(size_t index) const;
  // Fills the rows of row-major [rows_per_sample() * indices.size(), seq_len] arrays:
  // row r with sample indices[r]; for a pairwise dataset (n = indices.size()) rows 0..n-1
  // with the chosen sequences of indices[0..n) and rows n..2n-1 with their rejected ones,
  // in the same order (LLaMA-Factory's PairwiseDataCollator's order).
  // doc_start (optional) likewise, as sample() fills it.
  void batch(const std::vector<size_t>& indices, int32_t* inputs, int32_t* targets, int32_t* doc_start = nullptr) const;

  struct Source;  // a shard or in-memory TokenData (dataset.cpp)

 private:
  struct Entry {
    uint32_t source;
    uint64_t begin;        // first token of the window / document
    uint64_t length;       // tokens available (<= seq_len + 1)
    uint32_t more = 0;     // whole-document packing: the documents after this one,
    uint32_t more_at = 0;  // more_[more_at .. more_at + more)
  };
  struct Span {
    uint64_t begin, length;
  };
  void build();
  std::string build_check_sources();
  // A document truncated to seq_len + 1 tokens, or nullopt when no target of it is trained.
  std::optional<Entry> document_entry(uint32_t source, size_t d) const;
  // Counts a kept document that document_entry() truncated.
  void document_kept(uint32_t source, size_t d);
  // Appends document d to `into` when a target of it is trained (counted kept), else
  // counts it skipped.
  void document_take(uint32_t source, size_t d, std::vector<Entry>& into);
  void build_index(uint32_t source);
  void build_report(const std::string& name) const;
  void pack_documents(uint32_t source, const std::vector<Entry>& docs);
  void row(const Entry& e, int32_t* inputs, int32_t* targets, int32_t* doc_start) const;

  DatasetOptions options_;
  std::vector<std::unique_ptr<Source>> sources_;
  std::vector<Entry> index_;  // pairwise: entries 2k and 2k+1 are pair k's chosen and rejected
  std::vector<Span> more_;    // whole-document packing: the documents after an entry's first
  bool pairwise_ = false;
  int32_t vocab_size_ = 0;
  int32_t pad_id_ = 0;
  size_t skipped_ = 0;
  size_t truncated_ = 0;
};

}  // namespace dtrain::data
