// `dtrain run`'s join: one claimant per rank, one config per set.
#include "rank/external_join.h"

#include "core/check.h"

#include <fmt/format.h>

#include <map>
#include <sstream>

namespace dtrain::rank {

namespace {

bool excluded(const std::string& key) {
  for (const char* section : {"cluster.", "doctor.", "elastic."})
    if (key.rfind(section, 0) == 0) return true;
  return key == "training.output_dir" || key == "tensorboard.output_path";
}

// "key=value" lines -> key -> value (a value holds no newline: config_key_values quotes).
std::map<std::string, std::string> parse(const std::string& text) {
  std::map<std::string, std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    const size_t eq = line.find('=');
    if (eq != std::string::npos) out[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return out;
}

std::string claim_key(int rank) { return fmt::format("join/claims/rank{}", rank); }
std::string who_key(int rank, int64_t n) { return fmt::format("join/who/rank{}/{}", rank, n); }

}  // namespace

std::string external_config_text(const config::TrainConfig& cfg) {
  std::string out;
  for (const auto& [key, value] : config::config_key_values(cfg))
    if (!excluded(key)) out += key + "=" + value + "\n";
  return out;
}

std::vector<std::string> external_config_diff(const std::string& rank0, const std::string& mine, int rank) {
  const auto a = parse(rank0), b = parse(mine);
  std::map<std::string, std::pair<std::string, std::string>> keys;
  for (const auto& [k, v] : a) keys[k].first = v;
  for (const auto& [k, v] : b) keys[k].second = v;
  std::vector<std::string> out;
  for (const auto& [k, v] : keys) {
    if (a.count(k) && b.count(k) && v.first == v.second) continue;
    out.push_back(fmt::format("{} (rank 0: {}, rank {}: {})", k, a.count(k) ? v.first : "(unset)", rank,
                              b.count(k) ? v.second : "(unset)"));
  }
  return out;
}

void external_join_claim(rendezvous::PrefixStore& store, int rank, const std::string& who, const std::string& stop_key,
                         std::chrono::milliseconds timeout) {
  const int64_t n = store.add(claim_key(rank), 1);
  store.set(who_key(rank, n), who);
  if (n == 1) return;
  // The first claimant sets its name right after its ADD; a process that died in between
  // leaves none, and the refusal stands without it.
  std::string first = "another process";
  try {
    first = store.get(who_key(rank, 1), timeout);
  } catch (const CommError&) {
  }
  const std::string why = fmt::format(
      "rank {} was started twice: by {} and again by {}; every process of the job needs its own rank "
      "(check RANK / the launcher's rank variable of each; a process of an earlier set may still run)",
      rank, first, who);
  try {
    store.set(stop_key, why);
  } catch (const CommError&) {
  }
  DT_THROW(UsageError, "{}", why);
}

void external_config_publish(rendezvous::PrefixStore& store, const std::string& text) {
  store.set("join/config", text);
}

void external_config_check(rendezvous::PrefixStore& store, const std::string& text, int rank,
                           std::chrono::milliseconds timeout) {
  const std::string rank0 = store.get("join/config", timeout);
  const std::vector<std::string> diff = external_config_diff(rank0, text, rank);
  if (diff.empty()) return;
  std::string list;
  for (size_t i = 0; i < diff.size() && i < 12; ++i) list += (i ? "; " : "") + diff[i];
  if (diff.size() > 12) list += fmt::format("; and {} more", diff.size() - 12);
  DT_THROW(ConfigError,
           "this process's config differs from rank 0's in {} key(s): {}; every process of the job must run the same "
           "config (the same --config file and --set arguments)",
           diff.size(), list);
}

}  // namespace dtrain::rank
