// Preference (pairwise) data: LLaMA-Factory ranking datasets (alpaca chosen/rejected
// strings, sharegpt conversations ending with the question and chosen/rejected messages,
// role/content tags, renamed columns, .json and .jsonl) and plain pairwise JSONL lines in
// each shape; malformed records named by file and line; the rendering (only the final
// answer trained, both sides on the same prompt tokens, with every template); the format
// told from the records; in-memory tokenizing on one and two threads the same as record by
// record; the shipped preference example (configs/data/preference).
#include "data/dataset.h"
#include "data/llamafactory.h"
#include "data/pairwise.h"
#include "data/prepare.h"

#include "core/error.h"
#include "temp_dir.h"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

using namespace dtrain;
using namespace dtrain::data;
using nlohmann::json;
namespace fs = std::filesystem;
using dtrain::test::source_dir;
using dtrain::test::TempDir;

namespace {

const json kInfo = json::parse(R"({
  "pref_alpaca": {"file_name": "pa.json", "ranking": true,
                  "columns": {"prompt": "q", "query": "ctx", "chosen": "good", "rejected": "bad",
                              "system": "sys", "history": "hist"}},
  "pref_sg": {"file_name": "ps.jsonl", "formatting": "sharegpt", "ranking": true,
              "columns": {"messages": "conversations", "chosen": "chosen", "rejected": "rejected",
                          "system": "system"}},
  "pref_oai": {"file_name": "po.json", "formatting": "sharegpt", "ranking": true,
               "columns": {"messages": "messages", "chosen": "c", "rejected": "r"},
               "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user",
                        "assistant_tag": "assistant", "system_tag": "system"}},
  "sft": {"file_name": "sft.jsonl"}
})");

const char* kAlpaca = R"([
  {
    "q": "Add 2 and 3.",
    "ctx": "numbers",
    "good": "5",
    "bad": "6",
    "sys": "Be exact.",
    "hist": [["Add 1 and 1.", "2"]]
  },
  {"q": "Say hi.", "ctx": "", "good": "hi", "bad": "bye"}
]
)";

void write_all(const TempDir& d) {
  d.write("dataset_info.json", kInfo.dump(2));
  d.write("pa.json", kAlpaca);
  d.write(
      "ps.jsonl",
      R"({"conversations": [{"from": "human", "value": "a"}, {"from": "gpt", "value": "b"}, {"from": "human", "value": "c"}], "chosen": {"from": "gpt", "value": "yes"}, "rejected": {"from": "gpt", "value": "no"}, "system": "S"})"
      "\n\n"
      R"({"conversations": [{"from": "system", "value": "T"}, {"from": "observation", "value": "o"}], "chosen": {"from": "function_call", "value": "f"}, "rejected": {"from": "gpt", "value": "g"}})"
      "\n");
  d.write(
      "po.json",
      R"([{"messages": [{"role": "system", "content": "Sys"}, {"role": "user", "content": "U"}], "c": {"role": "assistant", "content": "A1"}, "r": {"role": "assistant", "content": "A2"}}])");
  d.write("sft.jsonl", R"({"instruction": "x", "output": "y"})"
                       "\n");
}

using Flat = std::vector<std::pair<SftRole, std::string>>;
constexpr SftRole S = SftRole::SYSTEM, U = SftRole::USER, A = SftRole::ASSISTANT;

Flat flat(const std::vector<SftMessage>& msgs) {
  Flat out;
  for (const SftMessage& m : msgs) out.emplace_back(m.role, m.content);
  return out;
}

// Expects `fn` to throw a ConfigError containing `needle`.
template <class F>
void expect_error(F&& fn, const std::string& needle) {
  CAPTURE(needle);
  try {
    fn();
    FAIL("no error");
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    CHECK_MESSAGE(what.find(needle) != std::string::npos, what);
  }
}

// The positions with a trained token, decoded as one string (they must be contiguous).
std::string trained_text(const SftTokens& t, const Tokenizer& tok) {
  std::vector<int32_t> ids;
  size_t first = t.mask.size(), last = 0;
  for (size_t i = 0; i < t.mask.size(); ++i)
    if (t.mask[i]) {
      ids.push_back(t.tokens[i]);
      first = std::min(first, i);
      last = i;
    }
  CHECK(ids.size() == last - first + 1);  // one run
  return tok.decode(ids);
}

}  // namespace

