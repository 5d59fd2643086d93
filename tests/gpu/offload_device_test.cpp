// ZeRO-Offload on the CPU execution engine's CUDA devices (EMU tree; skipped without a
// GPU elsewhere): offloaded training at stages 1-3 on 1 and 2 ranks against the same
// run without offload (fp32, bf16, fp16 with loss scaling, clipping on and off,
// offload_param at stage 3); the engine's device bytes drop by what the formula says
// moves to the host; the schedule of an offloaded step (each bucket's host AdamW after
// its gradient landed, during the backward when nothing waits for the whole gradient);
// a run checkpointed with offload resumes without it and back.
#include "gpu/gpu_skip.h"
#include "gpu/tiny_model.h"
#include "gpu/train_runs.h"

#include "comm/nccl_comm.h"
#include "device/device.h"
#include "model/model.h"
#include "train/zero_engine.h"

#include <doctest/doctest.h>
#include <gloo/rendezvous/hash_store.h>

#include <cmath>
#include <iomanip>
#include <memory>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

using namespace dtrain;
using namespace dtrain::train;
using train_runs::Run;
using train_runs::train_ranks;

namespace {

using Setup = test::GpuSetup;
using test::enough_gpus;

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

const std::vector<std::string> kOffload = {"zero_optimization.offload_optimizer.device=cpu",
                                           "zero_optimization.offload_optimizer.pin_memory=true"};

void check_close(const std::vector<double>& got, const std::vector<double>& want, double rel) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("step " << i + 1 << ": offloaded " << std::setprecision(17) << got[i] << " vs on the device " << want[i]);
    CHECK(std::isfinite(got[i]));
    CHECK(std::fabs(got[i] - want[i]) <= rel * std::fabs(want[i]));
  }
}

}  // namespace

TEST_CASE("offload_optimizer at stages 1-3 on 1 and 2 ranks trains as the run without it (fp32)") {
  Setup s;
  for (int world : {1, 2}) {
    if (!enough_gpus(world)) continue;
    for (int stage : {1, 2, 3}) {
      // clipping 0: at stages 2-3 the host updates each bucket during the backward;
      // clipping 1: the update waits for the global norm.
      for (const std::string clip : {"0", "1.0"}) {
        CAPTURE(world);
        CAPTURE(stage);
        CAPTURE(clip);
        const std::vector<std::string> base = {
            "zero_optimization.stage=" + std::to_string(stage), "gradient_clipping=" + clip,
            "zero_optimization.stage3_param_persistence_threshold=0", "zero_optimization.reduce_bucket_size=3000"};
        const Run dev = train_ranks(world, 4, base);
        const Run off = train_ranks(world, 4, with(base, kOffload));
        // The same operations in the same order on the host as in the device's AdamW and
        // norm: bit-identical losses (the first step's loss precedes any update).
        CHECK(off.res[0].losses == dev.res[0].losses);
        check_close(off.res[0].grad_norms, dev.res[0].grad_norms, 1e-6);
        for (int r = 1; r < world; ++r) CHECK(off.res[static_cast<size_t>(r)].losses == off.res[0].losses);
      }
    }
  }
  // Gradient accumulation: each step's first micro-batch lands in the host gradient, the
  // second beside it and is added there (the device adds its shards in the same order).
  for (int stage : {2, 3}) {
    CAPTURE(stage);
    const std::vector<std::string> base = {
        "zero_optimization.stage=" + std::to_string(stage), "gradient_clipping=0", "gradient_accumulation_steps=2",
        "zero_optimization.stage3_param_persistence_threshold=0", "zero_optimization.reduce_bucket_size=3000"};
    CHECK(train_ranks(1, 3, with(base, kOffload)).res[0].losses == train_ranks(1, 3, base).res[0].losses);
  }
}

