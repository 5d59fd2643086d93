// Resource records for `dtrain status` and the live view: the ranks' files read and
// tailed, newest per rank, grouped by node, formatted.
#include "report/resource_status.h"

#include "core/input_file.h"

#include <fmt/format.h>

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>

namespace dtrain::report {

namespace {

using nlohmann::json;

template <class T>
std::optional<T> opt(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number()) return std::nullopt;
  return it->get<T>();
}

double gib(int64_t b) { return static_cast<double>(b) / (1024.0 * 1024.0 * 1024.0); }

std::string ago(int64_t now_ms, int64_t t) {
  const double s = std::max(0.0, static_cast<double>(now_ms - t) / 1000.0);
  return s < 120 ? fmt::format("{:.1f} s", s) : fmt::format("{:.0f} min", s / 60);
}

}  // namespace

std::string resource_file(const std::string& run_dir, int rank) {
  return (std::filesystem::path(run_dir) / RESOURCE_DIR / fmt::format("rank{}.jsonl", rank)).string();
}

std::vector<std::string> resource_files(const std::string& run_dir) {
  std::vector<std::pair<long, std::string>> found;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(std::filesystem::path(run_dir) / RESOURCE_DIR, ec), end; !ec && it != end;
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    // rank<digits>.jsonl only: anything else there is not the monitors'.
    if (name.size() < 11 || name.rfind("rank", 0) != 0 || name.substr(name.size() - 6) != ".jsonl") continue;
    const std::string digits = name.substr(4, name.size() - 10);
    if (digits.empty() || digits.size() > 7 || digits.find_first_not_of("0123456789") != std::string::npos) continue;
    found.emplace_back(std::strtol(digits.c_str(), nullptr, 10), it->path().string());
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(std::move(f.second));
  return out;
}

bool is_resource_record(const json& r) {
  if (!r.is_object()) return false;
  auto k = r.find("kind");
  return k != r.end() && k->is_string() && k->get<std::string>() == "resource";
}

void ResourceCollector::add(const json& r) {
  if (!is_resource_record(r)) return;
  const auto rank = opt<int>(r, "rank");
  const auto t = opt<int64_t>(r, "time_ms");
  if (!rank || *rank < 0 || *rank > (1 << 20) || !t) return;
  if (latest_.size() <= static_cast<size_t>(*rank)) latest_.resize(static_cast<size_t>(*rank) + 1);
  latest_[static_cast<size_t>(*rank)] = r;
}

std::vector<NodeResources> ResourceCollector::nodes() const {
  // The launch and round of the newest record decide which ranks are current (records
  // written before samples had a job_id count as a launch of their own, "").
  auto job_of = [](const json& r) {
    auto j = r.find("job_id");
    return j != r.end() && j->is_string() ? j->get<std::string>() : std::string();
  };
  int64_t newest = -1;
  int round = 0;
  std::string job;
  for (const json& r : latest_)
    if (!r.is_null() && opt<int64_t>(r, "time_ms").value_or(0) > newest) {
      newest = opt<int64_t>(r, "time_ms").value_or(0);
      round = opt<int>(r, "round").value_or(0);
      job = job_of(r);
    }
  std::map<int, NodeResources> by_node;
  for (const json& r : latest_) {
    if (r.is_null() || opt<int>(r, "round").value_or(0) != round || job_of(r) != job) continue;
    const int node = opt<int>(r, "node").value_or(0);
    NodeResources& n = by_node[node];
    n.node = node;
    RankResources k;
    k.rank = opt<int>(r, "rank").value_or(0);
    k.time_ms = opt<int64_t>(r, "time_ms").value_or(0);
    k.cpu_pct = opt<double>(r, "cpu_pct");
    k.rss_bytes = opt<int64_t>(r, "rss_bytes");
    k.gpu_index = opt<int>(r, "gpu_index");
    k.gpu_util_pct = opt<double>(r, "gpu_util_pct");
    k.gpu_temperature_c = opt<double>(r, "gpu_temperature_c");
    k.gpu_power_w = opt<double>(r, "gpu_power_w");
    k.gpu_mem_used_bytes = opt<int64_t>(r, "gpu_mem_used_bytes");
    k.gpu_mem_total_bytes = opt<int64_t>(r, "gpu_mem_total_bytes");
    k.gpu_sm_clock_mhz = opt<int64_t>(r, "gpu_sm_clock_mhz");
    k.gpu_throttle_reasons = opt<uint64_t>(r, "gpu_throttle_reasons");
    k.in_collective_frac = opt<double>(r, "in_collective_frac");
    // The node's own figures from its newest sample.
    if (k.time_ms >= n.time_ms) {
      n.time_ms = k.time_ms;
      if (auto h = r.find("host"); h != r.end() && h->is_string()) n.host = h->get<std::string>();
      auto keep = [](auto& dst, auto v) {
        if (v) dst = v;
      };
      keep(n.node_cpu_pct, opt<double>(r, "node_cpu_pct"));
      keep(n.net_rx_mbps, opt<double>(r, "net_rx_mbps"));
      keep(n.net_tx_mbps, opt<double>(r, "net_tx_mbps"));
      keep(n.mem_available_bytes, opt<int64_t>(r, "mem_available_bytes"));
      keep(n.mem_total_bytes, opt<int64_t>(r, "mem_total_bytes"));
      keep(n.disk_free_bytes, opt<int64_t>(r, "disk_free_bytes"));
    }
    n.ranks.push_back(std::move(k));
  }
  std::vector<NodeResources> out;
  for (auto& [_, n] : by_node) out.push_back(std::move(n));
  return out;
}

