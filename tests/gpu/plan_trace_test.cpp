// The plan is the code: one real training step (the trainer's train::TrainStep: forward,
// backward, the ZeRO engine's stage-0 update) on the CPU execution engine's CUDA device, traced, against
// PlanDevice's list for the same step (plan::plan_step). Tiny GPT-2 and Llama (GQA,
// recompute, accumulation, LoRA with dropout), bf16 and fp32: the kernel launches (by
// launch text), the cuBLASLt matmuls (shape, transposes, types, epilogue, alpha, beta)
// and the memsets / memcpys (kind, width, height) must be the same multisets, and in bf16 the
// tensor-core attention's launch geometry (blocks, threads, dynamic shared memory) the
// budget's occupancy reads. Run again under DTRAIN_ATTN_VARIANT=hopper
// (gpu_plan_trace_test_hopper): the hopper forward where it runs (head dims 64 and 128 on
// the engine's H100). Only the engine can trace, so any other build reports SKIPPED.
#include "plan/bench_plan.h"
#include "train/step_setup.h"
#include "gpu/gpu_skip.h"

#include <doctest/doctest.h>

#ifndef DTRAIN_CUDA_EMU

EMU_ONLY_SUITE("plan vs trace")

#else

#include "device/device.h"
#include "device/plan_device.h"
#include "model/model.h"
#include "train/train_step.h"

#include "gpu/tiny_model.h"
#include "kernels/cross_entropy.cuh"

#include <cublasLt.h>
#include <cuda_emu_trace.h>

#include <fmt/format.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

using namespace dtrain;
using device::PlanEntry;
using device::PlanKind;
using model::ModelConfig;

