// doctor-node: facts, nonce, barrier, clock, shared-directory view, network probe.
#include "doctor/node_probe.h"

#include "core/check.h"
#include "core/version.h"
#include "doctor/net_probe.h"
#include "launch/job.h"
#include "device/device.h"
#include "rendezvous/store.h"

#include <fmt/format.h>
#include <poll.h>
#include <sched.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

namespace fs = std::filesystem;

namespace dtrain::doctor {

namespace {

std::string read_small(const fs::path& p, size_t limit = 4096) {
  std::ifstream in(p, std::ios::binary);
  std::string s(limit, '\0');
  in.read(s.data(), static_cast<std::streamsize>(limit));
  s.resize(static_cast<size_t>(in.gcount()));
  return s;
}

// "550.54.14" from /proc/driver/nvidia/version ("NVRM version: NVIDIA UNIX x86_64 Kernel
// Module  550.54.14  Thu Feb 22 ..."); "" without the NVIDIA kernel module.
std::string nvidia_driver_version() {
  std::string text = read_small("/proc/driver/nvidia/version");
  auto pos = text.find("Kernel Module");
  if (pos == std::string::npos) return "";
  std::istringstream in(text.substr(pos + 13));
  std::string v;
  in >> v;
  return v;
}

int usable_cpus() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
  return static_cast<int>(std::thread::hardware_concurrency());
}

std::string host_name() {
  char buf[256] = {};
  ::gethostname(buf, sizeof buf - 1);
  return buf;
}

int64_t json_int(const nlohmann::json& j, const char* k, int64_t d) { return j.contains(k) ? j[k].get<int64_t>() : d; }
std::string json_str(const nlohmann::json& j, const char* k) { return j.contains(k) ? j[k].get<std::string>() : ""; }

void emit(std::FILE* out, const nlohmann::json& j) {
  std::string line = j.dump() + "\n";
  std::fwrite(line.data(), 1, line.size(), out);
  std::fflush(out);
}

// Reads stdin until EOF (the launcher's barrier) or `timeout`; the text read.
// Returns false on timeout.
bool read_until_eof(int fd, std::chrono::milliseconds timeout, std::string* text) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  char buf[512];
  while (true) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    int r = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 200)));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return true;
    if (r == 0) continue;
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return true;
    text->append(buf, static_cast<size_t>(n));
  }
}

double need_double(const std::string& opt, const std::string& v) {
  try {
    size_t used = 0;
    double d = std::stod(v, &used);
    if (used == v.size() && d > 0) return d;
  } catch (const std::exception&) {
  }
  DT_THROW(UsageError, "doctor-node {}: '{}' is not a positive number", opt, v);
}

int need_int(const std::string& opt, const std::string& v, int lo, int hi) {
  try {
    size_t used = 0;
    long x = std::stol(v, &used);
    if (used == v.size() && x >= lo && x <= hi) return static_cast<int>(x);
  } catch (const std::exception&) {
  }
  DT_THROW(UsageError, "doctor-node {}: '{}' is not an integer in {}..{}", opt, v, lo, hi);
}

}  // namespace

int64_t wall_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::vector<std::string> node_probe_argv(const NodeProbeArgs& a) {
  std::vector<std::string> v = {
      "--node",    std::to_string(a.node),      "--run-dir", a.run_dir, "--session", a.session, "--nonce", a.nonce,
      "--timeout", fmt::format("{}", a.timeout)};
  if (a.network) {
    v.insert(v.end(), {"--network", "--master-addr", a.master_addr, "--master-port", std::to_string(a.master_port),
                       "--link-seconds", fmt::format("{}", a.link_seconds)});
    if (!a.interface.empty()) v.insert(v.end(), {"--interface", a.interface});
  }
  return v;
}

