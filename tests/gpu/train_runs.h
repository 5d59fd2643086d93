// Test-only: train_run on the CPU execution engine's CUDA devices, traced, for
// the trainer-step suites (train_step_test: device read-backs; step_graph_test: CUDA
// graphs against eager steps).
#pragma once

#include "comm/nccl_comm.h"
#include "config/train_config.h"
#include "device/device.h"
#include "train/trainer.h"

#include "rank_threads.h"
#include "tiny_job.h"

#ifdef DTRAIN_CUDA_EMU
#include <cuda_emu_trace.h>
#include <cuda_runtime.h>
#endif
#include <gloo/rendezvous/hash_store.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include <unistd.h>

namespace train_runs {

using namespace dtrain;
using namespace dtrain::train;

inline const std::string kTiny = R"(
train_micro_batch_size_per_gpu: 2
gradient_accumulation_steps: 1
optimizer:
  type: AdamW
  params:
    lr: 3.0e-3
)" + dtrain::test::tiny_llama_yaml(64) +
                                 R"(data:
  train: configs/data/tasks/train.jsonl
  format: alpaca
  tokenizer: byte
  seq_len: 64
  pack: true
training:
  seed: 11
gradient_clipping: 1.0
)";

namespace fs = std::filesystem;

struct Run {
  std::vector<TrainResult> res;
#ifdef DTRAIN_CUDA_EMU
  cuda_emu::Trace trace;  // only the engine traces
#endif
};

// train_run of `steps` steps on `world` ranks (threads, rank r on CUDA device r), traced.
Run train_ranks(int world, int steps, const std::vector<std::string>& extra, const std::string& run_dir = "",
                bool resume = false) {
  std::vector<std::string> sets = extra;
  sets.push_back("training.max_steps=" + std::to_string(steps));
  Run out;
  out.res.resize(static_cast<size_t>(world));
  gloo::rendezvous::HashStore store;
#ifdef DTRAIN_CUDA_EMU
  cuda_emu::trace_begin();
#endif
  const std::vector<std::string> errors = dtrain::test::run_threads(world, [&](int r) {
    config::TrainConfig cfg = config::config_load_string(kTiny, "tiny.yaml", sets).cfg;
    config::config_resolve_batch(cfg, world);
    TrainerEnv env;
    env.print = false;
    env.run_dir = run_dir;
    env.resume = resume;
    env.rank = r;
    env.world_size = world;
    auto dev = device::cuda_create(r);
    env.device = dev.get();
    std::unique_ptr<comm::Communicator> comm;
    if (world > 1) {
      comm::NcclOptions o;
      o.timeout = std::chrono::milliseconds(120000);
      comm = comm::comm_create_nccl(store, r, world, r, o);
    }
    env.comm = comm.get();
    out.res[static_cast<size_t>(r)] = train_run(cfg, env);
  });
#ifdef DTRAIN_CUDA_EMU
  out.trace = cuda_emu::trace_take();
#endif
  for (const auto& e : errors) REQUIRE_MESSAGE(e == "", e);
  return out;
}

#ifdef DTRAIN_CUDA_EMU
// Device-to-host copies per device over a whole train_run of `steps` steps.
std::vector<size_t> d2h_per_device(int world, int steps, const std::vector<std::string>& extra) {
  const Run run = train_ranks(world, steps, extra);
  std::vector<size_t> n(static_cast<size_t>(world), 0);
  for (const auto& m : run.trace.memops)
    if (m.kind == cudaMemcpyDeviceToHost && m.device < world) ++n[static_cast<size_t>(m.device)];
  return n;
}

#endif

std::string file_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  REQUIRE_MESSAGE(in.good(), "cannot read " << p);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& name)
      : path(fs::temp_directory_path() / ("dtrain_train_step_" + std::to_string(getpid()) + "_" + name)) {
    fs::remove_all(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

#ifdef DTRAIN_CUDA_EMU
// The same run with and without CUDA graphs: bit-identical per-step results and exported
// weights; with graphs every step after the first two is a replay (one launch per step).
void graph_vs_eager(int world, const std::vector<std::string>& extra, int steps = 6) {
  TempDir a("graph"), b("eager");
  // fp32 exports: bit-identical masters, not only their bf16 rounding (export.dtype's default).
  std::vector<std::string> on = extra, off = extra;
  on.push_back("export.dtype=fp32");
  off.push_back("export.dtype=fp32");
  on.push_back("training.cuda_graph=true");
  off.push_back("training.cuda_graph=false");
  const Run g = train_ranks(world, steps, on, a.path.string());
  const Run e = train_ranks(world, steps, off, b.path.string());
  const TrainResult& rg = g.res[0];
  const TrainResult& re = e.res[0];
  CHECK(rg.losses == re.losses);
  CHECK(rg.grad_norms == re.grad_norms);
  CHECK(rg.skipped == re.skipped);
  CHECK(rg.loss_scales == re.loss_scales);
  CHECK(e.trace.graph_launches.empty());
  CHECK(re.graph_steps == 0);
  CHECK(rg.graph_steps > 0);
  // One launch per replayed step on every rank's device.
  CHECK(g.trace.graph_launches.size() == static_cast<size_t>(rg.graph_steps) * static_cast<size_t>(world));
  for (int r = 1; r < world; ++r) CHECK(g.res[static_cast<size_t>(r)].losses == rg.losses);
  CHECK(file_bytes(a.path / "final" / "model.safetensors") == file_bytes(b.path / "final" / "model.safetensors"));
}

std::vector<size_t> per_step(int world, const std::vector<std::string>& extra) {
  const std::vector<size_t> a = d2h_per_device(world, 3, extra), b = d2h_per_device(world, 6, extra);
  std::vector<size_t> out;
  for (size_t r = 0; r < a.size(); ++r) {
    REQUIRE(b[r] >= a[r]);
    CHECK((b[r] - a[r]) % 3 == 0);
    out.push_back((b[r] - a[r]) / 3);
  }
  return out;
}

#endif

}  // namespace train_runs
