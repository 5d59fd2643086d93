// Token shards (round trip, uint16/uint32, truncation and corruption), data_prepare
// for text and SFT JSONL, and TokenDataset samples in PACK and PAD modes.
#include "data/dataset.h"
#include "data/prepare.h"
#include "data/shard.h"

#include "core/error.h"

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <random>

#include <unistd.h>

using namespace dtrain;
using namespace dtrain::data;
namespace fs = std::filesystem;

namespace {

struct TempDir {
  fs::path path;
  TempDir() {
    std::random_device rd;
    path = fs::temp_directory_path() / ("dtrain_shard_" + std::to_string(rd()) + std::to_string(rd()));
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

TokenData make_data(int32_t vocab, size_t docs, bool masked, uint32_t seed) {
  std::mt19937 rng(seed);
  TokenData d;
  d.vocab_size = vocab;
  d.eos_id = vocab - 1;
  for (size_t k = 0; k < docs; ++k) {
    std::vector<int32_t> t(1 + rng() % 40);
    std::vector<uint8_t> m;
    for (auto& x : t) x = static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab));
    if (masked) {
      m.resize(t.size());
      for (auto& x : m) x = rng() % 2;
    }
    d.append(t, m);
  }
  return d;
}

void expect_io_error(const std::string& path, const std::string& needle) {
  try {
    ShardReader r(path);
    FAIL("no error for " << needle);
  } catch (const IoError& e) {
    std::string what = e.what();
    CHECK_MESSAGE(what.find(path) != std::string::npos, what);
    CHECK_MESSAGE(what.find(needle) != std::string::npos, what);
  }
}

}  // namespace

TEST_CASE("shards round-trip with uint16 and uint32 tokens, with and without mask") {
  TempDir dir;
  for (int32_t vocab : {261, 65536, 65537, 200000}) {
    for (bool masked : {false, true}) {
      TokenData d = make_data(vocab, 50, masked, static_cast<uint32_t>(vocab));
      d.pad_id = 3;
      shard_write(dir.file("s.bin"), d);
      ShardReader r(dir.file("s.bin"));
      CHECK(r.size() == d.tokens.size());
      CHECK(r.has_mask() == masked);
      CHECK(r.num_docs() == 50);
      CHECK(r.vocab_size() == vocab);
      CHECK(r.pad_id() == 3);
      TokenData back = r.to_data();
      CHECK(back.tokens == d.tokens);
      CHECK(back.mask == d.mask);
      CHECK(back.doc_starts == d.doc_starts);
      const size_t width = vocab <= 65536 ? 2 : 4;
      CHECK(fs::file_size(dir.file("s.bin")) ==
            SHARD_HEADER_BYTES + d.tokens.size() * width + d.mask.size() + 8 * d.doc_starts.size());
    }
  }
}

TEST_CASE("truncated or corrupt shards are IoErrors naming the file") {
  TempDir dir;
  TokenData d = make_data(1000, 20, true, 5);
  const std::string p = dir.file("bad.bin");
  shard_write(p, d);
  const size_t size = fs::file_size(p);

  fs::resize_file(p, size - 3);
  expect_io_error(p, "truncated");
  fs::resize_file(p, 10);
  expect_io_error(p, "truncated");

  shard_write(p, d);
  {
    std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(SHARD_HEADER_BYTES + 5));
    f.put('\x7F');
  }
  expect_io_error(p, "checksum");
  CHECK_NOTHROW(ShardReader(p, false));  // verification can be skipped

  shard_write(p, d);
  {
    std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(16);
    f.put('\x01');  // token count
  }
  expect_io_error(p, "corrupt header");
  std::ofstream(dir.file("text.bin")) << "hello, this is not a shard at all, but it is long enough to have a header";
  expect_io_error(dir.file("text.bin"), "bad magic");

  TokenData bad = d;
  bad.tokens[0] = 5000;
  CHECK_THROWS_AS(shard_write(p, bad), ConfigError);
}

