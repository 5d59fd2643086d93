// Unicode Normalization Form C, as the tokenizer.json "NFC" normalizer applies it (Qwen2,
// Qwen2.5): canonical decomposition (recursive, Hangul syllables algorithmic), canonical
// ordering of combining marks, then canonical composition (composition exclusions honoured,
// Hangul composed algorithmically). Tables generated from Unicode 14 by
// scripts/gen_unicode_nfc_tables.py. An invalid UTF-8 byte is kept as it is and, like a
// starter that composes with nothing, blocks composition across it.
#pragma once

#include "data/unicode.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace dtrain::data {

// True when NFC leaves `text` unchanged for sure: no code point in it can be changed by NFC
// (no combining mark, nothing with NFC_Quick_Check No or Maybe). Pure ASCII and text below
// U+0300 are decided from the bytes alone.
bool nfc_quick_check(std::string_view text);

// NFC of `text`.
std::string nfc(std::string_view text);

// NFC of `text` without a copy when it is already NFC by the quick check: returns `text`
// itself, else the normalized text kept in `storage`.
std::string_view nfc_view(std::string_view text, std::string& storage);

// The canonical combining class of cp (0 for starters).
uint8_t unicode_ccc(uint32_t cp);

namespace detail {
struct NfcCcc {
  uint32_t cp;
  uint8_t ccc;
};
struct NfcDecomp {
  uint32_t cp;
  uint32_t first;
  uint32_t second;  // 0: a singleton mapping
};
struct NfcCompose {
  uint32_t first;
  uint32_t second;
  uint32_t composite;
};
extern const NfcCcc NFC_CCC[];
extern const size_t NFC_CCC_SIZE;
extern const NfcDecomp NFC_DECOMP[];
extern const size_t NFC_DECOMP_SIZE;
extern const NfcCompose NFC_COMPOSE[];
extern const size_t NFC_COMPOSE_SIZE;
extern const CodeRange NFC_MAYBE_RANGES[];
extern const size_t NFC_MAYBE_RANGES_SIZE;
}  // namespace detail

}  // namespace dtrain::data
