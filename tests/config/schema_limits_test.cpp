// Integer limits and the file-size cap: every INT key of the schema, through every source
// (--set, YAML, JSON, env), rejects values its storage width cannot hold with the key,
// the value as written and the valid range; a value at the limit is accepted. A config
// that is a device or larger than the cap is a ConfigError naming the file.
#include "config/load_detail.h"
#include "config/schema.h"
#include "config/train_config.h"
#include "core/error.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <unistd.h>
#include <vector>

using namespace dtrain;
using namespace dtrain::config;

namespace {

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

const std::string k2p32p1 = "4294967297";               // 2^32 + 1: wraps to 1 in 32 bits
const std::string k2p31 = "2147483648";                 // 2^31: wraps to INT_MIN in 32 bits
const std::string kMinus2p63 = "-9223372036854775808";  // -2^63: INT64_MIN
const std::string k2p63 = "9223372036854775808";        // 2^63: INT64_MAX + 1
const std::string k2p64p1 = "18446744073709551617";     // 2^64 + 1: wraps to 1 in 64 bits

// The int64 value spec's field holds in cfg (either int64_t or optional<int64_t>).
int64_t field_value(TrainConfig& cfg, const KeySpec& spec) {
  int64_t out = 0;
  std::visit(
      [&](auto* p) {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, int64_t>) out = *p;
        else if constexpr (std::is_same_v<T, std::optional<int64_t>>) out = p->value_or(-424242);
        else FAIL("not an integer field: " << spec.path);
      },
      spec.field(cfg));
  return out;
}

