// The options of every dtrain subcommand and the functions that run them. main.cpp
// fills these from the command line (CLI11); each run_* returns the exit code.
#pragma once

#include "train/hf_export.h"
#include "train/sampling.h"

#include <string>
#include <vector>

namespace dtrain::launch {
struct JobRequest;
struct Job;
struct SupervisorOptions;
}  // namespace dtrain::launch

namespace dtrain::cli {

// Options shared by launch, resume and bench: where the job runs and how it is configured.
struct JobOptions {
  std::string config;                 // --config FILE ("" = embedded default)
  std::string hostfile;               // --hostfile FILE ("" = localhost)
  std::string output_dir;             // --output-dir DIR (overrides training.output_dir)
  std::vector<std::string> sets;      // --set key.path=value (repeatable)
  std::string include, exclude;       // --include / --exclude host[:slots][@host...]
  int num_nodes = -1, num_gpus = -1;  // --num-nodes / --num-gpus
  int nproc_per_node = -1;            // --nproc-per-node (no hostfile)
  std::string master_addr;            // --master-addr (rendezvous address ranks dial)
  int master_port = -1;               // --master-port
  bool dry_run = false;               // --dry-run
  bool tee_all = false;               // --tee-all
  std::string launcher = "ssh";       // --launcher ssh|slurm
  std::string nnodes;                 // --nnodes MIN:MAX (elastic.min_nodes / max_nodes)
  std::string plan_for;               // --plan-for [NODESx]GPUSxSIZE | SIZE (a dry run for that cluster)
};

int run_launch(const JobOptions& opts);
// cmd_launch.cpp: the job request the options describe ("train" or "bench" mode).
launch::JobRequest job_request(const JobOptions& o, const std::string& mode);
int run_resume(const std::string& run_dir, const JobOptions& opts);
// cmd_train.cpp
int run_eval(const std::string& run_dir_or_model_dir, const std::string& data_jsonl, int max_records,
             const std::string& config_override_path, bool init_weights);
int run_generate(const std::string& dir, const std::string& prompt, int max_new_tokens, bool raw, bool init_weights,
                 const train::SamplingOptions& sampling);
// cmd_chat.cpp: `dtrain chat`'s options.
struct ChatArgs {
  std::string dir, system;
  int max_new_tokens = 64;
  bool init = false;
  train::SamplingOptions sampling;
};
int run_chat(const ChatArgs& a);
// `dtrain data prepare`'s options (main.cpp's flags).
struct DataPrepareArgs {
  std::string input, output, format = "text", tokenizer = "byte", dataset, template_name = "plain";
  bool train_on_prompt = false, force = false;
  unsigned threads = 0;
  double chunk_mb = 1;
};
int run_data_prepare(const DataPrepareArgs& a);
// cmd_export.cpp
int run_export(const std::string& run_dir, const std::string& out_dir, bool init_weights,
               const train::HfExportFlags& flags);

// cmd_plot.cpp, cmd_status.cpp
int run_plot(const std::string& run_dir, const std::string& out_png, int width, int height, bool force);
int run_status(const std::string& run_dir);

// cmd_bench_train.cpp
// plan: the predicted budget of the step (lib/plan/bench_plan.h) instead of a timed run;
// cluster (with plan): "NxW,..." adds the step's cluster plan there (lib/plan/plan_cluster.h).
// `dtrain bench attention`: shape "B,T,NH,NKV,HD", dtype bf16/fp16/fp32, device cuda/cpu.
int run_bench_attention(const std::string& shape, const std::string& dtype, const std::string& device, int iters,
                        int warmup, bool json);

int run_bench_train(const std::string& config_path, const std::vector<std::string>& sets, int steps, int warmup,
                    bool json = false, const std::string& device = "cuda", bool plan = false,
                    const std::string& gpu = "h100", const std::string& cluster = "");

struct BenchCliOptions;
int run_bench(const BenchCliOptions& bench, const JobOptions& opts);
// Internal: `dtrain agent ...` (started by the launcher on each node) and
// `dtrain worker ...` (started by the agent, one per rank).
int run_agent(const std::vector<std::string>& argv);
int run_worker(const std::vector<std::string>& argv);

// cmd_worker.cpp: ends the process at once (no destructors), for the rank process's
// watch threads (lib/rank/process_exit.h).
[[noreturn]] void exit_now(int exit_code);

// cmd_doctor.cpp: `dtrain doctor` (exit 0 when every check passed, Exit::UNHEALTHY
// otherwise), the hidden `dtrain doctor-node`, and the preflight run before each
// launch round when doctor.preflight is on (over the job's own spawner).
int run_doctor(const JobOptions& opts, bool json, bool network);
int run_doctor_node(const std::vector<std::string>& argv);
// Sets opts.preflight to the doctor's quick check over opts.spawner, and an elastic
// job's host probe (opts.probe_factory) to the same checks, when
// job.cfg.doctor.preflight is on (DTRAIN_PREFLIGHT=0 turns it off).
void preflight_install(launch::SupervisorOptions& opts, const launch::Job& job);

}  // namespace dtrain::cli
