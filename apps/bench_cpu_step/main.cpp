// bench_cpu_step: tokens/s of a CPU training step (forward, backward, AdamW) for a
// config, on synthetic tokens, the share of the step spent inside GEMM (BLAS), a
// per-op-class breakdown and the peak RSS. Prints figures; asserts nothing. --doc-len N
// packs each row with documents of N tokens kept apart (the model's doc_start, as
// data.neat_packing gives), so the attention skips the key ranges between them. --unfused
// runs one GEMM per projection instead of the fused q/k/v and gate/up GEMMs.
//
//   build/bench_cpu_step configs/tiny-sft.yaml [--steps N] [--warmup N] [--doc-len N] [--unfused] [--set k=v ...]
#include "config/train_config.h"
#include "core/env.h"
#include "core/error.h"
#include "core/rng.h"
#include "model/model.h"
#include "ops/linear.h"
#include "ops/op_stats.h"
#include "ops/parallel.h"
#include "ops/optim.h"
#include "train/model_factory.h"

#include <cblas.h>
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

using namespace dtrain;

namespace {
double process_cpu_seconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s CONFIG [--steps N] [--warmup N] [--doc-len N] [--unfused] [--set key=value ...]\n",
                 argv[0]);
    return 2;
  }
  std::string path = argv[1];
  int steps = 10, warmup = 2, doc_len = 0;
  bool unfused = false;
  std::vector<std::string> sets;
  for (int i = 2; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--unfused")) {
      unfused = true;
      continue;
    }
    if (i + 1 >= argc) break;
    if (!std::strcmp(argv[i], "--steps")) steps = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--warmup")) warmup = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--doc-len")) doc_len = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--set")) sets.push_back(argv[i + 1]);
    ++i;
  }
  try {
    config::TrainConfig cfg = config::config_load_file(path, sets).cfg;
    config::config_resolve_batch(cfg, 1);
    auto model = train::model_create(cfg);
    model->set_fused_projections(!unfused);
    const auto& mc = model->config();
    const int B = static_cast<int>(cfg.resolved_micro_batch_size);
    // The sequence length every other command trains at: data.seq_len (the config loader
    // derives it from model.max_seq_len when left out and keeps it within it).
    const int T = static_cast<int>(cfg.data.seq_len.value_or(mc.max_seq_len));
    Rng rng(1);
    std::vector<int32_t> tokens(static_cast<size_t>(B) * T), targets(tokens.size());
    for (auto& t : tokens) t = static_cast<int32_t>(rng.below(static_cast<uint64_t>(mc.vocab_size)));
    for (size_t i = 0; i < tokens.size(); ++i) targets[i] = tokens[(i + 1) % tokens.size()];
    std::vector<int32_t> doc_start;  // documents of doc_len tokens (the last one of a row shorter)
    if (doc_len > 0)
      for (int b = 0; b < B; ++b)
        for (int t = 0; t < T; ++t) doc_start.push_back(t / doc_len * doc_len);
    std::vector<std::vector<float>> m, v;
    for (auto& pb : model->trainable_params()) {
      m.emplace_back(pb.size, 0.0f);
      v.emplace_back(pb.size, 0.0f);
    }
    ops::AdamWConfig ac;
    ac.lr = 1e-4f;
    double t_step = 0, t_fwd = 0, t_bwd = 0, t_opt = 0, cpu0 = 0;
    for (int s = 0; s < warmup + steps; ++s) {
      if (s == warmup) {
        cpu0 = process_cpu_seconds();
        ops::gemm_stats_reset();
        ops::gemm_stats_enable(true);
        ops::op_stats_reset();
        ops::op_stats_enable(true);
      }
      auto a = std::chrono::steady_clock::now();
      model->zero_grad();
      model->forward(tokens.data(), targets.data(), B, T, nullptr, doc_start.empty() ? nullptr : doc_start.data());
      auto b = std::chrono::steady_clock::now();
      model->backward();
      auto c = std::chrono::steady_clock::now();
      auto& ps = model->trainable_params();
      for (size_t i = 0; i < ps.size(); ++i)
        ops::adamw_step(ps[i].host_f32(), ps[i].grad, m[i].data(), v[i].data(), ps[i].size, ac, ac.lr, s + 1, true);
      auto d = std::chrono::steady_clock::now();
      if (s >= warmup) {
        t_fwd += std::chrono::duration<double>(b - a).count();
        t_bwd += std::chrono::duration<double>(c - b).count();
        t_opt += std::chrono::duration<double>(d - c).count();
        t_step += std::chrono::duration<double>(d - a).count();
      }
    }
    const double cpu_s = process_cpu_seconds() - cpu0;
    ops::GemmStats g = ops::gemm_stats();
    const auto per_op = ops::op_stats_seconds();
    const double tok = static_cast<double>(B) * T * steps;
    const int threads = ops::num_threads();
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    std::printf("config          %s (%s, %zu params, d_model %d, %d layers, vocab %d)\n", path.c_str(),
                model::arch_name(mc.arch), model->num_params(), mc.d_model, mc.n_layer, mc.vocab_size);
    std::printf("batch           %d x %d tokens, %d timed steps after %d warm-up, %d threads\n", B, T, steps, warmup,
                threads);
    if (doc_len > 0) std::printf("documents       packed, %d tokens each, kept apart (doc_start)\n", doc_len);
    std::printf("projections     %s\n",
                model->fused_qkv() || model->fused_gate_up()
                    ? (model->fused_qkv() ? (model->fused_gate_up() ? "fused q/k/v and gate/up" : "fused q/k/v")
                                          : "fused gate/up")
                    : "one GEMM each");
    std::printf("BLAS            %s (OPENBLAS_CORETYPE=%s)\n", openblas_get_corename(),
                dtrain::env_get("OPENBLAS_CORETYPE") ? dtrain::env_get("OPENBLAS_CORETYPE") : "unset: detected");
    std::printf("step time       %.1f ms (forward %.1f, backward %.1f, AdamW %.1f)\n", 1e3 * t_step / steps,
                1e3 * t_fwd / steps, 1e3 * t_bwd / steps, 1e3 * t_opt / steps);
    std::printf("tokens/s        %.0f\n", tok / t_step);
    // CPU time (user + system, all threads): the work a step costs, which other load on
    // the machine inflates far less than the wall time (no thread here spin-waits).
    std::printf("CPU time        %.1f ms/step (%.2f cores busy on average)\n", 1e3 * cpu_s / steps, cpu_s / t_step);
    std::printf("peak RSS        %.0f MiB\n", static_cast<double>(ru.ru_maxrss) / 1024.0);
    // GEMM's share of the step's CPU time (robust to other load on the machine), and of
    // threads x wall time (what it is on an otherwise idle machine).
    std::printf(
        "GEMM            %.1f%% of the step's CPU time, %.1f%% of threads x wall time (%llu calls, %.1f GFLOP/s "
        "per thread inside GEMM by CPU time)\n",
        100.0 * g.cpu_seconds / cpu_s, 100.0 * g.seconds / (t_step * threads), static_cast<unsigned long long>(g.calls),
        g.cpu_seconds > 0 ? g.flops / g.cpu_seconds / 1e9 : 0.0);
    std::printf("per op class    ms/step   %% of step (wall time on the calling thread)\n");
    double accounted = t_opt;
    for (size_t c = 0; c < ops::OP_CLASSES; ++c) {
      const auto cls = static_cast<ops::OpClass>(c);
      const double sec = cls == ops::OpClass::OPTIMIZER ? per_op[c] + t_opt : per_op[c];
      if (cls != ops::OpClass::OPTIMIZER) accounted += per_op[c];
      if (sec == 0) continue;
      std::printf("  %-28s %8.2f %6.1f%%\n", ops::op_class_name(cls), 1e3 * sec / steps, 100.0 * sec / t_step);
    }
    std::printf("  %-28s %8.2f %6.1f%%\n", "outside the ops", 1e3 * (t_step - accounted) / steps,
                100.0 * (t_step - accounted) / t_step);
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_cpu_step: %s\n", e.what());
    return e.exit_code();
  }
}