std::optional<ResourceAlertRecord> resource_alert_of(const json& e) {
  if (!e.is_object()) return std::nullopt;
  auto ev = e.find("event");
  if (ev == e.end() || !ev->is_string() || ev->get<std::string>() != "resource_alert") return std::nullopt;
  ResourceAlertRecord a;
  a.time_ms = opt<int64_t>(e, "time_ms").value_or(0);
  a.node = opt<int>(e, "node").value_or(-1);
  a.rank = opt<int>(e, "rank").value_or(-1);
  if (auto h = e.find("host"); h != e.end() && h->is_string()) a.host = h->get<std::string>();
  if (auto x = e.find("alert"); x != e.end() && x->is_string()) a.alert = x->get<std::string>();
  if (auto x = e.find("why"); x != e.end() && x->is_string()) a.why = x->get<std::string>();
  return a;
}

std::optional<Event> resource_alert_event(const json& r) {
  if (!r.is_object() || r.value("kind", json()) != kResourceAlertKind) return std::nullopt;
  const auto a = resource_alert_of(r);
  if (!a) return std::nullopt;
  Event e{.kind = EventKind::RESOURCE_ALERT,
          .round = opt<int>(r, "round").value_or(0),
          .time_ms = a->time_ms,
          .host = a->host,
          .why = a->why,
          .detail = {{"alert", a->alert}, {"rank", a->rank}}};
  if (a->node >= 0) e.node = a->node;
  return e;
}

