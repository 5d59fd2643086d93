// Job preparation: config + hostfile + selection -> placement and launch spec; the run
// directory's record of the job (config.yaml, hostfile), deferred on resume until the
// new round has started.
#include "launch/job.h"

#include "core/check.h"
#include "core/env.h"
#include "core/log.h"
#include "core/net_address.h"
#include "core/input_file.h"
#include "data/chat_template.h"
#include "data/dataset.h"
#include "data/llamafactory.h"
#include "data/prepare.h"
#include "data/tokenizer.h"
#include "device/device.h"
#include "launch/local_spawner.h"
#include "launch/rank_device.h"
#include "launch/run_dir.h"
#include "launch/same_machine.h"
#include "launch/ssh_session.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

namespace fs = std::filesystem;

namespace dtrain::launch {

namespace {

// An IPv4 or IPv6 address literal (no name lookup).
bool ip_literal(const std::string& s) {
  in_addr v4{};
  return ::inet_pton(AF_INET, s.c_str(), &v4) == 1 || ipv6_literal(s);
}

std::string absolute_path(const std::string& p) {
  std::error_code ec;
  fs::path abs = fs::absolute(p, ec);
  return ec ? p : abs.lexically_normal().string();
}

// A run directory file this launcher wrote (config.yaml, hostfile), "" when it cannot be
// read: through the input rule, so a FIFO or a link put in its place is never waited on.
std::string read_file(const fs::path& path) {
  std::string why;
  InputFile f = input_file_try_open(path.string(), config::kConfigMaxBytes, &why);
  if (!why.empty()) return {};
  try {
    return f.read_all("run directory file", config::kConfigMaxBytes);
  } catch (const Error&) {
    return {};
  }
}

// The config's keys and values, without comments (the "# from:" line names wherever it
// was loaded from, which differs between a launch and its resumes).
std::string without_comments(const std::string& yaml) {
  std::istringstream in(yaml);
  std::string out;
  for (std::string line; std::getline(in, line);)
    if (line.rfind('#', 0) != 0) out += line + "\n";
  return out;
}

std::string hostfile_text(const Job& job) {
  std::string hosts;
  for (const auto& h : job.hosts.hosts) {
    hosts += h.destination();
    hosts += fmt::format(" slots={}", h.slots);
    if (h.port > 0) hosts += fmt::format(" port={}", h.port);
    hosts += "\n";
  }
  return hosts;
}

}  // namespace

// ---------------------------------------------------------------------------

std::string job_id_generate() {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
  std::random_device rd;
  return fmt::format("{}-{:04x}", stamp, rd() & 0xffffu);
}

std::string self_exe_path() {
  std::error_code ec;
  fs::path p = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("dtrain") : p.string();
}

namespace {

// The first IPv4 address of `interface` ("" = of any interface that is up and not
// loopback); for a named interface without one (an IPv6-only network), its first IPv6
// address, a global one before a link-local one (which carries its zone: fe80::1%eth0).
std::string interface_address(const std::string& interface) {
  ifaddrs* ifs = nullptr;
  if (getifaddrs(&ifs) != 0) return "";
  std::string v4, v6_global, v6_link;
  for (ifaddrs* i = ifs; i; i = i->ifa_next) {
    if (!i->ifa_addr || !(i->ifa_flags & IFF_UP)) continue;
    if (interface.empty() ? (i->ifa_flags & IFF_LOOPBACK) != 0 : interface != i->ifa_name) continue;
    const int family = i->ifa_addr->sa_family;
    if (family != AF_INET && !(family == AF_INET6 && !interface.empty())) continue;
    const socklen_t len = family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    char buf[NI_MAXHOST];
    if (::getnameinfo(i->ifa_addr, len, buf, sizeof buf, nullptr, 0, NI_NUMERICHOST) != 0) continue;
    if (family == AF_INET) {
      if (v4.empty()) v4 = buf;
    } else if (IN6_IS_ADDR_LINKLOCAL(&reinterpret_cast<sockaddr_in6*>(i->ifa_addr)->sin6_addr)) {
      if (v6_link.empty()) v6_link = buf;
    } else if (v6_global.empty()) {
      v6_global = buf;
    }
  }
  freeifaddrs(ifs);
  return !v4.empty() ? v4 : !v6_global.empty() ? v6_global : v6_link;
}

// ---------------------------------------------------------------------------
// Input files, checked once before any rank starts

// `path` as the ranks open it: relative paths are resolved against `workdir`, where they start.
fs::path at_workdir(const std::string& path, const std::string& workdir) {
  return fs::path(path).is_absolute() ? fs::path(path) : fs::path(workdir) / path;
}

// Why `path` (resolved against `workdir`, where the ranks start) cannot be the input named
// by `key`, or "" when it can. A directory is accepted where the key allows one
// (data.* with format tokens: a directory of shards; data.tokenizer: a model directory
// holding tokenizer.json; model.init_from: always a directory).
std::string input_path_problem(const std::string& path, const std::string& workdir, bool dir_ok, bool dir_only) {
  const fs::path p = at_workdir(path, workdir);
  if (dir_ok || dir_only) {
    const std::string dir_problem = input_dir_problem(p.string());
    if (dir_problem.empty())
      return ::access(p.c_str(), R_OK | X_OK) == 0 ? "" : fmt::format("is not readable: {}", std::strerror(errno));
    if (dir_only) return dir_problem;
  }
  // A file, by the input rule (the same check the ranks' open makes).
  return input_file_problem(p.string());
}

// One unusable input of the config: the key, the message, and whether the path is missing
// (as opposed to present but unusable: a FIFO, a directory for a file, unreadable).
struct InputProblem {
  std::string key, text;
  bool missing = false;
};

// The config's data files for ranks on this machine: missing, a directory or unreadable
// input is a permanent error, so it fails here (ConfigError, exit 2) and not in every rank
// of every retry round. Remote hosts' files are the ranks' own to check (also exit 2).
// One entry per unusable input (none when every input is usable).
std::vector<InputProblem> input_files_problems(const config::TrainConfig& cfg, const std::string& workdir) {
  std::vector<InputProblem> out;
  const bool tokens = cfg.data.format == "tokens" || cfg.data.format == "auto";
  struct Input {
    const char* key;
    std::string path;
    bool dir_ok, dir_only;
  };
  const Input inputs[] = {
      {"data.train", cfg.data.train, tokens || !cfg.data.dataset.empty(), false},
      {"data.valid", cfg.data.valid, tokens, false},
      {"data.tokenizer", cfg.data.tokenizer == "byte" ? std::string() : cfg.data.tokenizer, true, false},
      {"model.init_from", cfg.model.init_from, true, true},
  };
  for (const auto& in : inputs) {
    if (in.path.empty()) continue;
    std::string problem = input_path_problem(in.path, workdir, in.dir_ok, in.dir_only);
    if (problem.empty()) continue;
    const fs::path p = at_workdir(in.path, workdir);
    std::error_code ec;
    const bool missing = fs::symlink_status(p, ec).type() == fs::file_type::not_found;
    std::string where = fs::path(in.path).is_relative()
                            ? fmt::format(
                                  " (relative paths are resolved against the working directory {}, where the "
                                  "ranks start)",
                                  workdir)
                            : "";
    std::string fix = fs::path(in.path).is_relative()
                          ? "run from the directory the path is relative to, set cluster.workdir, or give an "
                            "absolute path"
                      : cfg.source.rfind("<embedded default", 0) == 0
                          ? fmt::format(
                                "the default job reads the data shipped in the dtrain source tree it "
                                "was built from ({}); give --config with your own data",
                                config::kDefaultConfigDir)
                          : "fix the path";
    out.push_back(
        {in.key, fmt::format("{}: {} '{}'{} {}: {}", cfg.source, in.key, in.path, where, problem, fix), missing});
  }
  return out;
}

}  // namespace

std::string local_address_towards(const std::string& remote_host) {
  // No shortcut for local hosts: a rank on the node that runs the rendezvous must
  // advertise that node's address, not 127.0.0.1, or other nodes cannot reach it. The
  // route lookup below gives 127.0.0.1 only when remote_host is loopback itself.
  // IPv4 when the host has an IPv4 address (as before IPv6 support), else IPv6: a rank of
  // an IPv6 job advertises its IPv6 address (with its zone for a link-local one).
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  const std::string host = address_unbracket(remote_host);
  if (getaddrinfo(host.c_str(), "22", &hints, &res) != 0 || !res) {
    std::string any = interface_address("");
    return any.empty() ? "127.0.0.1" : any;
  }
  const addrinfo* target = res;
  for (const addrinfo* a = res; a; a = a->ai_next)
    if (a->ai_family == AF_INET) {
      target = a;
      break;
    }
  std::string out = target->ai_family == AF_INET6 ? "::1" : "127.0.0.1";
  int fd = ::socket(target->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd >= 0) {
    // connect() on UDP only picks a route and a source address; nothing is sent.
    if (::connect(fd, target->ai_addr, target->ai_addrlen) == 0) {
      sockaddr_storage local{};
      socklen_t len = sizeof local;
      char buf[NI_MAXHOST];
      if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0 &&
          ::getnameinfo(reinterpret_cast<sockaddr*>(&local), len, buf, sizeof buf, nullptr, 0, NI_NUMERICHOST) == 0)
        out = buf;
    }
    ::close(fd);
  }
  freeaddrinfo(res);
  return out;
}

