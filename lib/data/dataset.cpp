// TokenDataset: the sample index (windows, documents or pairs of documents) over shards
// or in-memory token data, and the copy of one sample into inputs / targets.
#include "data/dataset.h"

#include "core/check.h"
#include "core/log.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <optional>

namespace dtrain::data {

// ---------------------------------------------------------------------------
// Sources

struct TokenDataset::Source {
  virtual ~Source() = default;
  virtual std::string name() const = 0;
  virtual size_t size() const = 0;
  virtual int32_t token(size_t i) const = 0;
  virtual bool mask(size_t i) const = 0;
  virtual size_t num_docs() const = 0;
  virtual uint64_t doc_start(size_t d) const = 0;
  virtual uint64_t doc_end(size_t d) const = 0;
  virtual int32_t vocab_size() const = 0;
  virtual int32_t eos_id() const = 0;
  virtual int32_t pad_id() const = 0;
  virtual bool pairwise() const = 0;
};

namespace {

struct ShardSource final : TokenDataset::Source {
  explicit ShardSource(const std::string& path) : r(path) {}
  std::string name() const override { return r.path(); }
  size_t size() const override { return r.size(); }
  int32_t token(size_t i) const override { return r.token(i); }
  bool mask(size_t i) const override { return r.mask(i); }
  size_t num_docs() const override { return r.num_docs(); }
  uint64_t doc_start(size_t d) const override { return r.doc_start(d); }
  uint64_t doc_end(size_t d) const override { return r.doc_end(d); }
  int32_t vocab_size() const override { return r.vocab_size(); }
  int32_t eos_id() const override { return r.eos_id(); }
  int32_t pad_id() const override { return r.pad_id(); }
  bool pairwise() const override { return r.pairwise(); }
  ShardReader r;
};

struct MemorySource final : TokenDataset::Source {
  explicit MemorySource(TokenData data) : d(std::move(data)) {
    DT_ENFORCE(d.mask.empty() || d.mask.size() == d.tokens.size(), ConfigError,
               "token data: mask has {} entries for {} tokens", d.mask.size(), d.tokens.size());
    if (d.doc_starts.empty() && !d.tokens.empty()) d.doc_starts.push_back(0);
    DT_ENFORCE(!d.pairwise || d.doc_starts.size() % 2 == 0, InternalError,
               "{}: pairwise token data has {} documents, not (chosen, rejected) pairs", name(), d.doc_starts.size());
    if (d.vocab_size <= 0)
      d.vocab_size = d.tokens.empty() ? 1 : *std::max_element(d.tokens.begin(), d.tokens.end()) + 1;
  }
  std::string name() const override { return d.name.empty() ? "<memory>" : d.name; }
  size_t size() const override { return d.tokens.size(); }
  int32_t token(size_t i) const override { return d.tokens[i]; }
  bool mask(size_t i) const override { return d.mask.empty() || d.mask[i] != 0; }
  size_t num_docs() const override { return d.doc_starts.size(); }
  uint64_t doc_start(size_t k) const override { return d.doc_starts[k]; }
  uint64_t doc_end(size_t k) const override {
    return k + 1 < d.doc_starts.size() ? d.doc_starts[k + 1] : d.tokens.size();
  }
  int32_t vocab_size() const override { return d.vocab_size; }
  int32_t eos_id() const override { return d.eos_id; }
  int32_t pad_id() const override { return d.pad_id; }
  bool pairwise() const override { return d.pairwise; }
  TokenData d;
};

}  // namespace

// ---------------------------------------------------------------------------
// Construction

TokenDataset::TokenDataset(const std::vector<std::string>& shard_paths, const DatasetOptions& options)
    : options_(options) {
  DT_ENFORCE(!shard_paths.empty(), ConfigError, "no token shards given for the dataset");
  for (const std::string& p : shard_paths) sources_.push_back(std::make_unique<ShardSource>(p));
  build();
}

TokenDataset::TokenDataset(TokenData data, const DatasetOptions& options) : options_(options) {
  sources_.push_back(std::make_unique<MemorySource>(std::move(data)));
  build();
}

TokenDataset::~TokenDataset() = default;
TokenDataset::TokenDataset(TokenDataset&&) noexcept = default;
TokenDataset& TokenDataset::operator=(TokenDataset&&) noexcept = default;

void TokenDataset::build() {
  const std::string name = build_check_sources();
  for (uint32_t si = 0; si < sources_.size(); ++si) build_index(si);
  build_report(name);
}

// Checks that the sources agree (tokenizer, SFT or pairs) and resolves the pad id; returns
// the dataset's name (its sources' names) for the messages.
std::string TokenDataset::build_check_sources() {
  const int64_t L = options_.seq_len;
  DT_ENFORCE(L >= 1, ConfigError, "seq_len must be at least 1, got {}", L);
  vocab_size_ = sources_[0]->vocab_size();
  pairwise_ = sources_[0]->pairwise();
  for (const auto& s : sources_) {
    DT_ENFORCE_EQ(s->vocab_size(), vocab_size_, ConfigError, "shard '{}' was made with another tokenizer than '{}'",
                  s->name(), sources_[0]->name());
    DT_ENFORCE(s->pairwise() == pairwise_, ConfigError,
               "'{}' holds {} data but '{}' holds {}: one dataset is all preference pairs or none", s->name(),
               s->pairwise() ? "pairwise (preference)" : "SFT/text", sources_[0]->name(),
               pairwise_ ? "pairwise (preference)" : "SFT/text");
  }
  std::string name;
  for (const auto& s : sources_) name += (name.empty() ? "" : ", ") + s->name();
  DT_ENFORCE(!pairwise_ || options_.mode == SampleMode::PAD, ConfigError,
             "{}: pairwise (preference) data is one (chosen, rejected) pair per sample and never packed: set "
             "data.pack: false (or leave it out)",
             name);
  pad_id_ = options_.pad_id;
  if (pad_id_ < 0) pad_id_ = sources_[0]->pad_id();
  if (pad_id_ < 0) pad_id_ = sources_[0]->eos_id();
  if (pad_id_ < 0) pad_id_ = 0;
  DT_ENFORCE(pad_id_ < vocab_size_, ConfigError, "pad id {} is outside the vocabulary [0, {})", pad_id_, vocab_size_);
  return name;
}

// ---------------------------------------------------------------------------
// The sample index of one source

std::optional<TokenDataset::Entry> TokenDataset::document_entry(uint32_t si, size_t d) const {
  const Source& s = *sources_[si];
  const uint64_t window = static_cast<uint64_t>(options_.seq_len) + 1;
  const uint64_t b = s.doc_start(d);
  const uint64_t len = std::min<uint64_t>(s.doc_end(d) - b, window);
  for (uint64_t j = 1; j < len; ++j)
    if (s.mask(b + j)) return Entry{si, b, len};
  return std::nullopt;
}

void TokenDataset::document_kept(uint32_t si, size_t d) {
  const Source& s = *sources_[si];
  truncated_ += s.doc_end(d) - s.doc_start(d) > static_cast<uint64_t>(options_.seq_len) + 1;
}

void TokenDataset::document_take(uint32_t si, size_t d, std::vector<Entry>& into) {
  const std::optional<Entry> e = document_entry(si, d);
  if (!e) {
    ++skipped_;
    return;
  }
  into.push_back(*e);
  document_kept(si, d);
}

void TokenDataset::build_index(uint32_t si) {
  const Source& s = *sources_[si];
  const uint64_t L = static_cast<uint64_t>(options_.seq_len), window = L + 1;
  if (doc_starts()) {  // whole documents, packed into samples
    std::vector<Entry> docs;
    for (size_t d = 0; d < s.num_docs(); ++d) {
      document_take(si, d, docs);
      if (docs.size() == kPackRun || (d + 1 == s.num_docs() && !docs.empty())) {
        pack_documents(si, docs);
        docs.clear();
      }
    }
    return;
  }
  if (options_.mode == SampleMode::PACK) {
    if (s.size() < window) return;
    const uint64_t count = (s.size() - 1) / L;
    for (uint64_t i = 0; i < count; ++i) index_.push_back({si, i * L, window});
    return;
  }
  if (pairwise_) {
    for (size_t d = 0; d + 1 < s.num_docs(); d += 2) {
      const std::optional<Entry> chosen = document_entry(si, d), rejected = document_entry(si, d + 1);
      if (!chosen || !rejected) {
        ++skipped_;
        continue;
      }
      index_.push_back(*chosen);
      index_.push_back(*rejected);
      document_kept(si, d);
      document_kept(si, d + 1);
    }
    return;
  }
  for (size_t d = 0; d < s.num_docs(); ++d) document_take(si, d, index_);
}

// ---------------------------------------------------------------------------
// What the index kept and skipped

void TokenDataset::build_report(const std::string& name) const {
  const int64_t L = options_.seq_len;
  const uint64_t window = static_cast<uint64_t>(L) + 1;
  if (skipped_ > 0 && pairwise_)
    log_warn(
        "dataset: skipped {} pairs whose chosen or rejected side has no trained token within seq_len + 1 = {} tokens",
        skipped_, window);
  else if (skipped_ > 0)
    log_warn("dataset: skipped {} documents with no trained token within seq_len + 1 = {} tokens", skipped_, window);
  if (truncated_ > 0)
    log_warn(
        "dataset: {} of the {} documents kept are longer than seq_len + 1 = {} tokens and truncated to it: "
        "their ends (answers included) are not trained; raise data.seq_len to keep them whole",
        truncated_, index_.size() + more_.size(), window);
  size_t total = 0;
  for (const auto& s : sources_) total += s->size();
  // Whole documents (padded or packed) that all lost their trained tokens to truncation:
  // the sequences are too short for these records.
  DT_ENFORCE(!index_.empty() || skipped_ == 0 || pairwise_, ConfigError,
             "{}: none of its {} documents has a trained token within seq_len + 1 = {} tokens (each is kept whole "
             "or truncated to that, and here the answers start later): raise data.seq_len, or {}",
             name, skipped_, window,
             options_.mode == SampleMode::PAD ? "set data.pack: true to cut the token stream into windows"
                                              : "set data.neat_packing: false to cut the token stream into windows");
  DT_ENFORCE(
      !index_.empty(), ConfigError,
      "{}: the dataset yields no samples of seq_len {} ({} tokens in {} shard(s)); use a smaller seq_len or more "
      "data",
      name, L, total, sources_.size());
  // Padded samples were kept only with a trained target; packed windows need the same
  // check over the whole data, or training runs its steps on nothing and "succeeds".
  // It stops at the first trained target, so it costs a scan only when it fails.
  if (options_.mode == SampleMode::PACK && !doc_starts()) {
    bool trained = false;
    for (const Entry& e : index_) {
      for (uint64_t j = 1; j < e.length && !trained; ++j) trained = sources_[e.source]->mask(e.begin + j);
      if (trained) break;
    }
    DT_ENFORCE(trained, ConfigError,
               "{}: the dataset has no trained token: every target in its {} samples of seq_len {} is masked (prompt "
               "tokens only?); check data.format and the data",
               name, index_.size(), L);
  }
}

// Best fit, longest first: each document (longest first; equal lengths in data order) goes
// to the open sample with the least room that holds it, else opens one. Samples come out in
// the order they were opened, each with its documents in the order they were placed.
void TokenDataset::pack_documents(uint32_t source, const std::vector<Entry>& docs) {
  const uint64_t cap = static_cast<uint64_t>(options_.seq_len) + 1;
  std::vector<size_t> order(docs.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return docs[a].length > docs[b].length; });
  std::vector<std::vector<size_t>> bins;
  std::vector<uint64_t> used;
  std::multimap<uint64_t, size_t> room;  // room left -> bin
  for (size_t i : order) {
    const uint64_t len = docs[i].length;
    auto it = room.lower_bound(len);
    size_t bin;
    if (it == room.end()) {
      bin = bins.size();
      bins.emplace_back();
      used.push_back(0);
    } else {
      bin = it->second;
      room.erase(it);
    }
    bins[bin].push_back(i);
    used[bin] += len;
    if (used[bin] < cap) room.emplace(cap - used[bin], bin);
  }
  for (const std::vector<size_t>& bin : bins) {
    Entry e = docs[bin[0]];
    e.source = source;
    e.more = static_cast<uint32_t>(bin.size() - 1);
    e.more_at = static_cast<uint32_t>(more_.size());
    DT_ENFORCE(more_.size() + bin.size() < UINT32_MAX, ConfigError, "dataset: over 2^32 packed documents");
    for (size_t k = 1; k < bin.size(); ++k) more_.push_back({docs[bin[k]].begin, docs[bin[k]].length});
    index_.push_back(e);
  }
}

