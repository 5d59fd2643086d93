// Device-local backend: the ranks of one process (threads) on one CUDA device, each with
// its own stream, collectives as device copies and a fixed-rank-order reduction ordered
// by events between the ranks' streams. A test and check component (multi-rank GPU runs
// on one card, where NCCL refuses two ranks per device); never chosen for a user's job.
#pragma once

#include "comm/communicator.h"

#include <chrono>
#include <memory>

namespace dtrain::comm {

struct LocalOptions {
  /// Bound on each host-side meeting of a collective and on every synchronize(): a rank
  /// that does not arrive in time fails the collective on every rank with a CommError
  /// that names it.
  std::chrono::milliseconds timeout{60000};
};

/// What the ranks of one group share: their events, the buffers of the collective in
/// progress and the meeting point. Opaque; made by local_group_create.
class LocalGroup;

/// A group of `size` ranks on CUDA device `device`. Throws UsageError for bad arguments
/// (size in [1, 16]), DeviceError without CUDA.
std::shared_ptr<LocalGroup> local_group_create(int size, int device, const LocalOptions& opts = {});

/// Rank `rank`'s communicator in `group`; create and use it on that rank's thread (it makes
/// the group's device current there and creates the rank's stream). Every collective is
/// asynchronous on that stream, as NCCL's: call synchronize() before reading results on
/// the host. The buffers of different ranks must not overlap. backend() reports NCCL (the
/// device backend, for every caller that asks). Not capturable into a CUDA graph.
/// split() waits for the rank's stream, then gives each color a group of its own on the
/// same device (its own streams and events, the same ordering rules, timeout and test
/// switches), created on the calling rank's thread.
std::unique_ptr<Communicator> comm_create_local(std::shared_ptr<LocalGroup> group, int rank);

/// Test-only (the mutation test): SKIP_ENTRY_WAIT leaves one event wait out of every later
/// collective on every rank, rank r's wait for rank r+1's entry, so r may read r+1's
/// input before r+1's earlier work has written it.
enum class LocalFault { NONE, SKIP_ENTRY_WAIT };
void local_group_inject(LocalGroup& group, LocalFault fault);

/// Test-only (the GPU check's ranks stage): before each later collective, rank r's stream first
/// runs a one-thread spin kernel of (r + 1) * microseconds / size, so the collective's reads
/// and writes start late against the work of the ranks' other streams (and the ranks reach it
/// at staggered times): an ordering the caller forgot (a wait on the communicator's stream
/// before reading or reusing a buffer) shows as wrong results. 0 (the default) turns it
/// off; at most 10000. Under the CPU execution engine the kernel is a fixed short loop.
void local_group_delay(LocalGroup& group, int microseconds);

}  // namespace dtrain::comm
