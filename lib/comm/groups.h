// The process groups a rank takes part in, by role: the world (every rank) and the
// data-parallel group the ZeRO engine shards and reduces over. Today the world is the only
// group built (the data-parallel group is the world); another parallelism (tensor,
// pipeline) would split its groups from the world (Communicator::split) and name them here.
// A checkpoint of several data-parallel groups holds each group's own shards
// (train/checkpoint.h).
#pragma once

#include "comm/communicator.h"

namespace dtrain::comm {

/// Borrowed communicators (the rank owns them); nullptr for a single rank.
struct ProcessGroups {
  Communicator* world = nullptr;          ///< every rank of the job
  Communicator* data_parallel = nullptr;  ///< the ranks that share one model's shards and average its gradients

  /// One data-parallel group over the whole world (every job today).
  static ProcessGroups world_only(Communicator* world) { return {world, world}; }
};

}  // namespace dtrain::comm