TEST_CASE("LLaMA-Factory ranking datasets: alpaca, sharegpt and role/content pairs, with renamed columns") {
  TempDir d("pairwise");
  write_all(d);
  CHECK(llamafactory_ranking(d.path.string(), "pref_alpaca,pref_sg"));
  CHECK_FALSE(llamafactory_ranking(d.path.string(), "sft"));

  auto pairs = llamafactory_load_pairs(d.path.string(), "pref_alpaca");
  REQUIRE(pairs.size() == 2);
  CHECK(flat(pairs[0].prompt) == Flat{{S, "Be exact."}, {U, "Add 1 and 1."}, {A, "2"}, {U, "Add 2 and 3.\nnumbers"}});
  CHECK(pairs[0].chosen == "5");
  CHECK(pairs[0].rejected == "6");
  CHECK(flat(pairs[1].prompt) == Flat{{U, "Say hi."}});
  CHECK(pairs[1].source == (d.path / "pa.json").string() + ":10: record 1 of dataset 'pref_alpaca'");
  const SftRecord side = pairs[0].side(false);
  CHECK(flat(side.messages).back() == std::pair{A, std::string("6")});
  CHECK(side.messages.size() == pairs[0].prompt.size() + 1);

  pairs = llamafactory_load_pairs((d.path / "dataset_info.json").string(), "pref_sg, pref_oai");
  REQUIRE(pairs.size() == 3);
  CHECK(flat(pairs[0].prompt) == Flat{{S, "S"}, {U, "a"}, {A, "b"}, {U, "c"}});
  CHECK(pairs[0].chosen == "yes");
  CHECK(pairs[0].rejected == "no");
  CHECK(flat(pairs[1].prompt) == Flat{{S, "T"}, {U, "o"}});  // an observation is a user turn
  CHECK(pairs[1].chosen == "f");                             // a function call an answer
  CHECK(pairs[1].source.find("ps.jsonl:3: record 1 of dataset 'pref_sg'") != std::string::npos);
  CHECK(flat(pairs[2].prompt) == Flat{{S, "Sys"}, {U, "U"}});
  CHECK(pairs[2].chosen == "A1");
  CHECK(pairs[2].rejected == "A2");

  // data.mix weighs pairs as it does records.
  CHECK(llamafactory_load_pairs(d.path.string(), "pref_alpaca,pref_oai", {3, 1}).size() == 3);

  // One run trains one kind.
  expect_error([&] { llamafactory_load_pairs(d.path.string(), "pref_alpaca,sft"); },
               "data.dataset mixes preference datasets (\"ranking\": true: pref_alpaca) with SFT datasets (sft)");
  expect_error([&] { llamafactory_load(d.path.string(), "pref_sg"); },
               "\"ranking\": true datasets hold preference pairs (chosen/rejected), which an SFT run does not train");
  expect_error([&] { llamafactory_load_pairs(d.path.string(), "sft"); },
               "these are SFT datasets; preference training needs datasets with \"ranking\": true");
  json info = kInfo;
  info["pref_alpaca"]["ranking"] = "yes";
  d.write("dataset_info.json", info.dump());
  expect_error([&] { llamafactory_load_pairs(d.path.string(), "pref_alpaca"); },
               "\"pref_alpaca\": \"ranking\" must be true (a preference dataset) or false");
}

