// Internal to the train module: the checkpoint format's parts that saving (checkpoint.cpp)
// and loading (checkpoint_load.cpp) share: the shard magic and format version, durable
// writes and renames, bounded reads, the saved partition, the data-parallel groups' shard
// names and the manifest's checks.
#pragma once

#include "comm/communicator.h"

#include <nlohmann/json.hpp>
#include <sys/types.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace dtrain::train::ckpt {

inline constexpr char SHARD_MAGIC[8] = {'D', 'T', 'R', 'N', 'C', 'K', 'P', '1'};
inline constexpr int FORMAT_VERSION = 1;
// `latest` holds one checkpoint's name.
inline constexpr uint64_t kLatestMaxBytes = 4096;

// An open file descriptor, closed with its owner.
struct Fd {
  int fd = -1;
  Fd() = default;
  explicit Fd(int f) : fd(f) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  Fd(Fd&& o) noexcept : fd(o.fd) { o.fd = -1; }
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      if (fd >= 0) ::close(fd);
      fd = o.fd;
      o.fd = -1;
    }
    return *this;
  }
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

void fsync_path(const std::string& path);
// The permission bits of the run directory (0700 when it cannot be read).
mode_t run_dir_mode(const std::string& run_dir);
// Writes path durably and returns its CRC32C; a partial file is removed (IoError).
uint32_t file_write(const std::string& path, const std::vector<std::pair<const void*, size_t>>& parts, mode_t mode);
void rename_durable(const std::string& from, const std::string& to);
// A small file through the input rule: "" when it cannot be read, *problem says why
// unless it does not exist.
std::string read_text(const std::string& path, uint64_t max_bytes, std::string* problem = nullptr);

// The saved partition: buffer of n elements over W ranks, shard ceil(n / W).
struct Part {
  size_t lo, hi;
};
Part part_of(size_t n, int world, int rank);
// ----------------------------------------------------------------------------
// Data-parallel groups. A job whose world holds several data-parallel groups writes every
// group's shards into one checkpoint: rank r of group g is group<g>-rank<r>.bin, and the
// manifest lists them group by group. A job of one group keeps the names rank<r>.bin.

// This rank's place among the job's data-parallel groups, and the communicator over which
// checkpoint_save and checkpoint_load agree (every rank of the job takes part).
struct GroupPlace {
  int group = 0, groups = 1;           // this rank's group (numbered by its lowest world rank), and how many
  comm::Communicator* comm = nullptr;  // the job's world with several groups, else the data-parallel group
  int rank = 0;                        // in comm: rank 0 writes the manifest and `latest`
};
// Collective over world and data_parallel (every rank of the job). world == nullptr (or
// the group is the whole world): one group, over data_parallel. data_parallel == nullptr
// with a larger world: every rank is a group of its own. UsageError when the groups are
// not all of dp_size ranks.
GroupPlace group_place(comm::Communicator* world, comm::Communicator* data_parallel, int dp_rank, int dp_size);
// The shard file of rank `rank` of group `group` among `groups`.
std::string shard_name(int group, int groups, int rank);

// k of "step<k>", or -1 for another name.
int64_t step_of(const std::string& name);
// "tmp-step<digits>": a checkpoint being written (or an interrupted save).
bool partial_name(const std::string& name);

// Why the manifest's training state is unusable, or "".
std::string manifest_state_problem(const std::filesystem::path& dir, const nlohmann::json& man);
// Parses dir/manifest.json and checks its file list (world * groups bare names); "" or why
// the checkpoint is unusable. world: one group's size; groups: "data_parallel_groups" (1
// when absent: a checkpoint written before groups).
std::string manifest_read(const std::filesystem::path& dir, nlohmann::json& man, int& world, int& groups);
// The manifest and every file present at its recorded size; "" or the problem.
std::string checkpoint_check_sizes(const std::filesystem::path& dir);
// Renames dir to <name>.corrupt-<UTC time>; the new path, or "" when that failed.
std::string checkpoint_set_aside(const std::filesystem::path& dir);

}  // namespace dtrain::train::ckpt
