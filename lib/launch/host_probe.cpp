// The version probe: one short command per host through the launcher's spawners, bounded
// by a timeout; what it printed decides.
#include "launch/host_probe.h"

#include "core/error.h"
#include "core/version.h"
#include "launch/local_spawner.h"
#include "launch/node_command.h"
#include "launch/node_spawner.h"
#include "launch/ssh_spawner.h"

#include <fmt/format.h>

#include <mutex>
#include <thread>

namespace dtrain::launch {

namespace {

class VersionProbe : public HostProbe {
 public:
  VersionProbe(const config::TrainConfig& cfg, std::string path, std::chrono::milliseconds timeout)
      : ssh_(ssh_options_from_config(cfg.cluster.ssh)), path_(std::move(path)), timeout_(timeout) {
    ssh_.connect_timeout = std::min(ssh_.connect_timeout, timeout_);
  }

  ProbeResult probe(const config::HostEntry& host) override {
    const std::string want = fmt::format("dtrain {}", version());
    std::mutex mu;
    std::string out;
    auto cb = [&](Stream s, std::string_view line) {
      std::lock_guard<std::mutex> lock(mu);
      if (s == Stream::STDOUT && out.size() < 4096) out += std::string(line) + "\n";
    };
    std::unique_ptr<Process> p;
    try {
      if (host_is_local(host.host)) {
        p = spawn_local({path_, "--version"}, {}, "", "", cb, true);
      } else {
        SshOptions o = ssh_;
        if (!host.user.empty()) o.user = host.user;
        if (host.port > 0) o.port = host.port;
        p = spawn_ssh(host.host, o, shell_quote(path_) + " --version", "", cb);
      }
    } catch (const Error& e) {
      return {false, fmt::format("cannot start `{} --version` there: {}", path_, e.what())};
    }
    auto st = p->wait_for(timeout_);
    if (!st) {
      p->terminate(std::chrono::milliseconds(500));
      return {false, fmt::format("`{} --version` gave no answer within {:.0f} s", path_,
                                 std::chrono::duration<double>(timeout_).count())};
    }
    std::string said;
    {
      std::lock_guard<std::mutex> lock(mu);
      said = out;
    }
    while (!said.empty() && (said.back() == '\n' || said.back() == '\r' || said.back() == ' ')) said.pop_back();
    if (!st->success())
      return {false, fmt::format("`{} --version` {}; install this dtrain there or fix cluster.dtrain_path", path_,
                                 st->describe())};
    if (said != want)
      return {false, fmt::format("`{} --version` printed '{}', this launcher is '{}'; install the same dtrain build on "
                                 "every node",
                                 path_, said.substr(0, 200), want)};
    return {true, ""};
  }

 private:
  SshOptions ssh_;
  std::string path_;
  std::chrono::milliseconds timeout_;
};

}  // namespace

std::unique_ptr<HostProbe> host_probe_version(const config::TrainConfig& cfg, const std::string& dtrain_path,
                                              std::chrono::milliseconds timeout) {
  return std::make_unique<VersionProbe>(cfg, dtrain_path, timeout);
}

std::vector<ProbeResult> host_probe_all(HostProbe& probe, const std::vector<config::HostEntry>& hosts) {
  std::vector<ProbeResult> res(hosts.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < hosts.size(); ++i)
    threads.emplace_back([&, i] {
      try {
        res[i] = probe.probe(hosts[i]);
      } catch (const std::exception& e) {
        res[i] = {false, e.what()};
      }
    });
  for (auto& t : threads) t.join();
  return res;
}

}  // namespace dtrain::launch