namespace {

ModelConfig tiny(ModelConfig::Arch arch) { return test::tiny_model(arch, 64); }

train::StepSetup setup(ModelConfig::Arch arch, DType dt) {
  train::StepSetup s;
  s.model = tiny(arch);
  s.dtype = dt;
  s.micro_batch = 2;
  s.seq_len = 40;  // two attention tiles, the second partial
  s.zero.stage = 0;
  s.zero.compute_dtype = dt;
  s.zero.gradient_clipping = 1.0f;
  s.lr = 1e-3f;
  s.seed = 7;
  return s;
}

int cuda_type(DType t) { return t == DType::F32 ? CUDA_R_32F : t == DType::BF16 ? CUDA_R_16BF : CUDA_R_16F; }

uint32_t epilogue_value(device::PlanEpilogue e) {
  switch (e) {
    case device::PlanEpilogue::DEFAULT: return CUBLASLT_EPILOGUE_DEFAULT;
    case device::PlanEpilogue::BIAS: return CUBLASLT_EPILOGUE_BIAS;
    case device::PlanEpilogue::GELU_AUX: return CUBLASLT_EPILOGUE_GELU_AUX;
    case device::PlanEpilogue::GELU_AUX_BIAS: return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case device::PlanEpilogue::DGELU: return CUBLASLT_EPILOGUE_DGELU;
    case device::PlanEpilogue::BGRADB: return CUBLASLT_EPILOGUE_BGRADB;
  }
  return 0;
}

// Multisets of printable keys: what each side issued, with counts.
using Multiset = std::map<std::string, int64_t>;

std::string matmul_key(int64_t m, int64_t n, int64_t k, bool ta, bool tb, int a, int b, int c, int d, uint32_t epi,
                       float alpha, float beta, int batch) {
  return fmt::format("m={} n={} k={} ta={} tb={} types={}/{}/{}/{} epilogue={} alpha={} beta={} batch={}", m, n, k, ta,
                     tb, a, b, c, d, epi, alpha, beta, batch);
}
std::string memop_key(int kind, size_t width, size_t height) {
  return fmt::format("{} {}x{}", kind < 0 ? "memset" : fmt::format("memcpy kind {}", kind), width, height);
}

struct Issued {
  Multiset kernels, matmuls, memops;
  Multiset attn_fwd, attn_bwd;  // the tensor-core attention's launches: "launch text blocks threads smem"
  int64_t collectives = 0;
};

std::string launch_key(const std::string& name, int64_t blocks, int threads, size_t smem) {
  return fmt::format("{} blocks={} threads={} smem={}", name, blocks, threads, smem);
}

// (The tensor-core forward is launched as `kernel`, with dynamic shared memory; the norm
// forward's `kernel` has none, and a bf16 step runs no fp32 attention.)
Issued from_trace(const cuda_emu::Trace& t) {
  Issued r;
  for (const auto& k : t.kernels) {
    ++r.kernels[k.name];
    const std::string key = launch_key(k.name, static_cast<int64_t>(k.grid.x) * k.grid.y * k.grid.z,
                                       static_cast<int>(k.block.x * k.block.y * k.block.z), k.dynamic_smem);
    if (k.name == "kernel" && k.dynamic_smem > 0) ++r.attn_fwd[key];
    if (k.name == "kernel_dkdv" || k.name == "kernel_dq") ++r.attn_bwd[key];
  }
  for (const auto& m : t.matmuls)
    ++r.matmuls[matmul_key(m.m, m.n, m.k, m.transa, m.transb, m.a_type, m.b_type, m.c_type, m.d_type, m.epilogue,
                           m.alpha, m.beta, m.batch)];
  for (const auto& o : t.memops) ++r.memops[memop_key(o.kind, o.width, o.height)];
  r.collectives = static_cast<int64_t>(t.collectives.size());
  return r;
}

// smem_optin: the card's, which picks the stages the launch takes (bench_plan.cpp's kernel_fit).
Issued from_plan(const std::vector<PlanEntry>& entries, size_t smem_optin) {
  Issued r;
  for (const PlanEntry& e : entries) {
    switch (e.kind) {
      case PlanKind::KERNEL:
        r.kernels[e.kernel] += e.launches;
        if (!e.launch.kernel.empty()) {
          const device::PlanLaunch& l = e.launch;
          const size_t smem = l.smem_two_stages <= smem_optin ? l.smem_two_stages : l.smem_one_stage;
          (e.unit == device::PlanUnit::TENSOR_ATTN_FWD ? r.attn_fwd
                                                       : r.attn_bwd)[launch_key(e.kernel, l.blocks, l.threads, smem)] +=
              e.launches;
        }
        break;
      case PlanKind::MATMUL: {
        const auto& m = e.matmul;
        r.matmuls[matmul_key(m.m, m.n, m.k, m.transa, m.transb, cuda_type(m.ab), cuda_type(m.ab), cuda_type(m.c),
                             cuda_type(m.c), epilogue_value(m.epilogue), m.alpha, m.beta, m.batch)] += e.launches;
        break;
      }
      case PlanKind::MEMSET: r.memops[memop_key(-1, e.width, e.height)] += e.launches; break;
      case PlanKind::MEMCPY: {
        const int kind = e.copy == device::PlanCopy::H2D   ? cudaMemcpyHostToDevice
                         : e.copy == device::PlanCopy::D2H ? cudaMemcpyDeviceToHost
                                                           : cudaMemcpyDeviceToDevice;
        r.memops[memop_key(kind, e.width, e.height)] += e.launches;
        break;
      }
    }
  }
  return r;
}

// "" when equal, else what only one side has (with the count difference).
std::string diff(const Multiset& traced, const Multiset& planned) {
  std::string out;
  Multiset all = traced;
  for (const auto& [k, n] : planned) all[k];
  for (const auto& [k, unused] : all) {
    const auto t = traced.count(k) ? traced.at(k) : 0, p = planned.count(k) ? planned.at(k) : 0;
    if (t != p) out += fmt::format("\n  {}: traced {}, planned {}", k, t, p);
  }
  return out;
}

int64_t total(const Multiset& m) {
  int64_t n = 0;
  for (const auto& [k, c] : m) n += c;
  return n;
}

// The step as bench_train_run runs it on the device (the trainer's, train::TrainStep),
// the second step traced.
cuda_emu::Trace traced_step(const train::StepSetup& s) {
  auto dev = device::cuda_create(0);
  model::Model host(s.model);
  host.init_weights(s.seed);
  if (s.lora) host.lora_enable(*s.lora);
  host.set_recompute_layers(s.recompute_layers);
  const std::unique_ptr<model::Model> m = train::model_on_device(host, *dev, s.dtype);
  train::TrainStep step(*m, &host, nullptr, s.zero, s.step_options());
  train::StepTimer timer;
  const train::SyntheticBatch batch = train::synthetic_batch(s, 0);
  step.run(1, s.lr, batch.view(), timer);
  dev->synchronize();
  cuda_emu::trace_begin();
  step.run(2, s.lr, batch.view(), timer);
  dev->synchronize();
  return cuda_emu::trace_take();
}

// The engine's card's opt-in shared memory per block and compute capability (x 10), as the
// plan's card would give them.
size_t smem_optin() {
  int v = 0;
  REQUIRE(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0) == cudaSuccess);
  return static_cast<size_t>(v);
}
int compute_capability() {
  int major = 0, minor = 0;
  REQUIRE(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) == cudaSuccess);
  REQUIRE(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0) == cudaSuccess);
  return 10 * major + minor;
}

