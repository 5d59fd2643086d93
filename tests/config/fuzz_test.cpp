// Seeded mutation test: 2000 mutants of the shipped configs (truncation, line swaps and
// duplicates, garbage bytes, huge/negative numbers, deleted characters, typos) and random
// --set arguments. Each is either accepted (and then round-trips) or raises ConfigError /
// IoError: never another exception, a crash or a hang.
#include "config/train_config.h"
#include "core/error.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>

using namespace dtrain;
using namespace dtrain::config;
namespace fs = std::filesystem;

namespace {

std::vector<std::string> shipped_texts() {
  const char* d = std::getenv("DTRAIN_SOURCE_DIR");
  fs::path dir = (d && *d ? fs::path(d) : fs::current_path()) / "configs";
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file() && (e.path().extension() == ".yaml" || e.path().extension() == ".json"))
      files.push_back(e.path());
  std::sort(files.begin(), files.end());
  std::vector<std::string> out;
  for (const fs::path& f : files) {
    std::ifstream in(f);
    std::ostringstream s;
    s << in.rdbuf();
    out.push_back(s.str());
  }
  return out;
}

std::vector<std::string> lines_of(const std::string& t) {
  std::vector<std::string> out;
  std::istringstream in(t);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

std::string join_lines(const std::vector<std::string>& ls) {
  std::string out;
  for (const std::string& l : ls) out += l + "\n";
  return out;
}

struct Mutator {
  std::mt19937_64 rng;
  size_t pick(size_t n) { return n == 0 ? 0 : std::uniform_int_distribution<size_t>(0, n - 1)(rng); }

  std::string garbage(size_t n) {
    static const std::string kSpecial = ":{}[],&*!|>'\"%@`#-?\t\n\\ ";
    std::string g;
    for (size_t i = 0; i < n; ++i) {
      switch (pick(3)) {
        case 0: g += static_cast<char>(pick(256)); break;
        case 1: g += kSpecial[pick(kSpecial.size())]; break;
        default: g += static_cast<char>('a' + pick(26)); break;
      }
    }
    return g;
  }

  std::string mutate(std::string t) {
    std::vector<std::string> ls = lines_of(t);
    switch (pick(9)) {
      case 0: return t.substr(0, pick(t.size() + 1));  // truncate
      case 1: {                                        // swap two lines
        if (ls.size() > 1) std::swap(ls[pick(ls.size())], ls[pick(ls.size())]);
        return join_lines(ls);
      }
      case 2: {  // duplicate a line
        if (!ls.empty()) {
          size_t i = pick(ls.size());
          ls.insert(ls.begin() + i, ls[i]);
        }
        return join_lines(ls);
      }
      case 3: {  // garbage bytes
        size_t at = pick(t.size() + 1);
        return t.insert(at, garbage(1 + pick(8)));
      }
      case 4: {  // a number replaced by a huge, negative or odd one
        static const char* kNums[] = {"-1", "0",    "1e308", "-1e308", "99999999999999999999", "1e-320", "nan", ".inf",
                                      "-0", "0x10", "1_000", "3.5",    "9223372036854775807",  "+7",     "1e19"};
        std::vector<size_t> digits;
        for (size_t i = 0; i < t.size(); ++i)
          if (std::isdigit(static_cast<unsigned char>(t[i])) &&
              (i == 0 || !std::isalnum(static_cast<unsigned char>(t[i - 1]))))
            digits.push_back(i);
        if (digits.empty()) return t;
        size_t at = digits[pick(digits.size())];
        size_t end = at;
        while (end < t.size() && (std::isalnum(static_cast<unsigned char>(t[end])) || t[end] == '.' || t[end] == '-'))
          ++end;
        return t.replace(at, end - at, kNums[pick(std::size(kNums))]);
      }
      case 5: {  // delete characters
        if (t.empty()) return t;
        size_t at = pick(t.size());
        return t.erase(at, 1 + pick(4));
      }
      case 6: {  // typo in a key: swap two adjacent characters of a line
        if (ls.empty()) return t;
        std::string& l = ls[pick(ls.size())];
        if (l.size() > 2) {
          size_t i = pick(l.size() - 1);
          std::swap(l[i], l[i + 1]);
        }
        return join_lines(ls);
      }
      case 7: {  // re-indent a line
        if (ls.empty()) return t;
        std::string& l = ls[pick(ls.size())];
        if (pick(2)) l = std::string(1 + pick(6), ' ') + l;
        else l.erase(0, l.find_first_not_of(' ') == std::string::npos ? 0 : l.find_first_not_of(' '));
        return join_lines(ls);
      }
      default: {  // delete a line
        if (!ls.empty()) ls.erase(ls.begin() + pick(ls.size()));
        return join_lines(ls);
      }
    }
  }
};

// Loads text; returns "ok", "config", "io"; fails the test on anything else.
std::string try_load(const std::string& text, const std::vector<std::string>& sets) {
  try {
    LoadedConfig l = config_load_string(text, "mutant.yaml", sets);
    // An accepted config must survive its own YAML.
    TrainConfig back = config_load_string(config_to_yaml(l.cfg), "back.yaml").cfg;
    back.source = l.cfg.source;
    CHECK_MESSAGE(back == l.cfg, "round trip differs for:\n" << text);
    return "ok";
  } catch (const ConfigError& e) {
    // Every error says where: the file (with line:column when it has one) or the --set.
    std::string m = e.what();
    CHECK_MESSAGE((m.rfind("mutant.yaml", 0) == 0 || m.rfind("--set ", 0) == 0), m);
    return "config";
  } catch (const IoError&) {
    return "io";
  } catch (const std::exception& e) {
    FAIL("unexpected exception " << typeid(e).name() << ": " << e.what() << "\nfor:\n" << text);
  } catch (...) {
    FAIL("unexpected non-std exception for:\n" << text);
  }
  return "";
}

}  // namespace

