// SFT: JSONL parsing and errors, the plain and chatml templates, and that the loss
// mask covers exactly the response tokens (decoded back and compared as text).
#include "data/sft.h"

#include "core/error.h"

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <random>

using namespace dtrain;
using namespace dtrain::data;
namespace fs = std::filesystem;

namespace {

// Decodes the masked tokens, and the unmasked ones, as two strings.
std::pair<std::string, std::string> split_by_mask(const SftTokens& t, const Tokenizer& tok) {
  std::vector<int32_t> on, off;
  REQUIRE(t.tokens.size() == t.mask.size());
  for (size_t i = 0; i < t.tokens.size(); ++i) (t.mask[i] ? on : off).push_back(t.tokens[i]);
  return {tok.decode(on), tok.decode(off)};
}

// The masked tokens must form contiguous runs; returns them decoded.
std::vector<std::string> masked_runs(const SftTokens& t, const Tokenizer& tok) {
  std::vector<std::string> runs;
  std::vector<int32_t> cur;
  for (size_t i = 0; i <= t.tokens.size(); ++i) {
    if (i < t.tokens.size() && t.mask[i]) {
      cur.push_back(t.tokens[i]);
    } else if (!cur.empty()) {
      runs.push_back(tok.decode(cur));
      cur.clear();
    }
  }
  return runs;
}

struct TempFile {
  fs::path path;
  explicit TempFile(const std::string& content) {
    std::random_device rd;
    path = fs::temp_directory_path() / ("dtrain_sft_" + std::to_string(rd()) + ".jsonl");
    std::ofstream(path, std::ios::binary) << content;
  }
  ~TempFile() {
    std::error_code ec;
    fs::remove(path, ec);
  }
};

}  // namespace

TEST_CASE("plain template: Alpaca record, mask covers exactly output + eos") {
  ByteTokenizer tok;
  SftRecord rec = sft_parse_line(R"({"instruction":"Add 37 and 45.","input":"numbers","output":"82"})", SftFormat::AUTO,
                                 "x.jsonl", 1);
  SftTokens t = sft_render(rec, tok, SftTemplate::PLAIN);
  auto [on, off] = split_by_mask(t, tok);
  CHECK(on == "82<|eos|>");
  CHECK(off == "### Instruction:\nAdd 37 and 45.\n\n### Input:\nnumbers\n\n### Response:\n");
  CHECK(tok.decode(t.tokens) == off + on);
  CHECK(t.tokens.back() == tok.eos_id());
  CHECK(tok.decode(sft_render_prompt(rec, tok, SftTemplate::PLAIN)) == off);
}

TEST_CASE("plain template: empty or missing input drops the Input section") {
  ByteTokenizer tok;
  for (const char* line : {R"({"instruction":"Reverse 'abc'.","input":"","output":"cba"})",
                           R"({"instruction":"Reverse 'abc'.","output":"cba"})",
                           R"({"instruction":"Reverse 'abc'.","input":null,"output":"cba"})"}) {
    SftTokens t = sft_render(sft_parse_line(line, SftFormat::ALPACA, "f", 3), tok, SftTemplate::PLAIN);
    auto [on, off] = split_by_mask(t, tok);
    CHECK(on == "cba<|eos|>");
    CHECK(off == "### Instruction:\nReverse 'abc'.\n\n### Response:\n");
  }
}

TEST_CASE("chatml template: multi-turn chat masks every assistant turn and nothing else") {
  ByteTokenizer tok;
  SftRecord rec = sft_parse_line(
      R"({"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"2+2?"},
          {"role":"assistant","content":"4"},{"role":"user","content":"and 3+3?"},
          {"role":"assistant","content":"6, obviously"}]})",
      SftFormat::AUTO, "chat.jsonl", 9);
  REQUIRE(rec.messages.size() == 5);
  SftTokens t = sft_render(rec, tok, SftTemplate::CHATML);
  CHECK(masked_runs(t, tok) == std::vector<std::string>{"4<|im_end|>", "6, obviously<|im_end|>"});
  CHECK(tok.decode(t.tokens) ==
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
        "<|im_start|>assistant\n4<|im_end|>\n<|im_start|>user\nand 3+3?<|im_end|>\n"
        "<|im_start|>assistant\n6, obviously<|im_end|>\n");
  // Role markers are single special tokens with the byte tokenizer.
  CHECK(t.tokens[0] == ByteTokenizer::IM_START);
  CHECK(tok.decode(sft_render_prompt(rec, tok, SftTemplate::CHATML)) ==
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n");

  SftTokens p = sft_render(rec, tok, SftTemplate::PLAIN);
  CHECK(masked_runs(p, tok) == std::vector<std::string>{"4<|eos|>", "6, obviously<|eos|>"});
  CHECK(tok.decode(p.tokens) ==
        "Be brief.\n\n### Instruction:\n2+2?\n\n### Response:\n4<|eos|>\n\n"
        "### Instruction:\nand 3+3?\n\n### Response:\n6, obviously<|eos|>");
}

