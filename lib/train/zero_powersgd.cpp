// PowerSGD gradient compression (Vogels et al. 2019) on the ZeRO engine's stage 0-1
// gradient buckets, as PyTorch's powerSGD_hook does it: each tensor viewed as a matrix
// M (n = its first dimension, m = the rest) is sent as the factors P = M Q (n x r) and
// Q = M^T P (m x r), both allreduced, with Gram-Schmidt on P in between and M replaced by
// P Q^T; 1-D tensors and matrices the factors would not shrink by half travel
// uncompressed in one allreduce. Q is kept between steps (warm start; the first is random
// from a seed every rank shares) and re-orthogonalised before use; with error feedback
// each rank adds what its last approximation missed (M - P Q^T) to the next gradient.
#include "core/check.h"
#include "core/rng.h"
#include "train/zero_compression.h"

#include "train/zero_comm.h"
#include "train/zero_engine.h"
#include "train/zero_slot.h"

#include <algorithm>
#include <utility>

namespace dtrain::train {

namespace {
// The seed of the first Q: the same on every rank, so their factors start alike.
constexpr uint64_t kQSeed = 0x5053'4744'0001ULL;
}  // namespace

void ZeroCompression::powersgd_plan(ZeroWorkMeter& work) {
  const auto R = static_cast<size_t>(opts_.powersgd_rank);
  size_t q_len = 0, err_len = 0, p_most = 0, plain_most = 0;
  psgd_.assign(buckets_.size(), PsgdBucket{});
  for (size_t bi = 0; bi < buckets_.size(); ++bi) {
    PsgdBucket& pb = psgd_[bi];
    pb.q_begin = q_len;
    for (size_t si : buckets_[bi].slots) {
      const ZeroSlot& s = slots_[si];
      std::vector<std::pair<size_t, size_t>> packed;  // compressed (offset, count)
      for (const auto& t : s.pb->layout.tensors) {
        if (t.shape.size() < 2 || t.shape[0] <= 0) continue;
        const auto n = static_cast<size_t>(t.shape[0]), m = t.numel() / n, r = std::min({n, m, R});
        // PyTorch's min_compression_rate 2: compress only where the factors are at most
        // half the matrix.
        if (m == 0 || (n + m) * r * 2 >= n * m) continue;
        pb.mats.push_back({si, t.offset, n, m, r, pb.p_len, q_len, err_len});
        pb.p_len += n * r;
        q_len += m * r;
        err_len += n * m;
        packed.emplace_back(t.offset, t.numel());
      }
      std::sort(packed.begin(), packed.end());
      size_t at = 0;
      for (const auto& [off, cnt] : packed) {
        if (off > at) pb.plain.push_back({si, at, off - at});
        at = std::max(at, off + cnt);
      }
      if (s.n > at) pb.plain.push_back({si, at, s.n - at});
    }
    for (const auto& pl : pb.plain) pb.plain_len += pl[2];
    pb.q_len = q_len - pb.q_begin;
    p_most = std::max(p_most, pb.p_len);
    plain_most = std::max(plain_most, pb.plain_len);
  }
  psgd_q_ = device::DeviceBuffer(dev_, q_len * sizeof(float));
  powersgd_q_init();
  if (opts_.powersgd_error_feedback) {
    psgd_err_ = device::DeviceBuffer(dev_, err_len * sizeof(float));
    dev_.zero(psgd_err_.get(), err_len * sizeof(float));
  }
  psgd_p_ = device::DeviceBuffer(dev_, p_most * sizeof(float));
  psgd_plain_ = device::DeviceBuffer(dev_, plain_most * sizeof(float));
  work.add(static_cast<ptrdiff_t>(psgd_q_.bytes() + psgd_err_.bytes() + psgd_p_.bytes() + psgd_plain_.bytes()));
}

void ZeroCompression::powersgd_q_init() {
  std::vector<float> q(psgd_q_.bytes() / sizeof(float));
  Rng rng(kQSeed);
  for (auto& v : q) v = rng.normal();
  if (!q.empty()) dev_.copy_h2d(psgd_q_.get(), q.data(), q.size() * sizeof(float));
}

void ZeroCompression::reset() {
  for (auto& r : residual_) dev_.zero(r.get(), r.bytes());
  if (psgd_.empty()) return;
  if (psgd_err_.bytes()) dev_.zero(psgd_err_.get(), psgd_err_.bytes());
  powersgd_q_init();
}

// The top-k residuals, or PowerSGD's Q factors then (error feedback) its errors.
std::vector<device::DeviceBuffer*> ZeroCompression::rank_state() {
  std::vector<device::DeviceBuffer*> out;
  for (auto& r : residual_) out.push_back(&r);
  if (!psgd_.empty()) {
    out.push_back(&psgd_q_);
    if (psgd_err_.bytes()) out.push_back(&psgd_err_);
  }
  return out;
}

// Uncompressed until start_step updates were applied (PyTorch's start_powerSGD_iter).
bool ZeroCompression::powersgd_active(int64_t step_count) const {
  return !psgd_.empty() && step_count >= opts_.powersgd_start_step;
}

void ZeroCompression::powersgd_reduce(size_t index) {
  const PsgdBucket& pb = psgd_[index];
  const bool ef = opts_.powersgd_error_feedback;
  float* P = psgd_p_.as<float>();
  float* Q = psgd_q_.as<float>();
  float* E = ef ? psgd_err_.as<float>() : nullptr;
  float* plain = psgd_plain_.as<float>();
  const auto I = [](size_t v) { return static_cast<int>(v); };
  size_t o = 0;
  for (const auto& [si, off, cnt] : pb.plain) {
    dev_.copy_d2d(plain + o, slots_[si].pb->grad + off, cnt * sizeof(float));
    o += cnt;
  }
  for (const auto& x : pb.mats) {
    float* M = slots_[x.slot].pb->grad + x.off;
    if (ef) dev_.add(M, E + x.err_off, x.n * x.m);
    dev_.orthogonalize(Q + x.q_off, x.m, x.r);
    dev_.gemm(false, false, I(x.n), I(x.r), I(x.m), 1.0f, M, Q + x.q_off, 0.0f, P + x.p_off, DType::F32, DType::F32);
  }
  coll_.allreduce(plain, pb.plain_len, DType::F32, comm::ReduceOp::AVG);
  coll_.allreduce(P, pb.p_len, DType::F32, comm::ReduceOp::SUM);
  for (const auto& x : pb.mats) {
    const float* M = slots_[x.slot].pb->grad + x.off;
    dev_.orthogonalize(P + x.p_off, x.n, x.r);
    dev_.gemm(true, false, I(x.m), I(x.r), I(x.n), 1.0f, M, P + x.p_off, 0.0f, Q + x.q_off, DType::F32, DType::F32);
  }
  coll_.allreduce(Q + pb.q_begin, pb.q_len, DType::F32, comm::ReduceOp::SUM);
  dev_.scale(Q + pb.q_begin, pb.q_len, 1.0f / static_cast<float>(coll_.world()));
  for (const auto& x : pb.mats) {
    float* M = slots_[x.slot].pb->grad + x.off;
    if (ef) {  // error = M - P Q^T, this rank's M (error included) against the shared approximation
      dev_.copy_d2d(E + x.err_off, M, x.n * x.m * sizeof(float));
      dev_.gemm(false, true, I(x.n), I(x.m), I(x.r), -1.0f, P + x.p_off, Q + x.q_off, 1.0f, E + x.err_off, DType::F32,
                DType::F32);
    }
    dev_.gemm(false, true, I(x.n), I(x.m), I(x.r), 1.0f, P + x.p_off, Q + x.q_off, 0.0f, M, DType::F32, DType::F32);
  }
  o = 0;
  for (const auto& [si, off, cnt] : pb.plain) {
    dev_.copy_d2d(slots_[si].pb->grad + off, plain + o, cnt * sizeof(float));
    o += cnt;
  }
}

}  // namespace dtrain::train