TEST_CASE("a missing, directory or unreadable input file is a ConfigError naming the path") {
  // Config errors exit 2, which the supervisor does not restart; an IoError would be
  // retried round after round although no retry can make the file appear.
  TempDir dir;
  auto expect_config_error = [](const std::string& path, const std::string& needle) {
    try {
      ShardReader r(path);
      FAIL("no error for " << path);
    } catch (const ConfigError& e) {
      std::string what = e.what();
      CHECK_MESSAGE(what.find(path) != std::string::npos, what);
      CHECK_MESSAGE(what.find(needle) != std::string::npos, what);
    }
  };
  expect_config_error(dir.file("missing.bin"), "does not exist");
  expect_config_error(dir.path.string(), "is a directory");
  DataPrepareOptions o;
  CHECK_THROWS_AS(data_prepare(dir.file("missing.txt"), DataFormat::TEXT, "byte", dir.file("out.bin"), o), ConfigError);
  CHECK_THROWS_AS(data_prepare(dir.path.string(), DataFormat::SFT, "byte", dir.file("out.bin"), o), ConfigError);
  if (::geteuid() != 0) {  // root reads a mode-000 file anyway
    const std::string p = dir.file("locked.bin");
    shard_write(p, make_data(1000, 2, false, 1));
    fs::permissions(p, fs::perms::none);
    expect_config_error(p, "not readable");
  }
}

TEST_CASE("data_prepare: text documents separated by blank lines, each followed by eos") {
  TempDir dir;
  std::ofstream(dir.file("in.txt")) << "first doc\nstill first\n\n\n second\r\n\nthird\n";
  DataPrepareStats s = data_prepare(dir.file("in.txt"), DataFormat::TEXT, "byte", dir.file("t.bin"));
  CHECK(s.documents == 3);
  ShardReader r(dir.file("t.bin"));
  CHECK_FALSE(r.has_mask());
  ByteTokenizer tok;
  TokenData d = r.to_data();
  CHECK(tok.decode(d.tokens) == "first doc\nstill first<|eos|> second<|eos|>third<|eos|>");
  CHECK(d.doc_starts == std::vector<uint64_t>{0, 22, 30});

  DataPrepareOptions lines;
  lines.text_line_per_doc = true;
  CHECK(data_prepare(dir.file("in.txt"), DataFormat::TEXT, "byte", dir.file("l.bin"), lines).documents == 4);
  std::ofstream(dir.file("empty.txt")) << "\n\n";
  CHECK_THROWS_AS(data_prepare(dir.file("empty.txt"), DataFormat::TEXT, "byte", dir.file("e.bin")), ConfigError);
  CHECK_THROWS_AS(data_format_parse("csv"), ConfigError);
  CHECK(data_format_parse("sft") == DataFormat::SFT);
}

TEST_CASE("data_prepare: SFT JSONL keeps the response mask per record") {
  TempDir dir;
  std::ofstream(dir.file("in.jsonl")) << R"({"instruction":"add 1 and 2","output":"3"})"
                                      << "\n"
                                      << R"({"instruction":"reverse ab","input":"","output":"ba"})"
                                      << "\n";
  DataPrepareStats s = data_prepare(dir.file("in.jsonl"), DataFormat::ALPACA, "byte", dir.file("s.bin"));
  CHECK(s.documents == 2);
  CHECK(s.trained_tokens == 2 + 3);  // "3"+eos, "ba"+eos
  ShardReader r(dir.file("s.bin"));
  CHECK(r.has_mask());
  std::ofstream(dir.file("bad.jsonl")) << R"({"instruction":"a","output":"b"})"
                                       << "\nnot json\n";
  try {
    data_prepare(dir.file("bad.jsonl"), DataFormat::SFT, "byte", dir.file("b.bin"));
    FAIL("expected an error");
  } catch (const ConfigError& e) {
    CHECK(std::string(e.what()).find("bad.jsonl:2") != std::string::npos);
  }
}

TEST_CASE("TokenDataset PACK: contiguous windows of seq_len + 1, shifted targets") {
  TokenData d;
  d.vocab_size = 100;
  d.append({1, 2, 3, 4, 5, 6});
  d.append({7, 8, 9, 10, 11});
  TokenDataset ds(d, {4, SampleMode::PACK, -1});
  CHECK(ds.size() == 2);  // (11 - 1) / 4
  Sample s0 = ds.sample(0), s1 = ds.sample(1);
  CHECK(s0.inputs == std::vector<int32_t>{1, 2, 3, 4});
  CHECK(s0.targets == std::vector<int32_t>{2, 3, 4, 5});
  CHECK(s1.inputs == std::vector<int32_t>{5, 6, 7, 8});
  CHECK(s1.targets == std::vector<int32_t>{6, 7, 8, 9});  // packing crosses documents
  CHECK_THROWS_AS(TokenDataset(d, {11, SampleMode::PACK, -1}), ConfigError);
  CHECK_THROWS_AS(TokenDataset(d, {0, SampleMode::PACK, -1}), ConfigError);
}

