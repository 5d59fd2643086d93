// UTF-8 decoding, letter/number/space classification, GPT-2's byte map and the
// regex-equivalent pre-tokenizers. Each alternative of the regexes is one branch of
// pretokenize_at(), tried in the regex's order, so the pieces match the regex exactly.
#include "data/unicode.h"

#include <algorithm>
#include <array>

namespace dtrain::data {

// ---------------------------------------------------------------------------
// Classification

namespace {

bool in_ranges(uint32_t cp, const detail::CodeRange* ranges, size_t n) {
  size_t lo = 0, hi = n;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (ranges[mid].last < cp) lo = mid + 1;
    else hi = mid;
  }
  return lo < n && ranges[lo].first <= cp && cp <= ranges[lo].last;
}

}  // namespace

bool unicode_is_letter(uint32_t cp) {
  if (cp < 0x80) return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z';
  return cp != UTF8_INVALID && in_ranges(cp, detail::LETTER_RANGES, detail::LETTER_RANGES_SIZE);
}

bool unicode_is_number(uint32_t cp) {
  if (cp < 0x80) return cp >= '0' && cp <= '9';
  return cp != UTF8_INVALID && in_ranges(cp, detail::NUMBER_RANGES, detail::NUMBER_RANGES_SIZE);
}

bool unicode_is_space(uint32_t cp) {
  switch (cp) {
    case 0x09:
    case 0x0A:
    case 0x0B:
    case 0x0C:
    case 0x0D:
    case 0x20:
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000: return true;
    default: return cp >= 0x2000 && cp <= 0x200A;
  }
}

// ---------------------------------------------------------------------------
// UTF-8

void utf8_append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::vector<Utf8Unit> utf8_units(std::string_view text) {
  std::vector<Utf8Unit> units;
  units.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const size_t at = i;
    const uint32_t cp = utf8_next(text, i);
    units.push_back({cp, static_cast<uint32_t>(at), static_cast<uint32_t>(i - at)});
  }
  return units;
}

// ---------------------------------------------------------------------------
// GPT-2 byte map

namespace {

struct ByteMap {
  std::array<uint32_t, 256> to_unicode{};
  std::array<int16_t, 512> to_byte{};  // every mapped code point is < 0x144
  ByteMap() {
    to_byte.fill(-1);
    auto printable = [](int b) {
      return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    };
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      uint32_t cp = printable(b) ? static_cast<uint32_t>(b) : next++;
      to_unicode[b] = cp;
      to_byte[cp] = static_cast<int16_t>(b);
    }
  }
};

const ByteMap& byte_map() {
  static const ByteMap map;
  return map;
}

}  // namespace

uint32_t byte_to_unicode(uint8_t b) { return byte_map().to_unicode[b]; }

int unicode_to_byte(uint32_t cp) {
  if (cp >= byte_map().to_byte.size()) return -1;
  return byte_map().to_byte[cp];
}

// ---------------------------------------------------------------------------
// Pre-tokenizers

namespace {

class Scanner {
 public:
  Scanner(const std::vector<Utf8Unit>& u, PretokenizerKind kind, int max_digits)
      : u_(u), kind_(kind), max_digits_(max_digits) {}

  // Number of units matched by the regex at position i (always >= 1).
  size_t match_at(size_t i) const {
    size_t n = kind_ == PretokenizerKind::GPT2 ? match_gpt2(i) : match_llama3(i);
    return n == 0 ? 1 : n;  // unreachable (every unit has a class) but never loop forever
  }

 private:
  uint32_t cp(size_t i) const { return i < u_.size() ? u_[i].cp : UTF8_INVALID; }
  bool has(size_t i) const { return i < u_.size(); }
  bool letter(size_t i) const { return has(i) && unicode_is_letter(cp(i)); }
  bool number(size_t i) const { return has(i) && unicode_is_number(cp(i)); }
  bool space(size_t i) const { return has(i) && unicode_is_space(cp(i)); }
  bool other(size_t i) const { return has(i) && !letter(i) && !number(i) && !space(i); }
  bool crlf(size_t i) const { return has(i) && (cp(i) == '\r' || cp(i) == '\n'); }

  template <typename Pred>
  size_t run(size_t i, Pred pred) const {
    size_t j = i;
    while (j < u_.size() && (this->*pred)(j)) ++j;
    return j - i;
  }

  // 's 't 're 've 'm 'll 'd; fold = ASCII case-insensitive.
  size_t contraction(size_t i, bool fold) const {
    if (cp(i) != '\'') return 0;
    auto low = [&](size_t k) -> uint32_t {
      uint32_t c = cp(k);
      return fold && c >= 'A' && c <= 'Z' ? c + 32 : c;
    };
    uint32_t a = low(i + 1), b = low(i + 2);
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
    return 0;
  }

  // \s+(?!\S) then \s+: a white-space run followed by a non-space gives its last unit
  // back (when it has more than one) so " word" stays together.
  size_t space_tail(size_t i) const {
    size_t r = run(i, &Scanner::space);
    if (i + r < u_.size() && r >= 2) return r - 1;
    return r;
  }

  size_t match_gpt2(size_t i) const {
    if (size_t c = contraction(i, false)) return c;
    size_t sp = cp(i) == ' ' ? 1 : 0;
    if (letter(i + sp)) return sp + run(i + sp, &Scanner::letter);
    if (number(i + sp)) return sp + run(i + sp, &Scanner::number);
    if (other(i + sp)) return sp + run(i + sp, &Scanner::other);
    return space_tail(i);
  }

  size_t match_llama3(size_t i) const {
    if (size_t c = contraction(i, true)) return c;
    // [^\r\n\p{L}\p{N}]?\p{L}+
    if (letter(i)) return run(i, &Scanner::letter);
    if (!crlf(i) && !number(i) && letter(i + 1)) return 1 + run(i + 1, &Scanner::letter);
    // \p{N}{1,D}
    if (number(i)) return std::min<size_t>(run(i, &Scanner::number), static_cast<size_t>(max_digits_));
    // ' '?[^\s\p{L}\p{N}]+[\r\n]*
    size_t sp = cp(i) == ' ' ? 1 : 0;
    if (other(i + sp)) {
      size_t j = i + sp + run(i + sp, &Scanner::other);
      return j + run(j, &Scanner::crlf) - i;
    }
    // \s*[\r\n]+ : up to the last CR/LF of the white-space run.
    size_t r = run(i, &Scanner::space);
    for (size_t k = i + r; k > i; --k)
      if (crlf(k - 1)) return k - i;
    return space_tail(i);
  }

  const std::vector<Utf8Unit>& u_;
  PretokenizerKind kind_;
  int max_digits_;
};

}  // namespace

std::vector<Piece> pretokenize(std::string_view text, PretokenizerKind kind, int max_digits) {
  std::vector<Piece> pieces;
  if (text.empty()) return pieces;
  if (kind == PretokenizerKind::NONE) {
    pieces.push_back({0, text.size()});
    return pieces;
  }
  const std::vector<Utf8Unit> units = utf8_units(text);
  Scanner scanner(units, kind, max_digits < 1 ? 1 : max_digits);
  size_t i = 0;
  while (i < units.size()) {
    size_t n = scanner.match_at(i);
    size_t end = i + n;
    size_t off = units[i].offset;
    size_t stop = end < units.size() ? units[end].offset : text.size();
    pieces.push_back({off, stop - off});
    i = end;
  }
  return pieces;
}

}  // namespace dtrain::data
