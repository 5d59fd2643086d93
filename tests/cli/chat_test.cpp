// `dtrain chat` through a pipe and `dtrain generate`'s sampling options, on a tiny run
// trained once: one escaped answer line per message line, the first being what
// `generate` answers; temperature 0 (and top-k 1 at any temperature) is greedy; the same
// seed gives the same text; a history that no longer fits max_seq_len drops its oldest
// exchanges, said on stderr; bad options are usage errors naming the flag.
#include "cli_harness.h"
#include "skip.h"
#include "tiny_job.h"

#include <fstream>

using namespace dtrain::cli_test;

namespace {

constexpr int kUsage = 2;

// A tiny run (1 layer, 4 steps, max_seq_len 128), trained once for the file's cases.
struct TrainedRun {
  TempDir tmp{"dtrain-chat"};
  std::string config = tmp.path() + "/tiny.yaml";
  std::string run = tmp.path() + "/run";
  RunResult launched;
  explicit TrainedRun(const std::string& bin) {
    std::ofstream(config) << tiny_job({.top = "train_micro_batch_size_per_gpu: 4\n",
                                       .n_layer = 1,
                                       .seq_len = 128,
                                       .save_steps = 4,
                                       .training_more = "  device: cpu\n",
                                       .rest = "fault_tolerance:\n  max_retries: 0\n"});
    launched = ::dtrain::cli_test::run({bin, "launch", "--config", config, "--output-dir", run, "--master-port", "0"},
                                       {}, 120s);
  }
};

const TrainedRun& trained(const std::string& bin) {
  static TrainedRun t(bin);
  return t;
}

// The command's stdout; its stderr in *err, its exit code in *rc.
std::string stdout_of(const std::string& command, std::string* err, int* rc, const std::string& tmp) {
  const std::string err_file = tmp + "/stderr.txt";
  std::string out = shell("timeout 60 " + command + " 2>" + shq(err_file), rc);
  *err = read_text(err_file);
  return out;
}

// `dtrain chat`'s escaping of an answer into one line.
std::string one_line(const std::string& s) {
  std::string out;
  for (char c : s)
    out += c == '\\' ? std::string("\\\\") : c == '\n' ? std::string("\\n") : c == '\r' ? "\\r" : std::string(1, c);
  return out;
}

}  // namespace

TEST_CASE("generate: temperature 0 and top-k 1 are greedy, a seed repeats its text, bad options are exit 2") {
  const std::string bin = dtrain_bin();
  if (bin.empty()) return ::dtrain::test::skip_test("DTRAIN_BIN not set: skipping");
  const TrainedRun& t = trained(bin);
  INFO(t.launched.out);
  REQUIRE(t.launched.rc == 0);
  const std::vector<std::string> base{bin, "generate", t.run, "Add 12 and 30.", "--max-new-tokens", "12"};
  const auto gen = [&](std::vector<std::string> extra) {
    std::vector<std::string> argv = base;
    argv.insert(argv.end(), extra.begin(), extra.end());
    return run(argv, {}, 60s);
  };
  const RunResult greedy = gen({});
  INFO(greedy.out);
  REQUIRE(greedy.rc == 0);
  CHECK(gen({"--temperature", "0", "--seed", "3"}).out == greedy.out);
  CHECK(gen({"--temperature", "1.5", "--top-k", "1", "--seed", "3"}).out == greedy.out);
  CHECK(gen({"--temperature", "1.5", "--top-p", "0", "--seed", "4"}).out == greedy.out);
  // An almost untrained model sampled hot: the seed decides the text, and repeats it.
  const RunResult s1 = gen({"--temperature", "2", "--seed", "1"});
  const RunResult s1b = gen({"--temperature", "2", "--seed", "1"});
  const RunResult s2 = gen({"--temperature", "2", "--seed", "2"});
  CHECK(s1.rc == 0);
  CHECK(s1.out == s1b.out);
  CHECK(s1.out != s2.out);
  CHECK(s1.out != greedy.out);

  for (const auto& [flag, value] : std::vector<std::pair<std::string, std::string>>{{"--temperature", "-1"},
                                                                                    {"--temperature", "nan"},
                                                                                    {"--top-p", "1.5"},
                                                                                    {"--top-k", "-2"}}) {
    const RunResult r = gen({flag, value});
    INFO(flag << " " << value << ": " << r.out);
    CHECK(r.rc == kUsage);
    CHECK(contains(r.out, flag));
  }
}

TEST_CASE("chat through a pipe: one answer line per message line, the history kept within max_seq_len") {
  const std::string bin = dtrain_bin();
  if (bin.empty()) return ::dtrain::test::skip_test("DTRAIN_BIN not set: skipping");
  const TrainedRun& t = trained(bin);
  INFO(t.launched.out);
  REQUIRE(t.launched.rc == 0);
  const std::string chat = shq(bin) + " chat " + shq(t.run);
  std::string err;
  int rc = -1;

  // Two messages (a blank line between is no message): two lines, the first as generate answers it.
  std::string out = stdout_of("printf 'Add 12 and 30.\\n\\nReverse the word.\\n' | " + chat + " --max-new-tokens 12",
                              &err, &rc, t.tmp.path());
  INFO(out << "\nstderr: " << err);
  CHECK(rc == 0);
  const std::vector<std::string> lines = split_lines(out);
  REQUIRE(lines.size() == 2);
  RunResult g = run({bin, "generate", t.run, "Add 12 and 30.", "--max-new-tokens", "12"}, {}, 60s);
  REQUIRE(g.rc == 0);
  std::string answer = g.out.substr(0, g.out.size() - 1);  // generate's line end
  CHECK(lines[0] == one_line(answer));
  CHECK(!contains(out, "> "));  // no terminal prompt on a pipe

  // Sampling: the same seed, the same answers.
  const std::string sampled = " --max-new-tokens 12 --temperature 1.5 --top-p 0.9 --top-k 40 --seed 7";
  const std::string msgs = "printf 'Add 12 and 30.\\nWhat is 7 * 8?\\n' | ";
  const std::string a = stdout_of(msgs + chat + sampled, &err, &rc, t.tmp.path());
  CHECK(rc == 0);
  CHECK(split_lines(a).size() == 2);
  CHECK(stdout_of(msgs + chat + sampled, &err, &rc, t.tmp.path()) == a);

  // A second message that leaves no room for the first exchange (40 + the template's 33
  // tokens + 60 new ones > 128): the exchange is dropped, said on stderr; still one line each.
  out = stdout_of("printf 'hi\\n" + std::string(40, 'x') + "\\n' | " + chat + " --max-new-tokens 60", &err, &rc,
                  t.tmp.path());
  CHECK(rc == 0);
  CHECK(split_lines(out).size() == 2);
  CHECK(contains(err, "dropped the 1 earliest exchange(s) of the conversation"));
  CHECK(contains(err, "max_seq_len 128"));

  // No input, no answer; bad options are usage errors.
  out = stdout_of(chat + " </dev/null", &err, &rc, t.tmp.path());
  CHECK(rc == 0);
  CHECK(out.empty());
  out = stdout_of("echo hi | " + chat + " --max-new-tokens 0", &err, &rc, t.tmp.path());
  CHECK(rc == kUsage);
  CHECK(contains(err, "--max-new-tokens"));
  out = stdout_of("echo hi | " + chat + " --temperature -0.5", &err, &rc, t.tmp.path());
  CHECK(rc == kUsage);
  CHECK(contains(err, "--temperature"));
}