TEST_CASE("TokenDataset masks prompt targets in PACK and PAD modes") {
  TempDir dir;
  std::ofstream(dir.file("in.jsonl")) << R"({"instruction":"q","output":"42"})"
                                      << "\n"
                                      << R"({"instruction":"hello there","output":"x"})"
                                      << "\n";
  data_prepare(dir.file("in.jsonl"), DataFormat::ALPACA, "byte", dir.file("s.bin"));
  ByteTokenizer tok;
  const std::string prompt0 = "### Instruction:\nq\n\n### Response:\n";

  TokenDataset pad({dir.file("s.bin")}, {64, SampleMode::PAD, -1});
  CHECK(pad.size() == 2);
  Sample s = pad.sample(0);
  const size_t n0 = prompt0.size() + 3;  // prompt + "42" + eos
  std::vector<int32_t> trained;
  for (size_t j = 0; j < s.targets.size(); ++j) {
    if (s.targets[j] != IGNORE_INDEX) trained.push_back(s.targets[j]);
    if (j >= n0) CHECK(s.inputs[j] == ByteTokenizer::PAD);
    if (j + 1 >= n0) CHECK(s.targets[j] == IGNORE_INDEX);
  }
  CHECK(tok.decode(trained) == "42<|eos|>");
  CHECK(s.targets[prompt0.size() - 1] == '4');  // predicted from the prompt's last token

  // Truncation that cuts off the whole response skips the record.
  // Record 0 keeps "42" in seq_len + 1 = prompt0 + 2 tokens; record 1's longer prompt
  // leaves no response token, so it is skipped.
  TokenDataset cut({dir.file("s.bin")}, {static_cast<int64_t>(prompt0.size()) + 1, SampleMode::PAD, -1});
  CHECK(cut.size() == 1);
  CHECK(cut.skipped_documents() == 1);
  CHECK(tok.decode({cut.sample(0).targets.back()}) == "2");
  CHECK_THROWS_AS(TokenDataset({dir.file("s.bin")}, {8, SampleMode::PAD, -1}), ConfigError);

  TokenDataset pack({dir.file("s.bin"), dir.file("s.bin")}, {16, SampleMode::PACK, -1});
  std::vector<int32_t> all_trained;
  std::vector<int32_t> inputs(16 * pack.size()), targets(16 * pack.size());
  std::vector<size_t> idx(pack.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
  pack.batch(idx, inputs.data(), targets.data());
  for (int32_t t : targets)
    if (t != IGNORE_INDEX) all_trained.push_back(t);
  const std::string got = tok.decode(all_trained);
  CHECK(got.find("42<|eos|>") != std::string::npos);
  for (char c : got)
    CHECK((c == '4' || c == '2' || c == 'x' || c == '<' || c == '|' || c == 'e' || c == 'o' || c == 's' || c == '>'));
}

TEST_CASE("TokenDataset PACK with no trained target anywhere is a ConfigError naming the data") {
  TokenData d;
  d.vocab_size = 100;
  d.name = "prompts.jsonl";
  d.append({1, 2, 3, 4, 5, 6}, {0, 0, 0, 0, 0, 0});
  d.append({7, 8, 9, 10, 11}, {0, 0, 0, 0, 0});
  try {
    TokenDataset ds(d, {4, SampleMode::PACK, -1});
    FAIL("no error");
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    CHECK_MESSAGE(what.find("prompts.jsonl: the dataset has no trained token") != std::string::npos, what);
  }
  CHECK_THROWS_AS(TokenDataset(d, {4, SampleMode::PAD, -1}), ConfigError);  // every document skipped
  d.append({12, 13}, {0, 1});                                               // one trained target is enough
  CHECK(TokenDataset(d, {4, SampleMode::PACK, -1}).size() == 3);
}

TEST_CASE("TokenDataset rejects shards of different tokenizers") {
  TempDir dir;
  shard_write(dir.file("a.bin"), make_data(300, 5, false, 1));
  shard_write(dir.file("b.bin"), make_data(400, 5, false, 2));
  CHECK_THROWS_AS(TokenDataset({dir.file("a.bin"), dir.file("b.bin")}, {4, SampleMode::PACK, -1}), ConfigError);
  CHECK_THROWS_AS(TokenDataset(std::vector<std::string>{}, {4, SampleMode::PACK, -1}), ConfigError);
}

TEST_CASE("TokenDataset PACK with isolate: whole documents packed best-fit, their starts, padding, no cut") {
  // Documents of 4, 3, 6 and 5 tokens (tokens = 10 * document + position), all trained:
  // 10 11 12 13 | 20 21 22 | 30 31 32 33 34 35 | 40 41 42 43 44
  TokenData d;
  d.vocab_size = 100;
  const std::vector<int> lens = {4, 3, 6, 5};
  for (size_t k = 0; k < lens.size(); ++k) {
    std::vector<int32_t> doc;
    for (int j = 0; j < lens[k]; ++j) doc.push_back(static_cast<int32_t>(10 * (k + 1) + j));
    d.append(doc);
  }
  // seq_len 8: samples of 9 tokens. Longest first: 6 opens a sample (room 3), 5 another
  // (room 4), 4 fills the second, 3 the first.
  TokenDataset across(d, {8, SampleMode::PACK, -1, false}), apart(d, {8, SampleMode::PACK, -1, true});
  CHECK_FALSE(across.doc_starts());
  CHECK(apart.doc_starts());
  CHECK(across.size() == 2);  // windows of the stream: (18 - 1) / 8
  REQUIRE(apart.size() == 2);
  const Sample a = apart.sample(0), b = apart.sample(1);
  CHECK(a.inputs == std::vector<int32_t>{30, 31, 32, 33, 34, 35, 20, 21});
  CHECK(a.targets == std::vector<int32_t>{31, 32, 33, 34, 35, IGNORE_INDEX, 21, 22});  // 22: the 9th token
  CHECK(a.doc_start == std::vector<int32_t>{0, 0, 0, 0, 0, 0, 6, 6});
  CHECK(b.inputs == std::vector<int32_t>{40, 41, 42, 43, 44, 10, 11, 12});
  CHECK(b.targets == std::vector<int32_t>{41, 42, 43, 44, IGNORE_INDEX, 11, 12, 13});
  CHECK(b.doc_start == std::vector<int32_t>{0, 0, 0, 0, 0, 5, 5, 5});
  // Plain packing cuts the stream and trains across documents (13 -> 20).
  const Sample w = across.sample(0);
  CHECK(w.inputs == std::vector<int32_t>{10, 11, 12, 13, 20, 21, 22, 30});
  CHECK(w.targets == std::vector<int32_t>{11, 12, 13, 20, 21, 22, 30, 31});
  CHECK(w.doc_start.empty());
  // batch() fills the starts of every row, in row order.
  std::vector<int32_t> in(16), tg(16), ds(16, -1);
  apart.batch({1, 0}, in.data(), tg.data(), ds.data());
  CHECK(std::vector<int32_t>(ds.begin(), ds.begin() + 8) == b.doc_start);
  CHECK(std::vector<int32_t>(ds.begin() + 8, ds.end()) == a.doc_start);
  // Room left over is padding, a document of its own that trains nothing; a document
  // longer than a sample is truncated to it (as PAD does), never cut into two samples.
  TokenData e;
  e.vocab_size = 100;
  e.append({1, 2, 3, 4});
  e.append({5, 6, 7});
  e.append({50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61});
  TokenDataset p(e, {8, SampleMode::PACK, -1, true});
  REQUIRE(p.size() == 2);
  CHECK(p.truncated_documents() == 1);  // the 12-token one, told in a warning
  CHECK(apart.truncated_documents() == 0);
  CHECK(across.truncated_documents() == 0);  // windows cut the stream: nothing is truncated
  const Sample longest = p.sample(0), two = p.sample(1);
  CHECK(longest.inputs == std::vector<int32_t>{50, 51, 52, 53, 54, 55, 56, 57});
  CHECK(longest.targets == std::vector<int32_t>{51, 52, 53, 54, 55, 56, 57, 58});
  CHECK(longest.doc_start == std::vector<int32_t>(8, 0));
  CHECK(two.inputs == std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 0});
  CHECK(two.targets == std::vector<int32_t>{2, 3, 4, IGNORE_INDEX, 6, 7, IGNORE_INDEX, IGNORE_INDEX});
  CHECK(two.doc_start == std::vector<int32_t>{0, 0, 0, 0, 4, 4, 4, 7});
  // Every start is the previous position's or the position itself (the model's layout).
  for (const Sample* s : {&a, &b, &longest, &two})
    for (size_t j = 0; j < s->doc_start.size(); ++j)
      CHECK((s->doc_start[j] == (j == 0 ? 0 : s->doc_start[j - 1]) || s->doc_start[j] == static_cast<int32_t>(j)));
}
