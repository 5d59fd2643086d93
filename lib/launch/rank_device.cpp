#include "launch/rank_device.h"

#include <fmt/format.h>

#include <algorithm>

namespace dtrain::launch {

namespace {

std::string ids_text(const std::vector<int>& devices) {
  std::string out;
  for (size_t i = 0; i < devices.size(); ++i) out += (i ? "," : "") + std::to_string(devices[i]);
  return out;
}

std::string ranks_text(const NodePlan& n) {
  const int last = n.first_rank + static_cast<int>(n.ranks.size()) - 1;
  return n.ranks.size() == 1 ? fmt::format("rank {}", n.first_rank) : fmt::format("ranks {}-{}", n.first_rank, last);
}

}  // namespace

NodeDeviceVerdict node_device_verdict(std::string_view choice, int visible, const std::vector<int>& devices,
                                      std::string_view host) {
  if (choice == "cpu") return {"cpu", ""};
  const int need = devices.empty() ? 0 : *std::max_element(devices.begin(), devices.end()) + 1;
  const bool fits = visible > 0 && need <= visible;
  if (choice == "auto") return {fits ? "cuda" : "cpu", ""};
  if (choice != "cuda") return {"", fmt::format("training.device must be auto, cpu or cuda, got \"{}\"", choice)};
  if (fits) return {"cuda", ""};
  if (visible <= 0)
    return {"", fmt::format("training.device = cuda, but {} sees no CUDA device (a CPU-only build, no driver, "
                            "or CUDA_VISIBLE_DEVICES empty there): run on GPU nodes or set training.device: cpu",
                            host)};
  return {"", fmt::format("training.device = cuda, but {} sees {} CUDA device(s) and its ranks need device(s) {}: "
                          "give that host at most {} slot(s) in the hostfile (or fix CUDA_VISIBLE_DEVICES there)",
                          host, visible, ids_text(devices), visible)};
}

NodeDeviceVerdict rank_device_agree(const std::vector<std::pair<std::string, NodeDeviceVerdict>>& nodes) {
  for (const auto& [host, v] : nodes)
    if (!v.problem.empty()) return {"", v.problem};
  const std::string* cuda_host = nullptr;
  const std::string* cpu_host = nullptr;
  for (const auto& [host, v] : nodes) {
    if (v.device == "cuda" && !cuda_host) cuda_host = &host;
    if (v.device == "cpu" && !cpu_host) cpu_host = &host;
  }
  if (cuda_host && cpu_host)
    return {"", fmt::format("training.device = auto: {} has the GPUs its ranks need and {} has not, and one job "
                            "uses one collective backend: run on nodes that all have GPUs, or set training.device "
                            "to cpu (or cuda, to be told which host lacks them)",
                            *cuda_host, *cpu_host)};
  return {cuda_host ? "cuda" : "cpu", ""};
}

std::string rank_backend_name(std::string_view device, int world_size) {
  if (world_size <= 1) return "none (1 rank)";
  return device == "cuda" ? "nccl" : "gloo";
}

std::vector<std::string> rank_device_plan_lines(const Plan& plan, std::string_view choice) {
  std::vector<std::string> out;
  const bool one = plan.world_size <= 1;
  for (const NodePlan& n : plan.nodes) {
    std::vector<int> ids;
    for (const RankInfo& r : n.ranks) ids.push_back(r.device);
    const std::string host = n.host.destination();
    const std::string head = fmt::format("node {} ({}): {}", n.node_rank, host, ranks_text(n));
    const std::string cuda_where =
        fmt::format("cuda device{} {} (CUDA_VISIBLE_DEVICES)", ids.size() == 1 ? "" : "s", ids_text(ids));
    if (choice == "cuda")
      out.push_back(
          fmt::format("{} on {}, {}", head, cuda_where, one ? "no collectives (1 rank)" : "collectives over nccl"));
    else if (choice == "auto")
      out.push_back(fmt::format(
          "{} on {} if {} sees them, else the cpu (training.device auto), {}", head, cuda_where, host,
          one ? "no collectives (1 rank)" : "collectives over nccl when every node has its GPUs, else gloo"));
    else
      out.push_back(fmt::format("{} on the cpu, {}", head, one ? "no collectives (1 rank)" : "collectives over gloo"));
  }
  return out;
}

std::string device_verdict_key(int node_rank) { return fmt::format("device/node{}", node_rank); }

std::string device_verdict_value(const NodeDeviceVerdict& v, std::string_view host) {
  return v.problem.empty() ? v.device + "\n" + std::string(host) : "error\n" + v.problem;
}

std::pair<std::string, NodeDeviceVerdict> device_verdict_parse(const std::string& value, const std::string& who) {
  const size_t nl = value.find('\n');
  const std::string head = value.substr(0, nl), rest = nl == std::string::npos ? "" : value.substr(nl + 1);
  if (head == "error") return {who, NodeDeviceVerdict{"", rest}};
  return {rest, NodeDeviceVerdict{head, ""}};
}

}  // namespace dtrain::launch