namespace {

// The hosts: the hostfile, Slurm's nodes, or this machine with --nproc-per-node / its GPUs / 1 slot.
config::Hostfile job_hostfile(const JobRequest& req) {
  if (req.hosts) {
    DT_ENFORCE(
        req.hostfile_path.empty(), UsageError,
        "--hostfile and --launcher slurm exclude each other: under Slurm the nodes come from SLURM_JOB_NODELIST");
    return *req.hosts;
  }
  if (!req.hostfile_path.empty()) {
    DT_ENFORCE(req.nproc_per_node < 0, UsageError,
               "--nproc-per-node applies only without --hostfile (the hostfile's slots=N says it per host)");
    return config::hostfile_load(req.hostfile_path);
  }
  int slots = req.nproc_per_node > 0 ? req.nproc_per_node : std::max(1, device::cuda_count());
  return config::hostfile_localhost(slots);
}

// libssh2 reads the identity file whole and blocking when the first node connects: a
// FIFO, /dev/zero or a huge file would hang there past every timeout (and SIGTERM), so
// it is refused here, before any connection, as any bad config value is. (A missing or
// unreadable file is left to the SSH session, which names the host it was for.) The
// known_hosts file is read whole at every connection the same way (unless the host key
// policy is off); one that does not exist yet is fine: accept-new creates it.
void check_ssh_files(const config::TrainConfig& cfg) {
  struct stat id_st {};
  const char* home = env_get("HOME");
  const std::string id_file = path_expand_home(cfg.cluster.ssh.identity_file, home ? home : "");
  if (!id_file.empty() && ::stat(id_file.c_str(), &id_st) == 0) {
    const std::string problem = input_file_problem(id_file, kIdentityFileMaxBytes);
    if (!problem.empty())
      DT_THROW(ConfigError, "{}: cluster.ssh.identity_file: {} {}; give the private key file SSH should use",
               cfg.source, id_file, problem);
  }
  const std::string kh_file = path_expand_home(
      cfg.cluster.ssh.known_hosts.empty() ? std::string("~/.ssh/known_hosts") : cfg.cluster.ssh.known_hosts,
      home ? home : "");
  struct stat kh_st {};
  if (cfg.cluster.ssh.host_key_policy != "off" && !kh_file.empty() && ::stat(kh_file.c_str(), &kh_st) == 0 &&
      !known_hosts_is_dev_null(kh_file)) {
    const std::string problem = input_file_problem(kh_file, kKnownHostsMaxBytes);
    if (!problem.empty())
      DT_THROW(ConfigError,
               "{}: cluster.ssh.known_hosts: {} {}; give an OpenSSH known_hosts file (or leave the key "
               "out for ~/.ssh/known_hosts)",
               cfg.source, kh_file, problem);
  }
}

// The address ranks and agents dial: --master-addr, the config, or our address on the
// route to the first remote host.
std::string rendezvous_address(const JobRequest& req, const Job& job) {
  const config::TrainConfig& cfg = job.cfg;
  const char* what = req.master_addr.empty() ? "cluster.rendezvous.address" : "--master-addr";
  // An IPv6 literal may come in brackets ([::1]); it is dialled and exported bare.
  std::string addr = address_unbracket(!req.master_addr.empty() ? req.master_addr : cfg.cluster.rendezvous.address);
  if (addr.find_first_of("[]") != std::string::npos || (addr.find(':') != std::string::npos && !ipv6_literal(addr)))
    DT_THROW(ConfigError,
             "{} '{}' is not a host name or IP address (IPv6 as ::1 or [::1]); give the port with --master-port "
             "or cluster.rendezvous.port",
             what, addr);
  if ((addr.empty() || addr == "auto") && !cfg.cluster.network_interface.empty() && !job.all_local) {
    addr = interface_address(cfg.cluster.network_interface);
    DT_ENFORCE(!addr.empty(), ConfigError, "cluster.network_interface '{}' has no IP address on this machine",
               cfg.cluster.network_interface);
  }
  if (addr.empty() || addr == "auto") {
    addr = "127.0.0.1";
    for (const auto& h : job.hosts.hosts)
      if (!host_is_local(h.host)) {
        addr = local_address_towards(h.host);
        break;
      }
  }
  // A loopback address reaches only this machine: the agents on other hosts would dial
  // their own loopback and fail after the connect timeout. Said before anything starts; a
  // warning, not a refusal: an SSH tunnel to each node can carry that port back here.
  if (address_is_loopback(addr) && !job.all_local) {
    std::vector<std::string> remote;
    for (const auto& h : job.hosts.hosts)
      if (!host_is_local(h.host)) remote.push_back(h.host);
    std::string list;
    for (size_t i = 0; i < remote.size() && i < 3; ++i) list += (i ? ", " : "") + remote[i];
    if (remote.size() > 3) list += fmt::format(" and {} more", remote.size() - 3);
    log_warn(
        "{} '{}' is a loopback address, but {} {} not this machine: {} agents will dial their own loopback and "
        "cannot reach this launcher's store; give this host's address on the nodes' network, or leave it unset "
        "(dtrain then uses its address on the route to the first remote host)",
        what, addr, list, remote.size() == 1 ? "is" : "are", remote.size() == 1 ? "its" : "their");
  }
  // This process hosts the store on exactly that address: an IP literal of another machine
  // (a typo, the head node's address on a compute node) cannot be listened on, and would
  // otherwise surface only when the store starts. Refused here, so --dry-run says it too.
  // (A name is left to the store, which names the resolver's answer.)
  if (!address_is_loopback(addr) && addr != "0.0.0.0" && addr != "::" && ip_literal(addr) && !host_is_local(addr))
    DT_THROW(ConfigError,
             "{} '{}' is not an address of this machine ({}), which hosts the job's rendezvous store there: give one "
             "of this machine's addresses on the nodes' network, or leave it unset (dtrain then uses its address "
             "on the route to the first remote host)",
             what, addr, host_name());
  return addr;
}

// --plan-for with counts places the ranks on placeholder hosts: the host selection flags
// and a hostfile belong to a real cluster's hosts, not to these.
void plan_target_check_request(const JobRequest& req) {
  const config::HostSelection& s = req.selection;
  const char* clash = !req.hostfile_path.empty() ? "--hostfile"
                      : req.hosts                ? "--launcher slurm"
                      : !s.include.empty()       ? "--include"
                      : !s.exclude.empty()       ? "--exclude"
                      : s.num_nodes != -1        ? "--num-nodes"
                      : s.num_gpus != -1         ? "--num-gpus"
                      : req.nproc_per_node > 0   ? "--nproc-per-node"
                                                 : nullptr;
  if (clash)
    DT_THROW(UsageError,
             "--plan-for {} places the job on {} itself, so {} has nothing to select: give the GPU size alone "
             "(--plan-for {}) to plan on the hostfile's hosts, or leave {} out",
             req.plan_for->spec, req.plan_for->describe(), clash,
             req.plan_for->spec.substr(req.plan_for->spec.find_last_of("xX") + 1), clash);
}

// The rendezvous address of a plan on placeholder hosts: the one given (--master-addr, a
// configured cluster.rendezvous.address), else a placeholder (this launcher's address on
// the cluster's network is not known here).
std::string placeholder_address(const JobRequest& req, const Job& job) {
  if (!req.master_addr.empty()) return address_unbracket(req.master_addr);
  const std::string& a = job.cfg.cluster.rendezvous.address;
  return a.empty() || a == "auto" ? std::string("<launcher>") : a;
}

// The placement of the first round, and the batch resolved for its world size.
void plan_job(const JobRequest& req, Job& job, const std::string& addr) {
  config::TrainConfig& cfg = job.cfg;
  int port = req.master_port >= 0 ? req.master_port : static_cast<int>(cfg.cluster.rendezvous.port);
  // Port 0 is bound at launch; plan with a placeholder that job_set_port replaces.
  // An elastic job plans its first round over the first elastic.max_nodes hosts (the
  // rest are standbys); the supervisor re-plans every round over the members.
  config::Hostfile planned = job.hosts;
  if (cfg.elastic.min_nodes > 0) {
    if (static_cast<size_t>(cfg.elastic.min_nodes) > job.hosts.hosts.size())
      DT_THROW(ConfigError,
               "{}: elastic.min_nodes (--nnodes MIN) is {} but the hostfile selects only {} host(s); lower MIN or add "
               "hosts",
               cfg.source, cfg.elastic.min_nodes, job.hosts.hosts.size());
    if (cfg.elastic.max_nodes > 0 && planned.hosts.size() > static_cast<size_t>(cfg.elastic.max_nodes))
      planned.hosts.resize(static_cast<size_t>(cfg.elastic.max_nodes));
  }
  job.plan = plan_placement(planned, addr, port == 0 ? 29500 : port);
  if (port == 0) job.plan.master_port = 0;
  // A pure DeepSpeed config may leave every batch key to its trainer ("auto"): a dry run
  // then plans without one; a given but inconsistent batch is always an error.
  bool batch_given = cfg.train_batch_size || cfg.train_micro_batch_size_per_gpu || cfg.gradient_accumulation_steps;
  if (req.require_training && (batch_given || job.incomplete.empty()))
    config::config_resolve_batch(cfg, job.plan.world_size);
  // CPU ranks all on this machine share its memory: a batch that cannot fit is refused here
  // (and in --dry-run) with the numbers, not by std::bad_alloc on a rank. Remote and CUDA
  // ranks check their own memory before allocating.
  if (req.require_training && req.mode == "train" && cfg.training.device == "cpu" && job.all_local &&
      cfg.resolved_micro_batch_size > 0)
    config::config_check_host_batch_memory(cfg, job.plan.world_size, true);
}

// The run directory (checked, not yet created) and what every round launches with.
void fill_spec(const JobRequest& req, Job& job) {
  const config::TrainConfig& cfg = job.cfg;
  job.run_dir = absolute_path(cfg.training.output_dir);
  const char* run_dir_what = req.output_dir.empty() ? "training.output_dir" : "--output-dir";
  run_dir_check_path(job.run_dir, run_dir_what);
  // A system path or a directory of someone else's is refused before anything is written
  // (a dry run says so too); run_dir_create checks again when it creates or adopts it.
  run_dir_check_adoptable(job.run_dir, run_dir_what);
  LaunchSpec& spec = job.spec;
  spec.job_id = job_id_generate();
  spec.round = 0;
  spec.workdir = cfg.cluster.workdir.empty() ? fs::current_path().string() : cfg.cluster.workdir;
  spec.dtrain_path = cfg.cluster.dtrain_path.empty() ? self_exe_path() : cfg.cluster.dtrain_path;
  spec.run_dir = job.run_dir;
  spec.forward_prefixes = cfg.cluster.env.forward_prefixes;
  // cluster.env.set holds secrets: it reaches the ranks on the agent's stdin, never argv.
  spec.secret_env = cfg.cluster.env.set;
  spec.config_path = (fs::path(job.run_dir) / "config.yaml").string();
  spec.mode = req.mode;
  // Supervision timing travels with the agent's environment.
  spec.env_set["DTRAIN_HEARTBEAT_INTERVAL"] = fmt::format("{}", cfg.fault_tolerance.heartbeat_interval);
  spec.env_set["DTRAIN_STORE_CONNECT_TIMEOUT"] = fmt::format("{}", cfg.fault_tolerance.store_connect_timeout);
  if (!cfg.cluster.network_interface.empty())
    spec.env_set.emplace("DTRAIN_NETWORK_INTERFACE", cfg.cluster.network_interface);
  spec.device = cfg.training.device;
}

// A problem a training job would meet on this machine: the error `thrown`, or for a dry
// run the reason it is incomplete.
void local_problem(const JobRequest& req, Job& job, const std::string& thrown) {
  if (!req.dry_run) DT_THROW(ConfigError, "{}", thrown);
  job.blockers.push_back(thrown);
}

// data.dataset: its names looked up in data.train's dataset_info.json here, so that a name
// it does not have (or a hub entry) fails before any rank starts, and the dry run says which
// file each is read from. An entry's file this machine lacks is a blocker, or under
// --plan-for a note; one it holds but no rank could read is a blocker.
void check_datasets(const JobRequest& req, Job& job) {
  const config::TrainConfig& cfg = job.cfg;
  const fs::path dir = at_workdir(cfg.data.train, job.spec.workdir);
  std::vector<data::LlamaFactoryEntry> entries;
  try {
    entries = data::llamafactory_entries(dir.string(), cfg.data.dataset);
  } catch (const Error& e) {
    local_problem(req, job, fmt::format("{}: data.dataset {}: {}", cfg.source, cfg.data.dataset, e.what()));
    return;
  }
  for (const data::LlamaFactoryEntry& e : entries) {
    const std::string problem = input_path_problem(e.file, job.spec.workdir, false, false);
    std::error_code ec;
    if (problem.empty()) {
      job.data_lines.push_back(fmt::format("data.dataset {}: {} ({}{})", e.name,
                                           fs::path(e.file).lexically_normal().string(),
                                           e.sharegpt ? "sharegpt" : "alpaca", e.ranking ? ", preference pairs" : ""));
    } else if (req.plan_for && fs::symlink_status(e.file, ec).type() == fs::file_type::not_found) {
      job.elsewhere.push_back(fmt::format("{}: data.dataset {}: '{}' is not on this machine; the nodes need it there",
                                          cfg.source, e.name, e.file));
    } else {
      local_problem(req, job, fmt::format("{}: data.dataset {}: '{}' {}", cfg.source, e.name, e.file, problem));
    }
  }
}

// data.format not given: what the data files on this machine hold, told here so the dry
// run says it and a file of no format dtrain can tell fails before any rank starts (the
// ranks tell it again from their own copy). LLaMA-Factory datasets are looked up.
void detect_data_format(const JobRequest& req, Job& job) {
  const config::TrainConfig& cfg = job.cfg;
  if (!cfg.data.dataset.empty() && !cfg.data.train.empty()) check_datasets(req, job);
  std::string train_format = cfg.data.dataset.empty() ? cfg.data.format : "alpaca";  // records, for the packing line
  if (cfg.data.format == "auto")
    for (const auto& [key, path] : {std::pair{"data.train", cfg.data.train}, std::pair{"data.valid", cfg.data.valid}}) {
      if (path.empty() || (std::string_view(key) == "data.train" && !cfg.data.dataset.empty())) continue;
      const fs::path p = at_workdir(path, job.spec.workdir);
      try {
        const data::DataFormatGuess g = data::data_format_detect(p.string());
        job.data_lines.push_back(
            fmt::format("{} read as data.format {} ({}; data.format not given)", key, g.name, g.evidence));
        if (std::string_view(key) == "data.train") train_format = g.name;
      } catch (const ConfigError& e) {
        local_problem(req, job, fmt::format("{}: {}: {}", cfg.source, key, e.what()));
      }
    }
  // How examples fill the sequences, as the ranks will decide it (pairwise data is never
  // packed; the ranks refuse data.pack: true for it).
  if (cfg.data.train.empty() || train_format == "pairwise" || train_format == "auto" || cfg.training.stage == "dpo")
    return;
  if (!cfg.data.pack.value_or(true)) {
    job.data_lines.push_back("one example per sequence, padded (data.pack: false)");
    return;
  }
  bool neat = false;
  try {
    const fs::path p = at_workdir(cfg.data.train, job.spec.workdir);
    neat = cfg.data.neat_packing.value_or(data::neat_packing_default(train_format, p.string()));
  } catch (const Error&) {
    return;  // shards not on this machine (or unreadable: the ranks say so)
  }
  // The run directory's config.yaml records the resolved value: a resume packs as this run
  // did, whatever a later dtrain's default.
  if (!cfg.data.neat_packing) job.cfg.data.neat_packing = neat;
  job.data_lines.push_back(neat ? "whole examples packed into sequences, each attending only within itself "
                                  "(data.neat_packing)"
                                : "the examples' token stream cut into sequences, attention across examples "
                                  "(data.neat_packing: false)");
}

// What the nodes on this machine would need: a local node's GPUs are known here, so a
// config that asks for more than it has fails before anything starts (remote nodes'
// agents check theirs before starting ranks); so do the input files.
void check_local_nodes(const JobRequest& req, Job& job) {
  if (!req.require_training || req.mode != "train") return;
  const config::TrainConfig& cfg = job.cfg;
  bool any_local = false;
  for (const auto& h : job.hosts.hosts) any_local = any_local || host_is_local(h.host);
  if (cfg.training.device == "cuda") {
    for (const NodePlan& node : job.plan.nodes) {
      if (!host_is_local(node.host.host)) continue;
      std::vector<int> ids;
      for (const RankInfo& r : node.ranks) ids.push_back(r.device);
      NodeDeviceVerdict v = node_device_verdict("cuda", device::cuda_count(), ids, node.host.destination());
      if (v.problem.empty()) continue;
      local_problem(req, job, fmt::format("{}: {}", cfg.source, v.problem));
      break;
    }
  }
  if (any_local) {
    const std::vector<InputProblem> problems = input_files_problems(cfg, job.spec.workdir);
    for (const InputProblem& p : problems) local_problem(req, job, p.text);
    if (problems.empty()) detect_data_format(req, job);
  }
}

// --plan-for: the job is planned for a cluster this machine is not part of, so its GPUs are
// not looked for here. An input this machine does not hold (a model directory holding only
// config.json, data that lives on the cluster) is a note: the cluster must hold it at that
// path. One it holds but could not be read (a FIFO, a directory for a file, no permission)
// is a blocker, as in any dry run; data that is here is told its format as usual.
void check_inputs_elsewhere(const JobRequest& req, Job& job) {
  if (!req.require_training || req.mode != "train") return;
  bool data_usable = true;
  for (const InputProblem& p : input_files_problems(job.cfg, job.spec.workdir)) {
    if (p.missing) {
      job.elsewhere.push_back(p.text.substr(0, p.text.rfind(": ")) + ": not on this machine; the nodes need it there");
    } else {
      local_problem(req, job, p.text);
    }
    if (p.key == "data.train" || p.key == "data.valid") data_usable = false;
  }
  if (data_usable) detect_data_format(req, job);
}

// SFT data rendered with a template whose turn markers are single special tokens needs the
// model's tokenizer: the byte tokenizer has only chatml's. With model.init_from and no
// data.tokenizer, the tokenizer is that directory's tokenizer.json, or the byte tokenizer
// when the directory holds none; every rank would then refuse the template (the launcher's
// resolved config is theirs), so the launch is refused here first. Under --plan-for a model
// directory without tokenizer.json here is a note (the cluster's copy must hold it).
void check_template_tokenizer(const JobRequest& req, Job& job) {
  const config::TrainConfig& cfg = job.cfg;
  if (!req.require_training || req.mode != "train" || cfg.data.tokenizer != "byte") return;
  std::error_code ec;
  const bool init_lacks =
      !cfg.model.init_from.empty() && !fs::is_regular_file(fs::path(cfg.model.init_from) / "tokenizer.json", ec);
  if (init_lacks && req.plan_for) {
    job.elsewhere.push_back(fmt::format(
        "{}: model.init_from '{}' holds no tokenizer.json here (data.tokenizer, not given, defaults to it): the "
        "nodes' copy must hold it, or the byte tokenizer is used",
        cfg.source, cfg.model.init_from));
    return;
  }
  const bool templated = !cfg.data.dataset.empty() || cfg.data.format == "alpaca" || cfg.data.format == "chat" ||
                         cfg.data.format == "pairwise";
  if (!templated) return;
  const data::ByteTokenizer byte;
  try {
    data::sft_template_parse(cfg.data.template_name, &byte);
    return;
  } catch (const ConfigError& e) {
    local_problem(req, job,
                  init_lacks ? fmt::format("{}: model.init_from '{}' holds no tokenizer.json and data.tokenizer is "
                                           "not given, so the byte tokenizer would be used: {}",
                                           cfg.source, cfg.model.init_from, e.what())
                             : fmt::format("{}: {}", cfg.source, e.what()));
  }
}

}  // namespace

