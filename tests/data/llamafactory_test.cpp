// LLaMA-Factory datasets: a dataset_dir written here in the format of LLaMA-Factory's
// data/README.md (alpaca with system and history columns, sharegpt with from/value and
// with role/content tags, .json arrays and .jsonl), read into SFT records; mixing; and the
// errors for malformed records (file, line, record, field) and unsupported entries.
#include "temp_dir.h"
#include "data/llamafactory.h"
#include "data/sft.h"

#include "core/error.h"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <random>

using namespace dtrain;
using namespace dtrain::data;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

using dtrain::test::TempDir;

const json kInfo = json::parse(R"({
  "alpaca_sys": {"file_name": "alpaca.json",
                 "columns": {"prompt": "instruction", "query": "input", "response": "output",
                             "system": "system", "history": "history"}},
  "alpaca_renamed": {"file_name": "renamed.jsonl", "formatting": "alpaca",
                     "columns": {"prompt": "q", "response": "a"}},
  "sg": {"file_name": "sg.json", "formatting": "sharegpt",
         "columns": {"messages": "conversations", "system": "system"}},
  "oai": {"file_name": "oai.jsonl", "formatting": "sharegpt", "columns": {"messages": "messages"},
          "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user",
                   "assistant_tag": "assistant", "system_tag": "system"}}
})");

// Pretty-printed as LLaMA-Factory's examples are: records span several lines.
const char* kAlpaca = R"([
  {
    "instruction": "Add 2 and 3.",
    "input": "numbers",
    "output": "5",
    "system": "Be exact.",
    "history": [["Add 1 and 1.", "2"], ["Add 2 and 2.", "4"]]
  },
  {"instruction": "Say hi.", "input": "", "output": "hi"}
]
)";

const char* kShareGpt = R"([
  {"conversations": [{"from": "human", "value": "a [x] {y}"}, {"from": "gpt", "value": "b"},
                     {"from": "observation", "value": "c"}, {"from": "function_call", "value": "d"}],
   "system": "sys col"},
  {"conversations": [{"from": "system", "value": "sys msg"}, {"from": "human", "value": "e"},
                     {"from": "gpt", "value": "f"}], "system": "ignored"}
]
)";

void write_all(const TempDir& d) {
  d.write("dataset_info.json", kInfo.dump(2));
  d.write("alpaca.json", kAlpaca);
  d.write("renamed.jsonl", "{\"q\": \"Q1\", \"a\": \"A1\"}\n\n{\"q\": \"Q2\", \"a\": \"A2\"}\n");
  d.write("sg.json", kShareGpt);
  d.write(
      "oai.jsonl",
      R"({"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}, {"role": "assistant", "content": "A"}]})"
      "\n");
}

std::vector<std::pair<SftRole, std::string>> flat(const SftRecord& r) {
  std::vector<std::pair<SftRole, std::string>> out;
  for (const SftMessage& m : r.messages) out.emplace_back(m.role, m.content);
  return out;
}

using R = std::vector<std::pair<SftRole, std::string>>;
constexpr SftRole S = SftRole::SYSTEM, U = SftRole::USER, A = SftRole::ASSISTANT;

}  // namespace