TEST_CASE("offload in bf16 (stages 2-3, offload_param) and fp16 with loss scaling trains as without it") {
  Setup s;
  const int world = device::cuda_count() >= 2 ? 2 : 1;  // one GPU: one rank
  struct Case {
    const char* prec;
    int stage;
    bool param;
  };
  for (const Case c : {Case{"bf16", 2, false}, Case{"bf16", 3, true}, Case{"fp16", 2, false}, Case{"fp16", 3, false}}) {
    CAPTURE(c.prec);
    CAPTURE(c.stage);
    CAPTURE(c.param);
    const std::vector<std::string> base = {std::string(c.prec) + ".enabled=true",
                                           "zero_optimization.stage=" + std::to_string(c.stage),
                                           "zero_optimization.stage3_param_persistence_threshold=0",
                                           "zero_optimization.reduce_bucket_size=3000", "gradient_clipping=0"};
    std::vector<std::string> sets = with(base, kOffload);
    if (c.param) sets.push_back("zero_optimization.offload_param.device=cpu");
    const Run dev = train_ranks(world, 4, base);
    const Run off = train_ranks(world, 4, sets);
    check_close(off.res[0].losses, dev.res[0].losses, 1e-6);
    CHECK(off.res[0].skipped == dev.res[0].skipped);
    CHECK(off.res[0].loss_scales == dev.res[0].loss_scales);
  }
  // LoRA at stage 3 with offload_param: the frozen base shards live on the host in bf16.
  const std::vector<std::string> lora = {"bf16.enabled=true",
                                         "zero_optimization.stage=3",
                                         "lora.r=4",
                                         "zero_optimization.stage3_param_persistence_threshold=0",
                                         "zero_optimization.reduce_bucket_size=3000",
                                         "gradient_clipping=1.0"};
  const Run dev = train_ranks(world, 4, lora);
  const Run off = train_ranks(world, 4, with(with(lora, kOffload), {"zero_optimization.offload_param.device=cpu"}));
  check_close(off.res[0].losses, dev.res[0].losses, 1e-6);
}

TEST_CASE("offload moves the optimizer state, the gradient shards and (offload_param) the parameters to the host") {
  Setup s;
  const int world = device::cuda_count() >= 2 ? 2 : 1;  // one GPU: one rank
  const model::ModelConfig mc = test::tiny_model(model::ModelConfig::Arch::LLAMA, 16);
  model::Model host(mc);
  host.init_weights(3);
  const size_t phi = host.num_params(), W = static_cast<size_t>(world);
  struct Case {
    int stage;
    bool off, param;
  };
  for (int stage : {1, 2, 3}) {
    size_t on_device = 0;  // this stage's device bytes without offload
    for (const Case c : {Case{stage, false, false}, Case{stage, true, false}, Case{stage, true, stage == 3}}) {
      CAPTURE(c.stage);
      CAPTURE(c.off);
      CAPTURE(c.param);
      std::vector<ZeroMemory> mem(W);
      std::vector<std::string> errors(W);
      gloo::rendezvous::HashStore store;
      std::vector<std::thread> threads;
      for (int r = 0; r < world; ++r)
        threads.emplace_back([&, r] {
          try {
            auto dev = device::cuda_create(r);
            comm::NcclOptions o;
            std::unique_ptr<comm::Communicator> comm;
            if (world > 1) comm = comm::comm_create_nccl(store, r, world, r, o);
            model::Model m(mc, *dev, DType::BF16);
            m.weights_copy_from(host);
            ZeroOptions zo;
            zo.stage = c.stage;
            zo.compute_dtype = DType::BF16;
            zo.param_persistence_threshold = 0;
            zo.offload_optimizer = c.off;
            zo.offload_param = c.param;
            zo.offload_pin_memory = true;
            ZeroEngine e(m, comm.get(), zo, &host);
            CHECK(e.report().offloaded() == c.off);
            mem[static_cast<size_t>(r)] = e.report().memory();
          } catch (const std::exception& ex) {
            errors[static_cast<size_t>(r)] = ex.what();
          }
        });
      for (auto& t : threads) t.join();
      for (const auto& e : errors) REQUIRE_MESSAGE(e == "", e);
      const ZeroMemory& x = mem[0];
      // Every buffer has an even size: exact halves. Device: the bf16 compute copy
      // (resident at stages 1-2; at stage 3 the bf16 shard, none with offload_param) and
      // stage 1's full fp32 gradient; nothing of the optimizer, no gradient shard.
      if (!c.off) {
        CHECK(x.host_bytes == 0);
        on_device = x.total();
        continue;
      }
      const size_t want_param = c.stage < 3 ? 2 * phi : (c.param ? 0 : 2 * phi / W);
      CHECK(x.param_bytes == want_param);
      CHECK(x.grad_bytes == (c.stage == 1 ? 4 * phi : 0));
      CHECK(x.optim_bytes == 0);
      CHECK(x.theory_total() == x.total());
      // Host: master, m, v, gradient (16 B), the landing buffer at stages 2-3 (4 B) and
      // the bf16 copy (2 B), per owned element; all pinned here.
      const size_t want_host = (16 + (c.stage >= 2 ? 4 : 0) + 2) * phi / W;
      CHECK(x.host_bytes == want_host);
      CHECK(x.theory_host == want_host);
      CHECK(x.host_pinned_bytes == want_host);
      MESSAGE("stage " << c.stage << std::string(c.param ? " + offload_param" : "") << ": device " << on_device
                       << " -> " << x.total() << " B (theory " << x.theory_total() << "), host " << x.host_bytes
                       << " B (theory " << x.theory_host << ") for " << phi << " parameters on " << world
                       << " rank(s)");
    }
  }
}

