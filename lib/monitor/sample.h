// One resource sample of a rank process: its host's CPU, memory, network and run-
// directory filesystem (from /proc and statvfs) and its GPU (NVML), as the
// metrics.jsonl record {"kind": "resource", ...} that `dtrain status` reads back.
#pragma once

#include "monitor/nvml.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace dtrain::monitor {

/// The value of a resource record's "kind": metrics.jsonl's other records have no "kind"
/// (and these have no "step", which every reader of training records keys on).
inline constexpr const char* kResourceKind = "resource";

/// Who took the sample.
struct SampleOrigin {
  int rank = 0, local_rank = 0, node = 0, round = 0;
  std::string host;
  /// The launch (DTRAIN_JOB_ID: a new one for every `dtrain launch` and `dtrain resume`),
  /// so that readers can tell an earlier launch's ranks from this one's of the same round.
  std::string job_id{};
};

struct NetRate {
  std::string iface;
  double rx_mbps = 0, tx_mbps = 0;  // MB/s (10^6 bytes) over the last interval
};

struct ResourceSample {
  int64_t time_ms = 0;
  double interval_s = 0;               // since the previous sample (0 on the first: no rates yet)
  std::optional<double> cpu_pct;       // this process, % of one core (several threads: > 100)
  std::optional<double> node_cpu_pct;  // the node, % of all its cores
  std::optional<int64_t> rss_bytes, mem_available_bytes, mem_total_bytes, disk_free_bytes;
  std::vector<NetRate> net;  // interfaces of the process's network namespace
  /// Share of the interval this rank spent inside collectives (0..1; from its
  /// communicator's accounting; absent in a one-rank job and on the first sample).
  std::optional<double> in_collective_frac;
  std::optional<GpuReading> gpu;
};

/// Reads the host figures; rates come from the difference to the previous read().
class HostReader {
 public:
  /// proc_root: "/proc" (tests: a directory of captured files with the same layout:
  /// stat, meminfo, net/dev, self/stat, self/status). disk_path: the run directory.
  HostReader(std::string proc_root, std::string disk_path);
  ResourceSample read();

 private:
  std::string proc_, disk_;
  double ticks_per_s_;
  bool have_prev_ = false;
  double prev_t_ = 0;
  std::optional<uint64_t> prev_proc_;
  std::optional<std::pair<uint64_t, uint64_t>> prev_node_;  // busy, total
  std::map<std::string, std::pair<uint64_t, uint64_t>> prev_net_;
};

/// The metrics.jsonl record: {"kind": "resource", "time_ms", "rank", "local_rank", "node",
/// "host", "round", "job_id" (when known), "interval_s", "cpu_pct", "node_cpu_pct", "rss_bytes",
/// "mem_available_bytes", "mem_total_bytes", "disk_free_bytes", "net_rx_mbps",
/// "net_tx_mbps", "net": {iface: {"rx_mbps", "tx_mbps"}}, "in_collective_frac", "gpu_index", "gpu_util_pct",
/// "gpu_mem_util_pct", "gpu_mem_used_bytes", "gpu_mem_total_bytes", "gpu_temperature_c",
/// "gpu_power_w", "gpu_sm_clock_mhz", "gpu_throttle_reasons"}; absent figures are left out.
nlohmann::json sample_json(const ResourceSample& s, const SampleOrigin& o);

/// A metrics.jsonl record of this kind (kind == "resource").
bool is_resource_record(const nlohmann::json& record);

}  // namespace dtrain::monitor