TEST_CASE("dataset_info.json: alpaca with system and history, sharegpt from/value and role/content") {
  TempDir d;
  write_all(d);
  CHECK(llamafactory_is_dataset_dir(d.path.string()));
  CHECK(llamafactory_is_dataset_dir((d.path / "dataset_info.json").string()));
  CHECK_FALSE(llamafactory_is_dataset_dir((d.path / "alpaca.json").string()));

  auto recs = llamafactory_load(d.path.string(), "alpaca_sys");
  REQUIRE(recs.size() == 2);
  CHECK(flat(recs[0]) == R{{S, "Be exact."},
                           {U, "Add 1 and 1."},
                           {A, "2"},
                           {U, "Add 2 and 2."},
                           {A, "4"},
                           {U, "Add 2 and 3.\nnumbers"},
                           {A, "5"}});
  CHECK(flat(recs[1]) == R{{U, "Say hi."}, {A, "hi"}});
  CHECK(recs[0].source == (d.path / "alpaca.json").string() + ":2: record 0 of dataset 'alpaca_sys'");
  CHECK(recs[1].source == (d.path / "alpaca.json").string() + ":9: record 1 of dataset 'alpaca_sys'");

  recs = llamafactory_load((d.path / "dataset_info.json").string(), " sg , oai,alpaca_renamed ");
  REQUIRE(recs.size() == 5);
  CHECK(flat(recs[0]) == R{{S, "sys col"}, {U, "a [x] {y}"}, {A, "b"}, {U, "c"}, {A, "d"}});
  CHECK(flat(recs[1]) == R{{S, "sys msg"}, {U, "e"}, {A, "f"}});
  CHECK(flat(recs[2]) == R{{S, "S"}, {U, "U"}, {A, "A"}});
  CHECK(flat(recs[3]) == R{{U, "Q1"}, {A, "A1"}});
  CHECK(recs[4].source.find("renamed.jsonl:3: record 1") != std::string::npos);

  // Every assistant turn (history answers and function calls too) is trained.
  ByteTokenizer tok;
  const SftTokens t = sft_render(llamafactory_load(d.path.string(), "sg")[0], tok, SftTemplate::CHATML);
  CHECK(std::count(t.mask.begin(), t.mask.end(), 1) == 2 * 2);  // "b" + <|im_end|>, "d" + <|im_end|>
}

TEST_CASE("data.mix: each dataset's share of the records, repeated when it has fewer") {
  TempDir d;
  write_all(d);
  // 2 + 2 records; weights 3:1 -> 3 from alpaca_sys (its 2, then the first again), 1 from sg.
  auto recs = llamafactory_load(d.path.string(), "alpaca_sys,sg", {3, 1});
  REQUIRE(recs.size() == 4);
  CHECK(recs[0].source.find("record 0 of dataset 'alpaca_sys'") != std::string::npos);
  CHECK(recs[2].source == recs[0].source);
  CHECK(recs[3].source.find("record 0 of dataset 'sg'") != std::string::npos);
  CHECK(llamafactory_load(d.path.string(), "alpaca_sys,sg", {1, 0}).size() == 4);
  CHECK_THROWS_WITH_AS(llamafactory_load(d.path.string(), "alpaca_sys,sg", {1}),
                       doctest::Contains("data.mix has 1 weights for 2 datasets"), ConfigError);
  CHECK_THROWS_WITH_AS(llamafactory_load(d.path.string(), "alpaca_sys,sg", {0, 0}), doctest::Contains("add up to 0"),
                       ConfigError);
}

