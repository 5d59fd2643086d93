// AddedTokenMatcher: finds a tokenizer.json's added tokens in text the way Hugging Face
// tokenizers' AddedVocabulary does: leftmost-longest, non-overlapping matches, with each
// token's single_word, lstrip and rstrip flags applied to the match.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dtrain::data {

struct AddedTokenSpec {
  std::string pattern;  // what is searched for: the content, normalized when the token is
  int32_t id = -1;
  bool single_word = false;  // only when neither neighbour character is a word character
  bool lstrip = false;       // the match swallows the white space on its left
  bool rstrip = false;       // ... and on its right
};

// A split of the text: either a matched token (id >= 0, the span includes any white space
// its lstrip/rstrip swallowed) or plain text (id == -1).
struct AddedSplit {
  size_t offset;
  size_t length;
  int32_t id;
};

class AddedTokenMatcher {
 public:
  AddedTokenMatcher() = default;
  explicit AddedTokenMatcher(std::vector<AddedTokenSpec> specs);

  bool empty() const { return specs_.empty(); }
  // Appends the splits of `text` (offsets relative to `text`) to `out`; plain-text splits
  // are never empty. An empty text gives nothing.
  void split(std::string_view text, std::vector<AddedSplit>& out) const;

 private:
  std::vector<AddedTokenSpec> specs_;           // longest pattern first
  std::vector<std::vector<int32_t>> by_first_;  // 256 lists of indices into specs_
};

}  // namespace dtrain::data
