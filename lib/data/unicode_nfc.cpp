// Unicode NFC (UAX #15): decompose canonically, order the combining marks by class, then
// compose each starter with the marks that follow it unless a mark of the same or a higher
// class blocks it. The quick check keeps the common case (ASCII, Latin-1, CJK, already
// composed text) free of any copy: only text holding a code point NFC can change is
// decomposed and recomposed.
#include "data/unicode_nfc.h"

#include "data/unicode.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace dtrain::data {

namespace {

// Hangul syllables decompose and compose arithmetically (Unicode ch. 3.12).
constexpr uint32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr uint32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

// An invalid UTF-8 byte b travels through the buffers as kInvalidBase + b: out of the code
// point range, so it is a starter with no decomposition or composition.
constexpr uint32_t kInvalidBase = 0x110000;

bool nfc_in_ranges(uint32_t cp, const detail::CodeRange* ranges, size_t n) {
  const detail::CodeRange* it =
      std::lower_bound(ranges, ranges + n, cp, [](const detail::CodeRange& r, uint32_t c) { return r.last < c; });
  return it != ranges + n && it->first <= cp;
}

const detail::NfcDecomp* nfc_decomposition(uint32_t cp) {
  const detail::NfcDecomp* end = detail::NFC_DECOMP + detail::NFC_DECOMP_SIZE;
  const detail::NfcDecomp* it =
      std::lower_bound(detail::NFC_DECOMP, end, cp, [](const detail::NfcDecomp& d, uint32_t c) { return d.cp < c; });
  return it != end && it->cp == cp ? it : nullptr;
}

void nfc_decompose_into(uint32_t cp, std::vector<uint32_t>& out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const uint32_t s = cp - kSBase;
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out.push_back(kTBase + s % kTCount);
    return;
  }
  const detail::NfcDecomp* d = cp < 0xC0 || cp >= kInvalidBase ? nullptr : nfc_decomposition(cp);
  if (d == nullptr) {
    out.push_back(cp);
    return;
  }
  nfc_decompose_into(d->first, out);  // a mapping's first code point may decompose again
  if (d->second != 0) nfc_decompose_into(d->second, out);
}

// The primary composite of (a, b), or 0 when they do not compose.
uint32_t nfc_compose_pair(uint32_t a, uint32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount)
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase && b < kTBase + kTCount)
    return a + (b - kTBase);
  const detail::NfcCompose* end = detail::NFC_COMPOSE + detail::NFC_COMPOSE_SIZE;
  const detail::NfcCompose* it =
      std::lower_bound(detail::NFC_COMPOSE, end, std::make_pair(a, b),
                       [](const detail::NfcCompose& c, const std::pair<uint32_t, uint32_t>& k) {
                         return c.first != k.first ? c.first < k.first : c.second < k.second;
                       });
  return it != end && it->first == a && it->second == b ? it->composite : 0;
}

// One code point of text at i (data/unicode.h's decoder); an invalid byte b becomes
// kInvalidBase + b, so it travels through the buffers and is written back as it was.
uint32_t nfc_decode(std::string_view text, size_t& i) {
  const uint8_t first = static_cast<uint8_t>(text[i]);
  const uint32_t cp = utf8_next(text, i);
  return cp == UTF8_INVALID ? kInvalidBase + first : cp;
}

// NFC_MAYBE_RANGES as a bitmap over the Basic Multilingual Plane (8 KiB, built once): the
// quick check then costs a decode and a bit test per code point of non-Latin text.
const std::vector<uint64_t>& nfc_maybe_bmp() {
  static const std::vector<uint64_t> bits = [] {
    std::vector<uint64_t> b(0x10000 / 64, 0);
    for (size_t r = 0; r < detail::NFC_MAYBE_RANGES_SIZE; ++r)
      for (uint32_t cp = detail::NFC_MAYBE_RANGES[r].first; cp <= detail::NFC_MAYBE_RANGES[r].last && cp < 0x10000;
           ++cp)
        b[cp / 64] |= uint64_t{1} << (cp % 64);
    return b;
  }();
  return bits;
}

