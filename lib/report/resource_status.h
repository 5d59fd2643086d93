// The resource monitor's records as `dtrain status` and the live view show them: the
// latest sample of every rank from its own file RUN_DIR/resources/rank<R>.jsonl
// ({"kind": "resource"} records, lib/monitor), grouped by node, and the resource alerts
// (the ranks write theirs into the same files as {"kind": "resource_alert"} records, which
// the launcher copies into events.jsonl).
#pragma once

#include "report/event.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace dtrain::report {

/// The run directory's folder of the monitors' files, one per rank.
inline constexpr const char* RESOURCE_DIR = "resources";

/// The "kind" of a rank's alert record in its resources file: the events.jsonl record
/// ({"event": "resource_alert", ...}, report::event_json) with this "kind" added.
inline constexpr const char* kResourceAlertKind = "resource_alert";

/// Whether a record is a monitor sample ({"kind": "resource"}).
bool is_resource_record(const nlohmann::json& record);

/// RUN_DIR/resources/rank<R>.jsonl: rank R's resource records, written by its monitor only.
std::string resource_file(const std::string& run_dir, int rank);

/// The rank<digits>.jsonl files of RUN_DIR/resources, by rank (none: empty).
std::vector<std::string> resource_files(const std::string& run_dir);

/// One rank's latest resource sample.
struct RankResources {
  int rank = 0;
  int64_t time_ms = 0;
  std::optional<double> cpu_pct;
  std::optional<int64_t> rss_bytes;
  std::optional<int> gpu_index;
  std::optional<double> gpu_util_pct, gpu_temperature_c, gpu_power_w;
  std::optional<int64_t> gpu_mem_used_bytes, gpu_mem_total_bytes, gpu_sm_clock_mhz;
  std::optional<uint64_t> gpu_throttle_reasons;
  std::optional<double> in_collective_frac;  // share of its last interval in collectives
};

/// A node's figures, from the newest sample of any of its ranks.
struct NodeResources {
  int node = 0;
  std::string host;
  int64_t time_ms = 0;
  std::optional<double> node_cpu_pct, net_rx_mbps, net_tx_mbps;
  std::optional<int64_t> mem_available_bytes, mem_total_bytes, disk_free_bytes;
  std::vector<RankResources> ranks;  // by rank
};

struct ResourceAlertRecord {
  int64_t time_ms = 0;
  int node = -1, rank = -1;
  std::string host, alert, why;
};

/// Collects resource records (others are passed over), each rank's in the order its file
/// holds them: a rank's latest is the last one added. nodes() shows only the ranks whose
/// latest record is of the launch ("job_id") and round of the newest record of all (a
/// resized job's ranks that are gone drop out; a `dtrain resume`, whose rounds count from
/// 0 again, neither hides its ranks behind an earlier launch's higher round nor shows an
/// earlier launch's ranks of the same round number). Nodes by number.
class ResourceCollector {
 public:
  void add(const nlohmann::json& record);
  std::vector<NodeResources> nodes() const;

 private:
  std::vector<nlohmann::json> latest_;  // per rank, last record added
};

/// Every rank's records of RUN_DIR/resources (unreadable lines passed over).
std::vector<NodeResources> resource_read(const std::string& run_dir);

/// A "resource_alert" event of events.jsonl, or a rank's alert record; nullopt for any
/// other record.
std::optional<ResourceAlertRecord> resource_alert_of(const nlohmann::json& event);

/// A rank's alert record ({"kind": "resource_alert"}) as the typed event the launcher
/// appends to events.jsonl (the same record without "kind"); nullopt for any other.
std::optional<Event> resource_alert_event(const nlohmann::json& record);

/// The alert records of the last `tail_bytes` of every rank's file of RUN_DIR/resources,
/// oldest first (for `dtrain status` of a `dtrain run` job, which has no launcher to
/// copy them into events.jsonl).
std::vector<ResourceAlertRecord> resource_alerts_read(const std::string& run_dir, uint64_t tail_bytes);

/// The status lines: "  host n1 (node0, sampled 2.1 s ago): cpu 35 %, ..."
/// and one indented line per rank ("    rank 0: cpu 98 %, rss 1.21 GiB, gpu0 97 % ...").
std::string resource_lines(const std::vector<NodeResources>& nodes, int64_t now_ms);

/// The live view's compact line for a node: "node0 n0: cpu 30 % | mem 9.0/32.0 GiB
/// available | net 1.50/0.50 MB/s in/out | rss 2.10 GiB | gpu 95-97 %, mem 40.0-41.2/80 GiB"
/// (ranges over the node's ranks; parts without figures left out).
std::string resource_compact_line(const NodeResources& n);

/// Reads the records appended to the ranks' files of RUN_DIR/resources since the tail was
/// made (complete lines only): what a file held then belongs to earlier rounds; a file
/// that appears later is read from its start.
class ResourceTail {
 public:
  explicit ResourceTail(std::string run_dir);
  /// Feeds the new samples to the collector and appends the new alert records to *alerts
  /// (when given); true when there was at least one of either.
  bool poll(ResourceCollector& into, std::vector<nlohmann::json>* alerts = nullptr);

 private:
  std::string run_dir_;
  std::map<std::string, uint64_t> offset_;  // per file
};

}  // namespace dtrain::report
