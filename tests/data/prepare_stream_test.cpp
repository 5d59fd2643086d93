// Streaming data_prepare (data/prepare_stream.h, data/shard_writer.h): many small chunks
// on 1 and on several threads give the same shard, byte for byte, as tokenizing the records
// directly (sft_parse_line + sft_render or encode_ordinary, TokenData, shard_write); a
// malformed record deep in a many-chunk file is the parser's error with its line and
// leaves no OUT.tmp; peak memory stays bounded on an input far larger than a chunk; and a
// prepare killed midway leaves no OUT.tmp behind.
#include "data/prepare.h"
#include "data/shard.h"
#include "data/unicode.h"

#include "core/error.h"
#include "temp_dir.h"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include <csignal>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

using namespace dtrain;
using namespace dtrain::data;
using dtrain::test::TempDir;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A small byte-level BPE (GPT-2 byte map, a few merges, chatml specials): a tokenizer
// with real merges shared by the worker threads.
fs::path write_bpe(const TempDir& dir) {
  json vocab = json::object();
  auto ch = [](int b) {
    std::string s;
    utf8_append(s, byte_to_unicode(static_cast<uint8_t>(b)));
    return s;
  };
  for (int b = 0; b < 256; ++b) vocab[ch(b)] = b;
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"t", "h"}, {"th", "e"}, {ch(' '), "a"}, {"i", "n"}, {"e", "r"}, {ch(' '), "the"}, {"o", "u"}};
  json m = json::array();
  int next = 256;
  for (const auto& [a, b] : merges) {
    vocab[a + b] = next++;
    m.push_back(a + " " + b);
  }
  json root;
  root["version"] = "1.0";
  root["added_tokens"] = json::array({json{{"id", next}, {"content", "<|endoftext|>"}, {"special", true}},
                                      json{{"id", next + 1}, {"content", "<|im_start|>"}, {"special", true}},
                                      json{{"id", next + 2}, {"content", "<|im_end|>"}, {"special", true}}});
  root["normalizer"] = nullptr;
  root["pre_tokenizer"] = json{{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  root["model"] = json{{"type", "BPE"}, {"vocab", vocab}, {"merges", m}};
  return dir.write("tokenizer.json", root.dump());
}

std::string random_words(std::mt19937& rng, size_t n) {
  static const char* words[] = {"the", "answer", "in",    "ünïcode", "中文", "🙂", "over", "\t",
                                "  ",  "\\n",    "\"q\"", "then",    "a",    "x=1;", "42"};
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    if (i) s += ' ';
    s += words[rng() % (sizeof(words) / sizeof(*words))];
  }
  return s;
}

// SFT JSONL mixing alpaca and chat lines, blank lines, CRLF endings and a few records far
// longer than the chunks the tests use.
std::string sft_jsonl(size_t records, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string out;
  for (size_t i = 0; i < records; ++i) {
    json j;
    const size_t len = i % 97 == 5 ? 3000 : 1 + rng() % 40;
    if (rng() % 3 == 0) {
      j["messages"] = json::array({json{{"role", "system"}, {"content", random_words(rng, 3)}},
                                   json{{"role", "user"}, {"content", random_words(rng, len)}},
                                   json{{"role", "assistant"}, {"content", random_words(rng, 5)}}});
    } else {
      j["instruction"] = random_words(rng, len);
      if (rng() % 2) j["input"] = random_words(rng, 4);
      j["output"] = random_words(rng, 1 + rng() % 12);
    }
    out += j.dump();
    out += rng() % 5 == 0 ? "\r\n" : "\n";
    if (rng() % 11 == 0) out += rng() % 2 ? "\n" : "  \t\n";
  }
  return out;
}

// Text with paragraphs of 1-60 lines, runs of blank (or white space) lines, CRLF.
std::string text_input(size_t paragraphs, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string out;
  for (size_t p = 0; p < paragraphs; ++p) {
    const size_t lines = p % 53 == 7 ? 400 : 1 + rng() % 6;
    for (size_t l = 0; l < lines; ++l) out += random_words(rng, 1 + rng() % 12) + (rng() % 7 ? "\n" : "\r\n");
    for (size_t b = 0; b < 1 + rng() % 2; ++b) out += rng() % 3 ? "\n" : " \r\n";
  }
  return out;
}

// The reference: every record parsed and rendered directly, one after the other.
std::string direct_sft_shard(const fs::path& in, const Tokenizer& tok, const std::string& tmpl_name,
                             const fs::path& out) {
  const SftTemplate tmpl = sft_template_parse(tmpl_name, &tok);
  TokenData d;
  d.vocab_size = tok.vocab_size();
  d.eos_id = tok.eos_id();
  d.pad_id = tok.pad_id();
  std::ifstream f(in, std::ios::binary);
  std::string line;
  size_t n = 0;
  while (std::getline(f, line)) {
    ++n;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    const SftTokens t = sft_render(sft_parse_line(line, SftFormat::AUTO, in.string(), n), tok, tmpl);
    d.append(t.tokens, t.mask);
  }
  shard_write(out.string(), d);
  return read_bytes(out);
}