// The variant this process runs (the kernels read it once): the plan device reads the same.
std::string attn_variant() {
  const char* v = std::getenv("DTRAIN_ATTN_VARIANT");
  return v && *v ? v : "legacy";
}

// bwd_geometry: compare the backward's launch geometry too. Not where the real backward is
// fa2's (DTRAIN_ATTN_VARIANT fa2 or hopper) at a head dim where its 128-row dQ tiles run
// (33-64): the budget prices legacy's tiles there (cuda_costs.cpp).
Issued check_plan_matches(const train::StepSetup& s, bool bwd_geometry = true) {
  const Issued traced = from_trace(traced_step(s));
  const Issued planned = from_plan(plan::plan_step(s, smem_optin(), compute_capability()).entries, smem_optin());
  // A step issues all three kinds: an empty side would make the comparison vacuous.
  REQUIRE(total(traced.kernels) > 0);
  REQUIRE(total(traced.matmuls) > 0);
  REQUIRE(total(traced.memops) > 0);
  INFO(fmt::format("{} {} B={} T={} accum={} recompute={} of {} lora={}", model::arch_name(s.model.arch),
                   dtype_name(s.dtype), s.micro_batch, s.seq_len, s.grad_accum, s.recompute_layers, s.model.n_layer,
                   s.lora.has_value()));
  const std::string dk = diff(traced.kernels, planned.kernels);
  const std::string dm = diff(traced.matmuls, planned.matmuls);
  const std::string dmem = diff(traced.memops, planned.memops);
  CHECK_MESSAGE(dk.empty(), "kernel launches differ:" << dk);
  CHECK_MESSAGE(dm.empty(), "cuBLASLt matmuls differ:" << dm);
  CHECK_MESSAGE(dmem.empty(), "memsets / memcpys differ:" << dmem);
  CHECK(traced.collectives == 0);  // one rank: the plan has no collectives either
  if (s.dtype != DType::F32) {
    REQUIRE(total(traced.attn_fwd) > 0);
    const std::string dfwd = diff(traced.attn_fwd, planned.attn_fwd);
    CHECK_MESSAGE(dfwd.empty(), "attention forward launch geometry differs:" << dfwd);
    if (bwd_geometry) {
      const std::string dbwd = diff(traced.attn_bwd, planned.attn_bwd);
      CHECK_MESSAGE(dbwd.empty(), "attention backward launch geometry differs:" << dbwd);
    }
  }
  return traced;
}

}  // namespace

TEST_CASE("plan vs trace: GPT-2, bf16 and fp32") {
  for (DType dt : {DType::BF16, DType::F32}) check_plan_matches(setup(ModelConfig::Arch::GPT2, dt));
}

TEST_CASE("plan vs trace: Llama with GQA, bf16 and fp32; recompute (every layer, then some) with accumulation") {
  for (DType dt : {DType::BF16, DType::F32}) check_plan_matches(setup(ModelConfig::Arch::LLAMA, dt));
  train::StepSetup s = setup(ModelConfig::Arch::LLAMA, DType::BF16);
  s.recompute_layers = s.model.n_layer;
  s.grad_accum = 2;
  check_plan_matches(s);
  REQUIRE(s.model.n_layer >= 2);
  s.recompute_layers = s.model.n_layer / 2;
  check_plan_matches(s);
}

