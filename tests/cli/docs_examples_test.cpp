// The documentation's examples still parse (issue 44): every `dtrain ...` line of a code
// block in README.md, examples/README.md and docs/*.md names a command the binary has, and
// every --flag it shows is one that command's --help lists; README's worked-example job
// loads as a config and says what the prose says it does (LoRA r 16 on a LLaMA-Factory
// dataset at ZeRO-2).
// docs/config-reference.md is generated (config_reference_doc_test).
#include "cli_harness.h"
#include "skip.h"

#include "config/train_config.h"

#include <fmt/format.h>

#include <set>

using namespace dtrain::cli_test;
namespace fs = std::filesystem;

namespace {

std::vector<fs::path> doc_files() {
  std::vector<fs::path> out = {source_root() / "README.md", source_root() / "examples" / "README.md"};
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(source_root() / "docs", ec))
    if (e.path().extension() == ".md" && e.path().filename() != "config-reference.md") out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

struct Example {
  std::string where;  // file:line
  std::vector<std::string> words;
};

std::vector<std::string> split_words(const std::string& s) {
  std::vector<std::string> w;
  std::istringstream in(s);
  for (std::string x; in >> x;) {
    if (x == "#" || x.rfind("#", 0) == 0) break;  // a comment after the command
    w.push_back(x);
  }
  return w;
}

// The `dtrain ...` lines of indented or fenced code blocks ("$ dtrain" prompts too).
std::vector<Example> examples() {
  std::vector<Example> out;
  for (const fs::path& f : doc_files()) {
    const auto lines = split_lines(read_text(f.string()));
    bool fenced = false;
    for (size_t i = 0; i < lines.size(); ++i) {
      const std::string& l = lines[i];
      if (l.rfind("```", 0) == 0) {
        fenced = !fenced;
        continue;
      }
      std::string code;
      if (fenced) code = l;
      else if (l.rfind("    ", 0) == 0) code = l.substr(4);
      else continue;
      const size_t lead = code.find_first_not_of(' ');
      if (lead == std::string::npos) continue;
      code = code.substr(lead);
      if (code.rfind("$ ", 0) == 0) code = code.substr(2);
      if (code.rfind("dtrain ", 0) != 0) continue;
      out.push_back({fmt::format("{}:{}", fs::relative(f, source_root()).string(), i + 1), split_words(code)});
    }
  }
  return out;
}

}  // namespace

TEST_CASE("every dtrain command line in README.md, examples/ and docs/ names a command and flags the binary has") {
  const std::string bin = dtrain_bin();
  if (bin.empty()) return ::dtrain::test::skip_test("DTRAIN_BIN not set: skipping");
  const std::set<std::string> commands = {"launch", "resume", "bench", "eval",   "export", "generate",
                                          "data",   "plot",   "run",   "status", "doctor", "chat"};
  const std::set<std::string> nested = {"train", "prepare"};  // bench train, data prepare
  std::map<std::string, std::string> help;                    // command path -> its --help
  const auto list = examples();
  CHECK(list.size() >= 20);  // the README's worked example and the docs' sessions
  for (const Example& e : list) {
    CAPTURE(e.where);
    REQUIRE(e.words.size() >= 2);
    std::vector<std::string> path = {e.words[1]};
    if (!commands.count(path[0])) {
      // Prose in a code block ("dtrain run: seconds...") is not a command line.
      if (path[0].find_first_not_of("abcdefghijklmnopqrstuvwxyz-") != std::string::npos) continue;
      FAIL_CHECK("unknown command '" << path[0] << "'");
      continue;
    }
    if (e.words.size() > 2 && nested.count(e.words[2])) path.push_back(e.words[2]);
    const std::string key = fmt::format("{}", fmt::join(path, " "));
    if (!help.count(key)) {
      std::vector<std::string> argv = {bin};
      argv.insert(argv.end(), path.begin(), path.end());
      argv.push_back("--help");
      const RunResult r = run(argv, {}, 30s);
      INFO(r.out);
      REQUIRE(r.rc == 0);
      help[key] = r.out;
    }
    for (const std::string& w : e.words) {
      if (w.rfind("--", 0) != 0 || w == "--") continue;
      const std::string flag = w.substr(0, w.find('='));
      CAPTURE(flag);
      CHECK_MESSAGE(contains(help[key], flag), "dtrain " << key << " --help does not list " << flag);
    }
  }
}

TEST_CASE("README's worked example loads as a config: LoRA r 16, a LLaMA-Factory dataset, ZeRO-2, bf16") {
  const std::string readme = read_text((source_root() / "README.md").string());
  const size_t a = readme.find("```yaml\n");
  REQUIRE(a != std::string::npos);
  const size_t b = readme.find("```", a + 8);
  REQUIRE(b != std::string::npos);
  const std::string yaml = readme.substr(a + 8, b - a - 8);
  const auto loaded = dtrain::config::config_load_string(yaml, "README.md (worked example)", {});
  for (const auto& w : loaded.warnings) MESSAGE(w);
  CHECK(loaded.warnings.empty());
  const auto& c = loaded.cfg;
  CHECK(c.lora.r == 16);
  CHECK(c.lora.alpha == doctest::Approx(32));
  CHECK(c.data.dataset == "my_sft");
  CHECK(c.data.template_name == "qwen");
  CHECK(c.zero.stage == 2);
  CHECK(c.bf16.enabled);
  CHECK(c.training.max_steps == 1000);
  CHECK(c.model.init_from.find("Qwen2.5-7B-Instruct") != std::string::npos);
}