std::string direct_text_shard(const fs::path& in, const Tokenizer& tok, bool line_per_doc, const fs::path& out) {
  TokenData d;
  d.vocab_size = tok.vocab_size();
  d.eos_id = tok.eos_id();
  d.pad_id = tok.pad_id();
  auto add = [&](const std::string& doc) {
    std::vector<int32_t> ids = tok.encode_ordinary(doc);
    ids.push_back(tok.eos_id());
    d.append(ids);
  };
  std::ifstream f(in, std::ios::binary);
  std::string line, cur;
  while (std::getline(f, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    const bool blank = line.find_first_not_of(" \t") == std::string::npos;
    if (line_per_doc || blank) {
      if (!line_per_doc && !cur.empty()) add(cur);
      if (line_per_doc && !blank) add(line);
      cur.clear();
      continue;
    }
    cur += (cur.empty() ? "" : "\n") + line;
  }
  if (!cur.empty()) add(cur);
  shard_write(out.string(), d);
  return read_bytes(out);
}

std::vector<std::string> dir_names(const fs::path& dir) {
  std::vector<std::string> v;
  for (const auto& e : fs::directory_iterator(dir)) v.push_back(e.path().filename().string());
  std::sort(v.begin(), v.end());
  return v;
}

}  // namespace

TEST_CASE("data_prepare in many chunks: 1 and 3 threads write the shard of direct tokenizing, byte for byte") {
  TempDir dir("prepare-stream");
  const fs::path in = dir.write("in.jsonl", sft_jsonl(1500, 7));
  const std::string bpe = write_bpe(dir).string();
  for (const auto& [spec, tmpl] :
       std::vector<std::pair<std::string, std::string>>{{"byte", "plain"}, {bpe, "chatml"}}) {
    CAPTURE(spec);
    const std::string want = direct_sft_shard(in, *tokenizer_load(spec), tmpl, dir.path / "direct.bin");
    REQUIRE(want.size() > 100000);
    for (unsigned threads : {1u, 3u}) {
      CAPTURE(threads);
      DataPrepareOptions o;
      o.sft_template = tmpl;
      o.threads = threads;
      o.chunk_bytes = 4096;  // ~90 chunks; some records are longer than a chunk
      const fs::path out = dir.path / ("t" + std::to_string(threads) + ".bin");
      const DataPrepareStats s = data_prepare(in.string(), DataFormat::SFT, spec, out.string(), o);
      CHECK(s.documents == 1500);
      CHECK(read_bytes(out) == want);
      CHECK(!fs::exists(out.string() + ".tmp"));
      // The in-memory path (training) goes through the same chunks.
      CHECK(data_tokenize(in.string(), DataFormat::SFT, *tokenizer_load(spec), o).tokens ==
            ShardReader(out.string()).to_data().tokens);
    }
  }
  CHECK(dir_names(dir.path) ==
        std::vector<std::string>{"direct.bin", "in.jsonl", "t1.bin", "t3.bin", "tokenizer.json"});
}

TEST_CASE("data_prepare text in many chunks: paragraphs across chunk ends, and one document per line") {
  TempDir dir("prepare-stream-text");
  const fs::path in = dir.write("in.txt", text_input(700, 11));
  ByteTokenizer tok;
  for (bool per_line : {false, true}) {
    CAPTURE(per_line);
    const std::string want = direct_text_shard(in, tok, per_line, dir.path / "direct.bin");
    for (unsigned threads : {1u, 2u}) {
      CAPTURE(threads);
      DataPrepareOptions o;
      o.threads = threads;
      o.text_line_per_doc = per_line;
      o.chunk_bytes = 1000;  // some paragraphs span many chunks' worth of bytes
      const fs::path out = dir.path / "t.bin";
      data_prepare(in.string(), DataFormat::TEXT, "byte", out.string(), o);
      CHECK(read_bytes(out) == want);
    }
  }
}

TEST_CASE("a malformed record in the middle of a many-chunk file: its line in the error, no OUT.tmp, OUT untouched") {
  TempDir dir("prepare-stream-bad");
  std::string text = sft_jsonl(3000, 3);
  // Replace line 2345 with a record that lacks "output".
  size_t pos = 0;
  for (int n = 1; n < 2345; ++n) pos = text.find('\n', pos) + 1;
  text.replace(pos, text.find('\n', pos) - pos, R"({"instruction": "no answer here"})");
  const fs::path in = dir.write("bad.jsonl", text);
  const fs::path out = dir.write("out.bin", "DTRAINTK (an earlier shard)");
  for (unsigned threads : {1u, 2u}) {
    CAPTURE(threads);
    DataPrepareOptions o;
    o.threads = threads;
    o.chunk_bytes = 2048;
    try {
      data_prepare(in.string(), DataFormat::SFT, "byte", out.string(), o);
      FAIL("no error for the malformed record");
    } catch (const ConfigError& e) {
      const std::string what = e.what();
      CAPTURE(what);
      CHECK(what.find(in.string() + ":2345: missing \"output\"") != std::string::npos);
    }
    CHECK(dir_names(dir.path) == std::vector<std::string>{"bad.jsonl", "out.bin"});
    CHECK(read_bytes(out) == "DTRAINTK (an earlier shard)");
  }
}

