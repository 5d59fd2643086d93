// The shipped dataset (configs/data, made by scripts/gen_data.py): it loads, has the
// documented sizes, keeps valid held out, its answers are right, and it prepares.
#include "data/prepare.h"
#include "data/sft.h"

#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <regex>
#include <set>

using namespace dtrain::data;
namespace fs = std::filesystem;

namespace {

fs::path data_dir() {
  const char* d = std::getenv("DTRAIN_SOURCE_DIR");
  return (d ? fs::path(d) : fs::current_path()) / "configs" / "data";
}

std::string key(const SftRecord& r) { return r.messages[0].content + "\x01" + r.messages[0].input; }

// Recomputes the answer of the task families whose operands sit in the instruction
// or input; "" when the record is of another family.
std::string recompute(const SftRecord& r) {
  const std::string& q = r.messages[0].content;
  const std::string& in = r.messages[0].input;
  std::smatch m;
  static const std::regex add(R"(^Add (\d+) and (\d+)\.$)"), sub(R"(^Subtract (\d+) from (\d+)\.$)"),
      mul(R"(^Multiply (\d+) by (\d+)\.$)"), rev(R"(^Reverse the word '([a-z]+)'\.$)"),
      up(R"(^Write '([a-z]+)' in uppercase\.$)"), cnt(R"(^How many letters are in '([a-z]+)'\?$)");
  if (std::regex_match(q, m, add)) return std::to_string(std::stoi(m[1]) + std::stoi(m[2]));
  if (std::regex_match(q, m, sub)) return std::to_string(std::stoi(m[2]) - std::stoi(m[1]));
  if (std::regex_match(q, m, mul)) return std::to_string(std::stoi(m[1]) * std::stoi(m[2]));
  if (std::regex_match(q, m, rev)) {
    const std::string w = m[1];
    return std::string(w.rbegin(), w.rend());
  }
  if (std::regex_match(q, m, up)) {
    std::string s = m[1];
    for (char& c : s) c = static_cast<char>(c - 'a' + 'A');
    return s;
  }
  if (std::regex_match(q, m, cnt)) return std::to_string(m[1].str().size());
  if (q == "Reverse the word.") return std::string(in.rbegin(), in.rend());
  return "";
}

}  // namespace

TEST_CASE("shipped SFT tasks: sizes, held-out valid, exact answers") {
  auto train = sft_load_jsonl((data_dir() / "tasks" / "train.jsonl").string(), SftFormat::ALPACA);
  auto valid = sft_load_jsonl((data_dir() / "tasks" / "valid.jsonl").string(), SftFormat::ALPACA);
  CHECK(train.size() == 4000);
  CHECK(valid.size() == 200);
  std::set<std::string> train_keys;
  for (const auto& r : train) train_keys.insert(key(r));
  CHECK(train_keys.size() == train.size());
  for (const auto& r : valid) CHECK(train_keys.count(key(r)) == 0);
  size_t checked = 0, empty_input = 0;
  for (const auto* set : {&train, &valid}) {
    for (const auto& r : *set) {
      const std::string& out = r.messages[1].content;
      CHECK((!out.empty() && out.size() <= 12));
      empty_input += r.messages[0].input.empty();
      std::string want = recompute(r);
      if (want.empty()) continue;
      ++checked;
      CHECK_MESSAGE(sft_answer_matches(want, out), r.messages[0].content);
    }
  }
  CHECK(checked > 800);
  CHECK(empty_input > 1000);
  CHECK(empty_input < 4200 - 1000);
}

TEST_CASE("shipped text corpus tokenizes into many documents") {
  ByteTokenizer tok;
  TokenData d = data_tokenize((data_dir() / "text" / "train.txt").string(), DataFormat::TEXT, tok);
  CHECK(d.doc_starts.size() > 500);
  CHECK(d.tokens.size() > 250000);
  CHECK(d.mask.empty());
  TokenData v = data_tokenize((data_dir() / "text" / "valid.txt").string(), DataFormat::TEXT, tok);
  CHECK(v.tokens.size() > 20000);
  TokenData s = data_tokenize((data_dir() / "tasks" / "valid.jsonl").string(), DataFormat::ALPACA, tok);
  CHECK(s.doc_starts.size() == 200);
}