// The error config_apply_text gives for text, or "" when it accepts it.
std::string convert_error(const KeySpec& spec, const std::string& text) {
  TrainConfig cfg;
  try {
    config_apply_text(cfg, spec, text, "--set " + std::string(spec.path) + "=" + text);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

// YAML text that sets path ("a.b.c") to value, nested, the value on the last line.
std::string nested_yaml(const std::string& path, const std::string& value) {
  std::string out, indent;
  size_t start = 0;
  for (size_t dot; (dot = path.find('.', start)) != std::string::npos; start = dot + 1) {
    out += indent + path.substr(start, dot - start) + ":\n";
    indent += "  ";
  }
  return out + indent + path.substr(start) + ": " + value + "\n";
}

std::string nested_json(const std::string& path, const std::string& value) {
  std::string open, close;
  size_t start = 0;
  for (size_t dot; (dot = path.find('.', start)) != std::string::npos; start = dot + 1) {
    open += "{\"" + path.substr(start, dot - start) + "\": ";
    close += "}";
  }
  return open + "{\"" + path.substr(start) + "\": " + value + "}" + close + "\n";
}

std::string fmt_range(const IntRange& r) {
  return "valid range: " + std::to_string(r.lo) + " to " + std::to_string(r.hi);
}

std::string load_error(const std::string& text, const std::string& name, const std::vector<std::string>& sets = {}) {
  try {
    config_load_string(text, name, sets);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("every integer key: values its width cannot hold are rejected, its limits are accepted") {
  int swept = 0;
  for (const KeySpec& spec : schema_keys()) {
    if (spec.type != KeyType::INT) continue;
    ++swept;
    INFO(spec.path);
    const IntRange r = key_int_range(spec);
    // 32-bit unless declared otherwise; no key accepts a negative value it could wrap to.
    if (spec.width == IntWidth::I32) {
      CHECK(r.hi <= std::numeric_limits<int32_t>::max());
      CHECK(r.lo >= std::numeric_limits<int32_t>::min());
    }
    CHECK(r.lo >= 0);
    const std::string range = fmt_range(r);
    std::vector<std::string> bads = {
        kMinus2p63, "1.5", "abc", "99999999999999999999", "1e300", "1e400", std::to_string(r.hi) + "0", k2p63, k2p64p1};
    if (spec.width == IntWidth::I32) bads.insert(bads.end(), {k2p32p1, k2p31});
    for (const std::string& bad : bads) {
      INFO(bad);
      std::string e = convert_error(spec, bad);
      CHECK(has(e, std::string("--set ") + spec.path + "=" + bad + ": " + spec.path + ":"));
      CHECK(has(e, "'" + bad + "'"));  // the value as written
      CHECK(has(e, range));
    }
    // The limits themselves convert and are stored exactly; one past them does not.
    for (int64_t ok : {r.lo, r.hi}) {
      TrainConfig cfg;
      CHECK(config_apply_text(cfg, spec, std::to_string(ok), "--set"));
      CHECK(field_value(cfg, spec) == ok);
    }
    if (r.hi < std::numeric_limits<int64_t>::max()) CHECK(!convert_error(spec, std::to_string(r.hi + 1)).empty());
    if (r.lo > std::numeric_limits<int64_t>::min()) CHECK(!convert_error(spec, std::to_string(r.lo - 1)).empty());
  }
  CHECK(swept >= 30);
}

TEST_CASE("the ZeRO element counts are 64-bit (size_t in the engine): billions convert, 2^63 does not") {
  const KeySpec* spec = schema_find("zero_optimization.reduce_bucket_size");
  REQUIRE(spec != nullptr);
  CHECK(spec->width == IntWidth::I64);
  TrainConfig cfg;
  CHECK(config_apply_text(cfg, *spec, "5e9", "--set"));
  CHECK(cfg.zero.reduce_bucket_size == 5000000000);
  std::string e = convert_error(*spec, k2p63);
  CHECK(has(e, "valid range: 1 to 9223372036854775807"));
  CHECK(!has(e, "32-bit"));
}

TEST_CASE("every integer key: the same check from --set, YAML, JSON and env, through the whole load") {
  for (const KeySpec& spec : schema_keys()) {
    if (spec.type != KeyType::INT) continue;
    INFO(spec.path);
    const std::string range = fmt_range(key_int_range(spec));
    std::vector<std::string> bads = {kMinus2p63, k2p63};
    if (spec.width == IntWidth::I32) bads.insert(bads.end(), {k2p32p1, k2p31});
    for (const std::string& bad : bads) {
      INFO(bad);
      std::string e = load_error("wall_clock_breakdown: false\n", "base.yaml", {std::string(spec.path) + "=" + bad});
      CHECK(has(e, std::string(spec.path) + ": expected an integer"));
      CHECK(has(e, "'" + bad + "'"));
      CHECK(has(e, range));

      std::string yaml = nested_yaml(spec.path, bad);
      const size_t line = static_cast<size_t>(std::count(yaml.begin(), yaml.end(), '\n'));
      const size_t last = yaml.rfind('\n', yaml.size() - 2);
      const std::string last_line = yaml.substr(last == std::string::npos ? 0 : last + 1);
      const size_t col = last_line.find(": ") + 3;  // 1-based column of the value
      e = load_error(yaml, "t.yaml");
      CHECK(has(e, "t.yaml:" + std::to_string(line) + ":" + std::to_string(col) + ": " + spec.path + ":"));
      CHECK(has(e, range));

      e = load_error(nested_json(spec.path, bad), "t.json");
      CHECK(has(e, "t.json:1:"));
      CHECK(has(e, std::string(spec.path) + ": expected an integer"));
      CHECK(has(e, range));

      if (spec.env) {
        ::setenv(spec.env, bad.c_str(), 1);
        e = load_error("wall_clock_breakdown: false\n", "base.yaml");
        ::unsetenv(spec.env);
        CHECK(has(e, std::string("env ") + spec.env + "=" + bad + ": " + spec.path));
        CHECK(has(e, range));
      }
    }
  }
}

TEST_CASE("the wrap of finding 4: n_layer 2^32+1 and micro batch 2^31 name the key, value and range") {
  std::string e = load_error("wall_clock_breakdown: false\n", "base.yaml", {"model.n_layer=4294967297"});
  CHECK(has(e,
            "--set model.n_layer=4294967297: model.n_layer: expected an integer >= 1, got '4294967297'; "
            "valid range: 1 to 2147483647 (stored as a 32-bit integer)"));
  e = load_error("train_micro_batch_size_per_gpu: 2147483648\n", "ds.yaml");
  CHECK(has(e, "ds.yaml:1:33: train_micro_batch_size_per_gpu:"));
  CHECK(has(e, "'2147483648'"));
  CHECK(has(e, "valid range: 1 to 2147483647"));
  // DeepSpeed's float spelling is still an integer, and checked the same way.
  e = load_error("train_batch_size: 5e9\n", "ds.yaml");
  CHECK(has(e, "ds.yaml:1:19: train_batch_size:"));
  CHECK(has(e, "'5e9'"));
  CHECK(*config_load_string("train_batch_size: 5e8\n", "ds.yaml").cfg.train_batch_size == 500000000);
  // A bounded key names its own bounds, not the width's.
  e = load_error("cluster: {ssh: {port: 4294967318}}\n", "c.yaml");
  CHECK(has(e, "valid range: 1 to 65535"));
  CHECK(!has(e, "32-bit"));
}

TEST_CASE("config files: devices and files over the cap are ConfigErrors naming the file") {
  for (const char* dev : {"/dev/zero", "/dev/null"}) {
    INFO(dev);
    try {
      config_load_file(dev);
      FAIL("no throw");
    } catch (const ConfigError& e) {
      CHECK(has(e.what(), "config file '" + std::string(dev) + "' is not a regular file (a character device)"));
    }
  }
  auto dir = std::filesystem::temp_directory_path() / ("dtrain_cfg_cap_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  auto big = dir / "big.yaml";
  {
    std::ofstream out(big);
    out << "wall_clock_breakdown: false\n";
  }
  std::filesystem::resize_file(big, kConfigMaxBytes + 1);  // sparse: no disk, no memory
  try {
    config_load_file(big.string());
    FAIL("no throw");
  } catch (const ConfigError& e) {
    CHECK(has(e.what(), "config file '" + big.string() + "' is " + std::to_string(kConfigMaxBytes + 1) + " bytes"));
    CHECK(has(e.what(), "16 MiB"));
  }
  // A file exactly at the cap is read and loads.
  {
    std::string head = "wall_clock_breakdown: true\n#";
    std::ofstream out(big, std::ios::trunc);
    out << head << std::string(kConfigMaxBytes - head.size() - 1, 'x') << "\n";
  }
  REQUIRE(std::filesystem::file_size(big) == kConfigMaxBytes);
  CHECK(config_load_file(big.string()).cfg.wall_clock_breakdown);
  std::filesystem::remove_all(dir);
}