TEST_CASE("malformed preference records: the file, line, record and field") {
  TempDir d("pairwise-bad");
  write_all(d);
  auto expect = [&](const std::string& file, const std::string& text, const std::string& dataset,
                    const std::string& needle) {
    d.write(file, text);
    expect_error([&] { llamafactory_load_pairs(d.path.string(), dataset); }, needle);
  };
  const std::string q = R"("conversations": [{"from": "human", "value": "q"}])";
  const std::string ok =
      "{" + q + R"(, "chosen": {"from": "gpt", "value": "a"}, "rejected": {"from": "gpt", "value": "b"}})";
  expect(
      "ps.jsonl",
      ok + "\n" +
          R"({"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}], "chosen": {"from": "gpt", "value": "a"}, "rejected": {"from": "gpt", "value": "b"}})",
      "pref_sg",
      "ps.jsonl:2: record 1 of dataset 'pref_sg': \"conversations\" ends with a gpt turn (or holds only the system "
      "message): a preference record's turns end with the question");
  expect("ps.jsonl", "{" + q + R"(, "chosen": "a", "rejected": {"from": "gpt", "value": "b"}})", "pref_sg",
         "ps.jsonl:1: record 0 of dataset 'pref_sg': \"chosen\" (the chosen column) must be a message object "
         "{\"from\": \"gpt\", \"value\": ...}, got string");
  expect("ps.jsonl",
         "{" + q + R"(, "chosen": {"from": "gpt", "value": "a"}, "rejected": {"from": "human", "value": "b"}})",
         "pref_sg", "\"rejected\".\"from\" is 'human': the rejected answer must be a gpt/function_call message");
  expect("ps.jsonl", "{" + q + R"(, "chosen": {"from": "gpt", "value": "a"}})", "pref_sg",
         "\"rejected\" (the rejected column) must be a message object");
  expect("ps.jsonl", "{" + q + R"(, "chosen": {"from": "gpt"}, "rejected": {"from": "gpt", "value": "b"}})", "pref_sg",
         "\"chosen\": needs \"from\" and \"value\" strings");
  expect("pa.json", "[\n  {\"q\": \"x\", \"good\": \"y\"}\n]", "pref_alpaca",
         "pa.json:2: record 0 of dataset 'pref_alpaca': missing \"bad\" (the rejected column, a string)");
  expect("pa.json", "[\n  {\"q\": \"x\", \"good\": 1, \"bad\": \"z\"}\n]", "pref_alpaca",
         "\"good\" (the chosen column) must be a string, got number");
  expect("pa.json", "[\n  {\"good\": \"y\", \"bad\": \"z\"}\n]", "pref_alpaca",
         "missing \"q\" (the prompt column, a string)");
}

TEST_CASE("plain pairwise JSONL: alpaca, conversations and messages shapes; errors say file:line") {
  const PairRecord a = pair_parse_line(
      R"({"instruction": "Add.", "input": "1 2", "chosen": "3", "rejected": "4", "system": "Sys", "history": [["h", "i"]]})",
      "p.jsonl", 4);
  CHECK(flat(a.prompt) == Flat{{S, "Sys"}, {U, "h"}, {A, "i"}, {U, "Add.\n1 2"}});
  CHECK(a.chosen == "3");
  CHECK(a.rejected == "4");
  CHECK(a.source == "p.jsonl:4");
  const PairRecord c = pair_parse_line(
      R"({"conversations": [{"from": "human", "value": "q"}], "chosen": {"from": "gpt", "value": "y"}, "rejected": {"from": "gpt", "value": "n"}})",
      "p.jsonl", 5);
  CHECK(flat(c.prompt) == Flat{{U, "q"}});
  CHECK(c.chosen == "y");
  const PairRecord m = pair_parse_line(
      R"({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}], "chosen": {"role": "assistant", "content": "y"}, "rejected": {"role": "assistant", "content": "n"}})",
      "p.jsonl", 6);
  CHECK(flat(m.prompt) == Flat{{S, "s"}, {U, "q"}});
  CHECK(m.rejected == "n");

  expect_error([] { pair_parse_line(R"({"instruction": "x", "chosen": "a"})", "p.jsonl", 7); },
               "p.jsonl:7: missing \"rejected\" (the rejected column, a string)");
  expect_error([] { pair_parse_line(R"({"instruction": "x", "chosen": "a", )", "p.jsonl", 8); },
               "p.jsonl:8: invalid JSON");
  expect_error(
      [] {
        pair_parse_line(
            R"({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], "chosen": {"role": "assistant", "content": "y"}, "rejected": {"role": "assistant", "content": "n"}})",
            "p.jsonl", 9);
      },
      "p.jsonl:9: \"messages\" ends with a assistant turn");

  TempDir d("pairwise-plain");
  d.write("p.jsonl", R"({"instruction": "x", "chosen": "a", "rejected": "b"})"
                     "\n\n"
                     R"({"instruction": "x", "chosen": "a"})"
                     "\n");
  expect_error([&] { pair_load_jsonl((d.path / "p.jsonl").string()); },
               (d.path / "p.jsonl").string() + ":3: missing \"rejected\"");
  // The same record given to the SFT parser says what it is.
  expect_error(
      [] { sft_parse_line(R"({"instruction": "x", "chosen": "a", "rejected": "b"})", SftFormat::AUTO, "s.jsonl", 2); },
      "s.jsonl:2: a preference record (chosen/rejected), not an SFT one: it is read as data.format pairwise");
}

