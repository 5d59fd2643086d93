// The sampler thread (start, records in the rank's own resources/rank<R>.jsonl, which a
// restart appends to, with the run directory's permission bits; a stop that does not
// wait out the interval), NVML through a function table and a library that is not there, and the
// alerts' episodes (once when a condition begins, again only after it cleared).
#include "monitor/alert.h"
#include "monitor/monitor.h"
#include "monitor/nvml.h"

#include "temp_dir.h"

#include <doctest/doctest.h>

#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <thread>

using namespace dtrain::monitor;
using nlohmann::json;

namespace {

std::vector<json> jsonl(const std::filesystem::path& p) {
  std::vector<json> out;
  std::ifstream in(p);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(json::parse(line));
  return out;
}

// The alert records ({"kind": "resource_alert"}) of a rank's file.
std::vector<json> alert_records(const std::filesystem::path& p) {
  std::vector<json> out;
  for (json& r : jsonl(p))
    if (r.value("kind", "") == "resource_alert") out.push_back(std::move(r));
  return out;
}

// A fake NVML whose figures the test sets: one GPU, index 0.
struct FakeGpu {
  static inline unsigned long long used = 0, total = 80ull << 30, throttle = 0;
  static inline int inits = 0;
};
nvml_return_t fake_init() { return ++FakeGpu::inits, kNvmlSuccess; }
nvml_return_t fake_shutdown() { return --FakeGpu::inits, kNvmlSuccess; }
nvml_return_t fake_handle(unsigned int i, nvml_device_t* d) {
  if (i != 0) return 2;
  *d = reinterpret_cast<nvml_device_t>(1);
  return kNvmlSuccess;
}
nvml_return_t fake_memory(nvml_device_t, NvmlMemory* m) {
  *m = {FakeGpu::total, FakeGpu::total - FakeGpu::used, FakeGpu::used};
  return kNvmlSuccess;
}
nvml_return_t fake_util(nvml_device_t, NvmlUtilization* u) {
  *u = {87, 40};
  return kNvmlSuccess;
}
nvml_return_t fake_temp(nvml_device_t, int, unsigned int*) { return kNvmlErrorNotSupported; }
nvml_return_t fake_power(nvml_device_t, unsigned int* mw) { return *mw = 301500, kNvmlSuccess; }
nvml_return_t fake_throttle(nvml_device_t, unsigned long long* r) { return *r = FakeGpu::throttle, kNvmlSuccess; }

NvmlApi fake_api() {
  NvmlApi a;
  a.init = fake_init;
  a.shutdown = fake_shutdown;
  a.handle_by_index = fake_handle;
  a.memory = fake_memory;
  a.utilization = fake_util;
  a.temperature = fake_temp;
  a.power = fake_power;
  a.throttle_reasons = fake_throttle;
  return a;
}

template <class Pred>
bool wait_for(Pred p) {
  for (int i = 0; i < 400; ++i) {  // at most ~20 s
    if (p()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return p();
}

}  // namespace

TEST_CASE("monitor: the thread writes one resource record per sample and stops without waiting out the interval") {
  dtrain::test::TempDir d("monitor-thread");
  MonitorOptions o;
  o.interval_s = 0.05;
  o.run_dir = d.path.string();
  o.origin = {.rank = 1, .local_rank = 1, .node = 0, .round = 0, .host = "h"};
  {
    Monitor m(o);
    REQUIRE(wait_for([&] { return m.samples() >= 3; }));
  }
  const auto file = d.path / "resources" / "rank1.jsonl";
  const auto recs = jsonl(file);
  REQUIRE(recs.size() >= 3);
  for (const json& r : recs) {
    CHECK(is_resource_record(r));  // no alerts here: samples only
    CHECK(r["rank"] == 1);
    CHECK(r.contains("rss_bytes"));
    CHECK(r.contains("mem_available_bytes"));
    CHECK(r.contains("disk_free_bytes"));
    CHECK_FALSE(r.contains("gpu_index"));  // no GPU asked for
  }
  CHECK(recs[1].contains("node_cpu_pct"));  // the second sample has rates

  // An hour's interval: the destructor must end the wait at once (a hang here fails the
  // test by its ctest timeout).
  o.interval_s = 3600;
  {
    Monitor m(o);
    REQUIRE(wait_for([&] { return m.samples() >= 1; }));
  }
  CHECK(jsonl(file).size() == recs.size() + 1);                    // a restart appends to the rank's file
  CHECK_FALSE(std::filesystem::exists(d.path / "metrics.jsonl"));  // the trainer's alone
  CHECK_FALSE(monitor_start(o, false));                            // monitor.enabled: false
  o.run_dir.clear();
  CHECK_FALSE(monitor_start(o, true));  // nowhere to write
}

TEST_CASE("monitor: GPU figures through an NVML function table; alerts once per episode into the rank's file") {
  dtrain::test::TempDir d("monitor-gpu");
  const NvmlApi api = fake_api();
  MonitorOptions o;
  o.interval_s = 3600;  // samples are taken by the test
  o.run_dir = d.path.string();
  o.origin = {.rank = 0, .local_rank = 0, .node = 0, .round = 2, .host = "h"};
  o.gpu = true;
  o.nvml_api = &api;
  FakeGpu::used = 10ull << 30;
  FakeGpu::throttle = 0x1;  // idle: no slowdown
  {
    Monitor m(o);
    REQUIRE(wait_for([&] { return m.samples() >= 1; }));
    json r = m.sample_once();
    CHECK(r["gpu_index"] == 0);
    CHECK(r["gpu_util_pct"] == 87);
    CHECK(r["gpu_mem_used_bytes"] == 10ll << 30);
    CHECK(r["gpu_power_w"].get<double>() == doctest::Approx(301.5));
    CHECK_FALSE(r.contains("gpu_temperature_c"));  // not supported: left out
    CHECK_FALSE(std::filesystem::exists(d.path / "events.jsonl"));

    FakeGpu::used = 79ull << 30;  // 98.75 %
    FakeGpu::throttle = kThrottleHwThermal;
    m.sample_once();
    m.sample_once();  // the same episodes: no new alerts
    FakeGpu::used = 10ull << 30;
    FakeGpu::throttle = 0;
    m.sample_once();  // both clear
    FakeGpu::used = 78ull << 30;
    m.sample_once();  // a new GPU memory episode
  }
  CHECK(FakeGpu::inits == 0);  // nvmlShutdown on stop
  // Into the rank's own file, between its samples; events.jsonl is the launcher's.
  CHECK_FALSE(std::filesystem::exists(d.path / "events.jsonl"));
  const auto ev = alert_records(d.path / "resources" / "rank0.jsonl");
  std::vector<std::string> kinds;
  for (const json& e : ev) {
    CHECK(e["event"] == "resource_alert");
    CHECK(e["node"] == 0);
    CHECK(e["round"] == 2);
    CHECK(e["rank"] == 0);
    kinds.push_back(e["alert"]);
  }
  CHECK(kinds == std::vector<std::string>{"gpu_memory", "gpu_throttle", "gpu_memory"});
  CHECK(ev[1]["why"].get<std::string>().find("hardware thermal slowdown") != std::string::npos);
}

TEST_CASE("monitor: node memory under monitor.min_free_memory raises low_memory once, from the node's checking rank") {
  dtrain::test::TempDir d("monitor-mem");
  MonitorOptions o;
  o.interval_s = 3600;
  o.run_dir = d.path.string();
  o.limits.min_free_memory_bytes = int64_t{1} << 50;  // 1 PiB: no machine has that available
  {
    Monitor m(o);
    REQUIRE(wait_for([&] { return m.samples() >= 1; }));
    m.sample_once();
  }
  CHECK_FALSE(std::filesystem::exists(d.path / "events.jsonl"));
  const auto ev = alert_records(d.path / "resources" / "rank0.jsonl");
  REQUIRE(ev.size() == 1);
  CHECK(ev[0]["alert"] == "low_memory");
  CHECK(ev[0]["why"].get<std::string>().find("monitor.min_free_memory") != std::string::npos);

  // The node's other ranks do not repeat it.
  dtrain::test::TempDir d2("monitor-mem2");
  o.run_dir = d2.path.string();
  o.limits.node_checks = false;
  {
    Monitor m(o);
    REQUIRE(wait_for([&] { return m.samples() >= 1; }));
  }
  CHECK(alert_records(d2.path / "resources" / "rank0.jsonl").empty());
  CHECK_FALSE(std::filesystem::exists(d2.path / "events.jsonl"));
}

TEST_CASE("monitor: no NVML library means no GPU fields, and the reason") {
  std::string why;
  CHECK_FALSE(Nvml::open("libdtrain-no-such-nvml.so.1", &why));
  CHECK(why.find("libdtrain-no-such-nvml.so.1") != std::string::npos);
  why.clear();
  CHECK_FALSE(Nvml::open("", &why));  // this test program links no NVML
  CHECK(why.find("no NVML") != std::string::npos);

  dtrain::test::TempDir d("monitor-nonvml");
  MonitorOptions o;
  o.interval_s = 3600;
  o.run_dir = d.path.string();
  o.gpu = true;
  o.nvml_library = "libdtrain-no-such-nvml.so.1";
  {
    Monitor m(o);
    REQUIRE(wait_for([&] { return m.samples() >= 1; }));
  }
  const auto recs = jsonl(d.path / "resources" / "rank0.jsonl");
  REQUIRE(recs.size() == 1);
  CHECK_FALSE(recs[0].contains("gpu_index"));
  CHECK(recs[0].contains("rss_bytes"));
}

namespace {

mode_t mode_of(const std::filesystem::path& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 ? st.st_mode & 07777 : 0;
}

}  // namespace

TEST_CASE("monitor: resources/ and the rank's file get the run directory's bits within training.run_dir_mode") {
  const mode_t old_umask = ::umask(0);  // a remote rank's umask is not the launcher's: the bits must not depend on it
  dtrain::test::TempDir d("monitor-mode");
  MonitorOptions o;
  o.interval_s = 3600;
  o.run_dir = d.path.string();
  o.origin.rank = 3;
  ::chmod(d.path.c_str(), 0750);
  o.max_mode = 0750;
  {
    Monitor m(o);
    REQUIRE(wait_for([&] { return m.samples() >= 1; }));
  }
  CHECK(mode_of(d.path / "resources") == 0750);
  CHECK(mode_of(d.path / "resources" / "rank3.jsonl") == 0640);

  // An adopted, looser directory (a shared 1777 one): bounded by run_dir_mode 0700.
  dtrain::test::TempDir d2("monitor-mode2");
  ::chmod(d2.path.c_str(), 01777);
  o.run_dir = d2.path.string();
  o.max_mode = 0700;
  {
    Monitor m(o);
    REQUIRE(wait_for([&] { return m.samples() >= 1; }));
  }
  ::umask(old_umask);
  CHECK(mode_of(d2.path / "resources") == 0700);
  CHECK(mode_of(d2.path / "resources" / "rank3.jsonl") == 0600);
}

TEST_CASE("monitor: a torn last line left by a killed rank is not joined to the next record") {
  dtrain::test::TempDir d("monitor-torn");
  std::filesystem::create_directories(d.path / "resources");
  const auto file = d.path / "resources" / "rank0.jsonl";
  std::ofstream(file) << R"({"kind":"resource","time_ms":1,"rank":0})"
                      << "\n"
                      << R"({"kind":"resou)";
  MonitorOptions o;
  o.interval_s = 3600;
  o.run_dir = d.path.string();
  {
    Monitor m(o);
    REQUIRE(wait_for([&] { return m.samples() >= 1; }));
  }
  std::ifstream in(file);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  REQUIRE(lines.size() == 3);
  CHECK(lines[1] == R"({"kind":"resou)");
  const json last = json::parse(lines[2]);
  CHECK(is_resource_record(last));
  CHECK(last.contains("rss_bytes"));
}

TEST_CASE("monitor: a rank's NVML index follows CUDA_VISIBLE_DEVICES") {
  CHECK(nvml_index_of(1, nullptr) == 1);
  CHECK(nvml_index_of(1, "") == 1);
  CHECK(nvml_index_of(1, "4,6") == 6);
  CHECK(nvml_index_of(0, "3") == 3);
  CHECK(nvml_index_of(2, "3") == 2);                  // fewer entries: its own number
  CHECK(nvml_index_of(1, "GPU-8a1c,GPU-77de") == 1);  // UUIDs: not mapped
}

TEST_CASE("alerts: a missing figure neither starts nor ends an episode") {
  AlertState st;
  AlertLimits lim;
  lim.min_free_memory_bytes = 100;
  ResourceSample low;
  low.mem_available_bytes = 50;
  CHECK(st.update(low, lim).size() == 1);
  ResourceSample unknown;  // /proc/meminfo unreadable this time
  CHECK(st.update(unknown, lim).empty());
  CHECK(st.update(low, lim).empty());  // still the same episode
  ResourceSample ok;
  ok.mem_available_bytes = 100 + (int64_t{256} << 20);  // the threshold plus the end margin
  CHECK(st.update(ok, lim).empty());
  CHECK(st.update(low, lim).size() == 1);
}

TEST_CASE("alerts: a low_memory episode ends only 5 % (at least 256 MiB) above the threshold") {
  constexpr int64_t kMiB = int64_t{1} << 20;
  AlertState st;
  AlertLimits lim;
  lim.min_free_memory_bytes = 8192 * kMiB;  // 8 GiB: the end margin is 5 % = 409.6 MiB
  auto at = [](int64_t b) {
    ResourceSample s;
    s.mem_available_bytes = b;
    return s;
  };
  CHECK(st.update(at(8192 * kMiB), lim).empty());      // at the threshold: not under it
  CHECK(st.update(at(8191 * kMiB), lim).size() == 1);  // under: the episode starts
  CHECK(st.update(at(8500 * kMiB), lim).empty());      // above, within the margin: same episode
  CHECK(st.update(at(8000 * kMiB), lim).empty());      // under again: no second alert
  CHECK(st.update(at(8602 * kMiB), lim).empty());      // past 8192 + 409.6: the episode ends
  CHECK(st.update(at(8100 * kMiB), lim).size() == 1);  // a new episode, a new alert

  AlertState small;
  lim.min_free_memory_bytes = 1024 * kMiB;  // 5 % is 51 MiB: the margin is 256 MiB
  CHECK(small.update(at(1000 * kMiB), lim).size() == 1);
  CHECK(small.update(at(1279 * kMiB), lim).empty());
  CHECK(small.update(at(1000 * kMiB), lim).empty());
  CHECK(small.update(at(1280 * kMiB), lim).empty());  // 1024 + 256: ended
  CHECK(small.update(at(1000 * kMiB), lim).size() == 1);
}

TEST_CASE("monitor: in_collective_frac is the growth of the rank's collective seconds over the interval") {
  dtrain::test::TempDir d("monitor-collective");
  MonitorOptions o;
  o.interval_s = 3600;  // the thread takes the first sample only; the test takes the others
  o.run_dir = d.path.string();
  o.origin = {.rank = 0, .local_rank = 0, .node = 0, .round = 0, .host = "h"};
  std::atomic<double> in_collectives{5.0};
  o.collective_seconds = [&] { return in_collectives.load(); };
  Monitor m(o);
  REQUIRE(wait_for([&] { return m.samples() >= 1; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const json none = m.sample_once();  // no time in collectives since the first sample
  in_collectives = 5.0 + 1e6;         // more than the interval: all of it (clamped)
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const json all = m.sample_once();
  const auto recs = jsonl(d.path / "resources" / "rank0.jsonl");
  REQUIRE(recs.size() == 3);
  CHECK_FALSE(recs[0].contains("in_collective_frac"));  // the first sample: no interval yet
  REQUIRE(none.contains("in_collective_frac"));
  CHECK(none["in_collective_frac"].get<double>() == 0.0);
  REQUIRE(all.contains("in_collective_frac"));
  CHECK(all["in_collective_frac"].get<double>() == 1.0);
  CHECK(recs[2]["in_collective_frac"] == all["in_collective_frac"]);

  // A one-rank job has no communicator: no field at all.
  dtrain::test::TempDir d1("monitor-collective-1");
  MonitorOptions o1 = o;
  o1.run_dir = d1.path.string();
  o1.collective_seconds = nullptr;
  Monitor m1(o1);
  REQUIRE(wait_for([&] { return m1.samples() >= 1; }));
  CHECK_FALSE(m1.sample_once().contains("in_collective_frac"));
}
