// NFC (data/unicode_nfc.h) against Python's unicodedata.normalize('NFC', ...): the cases
// come from scripts/gen_nfc_cases.py run at test time (every decomposable or combining code
// point, precomposed and in NFD; marks in random orders; Hangul L V T; random mixed text).
// SKIPPED when python3 is not installed.
#include "temp_dir.h"
#include "data/unicode_nfc.h"

#include "skip.h"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

using namespace dtrain::data;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

using dtrain::test::source_dir;

// The [input, NFC] pairs Python computes, or none (the case marked SKIPPED) without python3.
std::vector<std::pair<std::string, std::string>> python_cases(const dtrain::test::TempDir& dir, int seed) {
  if (std::system("python3 --version > /dev/null 2>&1") != 0) {
    ::dtrain::test::skip_test("skipped: python3 is not installed");
    return {};
  }
  const fs::path out = dir.path / "nfc_cases.json";
  const std::string cmd = "timeout 300 python3 '" + (source_dir() / "scripts" / "gen_nfc_cases.py").string() + "' '" +
                          out.string() + "' " + std::to_string(seed) + " 4000";
  REQUIRE(std::system(cmd.c_str()) == 0);
  std::ifstream in(out, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return json::parse(ss.str()).get<std::vector<std::pair<std::string, std::string>>>();
}

std::string hex(const std::string& s) {
  std::string h;
  for (unsigned char c : s) h += "0123456789abcdef"[c >> 4], h += "0123456789abcdef"[c & 15], h += ' ';
  return h;
}

}  // namespace

TEST_CASE("NFC equals Python's unicodedata.normalize('NFC') on decompositions, mark orders, Hangul and mixed text") {
  dtrain::test::TempDir dir;
  const auto cases = python_cases(dir, 1);
  if (cases.empty()) return;
  REQUIRE(cases.size() > 20000);
  size_t bad = 0, changed = 0, quick_wrong = 0, not_idempotent = 0;
  for (const auto& [in, want] : cases) {
    const std::string got = nfc(in);
    changed += got != in;
    if (got != want && ++bad <= 10) MESSAGE("NFC(" << hex(in) << ") = " << hex(got) << "; Python: " << hex(want));
    // The quick check never calls text NFC that is not; NFC of NFC text is itself.
    quick_wrong += nfc_quick_check(in) && in != want;
    not_idempotent += nfc(want) != want;
    std::string storage;
    CHECK(nfc_view(in, storage) == want);
  }
  MESSAGE(cases.size() << " cases, " << changed << " changed by NFC, " << bad << " mismatches");
  CHECK(changed > 5000);  // the cases exercise composition, not only text NFC leaves alone
  CHECK(bad == 0);
  CHECK(quick_wrong == 0);
  CHECK(not_idempotent == 0);
}

TEST_CASE("NFC keeps invalid UTF-8 bytes and does not compose across them") {
  dtrain::test::TempDir dir;
  const auto cases = python_cases(dir, 2);
  if (cases.empty()) return;
  // For any two strings a and b: NFC(a + invalid byte + b) = NFC(a) + the byte + NFC(b),
  // since an invalid byte is a starter that composes with nothing.
  size_t bad = 0;
  for (size_t i = 0; i + 1 < cases.size(); i += 7)
    for (const char* byte : {"\xff", "\xcc", "\xe1\x84", "\x80"}) {
      const std::string& a = cases[i].first;
      const std::string& b = cases[i + 1].first;
      bad += nfc(a + byte + b) != cases[i].second + byte + cases[i + 1].second;
    }
  CHECK(bad == 0);
}

TEST_CASE("NFC fast path: ASCII, Latin-1, CJK and composed Hangul come back unchanged and without a copy") {
  for (const std::string& s :
       {std::string("plain ASCII text, 123 <|im_start|>\n"), std::string("caf\xc3\xa9 na\xc3\xafve"),
        std::string("\xe4\xb8\xad\xe6\x96\x87 \xea\xb0\x80"), std::string()}) {
    CHECK(nfc_quick_check(s));
    std::string storage;
    const std::string_view v = nfc_view(s, storage);
    CHECK(v.data() == s.data());  // the input itself
    CHECK(storage.empty());
  }
  // A combining mark after a starter is not quick-checked as NFC.
  CHECK_FALSE(nfc_quick_check("e\xcc\x81"));
  CHECK(unicode_ccc(0x301) == 230);
  CHECK(unicode_ccc('e') == 0);
}