std::string resource_lines(const std::vector<NodeResources>& nodes, int64_t now_ms) {
  std::string out;
  for (const NodeResources& n : nodes) {
    // "  host ..." rather than "  node...": the rows of the nodes section begin so.
    std::string line = fmt::format("  host {} (node{}, sampled {} ago):", n.host.empty() ? "?" : n.host, n.node,
                                   ago(now_ms, n.time_ms));
    std::string sep = " ";
    auto add = [&](const std::string& s) {
      line += sep + s;
      sep = ", ";
    };
    if (n.node_cpu_pct) add(fmt::format("cpu {:.0f} %", *n.node_cpu_pct));
    if (n.mem_available_bytes && n.mem_total_bytes)
      add(fmt::format("mem {:.1f}/{:.1f} GiB available", gib(*n.mem_available_bytes), gib(*n.mem_total_bytes)));
    else if (n.mem_available_bytes) add(fmt::format("mem {:.1f} GiB available", gib(*n.mem_available_bytes)));
    if (n.net_rx_mbps && n.net_tx_mbps)
      add(fmt::format("net rx {:.2f} tx {:.2f} MB/s", *n.net_rx_mbps, *n.net_tx_mbps));
    if (n.disk_free_bytes) add(fmt::format("run dir {:.1f} GiB free", gib(*n.disk_free_bytes)));
    out += line + "\n";
    for (const RankResources& k : n.ranks) {
      std::string r = fmt::format("    rank {}:", k.rank);
      std::string s2 = " ";
      auto put = [&](const std::string& s) {
        r += s2 + s;
        s2 = ", ";
      };
      if (k.cpu_pct) put(fmt::format("cpu {:.0f} %", *k.cpu_pct));
      if (k.rss_bytes) put(fmt::format("rss {:.2f} GiB", gib(*k.rss_bytes)));
      if (k.gpu_index) {
        std::string g = fmt::format("gpu{}", *k.gpu_index);
        if (k.gpu_util_pct) g += fmt::format(" {:.0f} %", *k.gpu_util_pct);
        if (k.gpu_mem_used_bytes && k.gpu_mem_total_bytes)
          g += fmt::format(" mem {:.2f}/{:.1f} GiB", gib(*k.gpu_mem_used_bytes), gib(*k.gpu_mem_total_bytes));
        if (k.gpu_temperature_c) g += fmt::format(" {:.0f} C", *k.gpu_temperature_c);
        if (k.gpu_power_w) g += fmt::format(" {:.0f} W", *k.gpu_power_w);
        if (k.gpu_sm_clock_mhz) g += fmt::format(" {} MHz", *k.gpu_sm_clock_mhz);
        // Thermal or power reasons only: idle and application clocks are no slowdown.
        if (k.gpu_throttle_reasons && (*k.gpu_throttle_reasons & 0xE4ull) != 0)
          g += fmt::format(" throttled (0x{:x})", *k.gpu_throttle_reasons);
        put(g);
      }
      out += r + "\n";
    }
  }
  return out;
}

std::string resource_compact_line(const NodeResources& n) {
  std::string out = fmt::format("node{} {}:", n.node, n.host.empty() ? "?" : n.host);
  std::string sep = " ";
  auto add = [&](const std::string& part) {
    out += sep + part;
    sep = " | ";
  };
  if (n.node_cpu_pct) add(fmt::format("cpu {:.0f} %", *n.node_cpu_pct));
  if (n.mem_available_bytes && n.mem_total_bytes)
    add(fmt::format("mem {:.1f}/{:.1f} GiB available", gib(*n.mem_available_bytes), gib(*n.mem_total_bytes)));
  if (n.net_rx_mbps && n.net_tx_mbps) add(fmt::format("net {:.2f}/{:.2f} MB/s in/out", *n.net_rx_mbps, *n.net_tx_mbps));
  int64_t rss = 0;
  bool have_rss = false;
  std::optional<double> ulo, uhi, mlo, mhi, mtot;
  auto widen = [](std::optional<double>& lo, std::optional<double>& hi, double v) {
    lo = lo ? std::min(*lo, v) : v;
    hi = hi ? std::max(*hi, v) : v;
  };
  for (const RankResources& r : n.ranks) {
    if (r.rss_bytes) rss += *r.rss_bytes, have_rss = true;
    if (r.gpu_util_pct) widen(ulo, uhi, *r.gpu_util_pct);
    if (r.gpu_mem_used_bytes) widen(mlo, mhi, gib(*r.gpu_mem_used_bytes));
    if (r.gpu_mem_total_bytes) mtot = gib(*r.gpu_mem_total_bytes);
  }
  if (have_rss) add(fmt::format("rss {:.2f} GiB", gib(rss)));
  auto range = [](double lo, double hi, const char* f) {
    return lo == hi ? fmt::format(fmt::runtime(f), lo)
                    : fmt::format(fmt::runtime(f), lo) + "-" + fmt::format(fmt::runtime(f), hi);
  };
  std::string gpu;
  if (ulo) gpu = "gpu " + range(*ulo, *uhi, "{:.0f}") + " %";
  if (mlo)
    gpu += (gpu.empty() ? "gpu mem " : ", mem ") + range(*mlo, *mhi, "{:.1f}") +
           (mtot ? fmt::format("/{:.0f}", *mtot) : std::string()) + " GiB";
  if (!gpu.empty()) add(gpu);
  return out;
}

