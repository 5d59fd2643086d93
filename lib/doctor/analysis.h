// What `dtrain doctor` and the preflight found: each node's observations (as its
// doctor-node reported them, or why it could not), the verdict per check as findings
// that name host, check and what to do, and the bandwidth table's summary (slowest link,
// nodes far below the median). Pure logic: no I/O, unit-tested on made-up observations.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace dtrain::doctor {

enum class Status { OK, WARN, FAIL };
/// "ok", "warn", "FAIL".
const char* status_name(Status s);

/// One verdict. Checks: ssh, build, slots, driver, disk, shared_dir, clock,
/// connectivity, bandwidth.
struct Finding {
  int node = -1;     ///< node index; -1 = the cluster as a whole
  std::string host;  ///< the node's hostfile destination ("" for the cluster)
  std::string check;
  Status status = Status::OK;
  std::string detail;  ///< what was found, with the figures
  std::string advice;  ///< what to do about it ("" when ok)
};

/// A node's own account of itself (doctor-node's "facts" line).
struct NodeFacts {
  std::string hostname, version, build_id;
  int cpus = 0;             ///< logical CPUs this process may run on
  int gpus = 0;             ///< CUDA devices visible (CUDA_VISIBLE_DEVICES applied)
  std::string driver;       ///< NVIDIA driver version, "" without one
  int64_t free_bytes = -1;  ///< free bytes for unprivileged users on the run directory's filesystem
  std::string free_path;    ///< the path statvfs was asked about (the run dir or its nearest existing parent)
  std::string write_error;  ///< why the nonce could not be written ("" = written)
};

/// Everything the launcher learnt about one node.
struct NodeObservation {
  int node = 0;
  std::string host;  ///< destination as in the hostfile ("root@10.0.0.2")
  int slots = 0;
  std::string start_error;     ///< SSH connect / command start failure ("" = started)
  bool start_refused = false;  ///< start_error is permanent: host key or credentials refused
  std::string end_error;       ///< the node's command failed or did not answer in time
  std::optional<NodeFacts> facts;
  std::optional<double> clock_offset_s;                    ///< node clock minus launcher clock
  std::optional<double> clock_uncertainty_s;               ///< half the round trip the offset was measured over
  std::optional<std::map<std::string, std::string>> seen;  ///< nonce files it read: name -> content
  std::optional<bool> allreduce_ok;                        ///< network phase: the collective check's outcome
  std::string net_error;                                   ///< network phase failure on this node
};

/// Measured bandwidth of one link, both directions, bytes per second (0 = not measured).
struct LinkSample {
  int a = 0, b = 0;
  double ab = 0, ba = 0;
  double bandwidth() const { return ab < ba ? ab : ba; }  ///< the slower direction
};

/// The bandwidth table's verdict.
struct NetworkSummary {
  std::vector<LinkSample> links;
  int slowest = -1;               ///< index into links, -1 = none measured
  std::vector<double> node_best;  ///< per node: its fastest link (0 = none measured)
  double median_node = 0;         ///< median of node_best over nodes with a measurement
  std::vector<int> slow_nodes;    ///< nodes whose best link is > factor below the median
  std::vector<int> slow_links;    ///< link indices > factor below the median node
};

/// What the checks compare against.
struct Expectations {
  std::string version, build_id;  ///< the launcher's
  std::string device = "auto";    ///< training.device: cpu, cuda or auto
  std::string run_dir;
  std::string dtrain_path;  ///< as the nodes run it, for advice
  std::string workdir;      ///< cluster.workdir as the nodes cd to it ("" = login directory)
  double min_free_gb = 1.0;
  double max_clock_skew = 5.0;
  double slow_factor = 2.0;
  /// The nonce every participant wrote: "launcher" and each node's name -> nonce.
  std::map<std::string, std::string> nonces;
  /// The nonces the launcher read back from the run directory.
  std::map<std::string, std::string> launcher_seen;
  std::string launcher_write_error;  ///< the launcher could not write its own nonce
};

/// The nonce file name of node k ("node2").
std::string node_nonce_name(int node);

/// Median of the values (mean of the middle two for an even count); 0 for none.
double median(std::vector<double> values);

/// Slowest link, per-node best link, median node and the nodes/links more than
/// `slow_factor` below that median. Links with a zero measurement are ignored.
NetworkSummary network_summarize(const std::vector<LinkSample>& links, int nnodes, double slow_factor);

/// "1.23 GB/s", "45.6 MB/s", "789 KB/s" (decimal units, bytes).
std::string rate_text(double bytes_per_s);

/// Every per-node check (ssh, build, slots, driver, disk, shared_dir, clock) as findings,
/// one per node and check that applies, in node order.
std::vector<Finding> analyze_nodes(const std::vector<NodeObservation>& nodes, const Expectations& expect);

/// The network checks (connectivity per node, bandwidth of slow links and nodes, the
/// slowest link as information).
std::vector<Finding> analyze_network(const std::vector<NodeObservation>& nodes, const NetworkSummary& net,
                                     double slow_factor);

}  // namespace dtrain::doctor
