// Slurm hostlist expansion (Slurm 22.05 order and zero padding) and its display inverse.
#include "launch/hostlist.h"

#include "core/check.h"

#include <cctype>
#include <cstdint>

namespace dtrain::launch {

namespace {

bool is_name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_'; }
bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

std::string printable(char c) {
  auto u = static_cast<unsigned char>(c);
  if (u < 0x20 || u >= 0x7f) return fmt::format("byte 0x{:02x}", u);
  return fmt::format("'{}'", c);
}

// One bracket group, already expanded to its numbers as text (padded), in order.
using Group = std::vector<std::string>;

// Parses the inside of "[...]" (expr[begin, end)) into its names' number texts.
Group parse_group(std::string_view expr, size_t begin, size_t end) {
  auto fail = [&](size_t col, const std::string& what) {
    DT_THROW(ConfigError,
             "hostlist '{}', column {}: {}; a bracket group holds numbers and LO-HI ranges "
             "separated by commas, e.g. node[01-04,07]",
             expr, col + 1, what);
  };
  if (begin == end) fail(begin - 1, "empty brackets '[]'");
  Group out;
  size_t pos = begin;
  while (pos <= end) {
    size_t comma = expr.find(',', pos);
    if (comma == std::string_view::npos || comma > end) comma = end;
    std::string_view r = expr.substr(pos, comma - pos);
    if (r.empty()) fail(pos, "empty range (two commas in a row, or a comma at the start or end of the group)");
    size_t dash = r.find('-');
    std::string_view lo = r.substr(0, dash);
    std::string_view hi = dash == std::string_view::npos ? lo : r.substr(dash + 1);
    auto parse_num = [&](std::string_view digits, size_t col, const char* which) -> uint64_t {
      if (digits.empty()) fail(col, fmt::format("range '{}' has no {} number", r, which));
      uint64_t v = 0;
      for (size_t i = 0; i < digits.size(); ++i) {
        char c = digits[i];
        if (c < '0' || c > '9') fail(col + i, fmt::format("{} in range '{}' is not a digit", printable(c), r));
        if (v > (UINT64_MAX - 9) / 10) fail(col, fmt::format("number '{}' is too large", digits));
        v = v * 10 + static_cast<uint64_t>(c - '0');
      }
      return v;
    };
    uint64_t a = parse_num(lo, pos, "first");
    uint64_t b = dash == std::string_view::npos ? a : parse_num(hi, pos + dash + 1, "last");
    if (a > b) fail(pos, fmt::format("range '{}' runs backwards; write it as {}-{}", r, hi, lo));
    if (b - a >= HOSTLIST_MAX_RANGE)
      fail(pos, fmt::format("range '{}' has {} names, more than the {} Slurm allows in one range", r, b - a + 1,
                            HOSTLIST_MAX_RANGE));
    const int width = static_cast<int>(lo.size());
    for (uint64_t v = a;; ++v) {
      out.push_back(fmt::format("{:0{}}", v, width));
      if (v == b) break;
    }
    pos = comma + 1;
  }
  return out;
}

// Expands one item (no top-level separators) and appends its names to `out`.
void expand_item(std::string_view expr, size_t begin, size_t end, std::vector<std::string>& out) {
  std::vector<std::string> texts;  // literal text before each group, then the suffix
  std::vector<Group> groups;
  std::string text;
  for (size_t i = begin; i < end; ++i) {
    char c = expr[i];
    if (c == '[') {
      size_t close = i + 1;
      while (close < end && expr[close] != ']') {
        if (expr[close] == '[')
          DT_THROW(ConfigError, "hostlist '{}', column {}: '[' inside brackets; bracket groups cannot nest", expr,
                   close + 1);
        if (is_space(expr[close]))
          DT_THROW(ConfigError, "hostlist '{}', column {}: whitespace inside brackets; remove it", expr, close + 1);
        ++close;
      }
      if (close >= end)
        DT_THROW(ConfigError, "hostlist '{}', column {}: '[' is never closed; add the matching ']'", expr, i + 1);
      texts.push_back(std::move(text));
      text.clear();
      groups.push_back(parse_group(expr, i + 1, close));
      i = close;
    } else if (c == ']') {
      DT_THROW(ConfigError, "hostlist '{}', column {}: ']' without a matching '['", expr, i + 1);
    } else if (!is_name_char(c)) {
      DT_THROW(ConfigError,
               "hostlist '{}', column {}: {} cannot be part of a host name (letters, digits, "
               "'.', '-' and '_' can)",
               expr, i + 1, printable(c));
    } else {
      text.push_back(c);
    }
  }
  texts.push_back(std::move(text));
  const size_t n = groups.size();
  if (n == 0) {
    out.push_back(std::move(texts[0]));
    return;
  }
  size_t total = 1;
  for (const Group& g : groups) {
    if (total > HOSTLIST_MAX_HOSTS / g.size())
      DT_THROW(ConfigError, "hostlist '{}': item '{}' expands to more than {} names", expr,
               expr.substr(begin, end - begin), HOSTLIST_MAX_HOSTS);
    total *= g.size();
  }
  if (out.size() + total > HOSTLIST_MAX_HOSTS)
    DT_THROW(ConfigError, "hostlist '{}' expands to more than {} names", expr, HOSTLIST_MAX_HOSTS);

  // Slurm's loop nesting, outermost first: group n-2, n-3, ..., 0, then n-1 innermost
  // (its _push_range_list peels brackets off the prefix from the right, recursively).
  std::vector<size_t> order;
  for (size_t k = n - 1; k-- > 0;) order.push_back(k);
  order.push_back(n - 1);
  std::vector<size_t> idx(n, 0);
  for (size_t count = 0; count < total; ++count) {
    std::string name;
    for (size_t k = 0; k < n; ++k) name += texts[k] + groups[k][idx[k]];
    name += texts[n];
    out.push_back(std::move(name));
    for (size_t o = n; o-- > 0;) {  // odometer: the innermost (last in order) turns fastest
      size_t k = order[o];
      if (++idx[k] < groups[k].size()) break;
      idx[k] = 0;
    }
  }
}

}  // namespace

// ---------------------------------------------------------------------------

std::vector<std::string> hostlist_expand(std::string_view expr) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < expr.size()) {
    if (expr[i] == ',' || is_space(expr[i])) {
      ++i;
      continue;
    }
    size_t j = i;
    bool in_bracket = false;
    while (j < expr.size() && (in_bracket || (expr[j] != ',' && !is_space(expr[j])))) {
      if (expr[j] == '[') in_bracket = true;
      else if (expr[j] == ']') in_bracket = false;
      else if (in_bracket && is_space(expr[j])) break;  // reported by expand_item
      ++j;
    }
    if (in_bracket && j < expr.size() && is_space(expr[j]))
      DT_THROW(ConfigError, "hostlist '{}', column {}: whitespace inside brackets; remove it", expr, j + 1);
    expand_item(expr, i, j, out);
    i = j;
  }
  return out;
}