TEST_CASE("2000 mutants of the shipped configs: accepted or ConfigError, nothing else") {
  for (const char* n : {"DTRAIN_OUTPUT_DIR", "DTRAIN_RDZV_PORT", "DTRAIN_RDZV_ADDR", "DTRAIN_MAX_STEPS", "DTRAIN_SEED",
                        "DTRAIN_DEVICE", "DTRAIN_STEP_TIMEOUT", "DTRAIN_CUDA_GRAPH"})
    ::unsetenv(n);
  std::vector<std::string> texts = shipped_texts();
  REQUIRE(!texts.empty());
  Mutator m{std::mt19937_64(20240611)};
  std::map<std::string, int> outcomes;
  for (int i = 0; i < 2000; ++i) {
    std::string t = texts[m.pick(texts.size())];
    int rounds = 1 + static_cast<int>(m.pick(3));
    for (int r = 0; r < rounds; ++r) t = m.mutate(t);
    outcomes[try_load(t, {})]++;
  }
  MESSAGE("accepted " << outcomes["ok"] << ", rejected " << outcomes["config"]);
  // The mutations are strong enough to break most configs and mild enough to keep some.
  CHECK(outcomes["ok"] > 50);
  CHECK(outcomes["config"] > 500);
}

TEST_CASE("random --set arguments: accepted or ConfigError") {
  static const char* kPaths[] = {"zero_optimization.stage",
                                 "train_batch_size",
                                 "optimizer.params.betas",
                                 "cluster.env.set",
                                 "cluster.env.set.X",
                                 "lora.target_modules",
                                 "model.n_head",
                                 "scheduler.type",
                                 "training.max_steps",
                                 "training.epochs",
                                 "fp16.enabled",
                                 "zero_optimization",
                                 "nonsense.key",
                                 "",
                                 "zero_optimization.offload_param.x"};
  static const char* kValues[] = {"1",        "-5",       "abc", "[1, 2]", "{a: b}", "",         "null",
                                  "auto",     "[",        "}",   "1e999",  "true",   "[q_proj]", "WarmupLR",
                                  "'quoted'", "\x01\xff", "&a",  "*b",     "!!str 3"};
  std::string base(kDefaultConfigYaml);
  std::mt19937_64 rng(7);
  for (int i = 0; i < 300; ++i) {
    std::vector<std::string> sets;
    size_t n = 1 + rng() % 3;
    for (size_t k = 0; k < n; ++k) {
      std::string s = kPaths[rng() % std::size(kPaths)];
      if (rng() % 10) s += "=";
      s += kValues[rng() % std::size(kValues)];
      sets.push_back(s);
    }
    try_load(base, sets);
  }
}