TEST_CASE("an offloaded step's schedule: each bucket's host AdamW after its gradient landed") {
  Setup s;
  model::ModelConfig mc = test::tiny_model(model::ModelConfig::Arch::LLAMA, 16);
  mc.n_layer = 4;  // several buckets
  model::Model host(mc);
  host.init_weights(5);
  const int B = 2, T = 16;
  std::vector<int32_t> tok(B * T), tgt(B * T);
  for (int i = 0; i < B * T; ++i) {
    tok[static_cast<size_t>(i)] = (i * 7) % 96;
    tgt[static_cast<size_t>(i)] = (i * 7 + 1) % 96;
  }
  for (float clip : {0.0f, 1.0f}) {
    CAPTURE(clip);
    auto dev = device::cuda_create(0);
    model::Model m(mc, *dev, DType::F32);
    m.weights_copy_from(host);
    ZeroOptions zo;
    zo.stage = 2;
    zo.reduce_bucket_size = 3000;  // one bucket per layer or so
    zo.offload_optimizer = true;
    zo.gradient_clipping = clip;
    ZeroEngine e(m, nullptr, zo);
    for (int step = 0; step < 2; ++step) {
      e.before_step();
      e.step_prepare(1e-3f);
      m.forward(tok.data(), tgt.data(), B, T);
      m.backward(1.0f);
      e.step_issue(1.0f);
      REQUIRE(e.step_finish(1.0f));
    }
    const std::vector<OffloadTraceEntry> tr = e.report().offload_trace();
    std::vector<double> landed, adamw;
    double last_backward = -1.0;
    int whole = 0;
    for (const auto& x : tr) {
      if (x.what == "landed") {
        if (static_cast<size_t>(x.index) >= landed.size()) landed.resize(static_cast<size_t>(x.index) + 1, -1.0);
        landed[static_cast<size_t>(x.index)] = x.t0;
      } else if (x.what == "adamw" && x.index >= 0) {
        if (static_cast<size_t>(x.index) >= adamw.size()) adamw.resize(static_cast<size_t>(x.index) + 1, -1.0);
        adamw[static_cast<size_t>(x.index)] = x.t0;
      } else if (x.what == "adamw") {
        ++whole;
      } else if (x.what == "backward" && x.index == -1) {
        last_backward = x.t0;
      }
    }
    REQUIRE(landed.size() >= 3);  // several buckets, each landed once
    for (double t : landed) CHECK(t >= 0.0);
    if (clip == 0.0f) {
      // Bucket by bucket on the host worker, each after its own gradient reached the host.
      CHECK(whole == 0);
      REQUIRE(adamw.size() == landed.size());
      size_t overlapped = 0;
      for (size_t b = 0; b < adamw.size(); ++b) {
        CHECK(adamw[b] >= landed[b]);
        if (adamw[b] < landed.back()) ++overlapped;
      }
      MESSAGE(overlapped << " of " << adamw.size()
                         << " buckets' host AdamW began before the device had finished the last bucket's gradient");
    } else {
      // Clipping needs the global norm: one update after the backward.
      CHECK(adamw.empty());
      CHECK(whole == 1);
      CHECK(last_backward >= 0.0);
    }
  }
}

TEST_CASE("a run checkpointed with offload resumes without it at another world size, and back") {
  Setup s;
  if (!enough_gpus(2)) return;
  train_runs::TempDir a("offload_a");
  const std::vector<std::string> base = {"zero_optimization.reduce_bucket_size=3000", "training.save_steps=2"};
  // 4 steps straight on 2 ranks at stage 2, without offload, for reference.
  const Run ref = train_ranks(2, 4, with(base, {"zero_optimization.stage=2"}));
  // 2 steps with offload (2 ranks, stage 2), then 2 without on 1 rank at stage 1 (the
  // same global batch: 2 micro-batches), then 2 more with offload at stage 3.
  REQUIRE(train_ranks(2, 2, with(base, with({"zero_optimization.stage=2"}, kOffload)), a.path.string()).res[0].steps ==
          2);
  const Run rest = train_ranks(1, 4, with(base, {"zero_optimization.stage=1", "gradient_accumulation_steps=2"}),
                               a.path.string(), true);
  CHECK(rest.res[0].resumed_step == 2);
  CHECK(rest.res[0].resumed_world_size == 2);
  REQUIRE(rest.res[0].losses.size() == 2);
  check_close(rest.res[0].losses, {ref.res[0].losses[2], ref.res[0].losses[3]}, 1e-5);
  const Run more = train_ranks(2, 6, with(base, with({"zero_optimization.stage=3"}, kOffload)), a.path.string(), true);
  CHECK(more.res[0].resumed_step == 4);
  REQUIRE(more.res[0].losses.size() == 2);
  for (double l : more.res[0].losses) CHECK(std::isfinite(l));
}