TEST_CASE("pair_render: only the final answer trains, both sides share the prompt tokens, with every template") {
  ByteTokenizer tok;
  const PairRecord rec = pair_parse_line(
      R"({"instruction": "and 3+3?", "chosen": "6", "rejected": "seven", "system": "Be brief.", "history": [["2+2?", "4"]]})",
      "p.jsonl", 1);
  for (const std::string& name : sft_template_names()) {
    CAPTURE(name);
    const SftTemplate tmpl = sft_template_parse(name);
    const PairTokens t = pair_render(rec, tok, tmpl);
    // Each side is the template's rendering of its whole conversation...
    const SftTokens whole = sft_render(rec.side(true), tok, tmpl);
    CHECK(t.chosen.tokens == whole.tokens);
    CHECK(t.rejected.tokens == sft_render(rec.side(false), tok, tmpl).tokens);
    // ... trained only on its final answer (content and end of turn), not the history's "4".
    const std::string chosen = trained_text(t.chosen, tok), rejected = trained_text(t.rejected, tok);
    CHECK(chosen.find('6') != std::string::npos);
    CHECK(chosen.find('4') == std::string::npos);
    CHECK(rejected.find("seven") != std::string::npos);
    CHECK(std::count(whole.mask.begin(), whole.mask.end(), 1) >
          std::count(t.chosen.mask.begin(), t.chosen.mask.end(), 1));  // SFT trains the history answer too
    // The prompt: every token before the answer, the same on both sides, none trained.
    REQUIRE(t.chosen_prompt == t.rejected_prompt);
    CHECK(std::equal(t.chosen.tokens.begin(), t.chosen.tokens.begin() + static_cast<long>(t.chosen_prompt),
                     t.rejected.tokens.begin()));
    CHECK(std::count(t.chosen.mask.begin(), t.chosen.mask.begin() + static_cast<long>(t.chosen_prompt), 1) == 0);
    REQUIRE(t.chosen_prompt < t.chosen.mask.size());
    CHECK(t.chosen.mask[t.chosen_prompt] == 1);  // the answer starts right after it
    // train_on_prompt: every token trains.
    const PairTokens all = pair_render(rec, tok, tmpl, false, true);
    CHECK(all.chosen.tokens == t.chosen.tokens);
    CHECK(std::count(all.rejected.mask.begin(), all.rejected.mask.end(), 0) == 0);
  }
}