namespace {

// Runs fn in a child process; its peak resident set size in MB (wait4's ru_maxrss), or
// -1 when the child failed.
template <class F>
double child_peak_rss_mb(F&& fn) {
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    int rc = 0;
    try {
      fn();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child: %s\n", e.what());
      rc = 1;
    }
    ::_exit(rc);
  }
  int status = 0;
  struct rusage ru {};
  REQUIRE(::wait4(pid, &status, 0, &ru) == pid);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return -1;
  return static_cast<double>(ru.ru_maxrss) / 1024.0;  // KiB on Linux
}

}  // namespace

namespace {

// `bytes` of text, one document per line, written in pieces (this process stays small:
// a forked child starts with its pages).
void write_big_text(const fs::path& path, size_t bytes) {
  std::mt19937 rng(5);
  std::ofstream f(path, std::ios::binary);
  size_t written = 0;
  while (written < bytes) {
    const std::string line = random_words(rng, 1 + rng() % 60) + "\n";
    f << line;
    written += line.size();
  }
}

}  // namespace

TEST_CASE("data_prepare's memory stays bounded on an input 256 times its chunk size") {
  TempDir dir("prepare-stream-rss");
  const fs::path in = dir.path / "big.txt";
  constexpr size_t kInput = size_t{32} << 20;
  write_big_text(in, kInput);
  // The bound: 24 MB above this process's own peak. Streaming holds at most 2 chunks per
  // thread (2 threads x 2 x 128 KB of input, each becoming ~0.5 MB of int32 tokens) plus
  // 1 MB write buffers: a few MB. Holding the data needs 4 bytes a token for the ids
  // (128 MB here; reading everything first, as data prepare did, also the input's 32 MB
  // of documents), so it cannot pass.
  struct rusage self {};
  ::getrusage(RUSAGE_SELF, &self);
  const double base_mb = static_cast<double>(self.ru_maxrss) / 1024.0;
  const double bound_mb = base_mb + 24;
  const double stream_mb = child_peak_rss_mb([&] {
    DataPrepareOptions o;
    o.threads = 2;
    o.chunk_bytes = 128 << 10;
    o.text_line_per_doc = true;
    data_prepare(in.string(), DataFormat::TEXT, "byte", (dir.path / "s.bin").string(), o);
  });
  MESSAGE("peak RSS: this process " << base_mb << " MB, streaming prepare " << stream_mb << " MB, bound " << bound_mb
                                    << " MB");
  REQUIRE(stream_mb > 0);
  CHECK(stream_mb < bound_mb);
  CHECK(ShardReader(dir.path / "s.bin").size() > kInput * 9 / 10);  // bytes less blank lines' newlines
  // The bound tells the two apart: tokenizing into memory (what data prepare did before
  // streaming) exceeds it on the same input.
  fs::remove(dir.path / "s.bin");
  const double memory_mb = child_peak_rss_mb([&] {
    DataPrepareOptions o;
    o.text_line_per_doc = true;
    ByteTokenizer tok;
    shard_write((dir.path / "m.bin").string(), data_tokenize(in.string(), DataFormat::TEXT, tok, o));
  });
  MESSAGE("tokenizing into memory: " << memory_mb << " MB");
  REQUIRE(memory_mb > 0);
  CHECK(memory_mb > bound_mb);
}

TEST_CASE("a data_prepare killed midway leaves neither OUT nor OUT.tmp (an earlier OUT stays)") {
  TempDir dir("prepare-stream-kill");
  const fs::path in = dir.path / "big.txt";
  write_big_text(in, size_t{48} << 20);
  const fs::path out = dir.write("out.bin", "DTRAINTK (an earlier shard)");
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    DataPrepareOptions o;
    o.threads = 2;
    o.text_line_per_doc = true;
    try {
      data_prepare(in.string(), DataFormat::TEXT, "byte", out.string(), o);
    } catch (...) {
      ::_exit(1);
    }
    ::_exit(0);
  }
  // Killed while the shard is being written (48 MB take seconds; the first chunks' tokens
  // are on disk after a few ms).
  ::usleep(300 * 1000);
  ::kill(pid, SIGKILL);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  // OUT is the earlier file or, when the prepare got as far as renaming its finished shard
  // into place before the kill landed (a loaded machine can delay the parent past the
  // whole prepare; the child may still be tearing down, so WIFSIGNALED says nothing),
  // the whole new shard, which its CRCs verify. Never a part of one.
  if (read_bytes(out) != "DTRAINTK (an earlier shard)") {
    MESSAGE("the prepare renamed its shard into place before it was killed (signalled: " << WIFSIGNALED(status)
                                                                                         << "): its output is checked");
    CHECK(ShardReader(out.string()).size() > 0);
  }
  CHECK(dir_names(dir.path) == std::vector<std::string>{"big.txt", "out.bin"});
}