bool neat_packing_default(const std::string& format, const std::string& path) {
  if (format == "text") return false;
  if (format != "tokens") return true;
  std::string shard = path;
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    shard.clear();
    for (const auto& e : std::filesystem::directory_iterator(path, ec)) {
      std::error_code entry_ec;
      if (e.is_regular_file(entry_ec) && (shard.empty() || e.path().string() < shard)) shard = e.path().string();
    }
    DT_ENFORCE(!shard.empty(), ConfigError, "data: directory {} holds no token shards", path);
  }
  return ShardReader(shard, false).has_mask();
}

// ---------------------------------------------------------------------------
// Samples

void TokenDataset::row(const Entry& e, int32_t* inputs, int32_t* targets, int32_t* doc_start) const {
  const Source& s = *sources_[e.source];
  const size_t L = static_cast<size_t>(options_.seq_len);
  if (doc_starts()) {  // whole documents end to end, then padding as one more document
    size_t j = 0;
    auto put = [&](uint64_t b, uint64_t len) {
      const auto start = static_cast<int32_t>(j);
      for (uint64_t k = 0; k < len && j < L; ++k, ++j) {
        inputs[j] = s.token(b + k);
        targets[j] = (k + 1 < len && s.mask(b + k + 1)) ? s.token(b + k + 1) : IGNORE_INDEX;
        if (doc_start != nullptr) doc_start[j] = start;
      }
    };
    put(e.begin, e.length);
    for (uint32_t k = 0; k < e.more; ++k) put(more_[e.more_at + k].begin, more_[e.more_at + k].length);
    const auto pad_start = static_cast<int32_t>(j);
    for (; j < L; ++j) {
      inputs[j] = pad_id_;
      targets[j] = IGNORE_INDEX;
      if (doc_start != nullptr) doc_start[j] = pad_start;
    }
    return;
  }
  for (size_t j = 0; j < L; ++j) {
    inputs[j] = j < e.length ? s.token(e.begin + j) : pad_id_;
    targets[j] = (j + 1 < e.length && s.mask(e.begin + j + 1)) ? s.token(e.begin + j + 1) : IGNORE_INDEX;
  }
  if (doc_start != nullptr) std::fill_n(doc_start, L, 0);
}

