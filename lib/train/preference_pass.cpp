// The reference sums (computed once, saved beside the run's checkpoints) and the held-out
// preference evaluation: forward-only passes over a rank's share of a pairwise dataset.
#include "train/preference_pass.h"

#include "core/check.h"
#include "train/preference.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>

#include <unistd.h>

namespace dtrain::train {

namespace fs = std::filesystem;

namespace {

constexpr char kMagic[8] = {'D', 'T', 'R', 'E', 'F', 'L', 'P', '1'};
constexpr const char* kFile = "reference_logps.bin";

// Runs this rank's pairs (i = rank mod world) through the model in batches; `each` gets the
// batch's pair indices and its rows' sums (chosen rows, then rejected). With lockstep the
// rank pads with all-masked forwards up to the largest rank's count.
void pairs_forward(model::Model& m, const data::TokenDataset& pairs, int per_batch, int rank, int world, bool lockstep,
                   const std::function<void(const std::vector<size_t>&, const std::vector<RowLogp>&)>& each) {
  DT_ENFORCE(pairs.pairwise(), InternalError, "a preference pass over a dataset that is not pairwise");
  DT_ENFORCE(per_batch > 0 && world > 0 && rank >= 0 && rank < world, InternalError,
             "preference pass: batch {}, rank {} of {}", per_batch, rank, world);
  const size_t n = pairs.size(), W = static_cast<size_t>(world), P = static_cast<size_t>(per_batch);
  std::vector<size_t> mine;
  for (size_t i = static_cast<size_t>(rank); i < n; i += W) mine.push_back(i);
  const int T = static_cast<int>(pairs.seq_len());
  std::vector<int32_t> inputs, targets;
  size_t made = 0;
  for (size_t b = 0; b < mine.size(); b += P) {
    const size_t e = std::min(mine.size(), b + P);
    std::vector<size_t> idx(mine.begin() + static_cast<ptrdiff_t>(b), mine.begin() + static_cast<ptrdiff_t>(e));
    const int rows = static_cast<int>(2 * idx.size());
    inputs.resize(static_cast<size_t>(rows) * static_cast<size_t>(T));
    targets.resize(inputs.size());
    pairs.batch(idx, inputs.data(), targets.data());
    m.forward(inputs.data(), targets.data(), rows, T);
    each(idx, row_logps(m.token_losses_to_host().data(), targets.data(), rows, T));
    ++made;
  }
  if (!lockstep) return;
  const size_t forwards = ((n + W - 1) / W + P - 1) / P;
  inputs.assign(2 * P * static_cast<size_t>(T), 0);
  targets.assign(inputs.size(), -100);
  for (; made < forwards; ++made) m.forward(inputs.data(), targets.data(), static_cast<int>(2 * P), T);
}

}  // namespace

std::vector<float> reference_logps_compute(model::Model& m, const data::TokenDataset& pairs, int pairs_per_batch,
                                           int rank, int world, comm::Communicator* comm, bool lockstep,
                                           bool adapters_off) {
  model::EvalScope mode(m);
  std::optional<model::AdaptersOffScope> off;
  if (adapters_off) off.emplace(m);
  std::vector<float> table(2 * pairs.size(), 0.0f);
  pairs_forward(m, pairs, pairs_per_batch, rank, world, lockstep,
                [&](const std::vector<size_t>& idx, const std::vector<RowLogp>& rows) {
                  for (size_t k = 0; k < idx.size(); ++k) {
                    table[2 * idx[k]] = static_cast<float>(rows[k].sum);
                    table[2 * idx[k] + 1] = static_cast<float>(rows[idx.size() + k].sum);
                  }
                });
  // Each entry is one rank's (the others hold 0): the sum is the value, exactly.
  if (comm != nullptr && comm->size() > 1 && !table.empty())
    comm->allreduce_host(table.data(), table.size(), DType::F32, comm::ReduceOp::SUM);
  return table;
}

uint64_t pairs_fingerprint(const data::TokenDataset& pairs) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the sizes and every row
  auto mix = [&h](const void* p, size_t bytes) {
    const auto* c = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < bytes; ++i) h = (h ^ c[i]) * 1099511628211ull;
  };
  const uint64_t n = pairs.size(), T = static_cast<uint64_t>(pairs.seq_len());
  mix(&n, sizeof n);
  mix(&T, sizeof T);
  std::vector<int32_t> in(2 * T), tg(2 * T);
  for (size_t i = 0; i < pairs.size(); ++i) {
    pairs.batch({i}, in.data(), tg.data());
    mix(in.data(), in.size() * sizeof(int32_t));
    mix(tg.data(), tg.size() * sizeof(int32_t));
  }
  return h;
}