TEST_CASE("malformed records: the file, line, record and field") {
  TempDir d;
  write_all(d);
  auto expect = [&](const std::string& file, const std::string& text, const std::string& dataset,
                    const std::string& needle) {
    d.write(file, text);
    CAPTURE(needle);
    try {
      llamafactory_load(d.path.string(), dataset);
      FAIL("no error");
    } catch (const ConfigError& e) {
      const std::string what = e.what();
      CHECK_MESSAGE(what.find(needle) != std::string::npos, what);
    }
  };
  const std::string ok = R"({"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]})";
  expect("sg.json", "[\n" + ok + ",\n\n" + R"({"conversations": [{"from": "gpt", "value": "a"}]})" + "\n]", "sg",
         "sg.json:4: record 1 of dataset 'sg': \"conversations\"[0].\"from\" is 'gpt' where a human/observation turn "
         "belongs");
  expect("sg.json", "[" + ok + ", " + R"({"conversations": [{"from": "human", "value": "q"}]})" + "]", "sg",
         "sg.json:1: record 1 of dataset 'sg': \"conversations\" ends with a human turn");
  expect("sg.json",
         "[\n" +
             std::string(R"({"conversations": [{"from": "human", "value": "q"}, {"from": "system", "value": "s"}]})") +
             "]",
         "sg", "sg.json:2: record 0 of dataset 'sg': \"conversations\"[1]: a 'system' message must come first");
  expect("sg.json", "[\n" + std::string(R"({"conversations": [{"from": "robot", "value": "q"}]})") + "]", "sg",
         "\"conversations\"[0].\"from\" is 'robot', not a role of this dataset");
  expect("sg.json", "[\n" + std::string(R"({"conversations": [{"from": "human", "value": 5}]})") + "]", "sg",
         "sg.json:2: record 0 of dataset 'sg': \"conversations\"[0].\"value\": missing, or not a string");
  expect("sg.json", "[\n" + std::string(R"({"messages": []})") + "]", "sg",
         "\"conversations\" (the messages column) must be a non-empty list");
  expect("alpaca.json", "[\n  {\"instruction\": \"x\"}\n]", "alpaca_sys",
         "alpaca.json:2: record 0 of dataset 'alpaca_sys': missing \"output\" (the response column");
  expect("alpaca.json", "[\n  {\"instruction\": \"x\", \"output\": \"y\", \"history\": [[\"a\"]]}\n]", "alpaca_sys",
         "\"history\"[0] must be a [prompt, response] pair of strings");
  expect("alpaca.json", "[\n  {\"instruction\": \"x\", \"output\": 3}\n]", "alpaca_sys",
         "\"output\" (the response column) must be a string, got number");
  expect("alpaca.json", "[\n  {\"instruction\": \"x\", \"output\": \"y\"},\n  {\"instruction\": \"x\" \"output\"}\n]",
         "alpaca_sys", "alpaca.json:3: record 1 of dataset 'alpaca_sys': invalid JSON");
  expect("alpaca.json", "[\n  {\"instruction\": \"x\", \"output\": \"y\"}", "alpaca_sys",
         "the JSON array is not closed");
  expect("alpaca.json", "{\"instruction\": \"x\", \"output\": \"y\"}", "alpaca_sys", "is a JSON array of records");
  expect("renamed.jsonl", "{\"q\": \"Q1\", \"a\": \"A1\"}\n[1]\n", "alpaca_renamed",
         "renamed.jsonl:2: record 1 of dataset 'alpaca_renamed': a record must be a JSON object");
}

TEST_CASE("dataset_info.json entries dtrain cannot read are refused by name") {
  TempDir d;
  write_all(d);
  auto expect = [&](const json& info, const std::string& dataset, const std::string& needle) {
    d.write("dataset_info.json", info.dump());
    CHECK_THROWS_WITH_AS(llamafactory_load(d.path.string(), dataset), doctest::Contains(needle.c_str()), ConfigError);
  };
  expect(kInfo, "nope", "no dataset named 'nope' (data.dataset); it has: alpaca_renamed, alpaca_sys, oai, sg");
  expect({{"x", {{"hf_hub_url", "a/b"}}}}, "x", "\"hf_hub_url\": dtrain reads local files only");
  // A preference dataset is read as pairs (data/pairwise.h), not as SFT records.
  expect({{"x", {{"file_name", "alpaca.json"}, {"ranking", true}}}}, "x",
         "\"ranking\": true datasets hold preference pairs (chosen/rejected), which an SFT run does not train");
  expect({{"x", {{"file_name", "alpaca.json"}, {"formatting", "openai"}}}}, "x", "\"formatting\" 'openai'");
  expect({{"x", {{"file_name", "alpaca.json"}, {"columns", {{"images", "images"}}}}}}, "x",
         "\"columns\".\"images\": images data is not supported");
  expect({{"x", {{"file_name", "alpaca.json"}, {"tags", {{"speaker", "who"}}}}}}, "x",
         "\"tags\".\"speaker\" is not a LLaMA-Factory tags key");
  expect({{"x", {{"file_name", "data.csv"}}}}, "x", "does not exist");
  d.write("data.csv", "a,b\n");
  expect({{"x", {{"file_name", "data.csv"}}}}, "x", "from .json (an array of records) or .jsonl files");
  expect({{"x", {{"columns", json::object()}}}}, "x", "\"file_name\" (a string");
  d.write("dataset_info.json", "{");
  CHECK_THROWS_WITH_AS(llamafactory_load(d.path.string(), "x"), doctest::Contains("dataset_info.json: invalid JSON"),
                       ConfigError);
}
