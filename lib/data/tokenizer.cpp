// ByteTokenizer and tokenizer_load(). Special tokens are matched leftmost-first in the
// text so "<|eos|>" written in a prompt template becomes the eos id.
#include "data/tokenizer.h"

#include "core/check.h"
#include "data/bpe.h"

#include <array>
#include <filesystem>

namespace dtrain::data {

namespace {

struct ByteSpecial {
  std::string_view text;
  int32_t id;
};
constexpr std::array<ByteSpecial, 5> BYTE_SPECIALS = {{
    {"<|bos|>", ByteTokenizer::BOS},
    {"<|eos|>", ByteTokenizer::EOS},
    {"<|pad|>", ByteTokenizer::PAD},
    {"<|im_start|>", ByteTokenizer::IM_START},
    {"<|im_end|>", ByteTokenizer::IM_END},
}};

}  // namespace

// ---------------------------------------------------------------------------
// ByteTokenizer

std::vector<int32_t> ByteTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    if (text[i] == '<') {
      bool matched = false;
      for (const auto& s : BYTE_SPECIALS) {
        if (text.substr(i, s.text.size()) == s.text) {
          ids.push_back(s.id);
          i += s.text.size();
          matched = true;
          break;
        }
      }
      if (matched) continue;
    }
    ids.push_back(static_cast<uint8_t>(text[i]));
    ++i;
  }
  return ids;
}

std::vector<int32_t> ByteTokenizer::encode_ordinary(std::string_view text) const {
  std::vector<int32_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<uint8_t>(text[i]);
  return ids;
}

std::string ByteTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  out.reserve(ids.size());
  for (int32_t id : ids) {
    if (id >= 0 && id < 256) {
      out.push_back(static_cast<char>(static_cast<uint8_t>(id)));
      continue;
    }
    for (const auto& s : BYTE_SPECIALS)
      if (s.id == id) out.append(s.text);
  }
  return out;
}

int32_t ByteTokenizer::special_id(std::string_view token) const {
  for (const auto& s : BYTE_SPECIALS)
    if (s.text == token) return s.id;
  return -1;
}

// ---------------------------------------------------------------------------
// tokenizer_load

std::unique_ptr<Tokenizer> tokenizer_load(const std::string& spec) {
  DT_ENFORCE(!spec.empty(), ConfigError, "empty tokenizer spec: use \"byte\" or the path of a tokenizer.json");
  if (spec == "byte") return std::make_unique<ByteTokenizer>();
  std::string path = spec;
  std::error_code ec;  // a loop or a missing path: the tokenizer file's open names it
  if (std::filesystem::is_directory(path, ec)) path = (std::filesystem::path(path) / "tokenizer.json").string();
  return std::make_unique<BpeTokenizer>(path);
}

}  // namespace dtrain::data