TEST_CASE("data.format pairwise: told from the records; tokenized on 1 and 2 threads as record by record") {
  TempDir d("pairwise-format");
  std::string lines;
  for (int i = 0; i < 40; ++i) {
    const std::string a = std::to_string(i), b = std::to_string(i + 1);
    lines += i % 2
                 ? json({{"instruction", "Add " + a + " and 1."}, {"input", ""}, {"chosen", b}, {"rejected", a}}).dump()
                 : json({{"conversations", {{{"from", "human"}, {"value", "Next after " + a + "?"}}}},
                         {"chosen", {{"from", "gpt"}, {"value", b}}},
                         {"rejected", {{"from", "gpt"}, {"value", a}}}})
                       .dump();
    lines += "\n";
  }
  const std::string path = d.write("pairs.jsonl", lines).string();
  CHECK(data_format_detect(path).name == "pairwise");
  d.write("pairs.json", "[\n" + json::parse(lines.substr(0, lines.find('\n'))).dump(2) + "\n]\n");
  CHECK(data_format_detect((d.path / "pairs.json").string()).name == "pairwise");
  const std::string mixed =
      d.write("mixed.jsonl", R"({"instruction": "x", "input": "", "output": "y"})" + std::string("\n") + lines)
          .string();
  expect_error([&] { data_format_detect(mixed); }, "mixes preference records (chosen/rejected) with SFT records");
  CHECK(data_format_parse("pairwise") == DataFormat::PAIRWISE);

  ByteTokenizer tok;
  DataPrepareOptions o;
  o.sft_template = "chatml";
  o.chunk_bytes = 300;  // many chunks: a pair never straddles two
  const TokenData ref = data_tokenize_pairs(pair_load_jsonl(path), path, tok, o);
  CHECK(ref.pairwise);
  CHECK(ref.doc_starts.size() == 80);
  for (unsigned threads : {1u, 2u}) {
    CAPTURE(threads);
    o.threads = threads;
    const TokenData t = data_tokenize(path, DataFormat::PAIRWISE, tok, o);
    CHECK(t.pairwise);
    CHECK(t.tokens == ref.tokens);
    CHECK(t.mask == ref.mask);
    CHECK(t.doc_starts == ref.doc_starts);
  }
  // Through the dataset: pair k's two rows are record k's two sides.
  DatasetOptions dopt;
  dopt.seq_len = 64;
  dopt.mode = SampleMode::PAD;
  const TokenDataset ds(data_tokenize(path, DataFormat::PAIRWISE, tok, o), dopt);
  REQUIRE(ds.size() == 40);
  const Pair p = ds.pair(3);
  const PairTokens r = pair_render(pair_load_jsonl(path)[3], tok, SftTemplate::CHATML);
  CHECK(std::equal(r.chosen.tokens.begin(), r.chosen.tokens.end(), p.chosen.inputs.begin()));
  CHECK(std::equal(r.rejected.tokens.begin(), r.rejected.tokens.end(), p.rejected.inputs.begin()));
}

TEST_CASE("shipped preference example: LLaMA-Factory ranking datasets, chosen right and rejected wrong, held out") {
  const fs::path dir = source_dir() / "configs" / "data" / "preference";
  const auto alpaca = llamafactory_load_pairs(dir.string(), "basics_pref_alpaca");
  const auto sharegpt = llamafactory_load_pairs(dir.string(), "basics_pref_sharegpt");
  const auto valid = pair_load_jsonl((dir / "valid.jsonl").string());
  CHECK(alpaca.size() == 1000);
  CHECK(sharegpt.size() == 1000);
  CHECK(valid.size() == llamafactory_load_pairs(dir.string(), "basics_pref_valid").size());
  CHECK(valid.size() >= 190);
  // Their prompts are the basics tasks' (configs/data/basics), whose answers are the chosen.
  std::map<std::string, std::string> answer;
  for (const char* split : {"train", "valid"})
    for (const SftRecord& r :
         sft_load_jsonl((source_dir() / "configs/data/basics" / (std::string(split) + ".jsonl")).string()))
      answer[r.messages[0].content + (r.messages[0].input.empty() ? "" : "\n" + r.messages[0].input)] =
          r.messages[1].content;
  std::set<std::string> train_prompts;
  size_t systems = 0, histories = 0;
  for (const auto* set : {&alpaca, &sharegpt, &valid}) {
    for (const PairRecord& p : *set) {
      CAPTURE(p.source);
      const std::string q = p.prompt.back().content;
      REQUIRE(answer.count(q) == 1);
      CHECK(p.chosen == answer[q]);
      CHECK(p.rejected != p.chosen);
      CHECK(!p.rejected.empty());
      systems += p.prompt.front().role == SftRole::SYSTEM;
      histories += p.prompt.size() > 2;
      if (set != &valid) train_prompts.insert(q);
    }
  }
  CHECK(systems > 100);
  CHECK(histories > 100);
  for (const PairRecord& p : valid) CHECK(train_prompts.count(p.prompt.back().content) == 0);
}