TEST_CASE("content cannot forge special tokens; bos is optional") {
  ByteTokenizer tok;
  SftRecord rec = sft_parse_line(R"({"instruction":"say <|eos|>","output":"<|im_end|>"})", SftFormat::AUTO, "f", 1);
  SftTokens t = sft_render(rec, tok, SftTemplate::PLAIN, true);
  CHECK(t.tokens.front() == tok.bos_id());
  CHECK(t.mask.front() == 0);
  size_t eos_count = 0;
  for (int32_t id : t.tokens) eos_count += id == tok.eos_id();
  CHECK(eos_count == 1);  // only the template's
  CHECK(split_by_mask(t, tok).first == "<|im_end|><|eos|>");
}

TEST_CASE("malformed JSONL lines are ConfigErrors with file:line") {
  auto expect = [](const std::string& content, const std::string& needle, SftFormat f = SftFormat::AUTO) {
    TempFile file(content);
    try {
      sft_load_jsonl(file.path.string(), f);
      FAIL("no error for " << needle);
    } catch (const ConfigError& e) {
      std::string what = e.what();
      CHECK_MESSAGE(what.find(needle) != std::string::npos, what);
    }
  };
  const std::string good = R"({"instruction":"a","output":"b"})";
  expect(good + "\n\n" + "{\"instruction\": \"a\", \"output\": \n", ".jsonl:3: invalid JSON");
  expect(good + "\n[1,2]\n", ":2: each line must be a JSON object");
  expect(R"({"instruction":"a"})", ":1: missing \"output\"");
  expect(R"({"instruction":"a","output":5})", "\"output\" must be a string");
  expect(R"({"messages":[{"role":"robot","content":"x"}]})", "unknown role 'robot'");
  expect(R"({"messages":[{"role":"user","content":"x"}]})", "no assistant message");
  expect(R"({"messages":[]})", "non-empty \"messages\"");
  expect(good, "non-empty \"messages\"", SftFormat::CHAT);
  // Missing input, or a directory given as the file: config errors (exit 2, not retried).
  CHECK_THROWS_WITH_AS(sft_load_jsonl("/nonexistent/x.jsonl"),
                       doctest::Contains("/nonexistent/x.jsonl' does not exist"), ConfigError);
  CHECK_THROWS_WITH_AS(sft_load_jsonl("/tmp"), doctest::Contains("is a directory"), ConfigError);
  CHECK_THROWS_AS(sft_template_parse("llama9"), ConfigError);
}

TEST_CASE("sft_load_jsonl skips blank lines and handles CRLF") {
  TempFile file(
      "{\"instruction\":\"a\",\"output\":\"b\"}\r\n\r\n  \n{\"messages\":[{\"role\":\"assistant\",\"content\":\"hi\"}]}\n");
  auto recs = sft_load_jsonl(file.path.string());
  REQUIRE(recs.size() == 2);
  CHECK(recs[0].messages[1].content == "b");
  CHECK(recs[1].messages[0].role == SftRole::ASSISTANT);
}

TEST_CASE("sft_answer_matches normalises white space and stops at eos") {
  CHECK(sft_answer_matches("82", "82<|eos|>garbage"));
  CHECK(sft_answer_matches("82", " 82 \n"));
  CHECK(sft_answer_matches("a b", "a\n  b<|im_end|>"));
  CHECK(sft_answer_matches("cba", "cba\n### Instruction:\nmore"));
  CHECK_FALSE(sft_answer_matches("82", "83<|eos|>"));
  CHECK_FALSE(sft_answer_matches("82", "821"));
  CHECK_FALSE(sft_answer_matches("82", ""));
  CHECK(sft_answer_matches("", "<|endoftext|>x"));
  ByteTokenizer tok;
  CHECK(sft_stop_ids(tok) == std::vector<int32_t>{ByteTokenizer::EOS, ByteTokenizer::IM_END});
}
