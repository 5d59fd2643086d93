// Launching inside a Slurm allocation: the allocation read from the SLURM_* variables
// (node list, tasks/CPUs/GPUs per node, with Slurm's "2(x3),1" count syntax), the
// hostfile it implies (so placement is the same as with a hostfile), and the node
// spawner that starts each node's agent as a one-task job step with srun.
#pragma once

#include "config/hostfile.h"
#include "launch/node_spawner.h"

#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace dtrain::launch {

struct SlurmAllocation {
  std::string job_id;               ///< SLURM_JOB_ID ("" outside a job)
  std::vector<std::string> nodes;   ///< expanded SLURM_JOB_NODELIST, Slurm's order
  std::vector<int> tasks_per_node;  ///< per node; empty when Slurm gave no task counts
  std::vector<int> cpus_per_node;   ///< per node (SLURM_JOB_CPUS_PER_NODE); may be empty
  int gpus_per_node = 0;            ///< SLURM_GPUS_ON_NODE / SLURM_GPUS_PER_NODE; 0 = none/unknown
};

/// Expands Slurm's per-node count lists: "2(x3),1" -> {2,2,2,1}; "8" -> {8}.
/// ConfigError naming `var` and the text for anything else (empty items, zero or
/// negative counts, a bad repeat).
std::vector<int> slurm_counts_expand(std::string_view text, const std::string& var);

/// GPUs per node from "8", "a100:8" or "a100:4,v100:2" (types summed). ConfigError
/// naming `var` otherwise.
int slurm_gpus_parse(std::string_view text, const std::string& var);

/// Reads the allocation from `env` (pass environ_map()). Node list: SLURM_JOB_NODELIST,
/// else SLURM_NODELIST. Tasks: SLURM_TASKS_PER_NODE (per node), else
/// SLURM_NTASKS_PER_NODE (same for all). GPUs: SLURM_GPUS_ON_NODE, else
/// SLURM_GPUS_PER_NODE, else SLURM_JOB_GPUS (a list of ids: its length).
/// ConfigError when there is no node list ("not inside a Slurm allocation: run under
/// sbatch or salloc") or a per-node list does not match the node count.
SlurmAllocation slurm_allocation_from_env(const std::map<std::string, std::string>& env);

/// One host per allocated node, in Slurm's order, with slots = gpus_per_node when known,
/// else that node's task count, else 1. The path is "SLURM_JOB_NODELIST=<list>" so
/// error messages say where the hosts came from.
config::Hostfile slurm_hostfile(const SlurmAllocation& alloc);

struct SrunOptions {
  std::string srun = "srun";       ///< the srun binary (tests use a stand-in)
  int cpus = 0;                    ///< --cpus-per-task; 0 = leave to Slurm
  int gpus = 0;                    ///< --gres=gpu:N; 0 = none requested
  std::vector<std::string> extra;  ///< more srun options, before the command
};

/// srun --nodes=1 --ntasks=1 --nodelist=<host> --export=ALL --unbuffered --overlap
///      --job-name=dtrain-node<k> [--cpus-per-task=C] [--gres=gpu:G] [--mem=0] [extra...]
///      /bin/sh -c '<cmd.shell_line()>'
/// The agent's environment and cwd travel inside the shell line (exec env -- K=V ...),
/// so nothing depends on srun's own environment handling.
std::vector<std::string> slurm_srun_argv(const std::string& host, int node_rank, const NodeCommand& cmd,
                                         const SrunOptions& opts);

/// A NodeSpawner that starts every node's agent (local node included) as a job step
/// through srun, run with spawn_local; the token goes to srun's stdin, which srun
/// forwards to the single task, so stdin EOF still means "the launcher is gone".
/// CPUs per step come from alloc.cpus_per_node, GPUs from the node's selected slots
/// when alloc.gpus_per_node > 0.
NodeSpawner node_spawner_slurm(const SlurmAllocation& alloc, const std::string& srun = "srun");

}  // namespace dtrain::launch