Job job_prepare(const JobRequest& req) {
  Job job;
  config::LoadedConfig loaded = config::config_load_or_default(req.config_path, req.sets);
  job.cfg = std::move(loaded.cfg);
  job.warnings = std::move(loaded.warnings);
  job.data_lines = std::move(loaded.notes);
  config::TrainConfig& cfg = job.cfg;
  if (!req.output_dir.empty()) cfg.training.output_dir = req.output_dir;
  if (req.plan_for && req.require_training && cfg.training.device != "cuda")
    DT_THROW(UsageError,
             "--plan-for {} plans GPU ranks, but {} trains on the {} (training.device): set training.device: cuda "
             "(or --set training.device=cuda)",
             req.plan_for->spec, cfg.source, cfg.training.device);
  if (req.require_training) {
    try {
      config::config_check_job(cfg);
    } catch (const ConfigError& e) {
      if (!req.dry_run) throw;
      job.incomplete = e.what();
    }
  }
  job.plan_for = req.plan_for;
  const bool placeholder_hosts = req.plan_for && req.plan_for->nodes > 0;
  if (placeholder_hosts) {
    plan_target_check_request(req);
    // node1..nodeN stand for the cluster's hosts: never resolved, never this machine.
    job.hosts = plan_target_hosts(*req.plan_for);
    job.all_local = false;
  } else {
    if (req.plan_for && req.hostfile_path.empty() && !req.hosts)
      DT_THROW(UsageError,
               "--plan-for {} gives no GPU count: give GPUSxSIZE (8x80GB) or NODESxGPUSxSIZE (2x8x80GB), or "
               "--hostfile with the cluster's hosts",
               req.plan_for->spec);
    job.hosts = config::hostfile_select(job_hostfile(req), req.selection);
    // Slurm's node names are distinct nodes by its own definition (and srun, not the name,
    // decides where an agent runs); a hostfile can name one machine twice.
    if (!req.hosts) hosts_check_distinct(job.hosts);
    for (const auto& h : job.hosts.hosts) job.all_local = job.all_local && host_is_local(h.host);
  }
  // The SSH files are this launcher's; a plan for another cluster is launched from there.
  if (!req.hosts && !job.all_local && !req.plan_for) check_ssh_files(cfg);
  plan_job(req, job, placeholder_hosts ? placeholder_address(req, job) : rendezvous_address(req, job));
  fill_spec(req, job);
  if (req.plan_for) {
    check_inputs_elsewhere(req, job);
  } else {
    check_local_nodes(req, job);
  }
  check_template_tokenizer(req, job);
  return job;
}

