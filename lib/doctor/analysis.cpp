// Verdicts of the doctor checks from the nodes' observations; bandwidth-table summary.
#include "doctor/analysis.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>

namespace dtrain::doctor {

namespace {

std::string short_id(const std::string& id) { return id.size() > 16 ? id.substr(0, 16) : id; }

std::string node_label(const std::vector<NodeObservation>& nodes, int k) {
  for (const auto& n : nodes)
    if (n.node == k) return fmt::format("node {} ({})", k, n.host);
  return fmt::format("node {}", k);
}

Finding make(const NodeObservation& n, const char* check, Status s, std::string detail, std::string advice = "") {
  return {n.node, n.host, check, s, std::move(detail), std::move(advice)};
}

std::string gib(int64_t bytes) {
  return fmt::format("{:.1f} GiB", static_cast<double>(bytes) / (1024.0 * 1024 * 1024));
}

}  // namespace

const char* status_name(Status s) {
  switch (s) {
    case Status::OK: return "ok";
    case Status::WARN: return "warn";
    case Status::FAIL: return "FAIL";
  }
  return "?";
}

std::string node_nonce_name(int node) { return fmt::format("node{}", node); }

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

std::string rate_text(double r) {
  if (r >= 1e9) return fmt::format("{:.2f} GB/s", r / 1e9);
  if (r >= 1e6) return fmt::format("{:.1f} MB/s", r / 1e6);
  return fmt::format("{:.0f} KB/s", r / 1e3);
}

NetworkSummary network_summarize(const std::vector<LinkSample>& links, int nnodes, double slow_factor) {
  NetworkSummary s;
  s.links = links;
  s.node_best.assign(static_cast<size_t>(std::max(nnodes, 0)), 0.0);
  for (size_t i = 0; i < links.size(); ++i) {
    const LinkSample& l = links[i];
    const double bw = l.bandwidth();
    if (bw <= 0) continue;
    if (s.slowest < 0 || bw < links[static_cast<size_t>(s.slowest)].bandwidth()) s.slowest = static_cast<int>(i);
    for (int k : {l.a, l.b})
      if (k >= 0 && k < nnodes) s.node_best[static_cast<size_t>(k)] = std::max(s.node_best[static_cast<size_t>(k)], bw);
  }
  std::vector<double> measured;
  for (double b : s.node_best)
    if (b > 0) measured.push_back(b);
  s.median_node = median(measured);
  if (s.median_node <= 0 || slow_factor <= 0) return s;
  const double bar = s.median_node / slow_factor;
  for (int k = 0; k < nnodes; ++k)
    if (s.node_best[static_cast<size_t>(k)] > 0 && s.node_best[static_cast<size_t>(k)] < bar) s.slow_nodes.push_back(k);
  for (size_t i = 0; i < links.size(); ++i)
    if (links[i].bandwidth() > 0 && links[i].bandwidth() < bar) s.slow_links.push_back(static_cast<int>(i));
  return s;
}

namespace {

// The driver most GPU nodes run: a node with another one is worth a warning.
std::string common_driver_of(const std::vector<NodeObservation>& nodes) {
  std::map<std::string, int> drivers;
  for (const auto& n : nodes)
    if (n.facts && n.facts->gpus > 0) ++drivers[n.facts->driver];
  std::string common_driver;
  int common_count = 0;
  for (const auto& [d, c] : drivers)
    if (c > common_count) common_driver = d, common_count = c;
  return common_driver;
}

// Whether node n was reached and reported its facts; the findings that say so, or why not.
bool reached(const NodeObservation& n, const Expectations& ex, std::vector<Finding>& out) {
  // The node's command starts with `cd <workdir>`: when that is what failed, the working
  // directory is the problem, not the host, SSH or the dtrain build.
  auto workdir_failed = [&](const std::string& error) {
    return !ex.workdir.empty() && error.find(ex.workdir) != std::string::npos &&
           (error.find("cd") != std::string::npos || error.find("working directory") != std::string::npos);
  };
  const std::string workdir_advice = fmt::format(
      "cluster.workdir {} must be a directory that exists on every node (the nodes cd to it; leave the key out to "
      "use the launcher's current directory)",
      ex.workdir);
  if (!n.start_error.empty() && workdir_failed(n.start_error)) {
    out.push_back(make(n, "workdir", Status::FAIL, n.start_error, workdir_advice));
    return false;
  }
  if (!n.start_error.empty()) {
    out.push_back(make(n, "ssh", Status::FAIL, n.start_error,
                       "check that the host is up and reachable, and the cluster.ssh settings (user, port, "
                       "identity_file, known_hosts, host_key_policy)"));
    return false;
  }
  out.push_back(make(n, "ssh", Status::OK, "connected, command started"));
  if (!n.facts && workdir_failed(n.end_error)) {
    out.push_back(make(n, "workdir", Status::FAIL, n.end_error, workdir_advice));
    return false;
  }
  if (!n.facts) {
    out.push_back(make(n, "node", Status::FAIL, n.end_error.empty() ? "the node check reported nothing" : n.end_error,
                       fmt::format("check that {} is this dtrain build on the node (cluster.dtrain_path) and that "
                                   "it runs there: {} --version",
                                   ex.dtrain_path, ex.dtrain_path)));
    return false;
  }
  return true;
}

// The build, slots, driver and disk findings of a node that reported its facts.
void host_findings(const NodeObservation& n, const Expectations& ex, const std::string& common_driver,
                   std::vector<Finding>& out) {
  const NodeFacts& f = *n.facts;
  if (f.build_id != ex.build_id || f.version != ex.version)
    out.push_back(make(n, "build", Status::FAIL,
                       fmt::format("dtrain {} build {} differs from the launcher's dtrain {} build {}", f.version,
                                   short_id(f.build_id), ex.version, short_id(ex.build_id)),
                       fmt::format("install the launcher's dtrain binary at {} on {} (or point cluster.dtrain_path "
                                   "at the same build)",
                                   ex.dtrain_path, n.host)));
  else out.push_back(make(n, "build", Status::OK, fmt::format("dtrain {} build {}", f.version, short_id(f.build_id))));

  const bool want_gpu = ex.device == "cuda" || (ex.device == "auto" && f.gpus > 0);
  if (want_gpu && f.gpus < n.slots)
    out.push_back(
        make(n, "slots", Status::FAIL,
             fmt::format("the hostfile claims {} slot(s) but the node sees {} CUDA device(s)", n.slots, f.gpus),
             "fix slots= for this host in the hostfile, or the node's CUDA_VISIBLE_DEVICES / driver"));
  else if (want_gpu)
    out.push_back(make(n, "slots", Status::OK, fmt::format("{} slot(s), {} CUDA device(s)", n.slots, f.gpus)));
  else if (f.cpus < n.slots)
    out.push_back(make(n, "slots", Status::WARN,
                       fmt::format("{} CPU rank(s) on {} logical CPU(s): oversubscribed", n.slots, f.cpus),
                       "fewer slots= for this host, unless oversubscription is intended"));
  else out.push_back(make(n, "slots", Status::OK, fmt::format("{} CPU slot(s), {} logical CPU(s)", n.slots, f.cpus)));

  if (f.gpus > 0) {
    if (f.driver.empty())
      out.push_back(make(n, "driver", Status::WARN, "CUDA devices visible but no NVIDIA driver version found",
                         "check /proc/driver/nvidia/version on the node"));
    else if (f.driver != common_driver)
      out.push_back(make(n, "driver", Status::WARN,
                         fmt::format("NVIDIA driver {} while most GPU nodes run {}", f.driver, common_driver),
                         "install the same driver on every GPU node"));
    else out.push_back(make(n, "driver", Status::OK, fmt::format("NVIDIA driver {}", f.driver)));
  }

  const double min_bytes = ex.min_free_gb * 1024.0 * 1024 * 1024;
  if (f.free_bytes < 0)
    out.push_back(make(n, "disk", Status::WARN, fmt::format("cannot tell the free space of {}", f.free_path),
                       "check that the run directory's filesystem is mounted"));
  else if (static_cast<double>(f.free_bytes) < min_bytes)
    out.push_back(make(n, "disk", Status::FAIL,
                       fmt::format("{} free on the filesystem of {}, below doctor.min_free_gb = {}", gib(f.free_bytes),
                                   f.free_path, ex.min_free_gb),
                       "free space there, or put training.output_dir on a larger shared filesystem"));
  else out.push_back(make(n, "disk", Status::OK, fmt::format("{} free on {}", gib(f.free_bytes), f.free_path)));
}

// Whether node n shares the run directory with the launcher (or, when the launcher could
// not write there, with most nodes): each side looks for the others' nonce files.
void shared_dir_finding(const NodeObservation& n, const std::vector<NodeObservation>& nodes, const Expectations& ex,
                        std::vector<Finding>& out) {
  const NodeFacts& f = *n.facts;
  const std::string name = node_nonce_name(n.node);
  if (!f.write_error.empty()) {
    out.push_back(make(n, "shared_dir", Status::FAIL, f.write_error,
                       fmt::format("make {} exist and be writable by the SSH user on this node", ex.run_dir)));
  } else if (n.seen) {
    auto match = [&](const std::map<std::string, std::string>& seen, const std::string& who) {
      auto it = seen.find(who);
      auto want = ex.nonces.find(who);
      return it != seen.end() && want != ex.nonces.end() && it->second == want->second;
    };
    int peers = 0, peers_seen = 0, peers_seeing = 0;
    for (const NodeObservation& o : nodes) {
      if (o.node == n.node || !o.seen || !o.facts || !o.facts->write_error.empty()) continue;
      ++peers;
      if (match(*n.seen, node_nonce_name(o.node))) ++peers_seen;
      if (match(*o.seen, name)) ++peers_seeing;
    }
    const bool launcher_ok = ex.launcher_write_error.empty();
    const bool sees_launcher = launcher_ok && match(*n.seen, "launcher");
    const bool launcher_sees = launcher_ok && match(ex.launcher_seen, name);
    const std::string peer_text =
        fmt::format("sees {} of {} other node(s)' files, {} of them see its file", peers_seen, peers, peers_seeing);
    // The launcher's view is the reference (it writes the run's config there and the
    // ranks read it); only when it could not write, the majority of the nodes is.
    const bool shared = launcher_ok ? (sees_launcher && launcher_sees) : (peers > 0 && 2 * peers_seen >= peers);
    if (shared)
      out.push_back(make(
          n, "shared_dir", Status::OK,
          fmt::format("{} is shared: {}{}", ex.run_dir, launcher_ok ? "sees the launcher's file, " : "", peer_text)));
    else
      out.push_back(
          make(n, "shared_dir", Status::FAIL,
               fmt::format("the run directory {} on this node is not the one {} sees: {}{}", ex.run_dir,
                           launcher_ok ? "the launcher" : "the other nodes",
                           launcher_ok ? fmt::format("the launcher {} its file and it {} the launcher's; ",
                                                     launcher_sees ? "reads" : "cannot read",
                                                     sees_launcher ? "reads" : "cannot read")
                                       : std::string(),
                           peer_text),
               fmt::format("mount the same shared filesystem at {} on every node and the launcher (the ranks read the "
                           "run's config and checkpoints there, and a resume on another node set needs them), or set "
                           "training.output_dir to a shared path",
                           ex.run_dir)));
  }
}

void clock_finding(const NodeObservation& n, const Expectations& ex, std::vector<Finding>& out) {
  if (n.clock_offset_s) {
    const double off = *n.clock_offset_s, unc = n.clock_uncertainty_s.value_or(0);
    const std::string text = fmt::format("{:+.3f} s from the launcher's clock (+-{:.3f} s)", off, unc);
    if (std::fabs(off) - unc > ex.max_clock_skew)
      out.push_back(make(n, "clock", Status::FAIL,
                         text + fmt::format(", more than doctor.max_clock_skew = {} s", ex.max_clock_skew),
                         "synchronise the node's clock (chrony or systemd-timesyncd against the cluster's NTP "
                         "server): logs, events and timeouts compare times across nodes"));
    else out.push_back(make(n, "clock", Status::OK, text));
  }
}

}  // namespace

std::vector<Finding> analyze_nodes(const std::vector<NodeObservation>& nodes, const Expectations& ex) {
  std::vector<Finding> out;
  const std::string common_driver = common_driver_of(nodes);
  for (const NodeObservation& n : nodes) {
    if (!reached(n, ex, out)) continue;
    host_findings(n, ex, common_driver, out);
    shared_dir_finding(n, nodes, ex, out);
    clock_finding(n, ex, out);
    if (!n.end_error.empty())
      out.push_back(make(n, "node", Status::FAIL, n.end_error, "see the node's message above; rerun dtrain doctor"));
  }
  return out;
}

std::vector<Finding> analyze_network(const std::vector<NodeObservation>& nodes, const NetworkSummary& net,
                                     double slow_factor) {
  std::vector<Finding> out;
  for (const NodeObservation& n : nodes) {
    if (!n.net_error.empty())
      out.push_back(make(n, "connectivity", Status::FAIL, n.net_error,
                         "check that the nodes reach each other over TCP on the interface the launcher's address "
                         "routes through (cluster.network_interface), and that no firewall drops the traffic"));
    else if (n.allreduce_ok && *n.allreduce_ok)
      out.push_back(make(n, "connectivity", Status::OK, "allreduce and barrier over gloo correct"));
    else if (n.allreduce_ok)
      out.push_back(make(n, "connectivity", Status::FAIL, "the allreduce returned a wrong sum",
                         "run dtrain bench allreduce on these hosts and report the output"));
  }
  for (int k : net.slow_nodes) {
    const auto it = std::find_if(nodes.begin(), nodes.end(), [&](const NodeObservation& o) { return o.node == k; });
    Finding f{
        k,
        it != nodes.end() ? it->host : "",
        "bandwidth",
        Status::FAIL,
        fmt::format("its fastest link runs at {}, {:.1f}x below the median node's {} (doctor.slow_factor = {})",
                    rate_text(net.node_best[static_cast<size_t>(k)]),
                    net.median_node / net.node_best[static_cast<size_t>(k)], rate_text(net.median_node), slow_factor),
        "check this node's NIC and link speed (ethtool), cabling, and traffic shaping (tc qdisc show)"};
    out.push_back(f);
  }
  for (int i : net.slow_links) {
    const LinkSample& l = net.links[static_cast<size_t>(i)];
    out.push_back({-1, "", "bandwidth", Status::FAIL,
                   fmt::format("link {} <-> {} runs at {} ({} one way, {} the other), {:.1f}x below the median node's "
                               "{}{}",
                               node_label(nodes, l.a), node_label(nodes, l.b), rate_text(l.bandwidth()),
                               rate_text(l.ab), rate_text(l.ba), net.median_node / l.bandwidth(),
                               rate_text(net.median_node), net.slowest == i ? " (the slowest link)" : ""),
                   "check the NICs and switch ports of these two nodes and any traffic shaping between them"});
  }
  return out;
}

}  // namespace dtrain::doctor