namespace {

bool is_alert_record(const json& r) { return r.is_object() && r.value("kind", json()) == kResourceAlertKind; }

// Feeds the complete lines of buf[0, end] that are samples to `into` and those that are
// alert records to *alerts (when given); true for any of either.
bool lines_add(std::string_view buf, size_t end, ResourceCollector* into, std::vector<json>* alerts) {
  bool any = false;
  for (size_t at = 0; at <= end;) {
    const size_t nl = buf.find('\n', at);
    if (nl == std::string_view::npos) break;
    auto j = json::parse(buf.substr(at, nl - at), nullptr, false);
    if (into && is_resource_record(j)) {
      into->add(j);
      any = true;
    } else if (alerts && is_alert_record(j)) {
      alerts->push_back(std::move(j));
      any = true;
    }
    at = nl + 1;
  }
  return any;
}

uint64_t file_size(const std::string& path) {
  std::error_code ec;
  const auto n = std::filesystem::file_size(path, ec);
  return ec ? 0 : static_cast<uint64_t>(n);
}

// Up to `want` bytes of f from `offset` (fewer at its end or on a read error).
std::string bytes_at(const InputFile& f, uint64_t offset, uint64_t want) {
  std::string buf(want, '\0');
  size_t got = 0;
  while (got < want) {
    const ssize_t n = ::pread(f.fd(), buf.data() + got, want - got, static_cast<off_t>(offset + got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  buf.resize(got);
  return buf;
}

// A rank's file through the input rule: one that is not a regular file (a FIFO would block
// status and the launcher's poll) is passed over like a missing one.
InputFile resource_file_open(const std::string& path) {
  std::string why;
  return input_file_try_open(path, kInputAnySize, &why);
}

// The last `tail_bytes` of every rank's file, whole lines only, to `into` / `alerts`.
void files_tail_read(const std::string& run_dir, uint64_t tail_bytes, ResourceCollector* into,
                     std::vector<json>* alerts) {
  for (const std::string& path : resource_files(run_dir)) {
    const InputFile f = resource_file_open(path);
    if (!f.is_open()) continue;
    const uint64_t size = f.size();
    const uint64_t from = size > tail_bytes ? size - tail_bytes : 0;
    std::string buf = bytes_at(f, from, size - from);
    buf.push_back('\n');  // a last line without its newline is read too (and passed over when torn)
    // Read from the middle of a line: that line is not whole.
    const size_t begin = from == 0 ? 0 : buf.find('\n') + 1;
    if (begin >= buf.size()) continue;  // one line longer than the tail: no whole record
    lines_add(std::string_view(buf).substr(begin), buf.size() - 1 - begin, into, alerts);
  }
}

}  // namespace

std::vector<NodeResources> resource_read(const std::string& run_dir) {
  // A rank's latest record is its file's last: only the end of each file is read (a long
  // run's files hold a record every monitor.interval).
  ResourceCollector c;
  files_tail_read(run_dir, 64u << 10, &c, nullptr);
  return c.nodes();
}

std::vector<ResourceAlertRecord> resource_alerts_read(const std::string& run_dir, uint64_t tail_bytes) {
  std::vector<json> records;
  files_tail_read(run_dir, tail_bytes, nullptr, &records);
  std::vector<ResourceAlertRecord> out;
  for (const json& r : records)
    if (auto a = resource_alert_of(r)) out.push_back(std::move(*a));
  std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.time_ms < b.time_ms; });
  return out;
}

ResourceTail::ResourceTail(std::string run_dir) : run_dir_(std::move(run_dir)) {
  for (const std::string& path : resource_files(run_dir_)) offset_[path] = file_size(path);
}

bool ResourceTail::poll(ResourceCollector& into, std::vector<json>* alerts) {
  bool any = false;
  for (const std::string& path : resource_files(run_dir_)) {
    uint64_t& offset = offset_[path];  // a new file: from its start
    const InputFile f = resource_file_open(path);
    if (!f.is_open()) continue;
    const uint64_t size = f.size();
    if (size < offset) offset = 0;  // replaced by hand: read it again
    if (size == offset) continue;
    // At most 4 MiB per file and poll: a huge backlog is caught up over several polls.
    const uint64_t want = std::min<uint64_t>(size - offset, 4u << 20);
    std::string buf = bytes_at(f, offset, want);
    const size_t end = buf.rfind('\n');
    if (end == std::string::npos) continue;  // no complete line yet
    offset += end + 1;
    any = lines_add(buf, end, &into, alerts) || any;
  }
  return any;
}

}  // namespace dtrain::report
