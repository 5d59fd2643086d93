// Sharded checkpoints of a ZeroEngine, through its ZeroCheckpointView (buffer views,
// step, placement): every rank writes its shard (master / m / v slices, RNG), rank 0 a
// manifest with the layout and CRC32C of every file; directory rename + an atomically
// switched `latest`; keep_last pruning. Loading verifies the checksums, falls back to the
// previous complete checkpoint and reshards to any world size and ZeRO stage.
#pragma once

#include "core/rng.h"
#include "data/sampler.h"
#include "train/loss_scaler.h"
#include "train/zero_engine.h"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <sys/types.h>

namespace dtrain::train {

// ----------------------------------------------------------------------------
// Data-parallel groups (comm::ProcessGroups: a world split into several groups, each
// sharding its own copy of the model). Every group writes its own shards, named by group
// and rank (group<g>-rank<r>.bin; a job of one group keeps rank<r>.bin), and the manifest
// records the number of groups and lists every group's files; a checkpoint is complete only
// with all of them. Every group writes, not one on behalf of all: the engine averages
// gradients within a group only, so nothing makes the groups' states equal (they train
// apart, or hold different parts of a model once groups build tensor or pipeline
// parallelism); a mode that makes them replicas by construction could write one group's.
// A load takes each group's state (masters, moments, its AdamW step, error feedback) from
// its own group's shards (resliced to the group's size), and a checkpoint of another number of groups is a ConfigError naming its manifest:
// never one group's shards into another, nor one state copied into several groups.

/// Trainer state carried beside the engine's. Every field but rng is global (rank 0's
/// values go into the manifest; with several data-parallel groups the job's rank 0, one
/// value for every group); rng is per rank.
struct TrainState {
  int64_t step = 0;            ///< optimizer steps attempted (the loop index)
  int64_t scheduler_step = 0;  ///< steps applied (the lr schedule's position)
  bool has_scaler = false;
  LossScalerState scaler;
  data::SamplerPosition sampler;  ///< global: valid at any world size
  uint64_t forward_count = 0;     ///< model forward count (LoRA dropout masks)
  bool has_rng = false;           ///< on load: false when this rank did not exist at save
  Rng::State rng{};
  std::string config_yaml;  ///< the resolved config, for `dtrain resume` and humans
};

struct CheckpointSaveOptions {
  int64_t keep_last = 2;  ///< complete checkpoints kept (the one `latest` names always is)
  /// The run's training.run_dir_mode: checkpoint directories get the run directory's
  /// permission bits within it, files those without x. A directory dtrain adopted keeps
  /// its own, maybe looser mode (a shared 1777 scratch directory); its checkpoints must
  /// not become world-writable with it.
  mode_t max_mode = 0700;
  /// Test hook, called at "shard_written" (every rank, its shard durable, before the
  /// ranks confirm) and "renamed" (rank 0: step<k>/ in place, `latest` not switched).
  /// Throwing there simulates a crash at that point.
  std::function<void(const std::string& point)> fault_hook;
};

/// Writes <run_dir>/checkpoints/step<state.step>/ (rank<r>.bin per rank, or
/// group<g>-rank<r>.bin with several data-parallel groups, + manifest.json) through
/// tmp-step<k>/ and switches <run_dir>/checkpoints/latest to it once every rank of the job
/// confirmed its shard; prunes beyond keep_last (counting only checkpoints that verify:
/// a damaged one is renamed stepK.corrupt-<time>, never deleted). Files get the run
/// directory's permission bits within opts.max_mode, without x; the manifest's config
/// omits cluster.env.
/// Collective: every rank of the job calls it (view.world_comm; the data-parallel group when
/// that is the job). UsageError when the data-parallel groups differ in size.
/// run_dir must be on a filesystem every rank sees. Returns the checkpoint directory.
/// IoError when a file cannot be written.
std::string checkpoint_save(const std::string& run_dir, const ZeroCheckpointView& view, const TrainState& state,
                            const CheckpointSaveOptions& opts = {});

/// "" when the checkpoint directory dir looks usable without reading its shards whole:
/// its manifest parses and every field is typed and in range, and every file it names is
/// there at its recorded size; otherwise why not (naming the file). For `dtrain status`,
/// which must not offer a resume from a checkpoint the load would refuse.
std::string checkpoint_problem(const std::string& dir);

struct CheckpointLoadResult {
  bool loaded = false;  ///< false: no checkpoint at all under run_dir (fresh start)
  std::string dir;      ///< the checkpoint loaded
  TrainState state;
  int saved_world_size = 0;
  int saved_stage = 0;
  /// One line per newer checkpoint that was unusable and skipped, naming the bad file
  /// and why (checksum mismatch, truncated, missing, bad manifest).
  std::vector<std::string> skipped;
};

/// Loads the checkpoint `latest` names, or (when it is damaged) the newest older complete
/// one, into the view's engine, whatever world size and stage it was written with: each rank
/// reads only the slices it needs, from its own data-parallel group's shards. Collective:
/// every rank of the job calls it; all ranks, of every group, agree on the checkpoint (rank
/// 0 verifies every group's shards, the others their own group's and the sizes of all).
/// Returns loaded == false when run_dir has no checkpoint; throws CheckpointError naming
/// every checkpoint tried and why when none is usable, or when the checkpoint's buffers do
/// not match the model; ConfigError when it holds another number of data-parallel groups
/// than the job (the group size may differ). A damaged checkpoint (bad manifest, buffer
/// sizes the shards do not hold, a file name that is not a bare name in its directory, a
/// missing, truncated or corrupt shard, a shard whose header names another group or rank
/// than its place in the manifest) is skipped and, with set_aside_damaged, renamed
/// stepK.corrupt-<UTC time> by rank 0 so that pruning neither counts nor keeps it. Without
/// set_aside_damaged (a read-only look: export, eval) none usable is loaded == false with
/// `skipped` saying why, for the caller to say what to do.
CheckpointLoadResult checkpoint_load(const std::string& run_dir, const ZeroCheckpointView& view,
                                     bool set_aside_damaged = true);

/// The fp32 master weights of a run's checkpoint, read in element ranges without a model
/// or an engine (what `dtrain export` streams, one tensor at a time). The checkpoint is
/// chosen and verified as checkpoint_load chooses it (`latest`, else the newest older
/// complete one; a damaged one is skipped and named in result().skipped, never set
/// aside), in one process. CheckpointError when none is usable; ConfigError when its
/// buffers are not `buffers` (the model's base layouts then its adapters', each with
/// whether it trains), as in checkpoint_load, or when it holds several data-parallel
/// groups' states (none of which is the model).
class CheckpointMasters {
 public:
  CheckpointMasters(const std::string& run_dir, const std::vector<std::pair<model::BufferLayout, bool>>& buffers);
  ~CheckpointMasters();
  CheckpointMasters(const CheckpointMasters&) = delete;
  CheckpointMasters& operator=(const CheckpointMasters&) = delete;
  /// Elements [lo, hi) of buffer b's master into dst, from whichever shards hold them.
  void read(size_t buffer, size_t lo, size_t hi, float* dst);
  /// The checkpoint (dir, state, saved world size and stage, skipped ones); loaded is true.
  const CheckpointLoadResult& result() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dtrain::train
