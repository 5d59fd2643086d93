// AddedTokenMatcher. The flags follow tokenizers' AddedVocabulary::find_matches: a
// single_word match is dropped (and the search goes on after it) when the character before
// or after it is a word character (\w: letters, numbers, '_'); lstrip moves the start left
// over the white space (\s) before it, never past the previous split; rstrip moves the end
// right over the white space after it.
#include "data/added_tokens.h"

#include "data/unicode.h"

#include <algorithm>

namespace dtrain::data {

namespace {

bool is_word(uint32_t cp) { return cp == '_' || unicode_is_letter(cp) || unicode_is_number(cp); }

// The code point that ends at `end` (lenient: an invalid byte is UTF8_INVALID).
uint32_t cp_before(std::string_view text, size_t end) {
  size_t b = end;
  while (b > 0 && end - b < 4) {
    --b;
    if ((static_cast<uint8_t>(text[b]) & 0xC0) != 0x80) break;
  }
  std::vector<Utf8Unit> u = utf8_units(text.substr(b, end - b));
  return u.empty() ? UTF8_INVALID : u.back().cp;
}

uint32_t cp_at(std::string_view text, size_t begin) {
  std::vector<Utf8Unit> u = utf8_units(text.substr(begin, std::min<size_t>(4, text.size() - begin)));
  return u.empty() ? UTF8_INVALID : u.front().cp;
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(std::vector<AddedTokenSpec> specs) : specs_(std::move(specs)), by_first_(256) {
  std::erase_if(specs_, [](const AddedTokenSpec& s) { return s.pattern.empty(); });
  std::stable_sort(specs_.begin(), specs_.end(), [](const AddedTokenSpec& x, const AddedTokenSpec& y) {
    return x.pattern.size() > y.pattern.size();
  });
  for (size_t i = 0; i < specs_.size(); ++i)
    by_first_[static_cast<uint8_t>(specs_[i].pattern[0])].push_back(static_cast<int32_t>(i));
}

void AddedTokenMatcher::split(std::string_view text, std::vector<AddedSplit>& out) const {
  size_t done = 0;  // end of the last split emitted
  size_t i = 0;
  while (i < text.size()) {
    const AddedTokenSpec* hit = nullptr;
    if (!specs_.empty()) {
      for (int32_t k : by_first_[static_cast<uint8_t>(text[i])]) {
        const AddedTokenSpec& s = specs_[k];
        if (text.compare(i, s.pattern.size(), s.pattern) == 0) {
          hit = &s;  // longest first
          break;
        }
      }
    }
    if (!hit) {
      ++i;
      continue;
    }
    size_t start = i, stop = i + hit->pattern.size();
    i = stop;                    // the next search starts after this match, kept or not
    if (start < done) continue;  // inside white space an rstrip swallowed
    if (hit->single_word) {
      bool word_before = start > 0 && is_word(cp_before(text, start));
      bool word_after = stop < text.size() && is_word(cp_at(text, stop));
      if (word_before || word_after) continue;
    }
    if (hit->lstrip) {
      while (start > done) {
        size_t b = start - 1;
        while (b > done && (static_cast<uint8_t>(text[b]) & 0xC0) == 0x80) --b;
        if (!unicode_is_space(cp_at(text, b))) break;
        start = b;
      }
    }
    if (hit->rstrip) {
      while (stop < text.size()) {
        std::vector<Utf8Unit> u = utf8_units(text.substr(stop, std::min<size_t>(4, text.size() - stop)));
        if (u.empty() || !unicode_is_space(u.front().cp)) break;
        stop += u.front().length;
      }
      i = std::max(i, stop);
    }
    if (start > done) out.push_back({done, start - done, -1});
    out.push_back({start, stop - start, hit->id});
    done = stop;
  }
  if (done < text.size()) out.push_back({done, text.size() - done, -1});
}

}  // namespace dtrain::data
