// The node side of `dtrain doctor` and the preflight (hidden `dtrain doctor-node`, started
// over the job's spawner): this node's facts and nonce, the launcher's barrier (stdin
// EOF), its clock and the nonces it can read, optionally the network probe; one JSON
// object per line on stdout.
#pragma once

#include "doctor/analysis.h"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

namespace dtrain::doctor {

/// The words after `dtrain doctor-node`.
///     --node K --run-dir D --session S --nonce N [--timeout SECONDS]
///     [--network --master-addr A --master-port P [--interface IF] [--link-seconds X]]
/// With --network the first line of stdin is the rendezvous token.
struct NodeProbeArgs {
  int node = 0;
  std::string run_dir, session, nonce;
  double timeout = 30;  ///< bound on each wait (the barrier, the store, the mesh)
  bool network = false;
  std::string master_addr;
  int master_port = 0;
  std::string interface;
  double link_seconds = 0.5;
};

std::vector<std::string> node_probe_argv(const NodeProbeArgs& args);
/// UsageError naming the option for a missing, repeated or bad one.
NodeProbeArgs node_probe_parse(const std::vector<std::string>& argv);

/// run_dir/.doctor/<session>: where every participant writes its nonce file.
std::string session_dir(const std::string& run_dir, const std::string& session);

/// This node's facts; writes `nonce` into session_dir/<name> (failure in write_error).
NodeFacts node_facts_gather(const std::string& run_dir, const std::string& session, const std::string& name,
                            const std::string& nonce);
/// The nonce files readable in session_dir: file name -> content.
std::map<std::string, std::string> nonces_read(const std::string& run_dir, const std::string& session);
/// Writes `nonce` as file `name` in the session directory (creating it); "" or the error.
std::string nonce_write(const std::string& run_dir, const std::string& session, const std::string& name,
                        const std::string& nonce);

nlohmann::json facts_to_json(const NodeFacts& f);
NodeFacts facts_from_json(const nlohmann::json& j);

/// Runs the node's part, reading the barrier (and the token) from `stdin_fd` and writing
/// its JSON lines to `out`. Returns the exit code (0 also when a check found a problem:
/// problems are in the report; non-zero only when the protocol itself failed).
int node_probe_main(const NodeProbeArgs& args, int stdin_fd, std::FILE* out);

/// Current time on the system clock, in nanoseconds since the epoch.
int64_t wall_ns();

}  // namespace dtrain::doctor
