// The sampler thread: sample, write, alert, wait; a condition variable ends the wait at
// once when the monitor is stopped.
#include "monitor/monitor.h"

#include "core/append_record.h"
#include "core/check.h"
#include "core/log.h"
#include "report/event.h"
#include "report/resource_status.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>

namespace dtrain::monitor {

std::vector<tensorboard::Scalar> sample_scalars(const ResourceSample& s) {
  std::vector<tensorboard::Scalar> v;
  auto put = [&](const char* tag, const auto& x, double scale) {
    if (x) v.push_back({tag, static_cast<double>(*x) * scale});
  };
  const double g = 1.0 / (1024.0 * 1024.0 * 1024.0);
  put("resource/cpu_pct", s.cpu_pct, 1);
  put("resource/node_cpu_pct", s.node_cpu_pct, 1);
  put("resource/rss_gib", s.rss_bytes, g);
  put("resource/mem_available_gib", s.mem_available_bytes, g);
  put("resource/disk_free_gib", s.disk_free_bytes, g);
  if (!s.net.empty()) {
    double rx = 0, tx = 0;
    for (const NetRate& n : s.net)
      if (n.iface != "lo") rx += n.rx_mbps, tx += n.tx_mbps;
    v.push_back({"resource/net_rx_mbps", rx});
    v.push_back({"resource/net_tx_mbps", tx});
  }
  if (s.gpu) {
    put("gpu/util_pct", s.gpu->util_pct, 1);
    put("gpu/mem_util_pct", s.gpu->mem_util_pct, 1);
    put("gpu/mem_used_gib", s.gpu->mem_used, g);
    put("gpu/temperature_c", s.gpu->temperature_c, 1);
    put("gpu/power_w", s.gpu->power_w, 1);
    put("gpu/sm_clock_mhz", s.gpu->sm_clock_mhz, 1);
  }
  return v;
}

Monitor::Monitor(MonitorOptions opts) : o_(std::move(opts)), host_(o_.proc_root, o_.run_dir) {
  thread_ = std::thread([this] { run(); });
}

Monitor::~Monitor() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (fd_ >= 0) ::close(fd_);
}

int64_t Monitor::samples() const {
  std::lock_guard<std::mutex> lock(mu_);
  return samples_;
}

void Monitor::gpu_open() {
  gpu_tried_ = true;
  std::string why;
  nvml_ = o_.nvml_api ? Nvml::from_api(*o_.nvml_api, &why) : Nvml::open(o_.nvml_library, &why);
  // Said once: the records then simply have no GPU fields.
  if (!nvml_) log_info("rank {}: resource monitor without GPU figures: {}", o_.origin.rank, why);
}

// The alert goes into the rank's own file, never into events.jsonl: that file is the
// launcher's (it copies these records there, one writer on one host), and a rank on
// another host appending to it over a shared filesystem could interleave with the
// launcher's writes. Under `dtrain run` nobody copies them: `dtrain status` reads them
// from the ranks' files.
void Monitor::event_append(const Alert& a, int64_t time_ms) {
  report::Event e{.kind = report::EventKind::RESOURCE_ALERT,
                  .round = o_.origin.round,
                  .time_ms = time_ms,
                  .node = o_.origin.node,
                  .host = o_.origin.host,
                  .why = a.why,
                  .detail = {{"alert", alert_kind_name(a.kind)}, {"rank", o_.origin.rank}}};
  log_warn("rank {} on {}: {}", o_.origin.rank, o_.origin.host, a.why);
  if (fd_ < 0) return;  // the file could not be opened: said once by sample_once
  nlohmann::json rec = report::event_json(e);
  rec["kind"] = report::kResourceAlertKind;
  append_record(fd_, rec.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
}

void Monitor::tensorboard_write(const ResourceSample& s) {
  if (o_.tensorboard_dir.empty() || tb_failed_) return;
  const double wall = static_cast<double>(s.time_ms) / 1e3;
  if (!tb_) {
    try {
      tb_ = std::make_unique<tensorboard::EventWriter>(o_.tensorboard_dir, wall, o_.origin.host);
    } catch (const std::exception& e) {
      // Said once; the metrics.jsonl records go on.
      tb_failed_ = true;
      log_warn("rank {}: resource monitor writes no TensorBoard scalars: {}", o_.origin.rank, e.what());
      return;
    }
  }
  tb_->scalars(s.time_ms, sample_scalars(s), wall);
}

// The rank's file is its alone (no other process appends to it, so a shared filesystem
// such as NFS cannot interleave another host's writes with it); a later round or
// `dtrain resume` appends to it. resources/ and the file get the run directory's
// permission bits within training.run_dir_mode (files without x), set explicitly as
// checkpoint_save does: a rank on another host does not run under the launcher's umask.
int Monitor::file_open() {
  struct stat st {};
  const mode_t mode = (::stat(o_.run_dir.c_str(), &st) == 0 ? st.st_mode & 0777 : 0700) & (o_.max_mode & 0777);
  const std::string dir = (std::filesystem::path(o_.run_dir) / report::RESOURCE_DIR).string();
  if (::mkdir(dir.c_str(), mode) == 0) ::chmod(dir.c_str(), mode);  // mkdir's mode passed the umask
  else if (errno != EEXIST) return errno;
  const std::string path = report::resource_file(o_.run_dir, o_.origin.rank);
  int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_EXCL | O_CLOEXEC, mode & 0666);
  if (fd >= 0) {
    ::fchmod(fd, mode & 0666);
  } else if (errno == EEXIST) {
    fd = ::open(path.c_str(), O_RDWR | O_APPEND | O_CLOEXEC);
    if (fd < 0) return errno;
    // A process killed in the middle of a write can leave a partial last line: the next
    // record starts on a line of its own (readers pass over the torn one).
    const off_t end = ::lseek(fd, 0, SEEK_END);
    char last = '\n';
    if (end > 0 && ::pread(fd, &last, 1, end - 1) == 1 && last != '\n') append_record(fd, "\n");
  } else {
    return errno;
  }
  fd_ = fd;
  return 0;
}

