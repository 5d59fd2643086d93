// The environment knobs without a YAML key (DTRAIN_ATTN_VARIANT, DTRAIN_GEMM_ALGO_CACHE, DTRAIN_LOG_LEVEL,
// DTRAIN_NORM_BACKWARD, DTRAIN_NUM_THREADS, DTRAIN_POOL_SPIN_US, DTRAIN_WORKER_PRINT_ENV): declared in the schema, listed by
// --help-config, and a bad value refused by every config load with an error naming the
// variable, the value and what is accepted; good and unset values load as before.
#include "config/schema.h"
#include "config/train_config.h"
#include "core/error.h"

#include <doctest/doctest.h>

#include <cstdlib>
#include <string>
#include <vector>

using namespace dtrain;
using namespace dtrain::config;

namespace {

const std::string kJob =
    "model: {architecture: llama, vocab_size: 512, n_layer: 2, n_head: 4, d_model: 64, max_seq_len: 32}\n"
    "data: {train: x.jsonl}\n"
    "training: {max_steps: 10}\n";

bool has(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }

// Sets an env var for one scope and restores the old value.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    had_ = old != nullptr;
    if (old) old_ = old;
    ::setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (had_) ::setenv(name_, old_.c_str(), 1);
    else ::unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

// The ConfigError text a load gives with name=value set ("" when it loads).
std::string load_error(const char* name, const char* value) {
  ScopedEnv env(name, value);
  try {
    config_load_string(kJob, "t.yaml", {});
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("each env knob is declared once in the schema, beside no YAML key of the same name") {
  std::vector<std::string> names;
  for (const KeySpec& k : schema_env_knobs()) {
    REQUIRE(k.env != nullptr);
    CHECK(std::string(k.path) == k.env);
    CHECK(!k.field);
    CHECK(k.derived != nullptr);  // the default, as text
    CHECK(schema_find(k.env) == nullptr);
    names.push_back(k.env);
  }
  CHECK(names == std::vector<std::string>{"DTRAIN_ATTN_VARIANT", "DTRAIN_GEMM_ALGO_CACHE", "DTRAIN_LOG_LEVEL",
                                          "DTRAIN_NORM_BACKWARD", "DTRAIN_NUM_THREADS", "DTRAIN_POOL_SPIN_US",
                                          "DTRAIN_WORKER_PRINT_ENV"});
  // No YAML key claims one of these variables too.
  for (const KeySpec& k : schema_keys())
    if (k.env)
      for (const auto& n : names) CHECK(n != k.env);
}

TEST_CASE("--help-config lists the env knobs with their type and default") {
  const std::string help = config_help();
  for (const char* want : {"DTRAIN_LOG_LEVEL\n    type: one of: debug, info, warn, error, off\n    default: info",
                           "DTRAIN_ATTN_VARIANT\n    type: one of: legacy, fa2, hopper\n    default: legacy",
                           "DTRAIN_NORM_BACKWARD\n    type: one of: split, fused\n    default: split",
                           "DTRAIN_NUM_THREADS\n    type: an integer in [1, 1024]",
                           "DTRAIN_POOL_SPIN_US\n    type: an integer in [0, 100000]\n    default: 200",
                           "DTRAIN_WORKER_PRINT_ENV\n    type: a string"}) {
    CAPTURE(want);
    CHECK(has(help, want));
  }
}

TEST_CASE("a bad env knob value is a config error naming the variable, the value and what is accepted") {
  struct Case {
    const char *name, *value, *want;
  };
  for (const Case& c : {Case{"DTRAIN_LOG_LEVEL", "verbose", "one of: debug, info, warn, error, off"},
                        Case{"DTRAIN_LOG_LEVEL", "debg", "did you mean debug?"},
                        Case{"DTRAIN_NORM_BACKWARD", "one", "one of: split, fused"},
                        Case{"DTRAIN_NUM_THREADS", "four", "valid range: 1 to 1024"},
                        Case{"DTRAIN_NUM_THREADS", "0", "valid range: 1 to 1024"},
                        Case{"DTRAIN_NUM_THREADS", "4x", "valid range: 1 to 1024"},
                        Case{"DTRAIN_NUM_THREADS", "5000", "valid range: 1 to 1024"},
                        Case{"DTRAIN_POOL_SPIN_US", "-1", "valid range: 0 to 100000"},
                        Case{"DTRAIN_POOL_SPIN_US", "2.5", "valid range: 0 to 100000"},
                        Case{"DTRAIN_ATTN_VARIANT", "flash", "one of: legacy, fa2, hopper"}}) {
    CAPTURE(c.name);
    CAPTURE(c.value);
    const std::string err = load_error(c.name, c.value);
    CHECK(has(err, std::string("env ") + c.name + "=" + c.value));
    CHECK(has(err, c.want));
  }
}

TEST_CASE("good and empty env knob values load") {
  for (auto [name, value] : std::vector<std::pair<const char*, const char*>>{{"DTRAIN_LOG_LEVEL", "debug"},
                                                                             {"DTRAIN_LOG_LEVEL", "off"},
                                                                             {"DTRAIN_LOG_LEVEL", ""},
                                                                             {"DTRAIN_NORM_BACKWARD", "split"},
                                                                             {"DTRAIN_NORM_BACKWARD", "fused"},
                                                                             {"DTRAIN_NUM_THREADS", "1"},
                                                                             {"DTRAIN_NUM_THREADS", "1024"},
                                                                             {"DTRAIN_POOL_SPIN_US", "0"},
                                                                             {"DTRAIN_POOL_SPIN_US", "200"},
                                                                             {"DTRAIN_ATTN_VARIANT", "fa2"},
                                                                             {"DTRAIN_ATTN_VARIANT", "legacy"},
                                                                             {"DTRAIN_ATTN_VARIANT", "hopper"},
                                                                             {"DTRAIN_WORKER_PRINT_ENV", "1"},
                                                                             {"DTRAIN_WORKER_PRINT_ENV", "A,B_2"}}) {
    CAPTURE(name);
    CAPTURE(value);
    CHECK(load_error(name, value) == "");
  }
}
