// Readers of what a training run leaves in its directory, for the end-to-end tests:
// the F32 tensors of a safetensors file, the largest relative difference of two such
// files, the (step, loss) records of metrics.jsonl and the resource monitor's records of
// resources/rank<R>.jsonl.
#pragma once

#include "cli_harness.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace dtrain::cli_test {

/// Every tensor of a safetensors file (all must be F32), by name.
inline std::map<std::string, std::vector<float>> tensors_read(const std::string& path) {
  std::map<std::string, std::vector<float>> out;
  const std::string bytes = read_text(path);
  REQUIRE_MESSAGE(bytes.size() >= 8, path << " is missing or too short");
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  REQUIRE(8 + n <= bytes.size());
  const auto head = nlohmann::json::parse(bytes.substr(8, n));
  for (const auto& [name, t] : head.items()) {
    if (name == "__metadata__") continue;
    // F32, or BF16 (export.dtype's default) widened exactly.
    const bool bf16 = t.at("dtype") == "BF16";
    REQUIRE_MESSAGE((t.at("dtype") == "F32" || bf16), path << ": " << name << " is " << t.at("dtype"));
    const size_t a = t.at("data_offsets")[0].get<size_t>(), b = t.at("data_offsets")[1].get<size_t>();
    REQUIRE(8 + n + b <= bytes.size());
    std::vector<float> v((b - a) / (bf16 ? 2 : 4));
    if (!bf16) std::memcpy(v.data(), bytes.data() + 8 + n + a, b - a);
    for (size_t i = 0; bf16 && i < v.size(); ++i) {
      uint16_t h;
      std::memcpy(&h, bytes.data() + 8 + n + a + 2 * i, 2);
      const uint32_t w = static_cast<uint32_t>(h) << 16;
      std::memcpy(&v[i], &w, 4);
    }
    out[name] = std::move(v);
  }
  return out;
}

/// Largest |a - b| / max(1, |b|) over every tensor; infinity when the tensor sets differ.
inline double weights_diff(const std::string& a_path, const std::string& b_path) {
  const auto a = tensors_read(a_path), b = tensors_read(b_path);
  if (a.size() != b.size() || a.empty()) return INFINITY;
  double d = 0;
  for (const auto& [name, va] : a) {
    auto it = b.find(name);
    if (it == b.end() || it->second.size() != va.size()) return INFINITY;
    for (size_t i = 0; i < va.size(); ++i)
      d = std::max(d, std::fabs(static_cast<double>(va[i]) - it->second[i]) /
                          std::max(1.0, std::fabs(static_cast<double>(it->second[i]))));
  }
  return d;
}

/// (step, loss) of every training record in metrics.jsonl, in file order.
inline std::vector<std::pair<int64_t, double>> metric_losses(const std::string& run_dir) {
  std::vector<std::pair<int64_t, double>> out;
  for (const auto& line : split_lines(read_text(run_dir + "/metrics.jsonl"))) {
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.contains("loss")) out.emplace_back(j.at("step").get<int64_t>(), j.at("loss").get<double>());
  }
  return out;
}

/// The resource records of RUN_DIR/resources/rank<R>.jsonl, file by file; each line must be
/// a whole record of the file's own rank (one writer per file: nothing torn, nothing
/// foreign), a sample or an alert record ({"kind": "resource_alert"}, passed over here).
inline std::vector<nlohmann::json> resource_records(const std::string& run_dir) {
  std::vector<nlohmann::json> out;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(run_dir + "/resources", ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    INFO(it->path().string());
    REQUIRE((name.rfind("rank", 0) == 0 && name.size() > 10 && name.substr(name.size() - 6) == ".jsonl"));
    const int rank = std::stoi(name.substr(4, name.size() - 10));
    for (const auto& line : split_lines(read_text(it->path().string()))) {
      INFO(line);
      const auto j = nlohmann::json::parse(line, nullptr, false);
      REQUIRE(j.is_object());
      CHECK(j.value("rank", -1) == rank);
      if (j.value("kind", "") == "resource_alert") continue;
      CHECK(j.value("kind", "") == "resource");
      out.push_back(j);
    }
  }
  return out;
}

/// How many records of RUN_DIR/metrics.jsonl are resource records (the trainer's file: none).
inline int metrics_resource_records(const std::string& run_dir) {
  int n = 0;
  for (const auto& line : split_lines(read_text(run_dir + "/metrics.jsonl"))) {
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.value("kind", "") == "resource") ++n;
  }
  return n;
}

}  // namespace dtrain::cli_test