nlohmann::json Monitor::sample_once() {
  std::lock_guard<std::mutex> one(sample_mu_);
  if (o_.gpu && !gpu_tried_) gpu_open();
  ResourceSample s = host_.read();
  if (o_.collective_seconds) {
    const double c = o_.collective_seconds();
    if (prev_collective_s_ && s.interval_s > 0)
      s.in_collective_frac = std::clamp((c - *prev_collective_s_) / s.interval_s, 0.0, 1.0);
    prev_collective_s_ = c;
  }
  if (nvml_) {
    std::string why;
    s.gpu = nvml_->read(o_.gpu_index, &why);
    if (!s.gpu && !gpu_read_warned_) log_info("rank {}: resource monitor: {}", o_.origin.rank, why);
    gpu_read_warned_ = !s.gpu;
  }
  nlohmann::json rec = sample_json(s, o_.origin);
  if (!o_.run_dir.empty()) {
    const std::string path = report::resource_file(o_.run_dir, o_.origin.rank);
    int err = fd_ >= 0 ? 0 : file_open();
    if (err == 0) err = append_record(fd_, rec.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
    // A full disk loses samples, never the run: reported once.
    if (err != 0 && !write_warned_) {
      write_warned_ = true;
      log_warn("rank {}: resource monitor cannot write {}: {}; samples are lost until it can", o_.origin.rank, path,
               std::strerror(err));
    } else if (err == 0) {
      write_warned_ = false;
    }
  }
  tensorboard_write(s);
  for (const Alert& a : alerts_.update(s, o_.limits)) event_append(a, s.time_ms);
  std::lock_guard<std::mutex> lock(mu_);
  ++samples_;
  return rec;
}

void Monitor::run() {
  const auto period =
      std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(o_.interval_s));
  auto next = std::chrono::steady_clock::now();
  for (;;) {
    // A thread must not let an exception escape (std::terminate): a failed sample is
    // logged and the next one tried; the training goes on either way.
    try {
      sample_once();
    } catch (const std::exception& e) {
      log_warn("rank {}: resource monitor sample failed: {}", o_.origin.rank, e.what());
    }
    next += period;
    std::unique_lock<std::mutex> lock(mu_);
    if (cv_.wait_until(lock, next, [this] { return stop_; })) return;
    // Behind by more than one period (a stopped process): skip the missed samples.
    if (std::chrono::steady_clock::now() > next + period) next = std::chrono::steady_clock::now();
  }
}

std::unique_ptr<Monitor> monitor_start(MonitorOptions opts, bool enabled) {
  if (!enabled || opts.run_dir.empty()) return nullptr;
  DT_ENFORCE(opts.interval_s > 0, ConfigError, "monitor.interval must be > 0 seconds, got {}", opts.interval_s);
  return std::make_unique<Monitor>(std::move(opts));
}

}  // namespace dtrain::monitor
