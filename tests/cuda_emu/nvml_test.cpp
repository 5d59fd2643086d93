// The engine's NVML subset, reached as the resource monitor reaches a driver's NVML:
// dlopen of the program itself (monitor.nvml_library: "") and dlsym of nvml.h's names.
// Memory used follows cudaMalloc, utilisation follows the kernels the device ran, the
// SM clock is the card model's; temperature and power are "not supported" and left out;
// an injected thermal throttle is one resource alert in the rank's own file.
#include <cuda_runtime.h>
#include <nvml.h>

#include "monitor/monitor.h"
#include "monitor/nvml.h"

#include "temp_dir.h"

#include <doctest/doctest.h>

#include <filesystem>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <thread>

#define LAUNCH(grid, block, smem, stream, ...) \
  ::cuda_emu::launch(#__VA_ARGS__, __FILE__, __LINE__, grid, block, smem, stream, __VA_ARGS__)

using namespace dtrain::monitor;

namespace {

__global__ void spin_kernel(float* p, int n, int rounds) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float v = p[i];
  for (int r = 0; r < rounds; ++r) v = v * 0.999f + 1.0f;
  p[i] = v;
}

std::vector<nlohmann::json> jsonl(const std::filesystem::path& p) {
  std::vector<nlohmann::json> out;
  std::ifstream in(p);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  return out;
}

}  // namespace

TEST_CASE("engine NVML: memory, clock and utilisation from the engine's accounting, through dlopen") {
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  std::string why;
  auto nv = Nvml::open("", &why);
  INFO(why);
  REQUIRE(nv);
  auto g0 = nv->read(0, &why);
  REQUIRE(g0);
  REQUIRE(g0->mem_used);
  REQUIRE(g0->mem_total);
  CHECK(*g0->mem_total == int64_t{80} << 30);
  CHECK_FALSE(g0->temperature_c);  // no thermal model: NVML_ERROR_NOT_SUPPORTED
  CHECK_FALSE(g0->power_w);
  CHECK(g0->sm_clock_mhz == 1980);
  REQUIRE(g0->throttle_reasons);
  CHECK((*g0->throttle_reasons & (kThrottleThermal | kThrottlePower)) == 0);

  float* p = nullptr;
  const size_t bytes = size_t{64} << 20;
  REQUIRE(cudaMalloc(&p, bytes) == cudaSuccess);
  auto g1 = nv->read(0, &why);
  REQUIRE(g1);
  CHECK(*g1->mem_used - *g0->mem_used == static_cast<int64_t>(bytes));

  // Kernels for a while: the next utilisation query covers them.
  nv->read(0, &why);  // opens a fresh window
  const int n = 1 << 14;
  for (int k = 0; k < 20; ++k) LAUNCH((n + 255) / 256, 256, 0, nullptr, spin_kernel)(p, n, 200);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  auto g2 = nv->read(0, &why);
  REQUIRE(g2);
  REQUIRE(g2->util_pct);
  CHECK(*g2->util_pct > 0);
  CHECK(*g2->util_pct <= 100);
  // Idle since: the next window reads 0 and NVML's GpuIdle reason.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  auto g3 = nv->read(0, &why);
  CHECK(*g3->util_pct == 0);
  CHECK((*g3->throttle_reasons & nvmlClocksThrottleReasonGpuIdle) != 0);

  REQUIRE(cudaFree(p) == cudaSuccess);
  auto g4 = nv->read(0, &why);
  CHECK(*g4->mem_used == *g0->mem_used);
  CHECK_FALSE(nv->read(1000, &why));
  CHECK(why.find("nvmlDeviceGetHandleByIndex_v2(1000)") != std::string::npos);
}

TEST_CASE("engine NVML: the monitor's records carry the GPU; an injected thermal throttle is one alert") {
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  dtrain::test::TempDir d("emu-nvml");
  MonitorOptions o;
  o.interval_s = 3600;
  o.run_dir = d.path.string();
  o.origin = {.rank = 0, .local_rank = 0, .node = 0, .round = 0, .host = "emu"};
  o.gpu = true;
  o.gpu_index = 0;
  o.nvml_library = "";  // the engine's NVML in this program
  float* p = nullptr;
  REQUIRE(cudaMalloc(&p, size_t{32} << 20) == cudaSuccess);
  {
    Monitor m(o);
    for (int i = 0; i < 400 && m.samples() < 1; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    REQUIRE(m.samples() >= 1);
    ::setenv("DTRAIN_EMU_NVML_THROTTLE", "0x40", 1);
    m.sample_once();
    m.sample_once();  // the same episode
    ::unsetenv("DTRAIN_EMU_NVML_THROTTLE");
  }
  REQUIRE(cudaFree(p) == cudaSuccess);
  // The rank's own file (lib/monitor: RUN_DIR/resources/rank<R>.jsonl), none in metrics.jsonl.
  CHECK_FALSE(std::filesystem::exists(d.path / "metrics.jsonl"));
  // Samples ("kind": "resource") and, since the ranks no longer write events.jsonl, the
  // alert as a "resource_alert" record in the same file (the launcher copies it).
  std::vector<nlohmann::json> recs, alerts;
  for (auto& r : jsonl(d.path / "resources" / "rank0.jsonl"))
    (r.value("kind", "") == "resource_alert" ? alerts : recs).push_back(r);
  REQUIRE(recs.size() == 3);
  for (const auto& r : recs) {
    CHECK(r.at("gpu_index") == 0);
    CHECK(r.at("gpu_mem_used_bytes").get<int64_t>() >= int64_t{32} << 20);
    CHECK(r.at("gpu_mem_total_bytes") == int64_t{80} << 30);
    CHECK(r.at("gpu_sm_clock_mhz") == 1980);
    CHECK_FALSE(r.contains("gpu_temperature_c"));
  }
  CHECK_FALSE(std::filesystem::exists(d.path / "events.jsonl"));
  REQUIRE(alerts.size() == 1);
  CHECK(alerts[0].at("alert") == "gpu_throttle");
}
