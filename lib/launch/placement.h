// Rank placement: which global ranks run on which node and device. Node ranks follow
// hostfile order, global ranks are contiguous per node, and each node's local ranks
// index its CUDA_VISIBLE_DEVICES list (right for nodes with different slot counts).
#pragma once

#include "config/hostfile.h"

#include <string>
#include <vector>

namespace dtrain::launch {

/// One rank process. `device` is the physical device id (the hostfile slot id);
/// because the node's CUDA_VISIBLE_DEVICES lists its selected slots in order, the rank
/// opens CUDA device `local_rank` inside its process.
struct RankInfo {
  int rank = 0;
  int local_rank = 0;
  int local_world_size = 0;
  int node_rank = 0;
  int device = 0;
};

struct NodePlan {
  int node_rank = 0;
  config::HostEntry host;
  int first_rank = 0;                // global rank of local rank 0
  std::vector<RankInfo> ranks;       // local rank order
  std::string cuda_visible_devices;  // selected slot ids joined by ',' ("1,3")
};

struct Plan {
  std::vector<NodePlan> nodes;
  int world_size = 0;
  std::string master_addr;
  int master_port = 0;
};

/// Plans every selected slot of `hf` (apply config::hostfile_select first).
/// ConfigError for an empty hostfile, an empty master_addr or a port outside 1..65535.
Plan plan_placement(const config::Hostfile& hf, const std::string& master_addr, int master_port);

/// Human-readable table, one row per node:
///     node  host              ranks   local  devices
///     0     node1             0-7     8      0,1,2,3,4,5,6,7
/// followed by a "world size W, master A:P" line.
std::string plan_format_table(const Plan& plan);

}  // namespace dtrain::launch