NodeProbeArgs node_probe_parse(const std::vector<std::string>& argv) {
  NodeProbeArgs a;
  std::map<std::string, std::string> seen;
  for (size_t i = 0; i < argv.size(); ++i) {
    std::string opt = argv[i], value;
    if (opt == "--network") {
      DT_ENFORCE(!seen.count(opt), UsageError, "doctor-node: {} given twice", opt);
      seen[opt] = "";
      a.network = true;
      continue;
    }
    auto eq = opt.find('=');
    if (opt.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = opt.substr(eq + 1);
      opt = opt.substr(0, eq);
    } else {
      DT_ENFORCE(i + 1 < argv.size(), UsageError, "doctor-node: {} needs a value", opt);
      value = argv[++i];
    }
    DT_ENFORCE(!seen.count(opt), UsageError, "doctor-node: {} given twice", opt);
    seen[opt] = value;
    if (opt == "--node") a.node = need_int(opt, value, 0, 1 << 20);
    else if (opt == "--run-dir") a.run_dir = value;
    else if (opt == "--session") a.session = value;
    else if (opt == "--nonce") a.nonce = value;
    else if (opt == "--timeout") a.timeout = need_double(opt, value);
    else if (opt == "--master-addr") a.master_addr = value;
    else if (opt == "--master-port") a.master_port = need_int(opt, value, 1, 65535);
    else if (opt == "--interface") a.interface = value;
    else if (opt == "--link-seconds") a.link_seconds = need_double(opt, value);
    else DT_THROW(UsageError, "doctor-node: unknown option '{}'", opt);
  }
  for (const char* req : {"--node", "--run-dir", "--session", "--nonce"})
    DT_ENFORCE(seen.count(req), UsageError, "doctor-node: {} is required", req);
  DT_ENFORCE(fs::path(a.run_dir).is_absolute(), UsageError, "doctor-node --run-dir '{}' must be absolute", a.run_dir);
  DT_ENFORCE(!a.session.empty() && a.session.find_first_not_of("0123456789abcdef") == std::string::npos, UsageError,
             "doctor-node --session '{}' must be lowercase hex", a.session);
  if (a.network)
    DT_ENFORCE(!a.master_addr.empty() && a.master_port > 0, UsageError,
               "doctor-node --network needs --master-addr and --master-port");
  return a;
}

std::string session_dir(const std::string& run_dir, const std::string& session) {
  return (fs::path(run_dir) / ".doctor" / session).string();
}

std::string nonce_write(const std::string& run_dir, const std::string& session, const std::string& name,
                        const std::string& nonce) {
  const fs::path dir = session_dir(run_dir, session);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return fmt::format("cannot create {}: {}", dir.string(), ec.message());
  const fs::path tmp = dir / (name + ".tmp"), file = dir / name;
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << nonce;
    out.flush();
    if (!out) return fmt::format("cannot write {}: {}", tmp.string(), std::strerror(errno));
  }
  fs::rename(tmp, file, ec);  // readers never see a half-written nonce
  if (ec) return fmt::format("cannot rename {} to {}: {}", tmp.string(), file.string(), ec.message());
  return "";
}

std::map<std::string, std::string> nonces_read(const std::string& run_dir, const std::string& session) {
  std::map<std::string, std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(session_dir(run_dir, session), ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() > 4 && name.compare(name.size() - 4, 4, ".tmp") == 0) continue;
    out[name] = read_small(e.path(), 256);
  }
  return out;
}

NodeFacts node_facts_gather(const std::string& run_dir, const std::string& session, const std::string& name,
                            const std::string& nonce) {
  NodeFacts f;
  f.hostname = host_name();
  f.version = version();
  f.build_id = build_id();
  f.cpus = usable_cpus();
  f.gpus = device::cuda_count();
  f.driver = nvidia_driver_version();
  f.write_error = nonce_write(run_dir, session, name, nonce);
  // Free space of the run directory's filesystem, or of its nearest existing parent.
  fs::path p = run_dir;
  std::error_code ec;
  while (!p.empty() && !fs::exists(p, ec) && p != p.root_path()) p = p.parent_path();
  f.free_path = p.string();
  struct statvfs st {};
  if (::statvfs(p.c_str(), &st) == 0)
    f.free_bytes = static_cast<int64_t>(st.f_bavail) * static_cast<int64_t>(st.f_frsize);
  return f;
}