void job_set_port(Job& job, int port) {
  DT_ENFORCE(port > 0 && port < 65536, InternalError, "bound port {} out of range", port);
  job.plan.master_port = port;
}

void job_write_run_dir(Job& job, bool defer) {
  const mode_t mode = run_dir_mode_parse(job.cfg.training.run_dir_mode);
  run_dir_create(job.run_dir, mode);
  std::error_code ec;
  fs::create_directories(fs::path(job.run_dir) / "logs", ec);
  fs::permissions(fs::path(job.run_dir) / "logs", static_cast<fs::perms>(mode), ec);
  const fs::path dir(job.run_dir);
  const std::string config = config::config_to_yaml(job.cfg);
  if (defer && fs::exists(dir / "config.yaml")) {
    run_dir_write_file((dir / "config.pending.yaml").string(), config, mode);
    job.spec.config_path = (dir / "config.pending.yaml").string();
    job.run_dir_pending = true;
    return;
  }
  run_dir_write_file((dir / "config.yaml").string(), config, mode);
  run_dir_write_file((dir / "hostfile").string(), hostfile_text(job), mode);
  job.spec.config_path = (dir / "config.yaml").string();
  job.run_dir_pending = false;
}

void job_commit_run_dir(Job& job) {
  if (!job.run_dir_pending) return;
  const mode_t mode = run_dir_mode_parse(job.cfg.training.run_dir_mode);
  const fs::path dir(job.run_dir);
  const fs::path pending = dir / "config.pending.yaml", current = dir / "config.yaml";
  std::error_code ec;
  if (without_comments(read_file(pending)) == without_comments(read_file(current))) {
    fs::remove(pending, ec);
  } else {
    // The previous config stays readable (and `dtrain resume --config RUN/config.prev.yaml`
    // goes back to it).
    fs::rename(current, dir / "config.prev.yaml", ec);
    DT_ENFORCE(!ec, IoError, "cannot rename {} to config.prev.yaml: {}", current.string(), ec.message());
    fs::rename(pending, current, ec);
    DT_ENFORCE(!ec, IoError, "cannot rename {} to {}: {}", pending.string(), current.string(), ec.message());
  }
  const std::string hosts = hostfile_text(job);
  if (read_file(dir / "hostfile") != hosts) run_dir_write_file((dir / "hostfile").string(), hosts, mode);
  job.spec.config_path = current.string();
  job.run_dir_pending = false;
}

std::string path_expand_home(const std::string& p, const std::string& home) {
  if (p.rfind("~/", 0) != 0 || home.empty()) return p;
  return home + p.substr(1);
}

}  // namespace dtrain::launch
