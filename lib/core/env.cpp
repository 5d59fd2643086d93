// The environment table and its reader. A row per variable: config's schema names the KEY
// and KNOB rows (tests/config/env_table_test.cpp holds the two to each other), the rest are
// read where they act, through env_get (the process's environment) or env_get_in (a snapshot
// of it: dtrain run's placement, the Slurm allocation).
#include "core/env.h"

#include "core/check.h"

#include <cstdlib>
#include <iterator>
#include <string>

namespace dtrain {

namespace {

constexpr const char* kRankContract = "rank: rank_context_from_env (the worker's env printout shows it)";
// The torchrun variables dtrain's agent sets for its ranks, which `dtrain run` also takes
// from torchrun or a Kubernetes PyTorchJob.
constexpr const char* kTorchrunContract =
    "rank: rank_context_from_env (the worker's env printout shows it); dtrain run's placement (external_placement)";
constexpr const char* kPlacement = "rank: dtrain run's placement (external_placement)";
constexpr const char* kAllocation = "launch: the Slurm allocation (slurm_allocation_from_env)";

using K = EnvKind;

// Constant-initialised: the log reads DTRAIN_LOG_LEVEL during static initialisation.
constexpr EnvVar kTable[] = {
    // clang-format off
    // Config keys' overrides (precedence: default < file < env < --set).
    {"DTRAIN_MAX_STEPS", K::KEY, "config: every config load", "training.max_steps"},
    {"DTRAIN_OUTPUT_DIR", K::KEY, "config: every config load", "training.output_dir"},
    {"DTRAIN_SEED", K::KEY, "config: every config load", "training.seed"},
    {"DTRAIN_DEVICE", K::KEY,
     "config: every config load; rank: the worker trains on the device its agent chose and set here",
     "training.device"},
    {"DTRAIN_CUDA_GRAPH", K::KEY, "config: every config load", "training.cuda_graph"},
    {"DTRAIN_STEP_TIMEOUT", K::KEY, "config: every config load", "fault_tolerance.step_timeout"},
    {"DTRAIN_RDZV_ADDR", K::KEY, "config: every config load", "cluster.rendezvous.address"},
    {"DTRAIN_RDZV_PORT", K::KEY, "config: every config load", "cluster.rendezvous.port"},
    {"DTRAIN_PREFLIGHT", K::KEY, "config: every config load", "doctor.preflight"},
    {"DTRAIN_MEMORY_TRACE", K::KEY, "config: every config load", "monitor.memory_trace"},
    // Knobs without a YAML key: config's schema_env_knobs gives each its type and default
    // (a config load refuses a bad value) and takes its help from here.
    {"DTRAIN_ATTN_VARIANT", K::KNOB,
     "kernels: the tensor-core attention, at each launch (read once); device: each plan device (--plan), when made",
     "which tensor-core attention kernels bf16/fp16 run: legacy (64-row query tiles, 16 rows a warp; dK/dV "
     "masks every tile) or fa2 (FlashAttention-2's shape: 128-row forward and dQ tiles, 32 rows a warp, where "
     "the card's shared memory holds them; dK/dV masks only the tiles the mask cuts), the same results; or "
     "hopper (the forward by an sm_90a wgmma kernel on FlashAttention-3's ideas at head dims 64 and 128 on a "
     "compute capability 9.0 card whose binary carries its sm_90a image, the same results to rounding; "
     "elsewhere, and the backward always, as fa2); all kept until a GPU run picks one (scripts/gpu_check.py's "
     "attention stage times each); `dtrain bench attention` reports the variant that ran (and why hopper fell "
     "back); `bench train --plan` prices hopper's forward where it runs, the rest as legacy's kernels"},
    {"DTRAIN_GEMM_ALGO_CACHE", K::KNOB, "kernels: the cuBLASLt GEMM algorithm cache",
     "file remembering the cuBLASLt GEMM algorithms a CUDA rank timed, per card and GEMM shape (e.g. "
     "<run dir>/gemm_algos.txt); each entry is checked before use, a bad one is timed again"},
    {"DTRAIN_LOG_LEVEL", K::KNOB, "core: the log, when the process starts",
     "the least severe log line written to stderr (read when the process starts)"},
    {"DTRAIN_NORM_BACKWARD", K::KNOB, "kernels: every LayerNorm/RMSNorm backward on a CUDA device",
     "split: the dinp kernel plus the column-sum kernels for the weight (and bias) gradients; fused: one kernel "
     "for dinp and 32-row column partials, then one finishing kernel (an alternative the GPU check times beside "
     "the default)"},
    {"DTRAIN_NUM_THREADS", K::KNOB, "ops: the CPU op pool, when first used",
     "threads of a CPU rank's op pool (its row loops and GEMMs)"},
    {"DTRAIN_POOL_SPIN_US", K::KNOB, "ops: the CPU op pool, when first used",
     "microseconds an idle pool thread polls before it sleeps; 0 = never (ranks sharing "
     "oversubscribed cores)"},
    {"DTRAIN_WORKER_PRINT_ENV", K::KNOB, "rank: the worker, when it starts",
     "NAME,NAME,...: every rank prints these variables and the torchrun contract (RANK, WORLD_SIZE, "
     "...) as `env NAME=value` lines; 1 = the contract only"},
    // dtrain's own: the agent sets these for each rank (torchrun's names where torchrun has one).
    {"WORLD_SIZE", K::CONTRACT, kTorchrunContract, "the number of ranks"},
    {"RANK", K::CONTRACT, kTorchrunContract, "this rank"},
    {"LOCAL_WORLD_SIZE", K::CONTRACT, kTorchrunContract, "the number of ranks on this node"},
    {"LOCAL_RANK", K::CONTRACT, kTorchrunContract, "this rank on its node (its CUDA device index)"},
    {"NNODES", K::CONTRACT, kRankContract, "the number of nodes"},
    {"NODE_RANK", K::CONTRACT, kRankContract, "this node"},
    {"MASTER_ADDR", K::CONTRACT, kTorchrunContract, "the rendezvous store's address"},
    {"MASTER_PORT", K::CONTRACT, kTorchrunContract, "the rendezvous store's port"},
    {"DTRAIN_ROUND", K::CONTRACT, kRankContract, "the launcher's round (0, then one more per restart)"},
    {"DTRAIN_JOB_ID", K::CONTRACT, kRankContract, "the job's id (its store keys' prefix)"},
    {"DTRAIN_RUN_DIR", K::CONTRACT, kRankContract, "the run directory"},
    {"DTRAIN_MODE", K::CONTRACT, kRankContract, "what the rank runs: train or bench"},
    {"DTRAIN_CONFIG", K::CONTRACT, kRankContract, "the run's config file (train)"},
    {"DTRAIN_NETWORK_INTERFACE", K::CONTRACT, "rank: rank_comm_create",
     "the interface Gloo binds (cluster.network_interface; dtrain run sets it from the config)"},
    // The launcher sets these for its agents.
    {"DTRAIN_HEARTBEAT_INTERVAL", K::CONTRACT, "launch: agent_timing_from_env",
     "seconds between an agent's heartbeats (fault_tolerance.heartbeat_interval)"},
    {"DTRAIN_STORE_CONNECT_TIMEOUT", K::CONTRACT, "launch: agent_timing_from_env",
     "seconds an agent retries connecting to the store (fault_tolerance.store_connect_timeout)"},
    // Set by the platform that started `dtrain run`'s processes (read from a snapshot of the
    // environment, env_get_in), and by a Slurm allocation `dtrain launch --launcher slurm` runs in.
    {"JOB_COMPLETION_INDEX", K::PLATFORM, kPlacement, "a Kubernetes Indexed Job's pod index (the rank, without RANK)"},
    {"GROUP_RANK", K::PLATFORM, kPlacement, "torchrun: this node"},
    {"GROUP_WORLD_SIZE", K::PLATFORM, kPlacement, "torchrun: the number of nodes"},
    {"TORCHELASTIC_RUN_ID", K::PLATFORM, kPlacement, "torchrun: the run's id (the job id)"},
    {"PET_NNODES", K::PLATFORM, kPlacement, "a PyTorchJob's node count (dtrain run --nproc-per-node)"},
    {"PET_NODE_RANK", K::PLATFORM, kPlacement, "a PyTorchJob's node index (dtrain run --nproc-per-node)"},
    {"OMPI_COMM_WORLD_RANK", K::PLATFORM, kPlacement, "Open MPI: the rank"},
    {"OMPI_COMM_WORLD_SIZE", K::PLATFORM, kPlacement, "Open MPI: the number of ranks"},
    {"OMPI_COMM_WORLD_LOCAL_RANK", K::PLATFORM, kPlacement, "Open MPI: the rank on its node"},
    {"OMPI_COMM_WORLD_LOCAL_SIZE", K::PLATFORM, kPlacement, "Open MPI: the ranks on its node"},
    {"OMPI_MCA_ess_base_jobid", K::PLATFORM, kPlacement, "Open MPI: the job's id"},
    {"PMI_RANK", K::PLATFORM, kPlacement, "PMI (MPICH, Intel MPI): the rank"},
    {"PMI_SIZE", K::PLATFORM, kPlacement, "PMI: the number of ranks"},
    {"MPI_LOCALRANKID", K::PLATFORM, kPlacement, "PMI: the rank on its node"},
    {"MPI_LOCALNRANKS", K::PLATFORM, kPlacement, "PMI: the ranks on its node"},
    {"SLURM_PROCID", K::PLATFORM, kPlacement, "srun: the task's rank"},
    {"SLURM_NTASKS", K::PLATFORM, kPlacement, "srun: the number of tasks"},
    {"SLURM_NNODES", K::PLATFORM, kPlacement, "srun: the number of nodes"},
    {"SLURM_NODEID", K::PLATFORM, kPlacement, "srun: this node"},
    {"SLURM_LOCALID", K::PLATFORM, kPlacement, "srun: the task on its node"},
    {"SLURM_STEP_TASKS_PER_NODE", K::PLATFORM, kPlacement, "srun: the step's tasks per node (\"2(x3),1\")"},
    {"SLURM_STEP_NODELIST", K::PLATFORM, kPlacement, "srun: the step's nodes"},
    {"SLURM_STEP_ID", K::PLATFORM, kPlacement, "srun: the step's id"},
    {"SLURM_TASKS_PER_NODE", K::PLATFORM, "rank: dtrain run's placement; launch: the Slurm allocation",
     "the allocation's tasks per node (\"2(x3),1\")"},
    {"SLURM_JOB_NODELIST", K::PLATFORM, "rank: dtrain run's placement; launch: the Slurm allocation",
     "the allocation's nodes"},
    {"SLURM_JOB_ID", K::PLATFORM, "rank: dtrain run's placement; launch: the Slurm allocation", "the job's id"},
    {"SLURM_NODELIST", K::PLATFORM, kAllocation, "the allocation's nodes (older Slurm)"},
    {"SLURM_NTASKS_PER_NODE", K::PLATFORM, kAllocation, "the tasks per node asked for"},
    {"SLURM_JOB_CPUS_PER_NODE", K::PLATFORM, kAllocation, "the allocation's CPUs per node"},
    {"SLURM_GPUS_ON_NODE", K::PLATFORM, kAllocation, "the allocation's GPUs on this node"},
    {"SLURM_GPUS_PER_NODE", K::PLATFORM, kAllocation, "the GPUs per node asked for"},
    {"SLURM_JOB_GPUS", K::PLATFORM, kAllocation, "the allocation's GPU ids on this node"},
    // Test-only faults: a multi-process test sets them on the launcher, which forwards DTRAIN_
    // variables to its ranks; only the worker's test seam (rank/train_rank_hooks.cpp) reads them.
    {"DTRAIN_TEST_STALL_AT_STEP", K::TEST_HOOK, "rank: train_rank_hooks_from_env (the worker)",
     "N: the rank stops before training step N in round 0 while its heartbeat goes on"},
    {"DTRAIN_TEST_STALL_RANK", K::TEST_HOOK, "rank: train_rank_hooks_from_env (the worker)",
     "R: only rank R stalls (unset: every rank)"},
    {"DTRAIN_TEST_SLOW_RANK", K::TEST_HOOK, "rank: train_rank_hooks_from_env (the worker)",
     "R or all: that rank sleeps DTRAIN_TEST_SLOW_MS after every training step"},
    {"DTRAIN_TEST_SLOW_MS", K::TEST_HOOK, "rank: train_rank_hooks_from_env (the worker)",
     "milliseconds of DTRAIN_TEST_SLOW_RANK's sleep (at most 10000)"},
    // Other programs' variables.
    {"HOME", K::EXTERNAL,
     "launch: the SSH session, ~ in config paths, the run directory's system-path check; rank: dtrain run's "
     "token_file",
     "the user's home directory"},
    {"USER", K::EXTERNAL, "launch: the SSH session",
     "the SSH login name when neither cluster.ssh.user nor the host's user@ gives one"},
    {"SSH_AUTH_SOCK", K::EXTERNAL, "launch: the SSH session", "the ssh-agent whose keys are tried"},
    {"CUDA_VISIBLE_DEVICES", K::EXTERNAL,
     "device: cuda_require's messages; rank: the monitor's NVML index, the worker's env printout",
     "the CUDA devices this process sees"},
    {"OMP_NUM_THREADS", K::EXTERNAL,
     "ops: the CPU op pool (when DTRAIN_NUM_THREADS is unset); launch: rank_thread_env keeps it",
     "OpenMP's thread count; the launcher sets it to the node's cores / its local ranks when unset"},
    {"OPENBLAS_NUM_THREADS", K::EXTERNAL, "launch: rank_thread_env keeps it",
     "OpenBLAS's thread count; the launcher sets it to the node's cores / its local ranks when unset"},
    {"OPENBLAS_CORETYPE", K::EXTERNAL, "apps: bench_cpu_step prints it",
     "the CPU kernel OpenBLAS uses (unset: detected)"},
    // clang-format on
};

}  // namespace

const std::vector<EnvVar>& env_table() {
  static const std::vector<EnvVar> table(std::begin(kTable), std::end(kTable));
  return table;
}

const EnvVar* env_find(std::string_view name) {
  for (const EnvVar& v : env_table())
    if (name == v.name) return &v;
  return nullptr;
}

const char* env_kind_name(EnvKind kind) {
  switch (kind) {
    case EnvKind::KEY: return "overrides a config key";
    case EnvKind::KNOB: return "a knob without a YAML key";
    case EnvKind::CONTRACT: return "set by dtrain for the processes it starts";
    case EnvKind::PLATFORM: return "set by the platform that started the processes";
    case EnvKind::TEST_HOOK: return "test hook (test-only fault injection)";
    case EnvKind::EXTERNAL: return "another program's";
  }
  return "?";
}

const char* env_get(std::string_view name) {
  const EnvVar* v = env_find(name);
  if (!v) DT_THROW(InternalError, "environment variable {} is read but not in the env table (core/env.cpp)", name);
  return std::getenv(v->name);
}

std::string env_get_in(const std::map<std::string, std::string>& env, std::string_view name) {
  if (!env_find(name))
    DT_THROW(InternalError, "environment variable {} is read but not in the env table (core/env.cpp)", name);
  auto it = env.find(std::string(name));
  return it == env.end() ? "" : it->second;
}

const char* env_get_user_named(std::string_view name) { return std::getenv(std::string(name).c_str()); }

}  // namespace dtrain