nlohmann::json facts_to_json(const NodeFacts& f) {
  return {{"hostname", f.hostname},
          {"version", f.version},
          {"build_id", f.build_id},
          {"cpus", f.cpus},
          {"gpus", f.gpus},
          {"driver", f.driver},
          {"free_bytes", f.free_bytes},
          {"free_path", f.free_path},
          {"write_error", f.write_error}};
}

NodeFacts facts_from_json(const nlohmann::json& j) {
  NodeFacts f;
  f.hostname = json_str(j, "hostname");
  f.version = json_str(j, "version");
  f.build_id = json_str(j, "build_id");
  f.cpus = static_cast<int>(json_int(j, "cpus", 0));
  f.gpus = static_cast<int>(json_int(j, "gpus", 0));
  f.driver = json_str(j, "driver");
  f.free_bytes = json_int(j, "free_bytes", -1);
  f.free_path = json_str(j, "free_path");
  f.write_error = json_str(j, "write_error");
  return f;
}

int node_probe_main(const NodeProbeArgs& a, int stdin_fd, std::FILE* out) {
  using namespace std::chrono;
  const auto timeout = duration_cast<milliseconds>(duration<double>(a.timeout));
  nlohmann::json facts = facts_to_json(node_facts_gather(a.run_dir, a.session, node_nonce_name(a.node), a.nonce));
  facts["type"] = "facts";
  emit(out, facts);

  // The barrier: the launcher closes stdin once every node has written its nonce.
  std::string input;
  if (!read_until_eof(stdin_fd, timeout, &input)) {
    emit(out,
         {{"type", "error"}, {"error", fmt::format("the launcher's barrier did not come within {} s", a.timeout)}});
    return 1;
  }
  emit(out, {{"type", "clock"}, {"time_ns", wall_ns()}});
  nlohmann::json seen = nlohmann::json::object();
  for (const auto& [name, nonce] : nonces_read(a.run_dir, a.session)) seen[name] = nonce;
  emit(out, {{"type", "shared"}, {"seen", seen}});
  if (!a.network) return 0;

  nlohmann::json net = {{"type", "net"}};
  try {
    const std::string token = input.substr(0, input.find('\n'));
    DT_ENFORCE(!token.empty(), UsageError, "doctor-node --network: no token on stdin");
    rendezvous::StoreClient client(a.master_addr, static_cast<uint16_t>(a.master_port), token, timeout);
    const std::string prefix = fmt::format("doctor/{}/", a.session);
    // The launcher lists the nodes that answered: their position is the rank.
    auto world = nlohmann::json::parse(client.get(prefix + "world", timeout));
    int rank = -1;
    for (size_t i = 0; i < world.size(); ++i)
      if (world[i].get<int>() == a.node) rank = static_cast<int>(i);
    if (rank < 0) {
      net["error"] = "left out of the network check";
      emit(out, net);
      return 0;
    }
    NetProbeOptions o;
    o.interface = a.interface;
    if (o.interface.empty()) o.address = launch::local_address_towards(a.master_addr);
    o.link_seconds = a.link_seconds;
    o.timeout = timeout;
    NetProbeResult r = net_probe_run(client, prefix + "net/", rank, static_cast<int>(world.size()), o);
    net["allreduce_ok"] = r.allreduce_ok;
    nlohmann::json links = nlohmann::json::array();
    for (const LinkSample& s : r.links)
      links.push_back({{"a", world[static_cast<size_t>(s.a)].get<int>()},
                       {"b", world[static_cast<size_t>(s.b)].get<int>()},
                       {"ab", s.ab},
                       {"ba", s.ba}});
    net["links"] = links;
  } catch (const Error& e) {
    net["error"] = e.what();
  }
  emit(out, net);
  return 0;
}

}  // namespace dtrain::doctor
