// Which device a rank trains on (training.device: auto | cpu | cuda) and which
// collective backend follows from it (NCCL on CUDA, Gloo on the CPU, none for 1 rank).
//
// The launcher cannot see remote GPUs, so the choice is made in two places:
//   - each node's agent, before it starts any rank, counts the CUDA devices it sees and
//     turns the config's choice into a verdict for its ranks (node_device_verdict);
//   - with more than one node the agents publish their verdicts in the round's store and
//     all read all of them (rank_device_agree): one job uses one backend, so `auto`
//     across nodes of which only some have GPUs is refused, naming them.
// The agent hands the outcome ("cpu" or "cuda") to its ranks as DTRAIN_DEVICE; local
// rank i opens CUDA device i of its CUDA_VISIBLE_DEVICES (the node's slots).
#pragma once

#include "launch/placement.h"

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dtrain::launch {

/// One node's verdict: device "cpu" or "cuda", or a problem (device empty) that names
/// the host and says what to do.
struct NodeDeviceVerdict {
  std::string device;
  std::string problem;
};

/// choice: "cpu", "cuda" or "auto". visible: CUDA devices the agent sees on `host`.
/// devices: the physical device ids (hostfile slots) of the node's ranks, local rank
/// order. cuda needs every id < visible; auto picks cuda exactly when that holds.
NodeDeviceVerdict node_device_verdict(std::string_view choice, int visible, const std::vector<int>& devices,
                                      std::string_view host);

/// The job's device from every node's (host, verdict) in node order: the first problem
/// found is the job's problem; nodes that disagree (auto with GPUs on only some nodes)
/// are a problem naming a node of each kind.
NodeDeviceVerdict rank_device_agree(const std::vector<std::pair<std::string, NodeDeviceVerdict>>& nodes);

/// "nccl", "gloo" or "none (1 rank)".
std::string rank_backend_name(std::string_view device, int world_size);

/// One line per node for --dry-run and the launcher's first lines: which device each of
/// its ranks uses and over which backend, e.g.
///   "node 0 (gpu1): ranks 0-1 on cuda devices 0,1 (CUDA_VISIBLE_DEVICES), collectives over nccl"
///   "node 0 (localhost): rank 0 on the cpu, no collectives (1 rank)"
///   "node 1 (gpu2): ranks 2-3 on cuda devices 0,1 if gpu2 sees them, else the cpu (auto), ..."
std::vector<std::string> rank_device_plan_lines(const Plan& plan, std::string_view choice);

/// Store key under which node k's agent publishes its verdict (device_verdict_value).
std::string device_verdict_key(int node_rank);

/// A verdict as published in the store: "<device>\n<host>", or "error\n<problem>".
std::string device_verdict_value(const NodeDeviceVerdict& v, std::string_view host);

/// The (host, verdict) pair rank_device_agree takes, from a published value; `who`
/// ("node 2", "rank 5") stands for the host of a verdict that is an error.
std::pair<std::string, NodeDeviceVerdict> device_verdict_parse(const std::string& value, const std::string& who);

}  // namespace dtrain::launch
