// Host readings and the resource record.
#include "monitor/sample.h"

#include "core/unix_time.h"
#include "monitor/proc_parse.h"

#include <sys/statvfs.h>
#include <unistd.h>

#include <chrono>

namespace dtrain::monitor {

namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

}  // namespace

HostReader::HostReader(std::string proc_root, std::string disk_path)
    : proc_(std::move(proc_root)), disk_(std::move(disk_path)) {
  const long t = ::sysconf(_SC_CLK_TCK);
  ticks_per_s_ = t > 0 ? static_cast<double>(t) : 100.0;
}

ResourceSample HostReader::read() {
  ResourceSample s;
  s.time_ms = unix_ms();
  const double t = now_s();
  const double dt = have_prev_ ? t - prev_t_ : 0.0;
  s.interval_s = dt;

  std::optional<uint64_t> proc_ticks;
  if (auto text = proc_read(proc_ + "/self/stat")) proc_ticks = parse_pid_stat_cpu(*text);
  if (proc_ticks && prev_proc_ && dt > 0 && *proc_ticks >= *prev_proc_)
    s.cpu_pct = 100.0 * static_cast<double>(*proc_ticks - *prev_proc_) / ticks_per_s_ / dt;
  prev_proc_ = proc_ticks;

  if (auto text = proc_read(proc_ + "/stat")) {
    if (auto c = parse_proc_stat(*text)) {
      if (prev_node_ && c->total > prev_node_->second && c->busy >= prev_node_->first)
        s.node_cpu_pct = 100.0 * static_cast<double>(c->busy - prev_node_->first) /
                         static_cast<double>(c->total - prev_node_->second);
      prev_node_ = std::make_pair(c->busy, c->total);
    }
  }
  if (auto text = proc_read(proc_ + "/self/status")) s.rss_bytes = parse_status_rss(*text);
  if (auto text = proc_read(proc_ + "/meminfo")) {
    const MemInfo m = parse_meminfo(*text);
    if (m.available >= 0) s.mem_available_bytes = m.available;
    if (m.total >= 0) s.mem_total_bytes = m.total;
  }
  if (auto text = proc_read(proc_ + "/net/dev")) {
    std::map<std::string, std::pair<uint64_t, uint64_t>> cur;
    for (const NetCounters& c : parse_net_dev(*text)) {
      cur[c.iface] = {c.rx_bytes, c.tx_bytes};
      auto p = prev_net_.find(c.iface);
      // A counter that went back (an interface re-created) gives no rate this time.
      if (p != prev_net_.end() && dt > 0 && c.rx_bytes >= p->second.first && c.tx_bytes >= p->second.second)
        s.net.push_back({c.iface, static_cast<double>(c.rx_bytes - p->second.first) / 1e6 / dt,
                         static_cast<double>(c.tx_bytes - p->second.second) / 1e6 / dt});
    }
    prev_net_ = std::move(cur);
  }
  if (!disk_.empty()) {
    struct statvfs v {};
    if (::statvfs(disk_.c_str(), &v) == 0)
      s.disk_free_bytes = static_cast<int64_t>(v.f_bavail) * static_cast<int64_t>(v.f_frsize);
  }
  have_prev_ = true;
  prev_t_ = t;
  return s;
}

nlohmann::json sample_json(const ResourceSample& s, const SampleOrigin& o) {
  nlohmann::json j = {
      {"kind", kResourceKind}, {"time_ms", s.time_ms}, {"rank", o.rank},   {"local_rank", o.local_rank},
      {"node", o.node},        {"host", o.host},       {"round", o.round}, {"interval_s", s.interval_s}};
  if (!o.job_id.empty()) j["job_id"] = o.job_id;
  auto put = [&](const char* key, const auto& v) {
    if (v) j[key] = *v;
  };
  put("cpu_pct", s.cpu_pct);
  put("node_cpu_pct", s.node_cpu_pct);
  put("rss_bytes", s.rss_bytes);
  put("mem_available_bytes", s.mem_available_bytes);
  put("mem_total_bytes", s.mem_total_bytes);
  put("disk_free_bytes", s.disk_free_bytes);
  if (!s.net.empty()) {
    double rx = 0, tx = 0;
    nlohmann::json per = nlohmann::json::object();
    for (const NetRate& n : s.net) {
      per[n.iface] = {{"rx_mbps", n.rx_mbps}, {"tx_mbps", n.tx_mbps}};
      if (n.iface != "lo") {  // loopback is the node talking to itself, not the network
        rx += n.rx_mbps;
        tx += n.tx_mbps;
      }
    }
    j["net_rx_mbps"] = rx;
    j["net_tx_mbps"] = tx;
    j["net"] = std::move(per);
  }
  put("in_collective_frac", s.in_collective_frac);
  if (s.gpu) {
    const GpuReading& g = *s.gpu;
    j["gpu_index"] = g.index;
    put("gpu_util_pct", g.util_pct);
    put("gpu_mem_util_pct", g.mem_util_pct);
    put("gpu_mem_used_bytes", g.mem_used);
    put("gpu_mem_total_bytes", g.mem_total);
    put("gpu_temperature_c", g.temperature_c);
    put("gpu_power_w", g.power_w);
    put("gpu_sm_clock_mhz", g.sm_clock_mhz);
    put("gpu_throttle_reasons", g.throttle_reasons);
  }
  return j;
}

bool is_resource_record(const nlohmann::json& record) {
  if (!record.is_object()) return false;
  auto k = record.find("kind");
  return k != record.end() && k->is_string() && k->get<std::string>() == kResourceKind;
}

}  // namespace dtrain::monitor
