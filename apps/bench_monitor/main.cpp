// bench_monitor [SAMPLES] [NVML_LIBRARY]: the resource monitor's cost. Takes SAMPLES
// (default 200) samples on the calling thread, as the sampler thread takes them (read
// /proc, statvfs, NVML when it loads; append the record to the rank's resources/rank0.jsonl
// in a temporary directory), and prints one JSON line: wall and CPU microseconds per sample (median,
// mean, max) and the share of one core that costs at monitor.interval's default 10 s.
#include "monitor/monitor.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <unistd.h>
#include <exception>
#include <filesystem>
#include <string>
#include <vector>

namespace {

double thread_cpu_us() {
  timespec t{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) * 1e6 + static_cast<double>(t.tv_nsec) / 1e3;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const int n = argc > 1 ? std::max(2, std::atoi(argv[1])) : 200;
    char tmpl[] = "/tmp/dtrain-bench-monitor-XXXXXX";
    if (!::mkdtemp(tmpl)) {
      std::perror("mkdtemp");
      return 1;
    }
    dtrain::monitor::MonitorOptions o;
    o.interval_s = 86400;  // the thread takes its first sample and waits: the samples below are ours
    o.run_dir = tmpl;
    o.gpu = true;
    if (argc > 2) o.nvml_library = argv[2];
    std::vector<double> wall, cpu;
    bool gpu = false;
    {
      dtrain::monitor::Monitor m(o);
      for (int i = 0; i < 1000 && m.samples() < 1; ++i) ::usleep(10000);
      for (int i = 0; i < n; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        const double c0 = thread_cpu_us();
        const nlohmann::json rec = m.sample_once();
        cpu.push_back(thread_cpu_us() - c0);
        wall.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
        gpu = rec.contains("gpu_index");
      }
    }
    std::filesystem::remove_all(tmpl);
    auto stats = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      double sum = 0;
      for (double x : v) sum += x;
      return nlohmann::json{{"median", v[v.size() / 2]},
                            {"mean", sum / static_cast<double>(v.size())},
                            {"max", v.back()}};
    };
    const nlohmann::json w = stats(wall), c = stats(cpu);
    const nlohmann::json out = {{"samples", n},
                                {"gpu_fields", gpu},
                                {"wall_us_per_sample", w},
                                {"cpu_us_per_sample", c},
                                {"core_share_at_10s_pct", c["mean"].get<double>() / 10e6 * 100.0}};
    std::printf("%s\n", out.dump().c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_monitor: %s\n", e.what());
    return 1;
  }
}