void reference_logps_save(const std::string& run_dir, const std::vector<float>& table, uint64_t fingerprint) {
  const fs::path path = fs::path(run_dir) / kFile;
  const std::string tmp = path.string() + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    const uint64_t n = table.size() / 2;
    f.write(kMagic, sizeof kMagic);
    f.write(reinterpret_cast<const char*>(&n), sizeof n);
    f.write(reinterpret_cast<const char*>(&fingerprint), sizeof fingerprint);
    f.write(reinterpret_cast<const char*>(table.data()), static_cast<std::streamsize>(table.size() * sizeof(float)));
    f.flush();
    DT_ENFORCE(f.good(), IoError, "{}: writing the reference log-probabilities failed (disk full?)", tmp);
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) ::unlink(tmp.c_str());
  DT_ENFORCE(!ec, IoError, "cannot replace {}: {}", path.string(), ec.message());
}

std::vector<float> reference_logps_load(const std::string& run_dir, size_t pairs, uint64_t fingerprint) {
  const std::string path = (fs::path(run_dir) / kFile).string();
  const char* redo =
      "the reference is the starting model's, so it cannot be rebuilt from a checkpoint: start the run again "
      "(a new training.output_dir), or resume with the data it was started with";
  std::ifstream f(path, std::ios::binary);
  DT_ENFORCE(f.good(), IoError, "{}: missing; this run's DPO reference log-probabilities were saved there; {}", path,
             redo);
  char magic[sizeof kMagic];
  uint64_t n = 0, fp = 0;
  f.read(magic, sizeof magic);
  f.read(reinterpret_cast<char*>(&n), sizeof n);
  f.read(reinterpret_cast<char*>(&fp), sizeof fp);
  DT_ENFORCE(f.good() && std::memcmp(magic, kMagic, sizeof kMagic) == 0, ConfigError,
             "{}: not a dtrain reference log-probability file (damaged header); {}", path, redo);
  DT_ENFORCE(n == pairs && fp == fingerprint, ConfigError,
             "{}: computed for other data ({} pairs, fingerprint {:016x}; data.train now gives {} pairs, {:016x}); {}",
             path, n, fp, pairs, fingerprint, redo);
  std::vector<float> table(2 * pairs);
  f.read(reinterpret_cast<char*>(table.data()), static_cast<std::streamsize>(table.size() * sizeof(float)));
  DT_ENFORCE(f.gcount() == static_cast<std::streamsize>(table.size() * sizeof(float)), ConfigError,
             "{}: truncated ({} of {} values); {}", path, f.gcount() / 4, table.size(), redo);
  return table;
}

PrefEval pref_eval(model::Model& m, const data::TokenDataset& pairs, int pairs_per_batch, int rank, int world,
                   bool lockstep) {
  model::EvalScope mode(m);
  PrefEval e;
  pairs_forward(m, pairs, pairs_per_batch, rank, world, lockstep,
                [&](const std::vector<size_t>& idx, const std::vector<RowLogp>& rows) {
                  for (size_t k = 0; k < idx.size(); ++k) {
                    const RowLogp& c = rows[k];
                    const RowLogp& r = rows[idx.size() + k];
                    e.pairs += 1;
                    e.preferred += c.sum > r.sum ? 1 : 0;
                    e.chosen_loss_sum -= c.sum;
                    e.chosen_targets += static_cast<double>(c.count);
                  }
                });
  return e;
}

}  // namespace dtrain::train