// Head dims 64 and 128 (the hopper forward's; the tiny models have 16 and 8), bf16 and fp16,
// T 200: two 128-row query tiles, the second partial. Under DTRAIN_ATTN_VARIANT=hopper on the
// engine's H100 the forward is the hopper kernel (288 threads), planned with its geometry.
TEST_CASE("plan vs trace: head dims 64 and 128 in bf16 and fp16 (the hopper forward under its variant)") {
  const bool fa2_backward = attn_variant() != "legacy";
  for (auto [arch, hd, dt] :
       {std::tuple{ModelConfig::Arch::LLAMA, 64, DType::BF16}, std::tuple{ModelConfig::Arch::GPT2, 128, DType::F16}}) {
    train::StepSetup s = setup(arch, dt);
    s.model = test::tiny_model(arch, 256);
    s.model.d_model = hd * s.model.n_head;
    s.micro_batch = 1;
    s.seq_len = 200;
    // fa2's 128-row dQ tiles run at head dim 64 only (kernels/attention_mma_tiles.cuh, kWideDq).
    const Issued traced = check_plan_matches(s, !(fa2_backward && hd == 64));
    int64_t hopper = 0;
    for (const auto& [key, n] : traced.attn_fwd)
      if (key.find("threads=288") != std::string::npos) hopper += n;
    // Each layer's forward once (no accumulation, no recompute): all hopper's where it runs.
    CHECK(hopper == (attn_variant() == "hopper" && compute_capability() == 90 ? s.model.n_layer : 0));
  }
}

TEST_CASE("plan vs trace: LoRA with dropout (GPT-2 bf16, Llama fp32)") {
  for (auto [arch, dt] :
       {std::pair{ModelConfig::Arch::GPT2, DType::BF16}, std::pair{ModelConfig::Arch::LLAMA, DType::F32}}) {
    train::StepSetup s = setup(arch, dt);
    model::LoraConfig lc;
    lc.rank = 4;
    lc.dropout = 0.1f;
    lc.targets = arch == ModelConfig::Arch::GPT2 ? std::vector<std::string>{"c_attn", "c_fc"}
                                                 : std::vector<std::string>{"q_proj", "v_proj", "down_proj"};
    lc.seed = 3;
    s.lora = lc;
    check_plan_matches(s);
  }
}

// The cross-entropy's kernels at every row length the launcher tells apart (one pass from
// registers, one pass with shared memory, two passes; kernels/cross_entropy.cu), as the
// step at real vocabularies would issue them: the plan's copy of the choice
// (cuda_costs.cpp) against the launches, for the fused, forward-only and backward-only ops.
TEST_CASE("plan vs trace: cross-entropy at every row length, fp32/bf16/fp16") {
  auto dev = device::cuda_create(0);
  device::PlanDevice plan(device::Kind::CUDA);
  plan.set_smem_optin(smem_optin());
  const int N = 2;
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    const int vec = 16 / static_cast<int>(dtype_size(dt)), top = kernels::cross_entropy_onepass_max_vocab(dt);
    for (int V : {5, 50257, 8 * 1024 * vec + vec, 128256, top, top + 1}) {
      INFO(dtype_name(dt), " V=", V);
      device::DeviceBuffer logits(*dev, static_cast<size_t>(N) * V * dtype_size(dt)), targets(*dev, N * 4),
          losses(*dev, N * 4), mean(*dev, 4), count(*dev, 4);
      dev->zero(logits.get(), logits.bytes());
      dev->zero(targets.get(), targets.bytes());
      const float one = 1.0f;
      dev->copy_h2d(count.get(), &one, sizeof one);
      auto* l = losses.as<float>();
      auto* m = mean.as<float>();
      auto* t = targets.as<int32_t>();
      for (int op = 0; op < 3; ++op) {
        auto issue = [&](device::Device& d) {
          if (op == 0)
            d.cross_entropy_forward_backward(l, m, logits.get(), logits.get(), t, N, V, V, 1.0f, count.as<float>(), dt);
          if (op == 1) d.cross_entropy_forward(l, m, logits.get(), t, N, V, V, dt);
          if (op == 2) d.cross_entropy_backward(logits.get(), logits.get(), t, N, V, V, 1.0f, count.as<float>(), dt);
        };
        cuda_emu::trace_begin();
        issue(*dev);
        dev->synchronize();
        const Issued traced = from_trace(cuda_emu::trace_take());
        plan.record(true);
        issue(plan);
        plan.record(false);
        const Issued planned = from_plan(plan.take(), smem_optin());
        REQUIRE(total(traced.kernels) > 0);
        const std::string dk = diff(traced.kernels, planned.kernels);
        CHECK_MESSAGE(dk.empty(), "op " << op << ": kernel launches differ:" << dk);
      }
    }
  }
}

#endif  // DTRAIN_CUDA_EMU
