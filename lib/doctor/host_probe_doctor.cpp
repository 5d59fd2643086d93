// The doctor-backed host probe: one preflight_nodes call per host, with the host's
// selected slots as its ranks and its hostfile index as its node number.
#include "doctor/host_probe_doctor.h"

#include "doctor/doctor.h"

#include <fmt/format.h>

#include <algorithm>

namespace dtrain::doctor {

namespace {

class DoctorProbe : public launch::HostProbe {
 public:
  DoctorProbe(const launch::Job& job, launch::NodeSpawner spawner, std::string build)
      : job_(job), spawner_(std::move(spawner)), build_(std::move(build)) {
    auto& t = job_.cfg.doctor.timeout;
    if (job_.cfg.elastic.probe_timeout > 0) t = std::min(t, job_.cfg.elastic.probe_timeout);
  }

  launch::ProbeResult probe(const config::HostEntry& host) override {
    launch::NodePlan node;
    node.node_rank = host_index(host);
    node.host = host;
    const int slots = host.slot_ids.empty() ? std::max(host.slots, 1) : static_cast<int>(host.slot_ids.size());
    for (int i = 0; i < slots; ++i) {
      const int dev = host.slot_ids.empty() ? i : host.slot_ids[static_cast<size_t>(i)];
      node.ranks.push_back({i, i, slots, node.node_rank, dev});
      node.cuda_visible_devices += (i ? "," : "") + std::to_string(dev);
    }
    Report r = preflight_nodes(job_, spawner_, {node}, build_);
    if (r.ok()) return {true, ""};
    // The node's own findings without the "node K (host): " prefix: the membership
    // change already names the host.
    std::string why;
    for (const Finding& f : r.findings) {
      if (f.status != Status::FAIL) continue;
      if (!why.empty()) why += "; ";
      why += fmt::format("preflight {}: {}", f.check, f.detail);
      if (!f.advice.empty()) why += "; " + f.advice;
    }
    return {false, why.empty() ? preflight_message(r) : why};
  }

 private:
  // The host's index in the job's hostfile (its node number in findings), or the next
  // free number for a host the hostfile does not list.
  int host_index(const config::HostEntry& h) const {
    const auto& hs = job_.hosts.hosts;
    for (size_t i = 0; i < hs.size(); ++i)
      if (hs[i].host == h.host && hs[i].user == h.user && hs[i].port == h.port) return static_cast<int>(i);
    return static_cast<int>(hs.size());
  }

  launch::Job job_;
  launch::NodeSpawner spawner_;
  std::string build_;
};

}  // namespace

std::unique_ptr<launch::HostProbe> host_probe_doctor(const launch::Job& job, launch::NodeSpawner spawner,
                                                     const std::string& expected_build_id) {
  return std::make_unique<DoctorProbe>(job, std::move(spawner), expected_build_id);
}

}  // namespace dtrain::doctor
