// Tokenizer interface, the byte-level tokenizer (256 bytes + a few specials) and
// tokenizer_load(), which picks the byte tokenizer or a Hugging Face tokenizer.json.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace dtrain::data {

// The most tokens a vocabulary may have (ids 0 .. 2^24 - 1): far above any real tokenizer
// (~256k), low enough that a forged id cannot make loading allocate gigabytes. The config's
// model.vocab_size has the same limit.
inline constexpr int32_t kMaxVocabSize = int32_t{1} << 24;

// ---------------------------------------------------------------------------
// Tokenizer: text <-> token ids. encode() matches the tokenizer's special tokens
// (e.g. "<|eos|>", "<|im_start|>") in the text and maps them to their ids, like
// Hugging Face's added_tokens; encode_ordinary() never does (for untrusted content).
// decode() renders special tokens as their text; ids outside [0, vocab_size()) (a
// model's padded vocabulary can produce them) decode to nothing. Implementations are immutable after
// construction, so one instance may be shared by threads.
// Where ordinary text sits in a longer text that a chat template tokenizes piece by
// piece: at the start, right after a special token, or continuing earlier text (after a
// loss-mask boundary). SentencePiece-style tokenizers prepend "\u2581" at the first two
// (as Hugging Face does per segment between added tokens), never at the third.
enum class TextAt { START, AFTER_SPECIAL, CONTINUATION };

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  virtual std::vector<int32_t> encode_ordinary(std::string_view text) const = 0;
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  // encode_ordinary() of text at `at` in a longer text (see TextAt).
  virtual std::vector<int32_t> encode_ordinary_at(std::string_view text, TextAt at) const {
    (void)at;
    return encode_ordinary(text);
  }

  // One past the largest id the tokenizer can produce.
  virtual int32_t vocab_size() const = 0;
  // -1 when the tokenizer has no such token.
  virtual int32_t bos_id() const = 0;
  virtual int32_t eos_id() const = 0;
  virtual int32_t pad_id() const = 0;
  // Id of the special token whose text is exactly `token`, or -1.
  virtual int32_t special_id(std::string_view token) const = 0;
  // "byte" or "bpe:<path>", for logs and shard metadata.
  virtual std::string name() const = 0;
};

// ---------------------------------------------------------------------------
// ByteTokenizer: ids 0..255 are the raw bytes, then the specials below. Round-trips
// any byte string (invalid UTF-8 included).
class ByteTokenizer final : public Tokenizer {
 public:
  static constexpr int32_t BOS = 256;       // <|bos|>
  static constexpr int32_t EOS = 257;       // <|eos|>
  static constexpr int32_t PAD = 258;       // <|pad|>
  static constexpr int32_t IM_START = 259;  // <|im_start|>  (chatml role marker)
  static constexpr int32_t IM_END = 260;    // <|im_end|>    (chatml end of turn)
  static constexpr int32_t VOCAB_SIZE = 261;

  std::vector<int32_t> encode(std::string_view text) const override;
  std::vector<int32_t> encode_ordinary(std::string_view text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int32_t vocab_size() const override { return VOCAB_SIZE; }
  int32_t bos_id() const override { return BOS; }
  int32_t eos_id() const override { return EOS; }
  int32_t pad_id() const override { return PAD; }
  int32_t special_id(std::string_view token) const override;
  std::string name() const override { return "byte"; }
};

// ---------------------------------------------------------------------------
// "byte" -> ByteTokenizer; anything else is a path to a tokenizer.json (or a directory
// holding one) loaded as a BpeTokenizer (data/bpe.h). Throws IoError / ConfigError
// naming the file when it cannot be read or is not a supported tokenizer.
std::unique_ptr<Tokenizer> tokenizer_load(const std::string& spec);

}  // namespace dtrain::data
