// The launcher's view of the ranks' resource monitors during a round: their files tailed
// at most once per monitor.interval, one compact line per node for the live view, the
// ranks' alert records to copy into events.jsonl (its one writer), and the alerts only
// the whole job's samples can show (network_idle).
#pragma once

#include "config/train_config.h"
#include "launch/placement.h"
#include "report/event.h"
#include "report/network_idle.h"
#include "report/resource_status.h"

#include <chrono>
#include <string>
#include <vector>

namespace dtrain::launch {

/// Whether the plan's nodes are on more than one host: hosts this machine answers to
/// count as one (ranks that share a host talk over loopback or shared memory).
bool plan_spans_hosts(const Plan& plan);

class ResourceView {
 public:
  /// Made before the round's agents start: what the files hold then is earlier rounds'.
  ResourceView(const std::string& run_dir, const config::MonitorConfig& cfg, const Plan& plan, int round);

  struct Update {
    std::vector<std::string> lines;     // the live view's, one per node (none: nothing new)
    std::vector<report::Event> copied;  // the ranks' alerts (their logs said them already)
    std::vector<report::Event> raised;  // network_idle episodes that begin now
  };
  /// Reads what the ranks appended since the last look, when monitor.interval (and a
  /// second) has passed since then; nothing otherwise.
  Update poll(std::chrono::steady_clock::time_point now);
  /// At the round's end: the ranks' alert records not copied yet (read at once).
  std::vector<report::Event> drain();

 private:
  bool enabled_;
  int round_;
  std::vector<std::string> hosts_;  // the plan's, by node: what the hostfile calls them
  std::chrono::steady_clock::duration every_;
  std::chrono::steady_clock::time_point last_;
  report::ResourceTail tail_;
  report::ResourceCollector collector_;
  report::NetworkIdleWatch idle_;

  bool read(Update& u);
};

}  // namespace dtrain::launch
