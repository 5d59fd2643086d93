// The resource monitor of a rank process: a thread of its own that, every interval,
// samples the host (and the rank's GPU through NVML), appends the sample and any alert
// that begins to the rank's own file RUN_DIR/resources/rank<R>.jsonl (the launcher copies
// the alerts into events.jsonl). It
// never runs on the training step's thread; stopping it waits at most for the sample
// being taken.
#pragma once

#include "monitor/alert.h"
#include "monitor/nvml.h"
#include "monitor/sample.h"

#include "tensorboard/event_writer.h"

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <optional>
#include <memory>
#include <mutex>
#include <string>
#include <sys/types.h>
#include <thread>

namespace dtrain::monitor {

struct MonitorOptions {
  double interval_s = 10.0;  // monitor.interval
  std::string run_dir;       // resources/rank<R>.jsonl; its filesystem's free space
  /// training.run_dir_mode: resources/ and the rank's file get the run directory's bits
  /// within this bound (files without x), as checkpoints do.
  mode_t max_mode = 0700;
  SampleOrigin origin;
  AlertLimits limits;
  std::string proc_root = "/proc";
  /// TensorBoard: this rank's scalars go to an event file in this directory ("" = none;
  /// with tensorboard.enabled: <log dir>/resources/rank<R>, a run of its own in TensorBoard).
  std::string tensorboard_dir;
  /// Read a GPU: the rank runs on CUDA. NVML comes from nvml_api when set (tests), else
  /// from dlopen(nvml_library) ("" = the program itself).
  bool gpu = false;
  unsigned int gpu_index = 0;
  std::string nvml_library = "libnvidia-ml.so.1";
  const NvmlApi* nvml_api = nullptr;
  /// The rank's seconds inside collectives so far (comm::ActivityCommunicator::
  /// collective_seconds); unset (a one-rank job): the samples have no in_collective_frac.
  std::function<double()> collective_seconds;
};

class Monitor {
 public:
  /// Starts the thread; its first sample is taken at once (no rates yet: those need two
  /// readings), then one every interval_s.
  explicit Monitor(MonitorOptions opts);
  /// Stops and joins the thread.
  ~Monitor();
  Monitor(const Monitor&) = delete;
  Monitor& operator=(const Monitor&) = delete;

  /// Samples written so far.
  int64_t samples() const;

  /// One sample, taken on the caller's thread (a benchmark, a test; the thread calls it
  /// too, one at a time): read, write the record, raise alerts. Returns the record.
  nlohmann::json sample_once();

 private:
  void run();
  void gpu_open();
  int file_open();  // 0 or the errno
  void event_append(const Alert& a, int64_t time_ms);
  void tensorboard_write(const ResourceSample& s);

  MonitorOptions o_;
  HostReader host_;
  AlertState alerts_;
  std::unique_ptr<Nvml> nvml_;
  std::unique_ptr<tensorboard::EventWriter> tb_;
  bool tb_failed_ = false;
  bool gpu_tried_ = false;
  int fd_ = -1;  // resources/rank<R>.jsonl, opened at the first sample
  bool write_warned_ = false;
  bool gpu_read_warned_ = false;
  std::optional<double> prev_collective_s_;
  std::mutex sample_mu_;  // one sample at a time (the thread, a benchmark's caller)
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  int64_t samples_ = 0;
  std::thread thread_;
};

/// The TensorBoard scalars of a sample: "resource/cpu_pct", "resource/node_cpu_pct",
/// "resource/rss_gib", "resource/mem_available_gib", "resource/disk_free_gib",
/// "resource/net_rx_mbps", "resource/net_tx_mbps", "gpu/util_pct", "gpu/mem_util_pct",
/// "gpu/mem_used_gib", "gpu/temperature_c", "gpu/power_w", "gpu/sm_clock_mhz" (those the
/// sample has). Their step is the sample's unix time in ms: unique and increasing across
/// rounds, where a sample counter would start again at every restart.
std::vector<tensorboard::Scalar> sample_scalars(const ResourceSample& s);

/// The rank's monitor as the config asks (nullptr when monitor.enabled is false or there
/// is no run directory to write to).
std::unique_ptr<Monitor> monitor_start(MonitorOptions opts, bool enabled);

}  // namespace dtrain::monitor
