// The trainer's CUDA step on the CPU execution engine's devices, traced. It reads from the
// device once: the device-to-host copies a step adds (a 6-step run minus a 3-step run,
// over 3) are the step's one read-back (gradient norm, overflow flag and the micro-batch
// losses together), plus, with several ranks, the two host-side allreduces of the
// batch's target count and of the loss sum. With training.cuda_graph the steady-state
// step is one graph launch, and the run is bit-identical to the run without graphs
// (losses, gradient norms, the exported weights): fp32, bf16, fp16 with loss-scale
// overflow steps, one rank and two at ZeRO stage 1. Only the engine traces, so any other
// build reports SKIPPED.
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>

#ifndef DTRAIN_CUDA_EMU

TEST_CASE("train step: needs the CPU execution engine (EMU build)") {
  std::printf("the step read-back test runs only in the EMU build (the CPU execution engine traces copies): skipped\n");
  std::fflush(stdout);
  std::exit(77);
}

#else

#include "comm/nccl_comm.h"
#include "config/train_config.h"
#include "device/device.h"
#include "train/trainer.h"

#include <cuda_emu_trace.h>
#include <cuda_runtime.h>
#include <gloo/rendezvous/hash_store.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <vector>

using namespace dtrain;
using namespace dtrain::train;

namespace {

const char* kTiny = R"(
train_micro_batch_size_per_gpu: 2
gradient_accumulation_steps: 1
optimizer:
  type: AdamW
  params:
    lr: 3.0e-3
model:
  architecture: llama
  vocab_size: 264
  n_layer: 2
  n_head: 2
  n_kv_head: 1
  d_model: 32
  d_ff: 64
  max_seq_len: 64
data:
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
  cuda_emu::Trace trace;
};

// train_run of `steps` steps on `world` ranks (threads, rank r on CUDA device r), traced.
Run train_ranks(int world, int steps, const std::vector<std::string>& extra, const std::string& run_dir = "") {
  std::vector<std::string> sets = extra;
  sets.push_back("training.max_steps=" + std::to_string(steps));
  std::vector<std::string> errors(static_cast<size_t>(world));
  Run out;
  out.res.resize(static_cast<size_t>(world));
  gloo::rendezvous::HashStore store;
  cuda_emu::trace_begin();
  auto body = [&](int r) {
    try {
      config::TrainConfig cfg = config::config_load_string(kTiny, "tiny.yaml", sets).cfg;
      config::config_resolve_batch(cfg, world);
      TrainerEnv env;
      env.print = false;
      env.run_dir = run_dir;
      env.resume = false;
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
    } catch (const std::exception& e) {
      errors[static_cast<size_t>(r)] = e.what();
    }
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) threads.emplace_back(body, r);
  for (auto& t : threads) t.join();
  out.trace = cuda_emu::trace_take();
  for (const auto& e : errors) REQUIRE_MESSAGE(e == "", e);
  return out;
}

// Device-to-host copies per device over a whole train_run of `steps` steps.
std::vector<size_t> d2h_per_device(int world, int steps, const std::vector<std::string>& extra) {
  const Run run = train_ranks(world, steps, extra);
  std::vector<size_t> n(static_cast<size_t>(world), 0);
  for (const auto& m : run.trace.memops)
    if (m.kind == cudaMemcpyDeviceToHost && m.device < world) ++n[static_cast<size_t>(m.device)];
  return n;
}

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

// The same run with and without CUDA graphs: bit-identical per-step results and exported
// weights; with graphs every step after the first two is a replay (one launch per step).
void graph_vs_eager(int world, const std::vector<std::string>& extra, int steps = 6) {
  TempDir a("graph"), b("eager");
  std::vector<std::string> on = extra, off = extra;
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

}  // namespace

TEST_CASE("train step: one device-to-host read per step on one rank (fp32, bf16, fp16)") {
  ::setenv("NCCL_SOCKET_IFNAME", "lo", 0);
  for (const char* dt : {"fp32", "bf16", "fp16"}) {
    CAPTURE(dt);
    std::vector<std::string> extra;
    if (std::string(dt) != "fp32") extra.push_back(std::string(dt) + ".enabled=true");
    CHECK(per_step(1, extra) == std::vector<size_t>{1});
  }
}

TEST_CASE("train step: two ranks at ZeRO stage 1 agree on the norm on the device (NCCL)") {
  ::setenv("NCCL_SOCKET_IFNAME", "lo", 0);
  if (device::cuda_count() < 2) {
    MESSAGE("one CUDA device: the two-rank case needs two");
    return;
  }
  // The read-back, and the host allreduces of the target count (before forward) and the
  // loss sum (logging): the norm and overflow flag no longer go through the host.
  CHECK(per_step(2, {"zero_optimization.stage=1"}) == std::vector<size_t>{3, 3});
}

TEST_CASE("train step: CUDA graphs replay the steady-state step bit-identically (one rank: fp32, bf16, fp16)") {
  for (const char* dt : {"fp32", "bf16", "fp16"}) {
    CAPTURE(dt);
    std::vector<std::string> extra;
    if (std::string(dt) != "fp32") extra.push_back(std::string(dt) + ".enabled=true");
    graph_vs_eager(1, extra);
  }
}

TEST_CASE("train step: fp16 overflow steps skipped on the device, with and without graphs") {
  // A loss scale that doubles every other step until the fp16 gradients overflow.
  const std::vector<std::string> extra = {"fp16.enabled=true", "fp16.initial_scale_power=12",
                                          "fp16.loss_scale_window=2", "fp16.hysteresis=1"};
  const Run probe = train_ranks(1, 12, extra);
  int64_t skipped = 0;
  for (int x : probe.res[0].skipped) skipped += x;
  CHECK(skipped > 0);
  graph_vs_eager(1, extra, 12);
}

TEST_CASE("train step: CUDA graphs with two ranks at ZeRO stage 1 (NCCL captured on its own stream)") {
  ::setenv("NCCL_SOCKET_IFNAME", "lo", 0);
  if (device::cuda_count() < 2) {
    MESSAGE("one CUDA device: the two-rank case needs two");
    return;
  }
  // Plain text: every position is a target, so each rank's share of the batch (its
  // backward scale) stays the same from step to step and the recorded step replays.
  const std::vector<std::string> text = {"data.train=configs/data/text/train.txt", "data.format=text",
                                         "zero_optimization.stage=1"};
  graph_vs_eager(2, text);
  std::vector<std::string> bf16 = text;
  bf16.push_back("bf16.enabled=true");
  graph_vs_eager(2, bf16);
  // SFT data: the ranks' shares of the unmasked targets change every step, and so does
  // the backward scale the step was recorded with: every step runs eagerly, identically.
  TempDir a("sft"), b("sft_off");
  const Run g = train_ranks(2, 4, {"zero_optimization.stage=1", "training.cuda_graph=true"});
  const Run e = train_ranks(2, 4, {"zero_optimization.stage=1", "training.cuda_graph=false"});
  CHECK(g.res[0].losses == e.res[0].losses);
  CHECK(g.res[0].graph_steps == 0);
}

#endif