// cp (or an invalid byte) may be changed by NFC: NFC_Quick_Check Maybe/No, or a combining mark.
bool nfc_maybe(uint32_t cp) {
  if (cp < 0x10000) return (nfc_maybe_bmp()[cp / 64] >> (cp % 64)) & 1;
  return cp < kInvalidBase && nfc_in_ranges(cp, detail::NFC_MAYBE_RANGES, detail::NFC_MAYBE_RANGES_SIZE);
}

}  // namespace

uint8_t unicode_ccc(uint32_t cp) {
  if (cp < 0x300 || cp >= kInvalidBase) return 0;
  const detail::NfcCcc* end = detail::NFC_CCC + detail::NFC_CCC_SIZE;
  const detail::NfcCcc* it =
      std::lower_bound(detail::NFC_CCC, end, cp, [](const detail::NfcCcc& e, uint32_t c) { return e.cp < c; });
  return it != end && it->cp == cp ? it->ccc : 0;
}

bool nfc_quick_check(std::string_view text) {
  // Every code point NFC can change is U+0300 or above, whose UTF-8 lead byte is >= 0xCC:
  // text without such a byte is decided without decoding (ASCII eight bytes at a time).
  size_t i = 0;
  for (uint64_t w; i + 8 <= text.size(); i += 8) {
    std::memcpy(&w, text.data() + i, 8);
    if (w & 0x8080808080808080ull) break;
  }
  while (i < text.size() && static_cast<uint8_t>(text[i]) < 0xCC) ++i;
  if (i == text.size()) return true;
  // text[i] is a lead byte (continuation bytes are < 0xCC), and so is every byte < 0xCC
  // skipped below or the continuation of a sequence below U+0300.
  while (i < text.size()) {
    if (static_cast<uint8_t>(text[i]) < 0xCC) {
      ++i;
      continue;
    }
    if (nfc_maybe(nfc_decode(text, i))) return false;
  }
  return true;
}

std::string nfc(std::string_view text) {
  if (nfc_quick_check(text)) return std::string(text);
  // 1. Canonical decomposition.
  std::vector<uint32_t> cps;
  cps.reserve(text.size() + 8);
  for (size_t i = 0; i < text.size();) nfc_decompose_into(nfc_decode(text, i), cps);
  // 2. Canonical ordering: each run of non-starters sorted by class, stably.
  std::vector<uint8_t> ccc(cps.size());
  for (size_t k = 0; k < cps.size(); ++k) ccc[k] = unicode_ccc(cps[k]);
  for (size_t k = 0; k < cps.size();) {
    if (ccc[k] == 0) {
      ++k;
      continue;
    }
    size_t e = k;
    while (e < cps.size() && ccc[e] != 0) ++e;
    for (size_t a = k + 1; a < e; ++a)  // insertion sort: runs are short
      for (size_t b = a; b > k && ccc[b - 1] > ccc[b]; --b) {
        std::swap(ccc[b - 1], ccc[b]);
        std::swap(cps[b - 1], cps[b]);
      }
    k = e;
  }
  // 3. Canonical composition. A mark composes with the last starter unless a mark between
  // them has a class >= its own (blocked), or it is a starter not adjacent to the last one.
  size_t out = 0, starter = SIZE_MAX;
  int last_ccc = 0;
  for (size_t k = 0; k < cps.size(); ++k) {
    const uint32_t c = cps[k];
    const int cc = ccc[k];
    if (starter != SIZE_MAX && (last_ccc < cc || (last_ccc == 0 && out == starter + 1))) {
      if (uint32_t comp = nfc_compose_pair(cps[starter], c); comp != 0) {
        cps[starter] = comp;
        continue;
      }
    }
    if (cc == 0) starter = out;
    last_ccc = cc;
    cps[out++] = c;
  }
  std::string s;
  s.reserve(text.size());
  for (size_t k = 0; k < out; ++k) {
    if (cps[k] >= kInvalidBase) s.push_back(static_cast<char>(cps[k] - kInvalidBase));
    else utf8_append(s, cps[k]);
  }
  return s;
}

std::string_view nfc_view(std::string_view text, std::string& storage) {
  if (nfc_quick_check(text)) return text;
  storage = nfc(text);
  return storage;
}

}  // namespace dtrain::data
