// Unicode helpers for the BPE tokenizer: lenient UTF-8 decoding (an invalid byte is
// its own "code point"), letter / number / white-space classification, GPT-2's
// byte <-> unicode mapping, and the GPT-2 / Llama-3 pre-tokenizers as state machines.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dtrain::data {

// ---------------------------------------------------------------------------
// Classification. Letters and numbers are the Unicode general categories L and N for
// every script (tables generated from Unicode 14 by scripts/gen_unicode_tables.py);
// white space is the Unicode White_Space property (what Rust/Oniguruma's \s is).
bool unicode_is_letter(uint32_t cp);
bool unicode_is_number(uint32_t cp);
bool unicode_is_space(uint32_t cp);

// Appends the UTF-8 encoding of cp (cp < 0x110000).
void utf8_append(std::string& out, uint32_t cp);

// One decoded unit of a byte string: a valid UTF-8 sequence, or one invalid byte
// (reported as cp = 0xFFFFFFFF, classified as neither letter, number nor space).
struct Utf8Unit {
  uint32_t cp;
  uint32_t offset;  // byte offset in the text
  uint32_t length;  // bytes
};
constexpr uint32_t UTF8_INVALID = 0xFFFFFFFFu;
std::vector<Utf8Unit> utf8_units(std::string_view text);

// Decodes the UTF-8 sequence at text[i] (i < text.size()) and moves i past it. An invalid
// sequence (a bad lead or continuation byte, an overlong form, a surrogate, a value past
// U+10FFFF, a sequence cut by the end) is its first byte alone: UTF8_INVALID, i + 1.
// Inline: the pre-tokenizer and the NFC quick check call it per code point.
inline uint32_t utf8_next(std::string_view text, size_t& i) {
  const auto byte = [&](size_t k) { return static_cast<uint8_t>(text[k]); };
  const uint8_t b = byte(i);
  if (b < 0x80) {
    ++i;
    return b;
  }
  size_t len = 0;
  uint32_t cp = 0, min = 0;
  if ((b & 0xE0) == 0xC0) len = 2, cp = b & 0x1Fu, min = 0x80;
  else if ((b & 0xF0) == 0xE0) len = 3, cp = b & 0x0Fu, min = 0x800;
  else if ((b & 0xF8) == 0xF0) len = 4, cp = b & 0x07u, min = 0x10000;
  bool ok = len > 0 && i + len <= text.size();
  for (size_t k = 1; ok && k < len; ++k) {
    ok = (byte(i + k) & 0xC0) == 0x80;
    cp = (cp << 6) | (byte(i + k) & 0x3Fu);
  }
  if (!ok || cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
    ++i;
    return UTF8_INVALID;
  }
  i += len;
  return cp;
}

// ---------------------------------------------------------------------------
// GPT-2's bytes_to_unicode(): printable bytes map to themselves, the rest to U+0100...
// byte_to_unicode(b) is that code point; unicode_to_byte(cp) the inverse, -1 if none.
uint32_t byte_to_unicode(uint8_t b);
int unicode_to_byte(uint32_t cp);

// ---------------------------------------------------------------------------
// Pre-tokenizers: split text into the pieces the regex would find (byte ranges).
//   GPT2:   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//   LLAMA3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,D}|
//           ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+     (D = max_digits: 3 for
//           Llama-3, 1 for Qwen2's \p{N})
//   NONE:   the whole text is one piece.
// The (?i) of LLAMA3 folds ASCII only.
enum class PretokenizerKind { GPT2, LLAMA3, NONE };
struct Piece {
  size_t offset;
  size_t length;
};
std::vector<Piece> pretokenize(std::string_view text, PretokenizerKind kind, int max_digits = 3);

namespace detail {
struct CodeRange {
  uint32_t first;
  uint32_t last;
};
extern const CodeRange LETTER_RANGES[];
extern const size_t LETTER_RANGES_SIZE;
extern const CodeRange NUMBER_RANGES[];
extern const size_t NUMBER_RANGES_SIZE;
}  // namespace detail

}  // namespace dtrain::data
