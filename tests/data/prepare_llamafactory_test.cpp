// data_prepare of LLaMA-Factory datasets (options.dataset): an alpaca .json array with
// system and history columns, a sharegpt .json array and a role/content sharegpt .jsonl,
// streamed in many small chunks on 1 and 3 threads, give the shard of llamafactory_load +
// data_tokenize_records + shard_write byte for byte; a malformed record deep in either
// file kind is the error llamafactory_load gives (file, line, record, field), with no OUT.tmp.
#include "data/llamafactory.h"
#include "data/prepare.h"
#include "data/shard.h"

#include "core/error.h"
#include "temp_dir.h"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

using namespace dtrain;
using namespace dtrain::data;
using dtrain::test::TempDir;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

const json kInfo = json::parse(R"({
  "alp": {"file_name": "alp.json",
          "columns": {"prompt": "instruction", "query": "input", "response": "output",
                      "system": "system", "history": "history"}},
  "sg": {"file_name": "sg.json", "formatting": "sharegpt",
         "columns": {"messages": "conversations", "system": "system"}},
  "oai": {"file_name": "oai.jsonl", "formatting": "sharegpt", "columns": {"messages": "messages"},
          "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user",
                   "assistant_tag": "assistant", "system_tag": "system"}}
})");

std::string words(std::mt19937& rng, size_t n) {
  static const char* w[] = {"the", "sum", "of", "中文", "🙂", "x", "answer", "is", "\t", "[a]", "{b}", "\"q\""};
  std::string s;
  for (size_t i = 0; i < n; ++i) s += (i ? " " : "") + std::string(w[rng() % 12]);
  return s;
}

// n records each; .json arrays pretty-printed (records span lines), the .jsonl with blank
// and CRLF lines.
void write_datasets(const TempDir& d, size_t n) {
  std::mt19937 rng(3);
  d.write("dataset_info.json", kInfo.dump(2));
  json alp = json::array(), sg = json::array();
  std::string oai;
  for (size_t i = 0; i < n; ++i) {
    json a{{"instruction", words(rng, 1 + rng() % 30)},
           {"input", rng() % 2 ? words(rng, 3) : ""},
           {"output", words(rng, 1 + rng() % 20)}};
    if (rng() % 3 == 0) a["system"] = words(rng, 4);
    if (rng() % 4 == 0) a["history"] = json::array({json::array({words(rng, 3), words(rng, 2)})});
    alp.push_back(a);
    json conv = json::array();
    if (rng() % 3 == 0) conv.push_back({{"from", "system"}, {"value", words(rng, 3)}});
    for (size_t t = 0; t < 1 + rng() % 3; ++t) {
      conv.push_back({{"from", rng() % 5 ? "human" : "observation"}, {"value", words(rng, 1 + rng() % 15)}});
      conv.push_back({{"from", rng() % 5 ? "gpt" : "function_call"}, {"value", words(rng, 1 + rng() % 15)}});
    }
    sg.push_back({{"conversations", conv}});
    json m = json::array({json{{"role", "user"}, {"content", words(rng, 1 + rng() % 25)}},
                          json{{"role", "assistant"}, {"content", words(rng, 1 + rng() % 10)}}});
    oai += json{{"messages", m}}.dump() + (rng() % 4 ? "\n" : "\r\n") + (rng() % 9 ? "" : " \n");
  }
  d.write("alp.json", alp.dump(2));
  d.write("sg.json", sg.dump(1));
  d.write("oai.jsonl", oai);
}

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string load_error(const std::string& dir, const std::string& names) {
  try {
    llamafactory_load(dir, names);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("LLaMA-Factory datasets streamed in many chunks: the shard of loading them whole, for 1 and 3 threads") {
  TempDir d("prepare-lf");
  write_datasets(d, 600);
  const std::string dir = d.path.string();
  ByteTokenizer tok;
  DataPrepareOptions o;
  o.sft_template = "chatml";
  o.dataset = "alp, sg,oai";
  shard_write((d.path / "want.bin").string(),
              data_tokenize_records(llamafactory_load(dir, "alp,sg,oai"), "lf", tok, o));
  const std::string want = read_bytes(d.path / "want.bin");
  for (unsigned threads : {1u, 3u}) {
    CAPTURE(threads);
    o.threads = threads;
    o.chunk_bytes = 3000;
    const fs::path out = d.path / "out.bin";
    const DataPrepareStats s = data_prepare(dir, DataFormat::TEXT, "byte", out.string(), o);  // format unused
    CHECK(s.documents == 1800);
    CHECK(s.input_bytes ==
          fs::file_size(d.path / "alp.json") + fs::file_size(d.path / "sg.json") + fs::file_size(d.path / "oai.jsonl"));
    CHECK(read_bytes(out) == want);
    CHECK(!fs::exists(out.string() + ".tmp"));
  }
  // The output may not be one of the datasets' files.
  CHECK_THROWS_AS(data_prepare(dir, DataFormat::SFT, "byte", (d.path / "oai.jsonl").string(), o), UsageError);
  CHECK(fs::file_size(d.path / "oai.jsonl") > 0);
}

TEST_CASE("a malformed LLaMA-Factory record deep in a .jsonl or a .json array: llamafactory_load's error, no OUT.tmp") {
  TempDir d("prepare-lf-bad");
  write_datasets(d, 500);
  const std::string dir = d.path.string();
  // .jsonl: record 321's answer turn gets an unknown role.
  {
    std::string text = read_bytes(d.path / "oai.jsonl");
    const size_t at = [&] {
      size_t pos = 0, rec = 0;
      for (;;) {
        const size_t nl = text.find('\n', pos);
        if (text.find_first_not_of(" \t\r", pos) < nl && rec++ == 321) return pos;
        pos = nl + 1;
      }
    }();
    const size_t role = text.find("\"assistant\"", at);
    text.replace(role, 11, "\"robot\"");
    d.write("oai.jsonl", text);
  }
  // .json: element 250 of sg.json loses its conversations.
  {
    json sg = json::parse(read_bytes(d.path / "sg.json"));
    sg[250].erase("conversations");
    sg[250]["chat"] = "x";
    d.write("sg.json", sg.dump(1));
  }
  for (const std::string names : {"alp,oai", "alp,sg"}) {
    CAPTURE(names);
    const std::string want = load_error(dir, names);
    REQUIRE(!want.empty());
    CHECK(want.find(names == "alp,oai" ? "record 321 of dataset 'oai'" : "record 250 of dataset 'sg'") !=
          std::string::npos);
    for (unsigned threads : {1u, 2u}) {
      CAPTURE(threads);
      DataPrepareOptions o;
      o.dataset = names;
      o.threads = threads;
      o.chunk_bytes = 2000;
      try {
        data_prepare(dir, DataFormat::SFT, "byte", (d.path / "out.bin").string(), o);
        FAIL("no error");
      } catch (const ConfigError& e) {
        CHECK(std::string(e.what()) == want);
      }
      CHECK(!fs::exists(d.path / "out.bin"));
      CHECK(!fs::exists(d.path / "out.bin.tmp"));
    }
  }
}
