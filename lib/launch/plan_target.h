// --plan-for: the cluster a dry run plans a job for when that cluster is not this machine
// ("8x80GB", "2x8x80GB", or "80GB" with the hosts from the hostfile): the memory of each
// GPU the plan is held against and the placeholder hosts its ranks are placed on.
#pragma once

#include "config/hostfile.h"

#include <string>

namespace dtrain::launch {

struct PlanTarget {
  int nodes = 0;          ///< 0: the hosts come from the hostfile (SPEC gave only the size)
  int gpus_per_node = 0;  ///< 0 with nodes
  double gpu_bytes = 0;   ///< each GPU's memory
  std::string spec;       ///< as given

  /// "8 GPUs x 80 GB (74.51 GiB) on 1 node", or "GPUs of 80 GB (74.51 GiB)" (hostfile).
  std::string describe() const;
};

/// Parses "[NODES x] GPUS x SIZE" or "SIZE": SIZE is a number with GB (10^9 bytes, as cards
/// are sold: an "80 GB" card reports about 79 GiB, the rest is headroom the plan does not
/// count) or GiB (2^30); 'x' or 'X' between the parts, no spaces. UsageError naming the
/// flag, the value and the grammar for anything else (a count or size of 0, a count over
/// the hostfile's limits, a size over 1 TB).
PlanTarget plan_target_parse(const std::string& spec);

/// The placeholder hosts node1..nodeN with GPUS slots each (never resolved or contacted).
config::Hostfile plan_target_hosts(const PlanTarget& t);

}  // namespace dtrain::launch