std::string hostlist_compress(const std::vector<std::string>& hosts) {
  // Split "prefix<digits>"; names without trailing digits (or with too many) stay literal.
  struct Split {
    std::string_view prefix, digits;
    uint64_t value = 0;
    bool numeric = false;
  };
  auto split = [](const std::string& h) {
    Split s;
    size_t k = h.size();
    while (k > 0 && std::isdigit(static_cast<unsigned char>(h[k - 1]))) --k;
    s.prefix = std::string_view(h).substr(0, k);
    s.digits = std::string_view(h).substr(k);
    s.numeric = !s.digits.empty() && s.digits.size() <= 18;
    for (char c : s.digits) s.value = s.value * 10 + static_cast<uint64_t>(c - '0');
    return s;
  };
  std::string out;
  size_t i = 0;
  while (i < hosts.size()) {
    if (!out.empty()) out += ',';
    Split first = split(hosts[i]);
    if (!first.numeric) {
      out += hosts[i++];
      continue;
    }
    // The run of names sharing prefix and digit width, as ranges of consecutive numbers.
    std::vector<std::pair<Split, Split>> ranges{{first, first}};
    size_t j = i + 1;
    for (; j < hosts.size(); ++j) {
      Split s = split(hosts[j]);
      if (!s.numeric || s.prefix != first.prefix || s.digits.size() != first.digits.size()) break;
      if (s.value == ranges.back().second.value + 1) ranges.back().second = s;
      else ranges.push_back({s, s});
    }
    if (j == i + 1) {
      out += hosts[i++];
      continue;
    }
    out += std::string(first.prefix) + '[';
    for (size_t r = 0; r < ranges.size(); ++r) {
      if (r) out += ',';
      out += ranges[r].first.digits;
      if (ranges[r].second.value != ranges[r].first.value) out += "-" + std::string(ranges[r].second.digits);
    }
    out += ']';
    i = j;
  }
  return out;
}

}  // namespace dtrain::launch