void TokenDataset::sample(size_t index, int32_t* inputs, int32_t* targets, int32_t* doc_start) const {
  DT_ENFORCE(!pairwise_, InternalError, "sample() on a pairwise dataset: a sample is a pair, read it with pair()");
  DT_ENFORCE_LT(index, index_.size(), InternalError, "sample index out of range");
  row(index_[index], inputs, targets, doc_start);
}

Sample TokenDataset::sample(size_t index) const {
  Sample out;
  out.inputs.resize(static_cast<size_t>(options_.seq_len));
  out.targets.resize(static_cast<size_t>(options_.seq_len));
  if (doc_starts()) out.doc_start.resize(static_cast<size_t>(options_.seq_len));
  sample(index, out.inputs.data(), out.targets.data(), doc_starts() ? out.doc_start.data() : nullptr);
  return out;
}

Pair TokenDataset::pair(size_t index) const {
  DT_ENFORCE(pairwise_, InternalError, "pair() on a dataset that is not pairwise");
  DT_ENFORCE_LT(index, size(), InternalError, "pair index out of range");
  const size_t L = static_cast<size_t>(options_.seq_len);
  Pair out;
  for (Sample* s : {&out.chosen, &out.rejected}) {
    s->inputs.resize(L);
    s->targets.resize(L);
  }
  row(index_[2 * index], out.chosen.inputs.data(), out.chosen.targets.data(), nullptr);
  row(index_[2 * index + 1], out.rejected.inputs.data(), out.rejected.targets.data(), nullptr);
  return out;
}

void TokenDataset::batch(const std::vector<size_t>& indices, int32_t* inputs, int32_t* targets,
                         int32_t* doc_start) const {
  const size_t L = static_cast<size_t>(options_.seq_len);
  auto ds = [&](size_t r) { return doc_start != nullptr ? doc_start + r * L : nullptr; };
  if (!pairwise_) {
    for (size_t r = 0; r < indices.size(); ++r) sample(indices[r], inputs + r * L, targets + r * L, ds(r));
    return;
  }
  const size_t n = indices.size();
  for (size_t r = 0; r < n; ++r) {
    DT_ENFORCE_LT(indices[r], size(), InternalError, "pair index out of range");
    row(index_[2 * indices[r]], inputs + r * L, targets + r * L, ds(r));
    row(index_[2 * indices[r] + 1], inputs + (n + r) * L, targets + (n + r) * L, ds(n + r));
  }
}

}  // namespace dtrain::data
