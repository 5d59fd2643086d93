// DistributedSampler: which sample each data-parallel rank reads next, as a
// deterministic per-epoch permutation that can be saved, resumed exactly, and resumed
// on a different number of ranks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace dtrain::data {

// Where the sampler stands: `offset` counts samples consumed in `epoch` by ALL ranks
// together (a global count, identical on every rank after the same number of steps).
struct SamplerPosition {
  uint64_t epoch = 0;
  uint64_t offset = 0;
  bool operator==(const SamplerPosition&) const = default;
};

// Each epoch has an order: the permutation of [0, num_samples) drawn from (seed, epoch)
// (identity when !shuffle), extended by wrapping around (order[i] = perm[i % n]).
// A step consumes the W entries order[offset .. offset+W): rank r gets order[offset+r],
// so rank r reads entries r, r+W, r+2W, ... as in PyTorch's DistributedSampler. A step
// is taken while offset + W <= n (drop_last: the tail that does not fill a step is
// dropped) or offset < n (!drop_last: the last step is padded by wrapping); otherwise
// the next epoch starts at offset 0.
// Changing the world size on resume: the position is global, so set_position() on
// W' ranks continues from order[offset] with the same permutation: the samples not yet
// consumed in that epoch are read exactly once (plus wrap padding when !drop_last),
// even when offset is not a multiple of W'.
class DistributedSampler {
 public:
  // ConfigError when num_samples == 0, rank is outside [0, world_size), or drop_last
  // leaves no step (num_samples < world_size).
  DistributedSampler(size_t num_samples, int rank, int world_size, uint64_t seed, bool shuffle, bool drop_last);

  // The next sample index for this rank (advances to the next epoch as needed).
  size_t next();

  SamplerPosition position() const { return {epoch_, offset_}; }
  // Resume: the next call to next() continues from this global position.
  void set_position(SamplerPosition position);

  // Steps (samples per rank) in a full epoch started at offset 0.
  size_t steps_per_epoch() const;
  size_t num_samples() const { return n_; }
  int rank() const { return rank_; }
  int world_size() const { return world_; }

  // The epoch's permutation of [0, num_samples) (exposed for tests and tools).
  std::vector<size_t> permutation(uint64_t epoch) const;

 private:
  bool step_fits(uint64_t offset) const;

  size_t n_;
  int rank_, world_;
  uint64_t seed_;
  bool shuffle_, drop_last_;
  uint64_t epoch_ = 0, offset_ = 0;
  uint64_t perm_epoch_ = UINT64_MAX;  // epoch whose permutation perm_ holds
  std::vector<size_t> perm_;
};

}  // namespace dtrain::data
