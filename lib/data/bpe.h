// BpeTokenizer: byte-level BPE loaded from a Hugging Face tokenizer.json (GPT-2,
// Llama-3 and Qwen2 style): added tokens matched first, then the regex pre-tokenizer,
// GPT-2's byte-to-unicode mapping and rank-ordered merges.
#pragma once

#include "data/tokenizer.h"
#include "data/unicode.h"

#include <array>
#include <string>
#include <unordered_map>
#include <vector>

namespace dtrain::data {

// Supported tokenizer.json: model.type "BPE" with vocab and merges ("a b" strings or
// ["a", "b"] pairs; model.ignore_merges honoured), added_tokens (matched leftmost-
// longest in the text before BPE; lstrip/rstrip/single_word are not applied),
// pre_tokenizer ByteLevel (GPT-2 regex, add_prefix_space honoured) or a Sequence of a
// Split with the Llama-3 / Qwen2 regex and ByteLevel, normalizer null (NFC is accepted
// and not applied: the text is assumed to be NFC already). bos/eos/pad come from a
// tokenizer_config.json next to the file when present, else from well-known names
// (<|endoftext|>, <|begin_of_text|>, <|end_of_text|>, <s>, </s>, <pad>, ...).
// Anything else is a ConfigError naming the file and the unsupported part.
class BpeTokenizer final : public Tokenizer {
 public:
  explicit BpeTokenizer(const std::string& path);

  std::vector<int32_t> encode(std::string_view text) const override;
  std::vector<int32_t> encode_ordinary(std::string_view text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int32_t vocab_size() const override { return static_cast<int32_t>(id_to_token_.size()); }
  int32_t bos_id() const override { return bos_id_; }
  int32_t eos_id() const override { return eos_id_; }
  int32_t pad_id() const override { return pad_id_; }
  int32_t special_id(std::string_view token) const override;
  std::string name() const override { return "bpe:" + path_; }

  PretokenizerKind pretokenizer() const { return pretokenizer_; }

 private:
  struct Merge {
    int32_t rank;
    int32_t merged;
  };
  struct Added {
    std::string content;
    int32_t id;
  };

  void encode_segment(std::string_view text, std::vector<int32_t>& out) const;
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;

  std::string path_;
  std::unordered_map<std::string, int32_t> vocab_;
  std::vector<std::string> id_to_token_;  // "" for unused ids
  std::vector<bool> is_added_;
  std::unordered_map<uint64_t, Merge> merges_;  // (left id << 32 | right id)
  std::array<int32_t, 256> byte_ids_{};
  std::vector<Added> added_;                       // longest content first
  std::array<std::vector<int32_t>, 256> added_by_first_;  // indices into added_
  PretokenizerKind pretokenizer_ = PretokenizerKind::GPT2;
  int max_digits_ = 3;
  bool add_prefix_space_ = false;
  bool ignore_merges_ = false;
  int32_t bos_id_ = -1, eos_id_ = -1, pad_id_ = -1;
};

}  // namespace dtrain::data
