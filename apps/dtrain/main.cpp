// dtrain command line: parses arguments (CLI11), dispatches to the cmd_* functions, and
// maps typed exceptions to process exit codes. The only place that catches dtrain::Error.
#include "bench_options.h"
#include "commands.h"
#include "config/hostfile.h"

#include "config/train_config.h"
#include "core/check.h"
#include "core/error.h"
#include "core/log.h"
#include "core/version.h"
#include "rank/external_run.h"

#include <CLI/CLI.hpp>

#include <csignal>
#include <cstdio>
#include <exception>

namespace {

using dtrain::cli::int_at_least;
using dtrain::cli::int_in_range;
using dtrain::cli::JobOptions;

// The options every job-running subcommand shares.
void add_job_options(CLI::App* cmd, JobOptions& o, bool config_required) {
  auto* c = cmd->add_option("--config", o.config, "training config (YAML, or DeepSpeed JSON)");
  if (config_required) c->required();
  c->check(CLI::ExistingFile);
  cmd->add_option("--hostfile", o.hostfile, "DeepSpeed-style hostfile (\"host slots=N\" per line); default: localhost")
      ->check(CLI::ExistingFile);
  cmd->add_option("--output-dir", o.output_dir, "the run directory (overrides training.output_dir)");
  cmd->add_option("--set", o.sets,
                  "override a config key, typed like its YAML value (repeatable): --set zero_optimization.stage=2")
      ->type_name("KEY=VALUE")
      ->allow_extra_args(false);
  auto* inc = cmd->add_option("--include", o.include, "use only these hosts/slots: host[:slot,slot][@host...]");
  auto* exc = cmd->add_option("--exclude", o.exclude, "leave out these hosts/slots: host[:slot,slot][@host...]");
  inc->excludes(exc);
  cmd->add_option("--num-nodes", o.num_nodes, "use the first N hosts of the hostfile")
      ->check(int_at_least("--num-nodes", 1));
  cmd->add_option("--nnodes", o.nnodes,
                  "elastic membership as torchrun's: MIN:MAX nodes (N = N:N); a node that fails the probe or "
                  "elastic.max_node_failures rounds in a row is left out while MIN remain, and rejoins at a "
                  "checkpoint (sets elastic.min_nodes and elastic.max_nodes)")
      ->type_name("MIN:MAX");
  cmd->add_option("--num-gpus", o.num_gpus, "use the first N slots of each host")->check(int_at_least("--num-gpus", 1));
  cmd->add_option("--nproc-per-node", o.nproc_per_node,
                  "ranks on localhost when no hostfile is given (default: visible GPUs, else 1)")
      ->check(int_at_least("--nproc-per-node", 1));
  cmd->add_option("--master-addr", o.master_addr, "address the nodes use to reach this launcher's rendezvous");
  cmd->add_option("--master-port", o.master_port, "rendezvous port (0 = pick a free one)")
      ->check(int_in_range("--master-port", 0, 65535, "0 = pick a free port"));
  cmd->add_option("--launcher", o.launcher,
                  "ssh: hosts from --hostfile (local ones without SSH); slurm: inside sbatch/salloc, nodes from "
                  "SLURM_JOB_NODELIST, one agent per node through srun")
      ->check(CLI::IsMember({"ssh", "slurm"}))
      ->capture_default_str();
  cmd->add_flag("--tee-all", o.tee_all, "show every rank's output on the terminal (default: rank 0 and all errors)");
  cmd->add_flag("--dry-run", o.dry_run, "print the placement and each node's command and environment, then exit");
  // The config loader's unknown-key message points here.
  cmd->add_flag_callback(
      "--help-config",
      [] {
        const std::string text = dtrain::config::config_help();
        std::fwrite(text.data(), 1, text.size(), stdout);
        throw CLI::Success();
      },
      "print every config key with its type, default, bounds and environment override, then exit");
}

// An empty --output-dir would read as "not given" and write into the config's
// training.output_dir: refuse it.
void check_output_dir(const CLI::App* cmd, const std::string& output_dir) {
  if (cmd->count("--output-dir") > 0 && output_dir.empty())
    DT_THROW(UsageError,
             "--output-dir is empty: give the run directory's path, or leave the flag out to use the "
             "config's training.output_dir");
}

// An empty --include/--exclude would read as "no filter" and run on every host: refuse it.
// (CLI11 skips validators for an empty value, so this is checked after parsing.)
void check_job_options(const CLI::App* cmd, const JobOptions& o) {
  for (const auto& [flag, value] : {std::pair{"--include", &o.include}, std::pair{"--exclude", &o.exclude}})
    if (cmd->count(flag) > 0 && value->empty())
      DT_THROW(UsageError,
               "{} is empty: give host[:slot,slot][@host...] (e.g. {} worker-0@worker-1:0,2), or leave "
               "the flag out",
               flag, flag);
  check_output_dir(cmd, o.output_dir);
}

int run_guarded(const std::function<int()>& body) {
  try {
    return body();
  } catch (const dtrain::Error& e) {
    std::fprintf(stderr, "dtrain: error: %s\n", e.what());
    return e.exit_code();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dtrain: internal error: %s\n", e.what());
    return static_cast<int>(dtrain::Exit::INTERNAL);
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dtrain: launch and run distributed transformer training (DeepSpeed-style configs and hostfiles)"};
  app.set_version_flag("--version", std::string("dtrain ") + dtrain::version());
  app.require_subcommand(1);
  app.failure_message(dtrain::cli::cli_failure_message);
  app.footer(
      "Exit codes: 0 success, 2 usage/config error, 3 I/O, 4 launch/SSH, 5 communication, "
      "6 training, 7 checkpoint, 8 device; a failed rank's own code otherwise.\n"
      "Run 'dtrain <command> --help' for a command's options.");

  JobOptions launch_opts;
  auto* launch = app.add_subcommand("launch", "run a training job on the hosts of a hostfile");
  add_job_options(launch, launch_opts, false);
  launch->footer(
      "Example:\n  dtrain launch --hostfile hostfiles/two-nodes-8 --config configs/gpt2-124m.yaml "
      "--set training.max_steps=100\nWithout --config the embedded default job runs "
      "(configs/tiny-sft.yaml: a tiny model on the shipped data, one CPU rank).");

  JobOptions resume_opts;
  std::string resume_dir;
  auto* resume = app.add_subcommand("resume", "continue a stopped or failed job from its run directory");
  resume->add_option("RUN_DIR", resume_dir, "the job's run directory")->required()->check(CLI::ExistingDirectory);
  add_job_options(resume, resume_opts, false);
  resume->footer("Example:\n  dtrain resume runs/tiny-sft --hostfile hostfiles/hetero --set training.max_steps=600");

  JobOptions bench_opts;
  dtrain::cli::BenchCliOptions bench_cli;
  auto* bench = app.add_subcommand("bench", "measure collectives across the hostfile's ranks (nccl-tests output)");
  bench->add_option("COLLECTIVE", bench_cli.collective, "allreduce, reduce_scatter, all_gather, broadcast or all")
      ->capture_default_str();
  dtrain::cli::bench_add_options(bench, bench_cli);
  add_job_options(bench, bench_opts, false);
  bench->footer("Example:\n  dtrain bench allreduce --hostfile hostfiles/two-nodes-8 -b 8 -e 1G -f 2 --backend nccl");

  struct {
    std::string config, device = "cuda";
    std::vector<std::string> sets;
    int steps = 20, warmup = 5;
    bool json = false, plan = false;
  } bt;
  auto* bench_train = bench->add_subcommand(
      "train", "one-device training throughput on synthetic tokens: tokens/s, step time, MFU, peak memory");
  bench_train->add_option("--config", bt.config, "training config (model, micro-batch, seq_len, precision, LoRA)")
      ->required()
      ->check(CLI::ExistingFile);
  bench_train->add_option("--set", bt.sets, "override a config key (repeatable)")
      ->type_name("KEY=VALUE")
      ->allow_extra_args(false);
  bench_train->add_option("--steps", bt.steps, "timed steps")->check(int_at_least("--steps", 1))->capture_default_str();
  bench_train->add_option("--warmup", bt.warmup, "untimed warm-up steps")
      ->check(int_at_least("--warmup", 0))
      ->capture_default_str();
  bench_train->add_flag("--json", bt.json, "print one JSON object");
  bench_train->add_flag("--plan", bt.plan,
                        "predict the step on an H100 instead of timing it: every launch the CUDA code issues, with "
                        "its FLOPs, bytes and roofline time (needs no GPU)");
  bench_train->add_option("--device", bt.device, "cuda, or cpu for the CPU reference model (fp32)")
      ->check(CLI::IsMember({"cuda", "cpu"}))
      ->capture_default_str();
  bench_train->footer(
      "Examples:\n  dtrain bench train --config configs/gpt2-124m.yaml --set train_micro_batch_size_per_gpu=16\n"
      "  dtrain bench train --config configs/gpt2-124m.yaml --set train_micro_batch_size_per_gpu=16 --plan");

  struct {
    std::string dir, data, config;
    int max_records = 200;
    bool init = false;
  } ev;
  auto* eval = app.add_subcommand("eval", "held-out task accuracy and validation loss of a trained model");
  eval->add_option("DIR", ev.dir,
                   "run directory (its final/, else its latest complete checkpoint), its final/ or a "
                   "Hugging Face model directory")
      ->required();
  eval->add_option("--data", ev.data, "SFT JSONL to evaluate on (default: the config's data.valid)");
  eval->add_option("--max-records", ev.max_records, "records to generate answers for (0 = all)")
      ->check(int_at_least("--max-records", 0))
      ->capture_default_str();
  eval->add_option("--config", ev.config, "config to take data/tokenizer settings from instead of DIR's");
  eval->add_flag("--init", ev.init, "evaluate the config's freshly initialised model (the before-training figure)");
  eval->footer("Example:\n  dtrain eval runs/tiny-sft --max-records 200");

  std::string export_dir, export_out;
  bool export_init = false;
  auto* export_cmd = app.add_subcommand(
      "export",
      "write a run's final/ model, else its latest complete checkpoint (any world size / ZeRO stage), as "
      "Hugging Face files");
  export_cmd->add_option("RUN_DIR", export_dir, "the run directory")->required()->check(CLI::ExistingDirectory);
  export_cmd->add_option("-o,--output", export_out, "directory to write (default: RUN_DIR/export)");
  export_cmd->add_flag("--init", export_init, "export the config's freshly initialised model instead");
  export_cmd->footer("Example:\n  dtrain export runs/tiny-sft -o tiny-sft-hf");

  struct {
    std::string dir, prompt;
    int max_new = 64;
    bool raw = false, init = false;
  } gen;
  auto* generate = app.add_subcommand("generate", "greedy generation from a trained model");
  generate
      ->add_option("DIR", gen.dir,
                   "run directory (its final/, else its latest complete checkpoint), its final/ "
                   "or a Hugging Face model directory")
      ->required();
  generate->add_option("PROMPT", gen.prompt, "instruction (rendered with the model's SFT template)")->required();
  generate->add_option("--max-new-tokens", gen.max_new, "tokens to generate at most")
      ->check(int_at_least("--max-new-tokens", 0))
      ->capture_default_str();
  generate->add_flag("--raw", gen.raw, "use PROMPT as is, without the SFT template");
  generate->add_flag("--init", gen.init, "generate with the config's freshly initialised model");
  generate->footer("Example:\n  dtrain generate runs/tiny-sft \"add 12 and 30\"");

  struct {
    std::string input, format = "text", tokenizer = "byte", output;
  } dp;
  auto* data = app.add_subcommand("data", "dataset tools");
  data->require_subcommand(1);
  auto* prepare = data->add_subcommand("prepare", "tokenize plain text or SFT JSONL into a token shard");
  prepare->add_option("INPUT", dp.input, "text file or JSONL")->required()->check(CLI::ExistingFile);
  prepare->add_option("OUTPUT", dp.output, "token shard to write")->required();
  prepare->add_option("--format", dp.format, "text, alpaca, chat or sft (alpaca or chat per line)")
      ->capture_default_str();
  prepare->add_option("--tokenizer", dp.tokenizer, "byte, or a Hugging Face tokenizer.json")->capture_default_str();
  prepare->footer("Example:\n  dtrain data prepare configs/data/tasks/train.jsonl /tmp/tasks.bin --format alpaca");

  std::string plot_dir, plot_out;
  int plot_w = 1200, plot_h = 800;
  auto* plot = app.add_subcommand("plot", "draw a run's loss and tokens/s curves (restarts marked) into a PNG");
  plot->add_option("RUN_DIR", plot_dir, "the run directory")->required()->check(CLI::ExistingDirectory);
  plot->add_option("-o,--output", plot_out, "PNG to write (default: RUN_DIR/plot.png)");
  plot->add_option("--width", plot_w, "image width")->check(int_in_range("--width", 400, 16384))->capture_default_str();
  plot->add_option("--height", plot_h, "image height")
      ->check(int_in_range("--height", 300, 16384))
      ->capture_default_str();
  plot->footer("Example:\n  dtrain plot runs/tiny-sft -o loss.png");

  dtrain::rank::ExternalOptions run_opts;
  auto* run_cmd = app.add_subcommand(
      "run",
      "one process of a job started by torchrun, a Kubernetes operator, srun or mpirun (placement from "
      "their environment)");
  run_cmd
      ->add_option("--config", run_opts.config, "training config (YAML or DeepSpeed JSON); default: the embedded job")
      ->check(CLI::ExistingFile);
  run_cmd->add_option("--set", run_opts.sets, "override a config key (repeatable)")
      ->type_name("KEY=VALUE")
      ->allow_extra_args(false);
  run_cmd->add_option("--output-dir", run_opts.output_dir,
                      "run directory (overrides training.output_dir); shared by "
                      "every process");
  run_cmd
      ->add_option("--nproc-per-node", run_opts.nproc_per_node,
                   "this process stands for its node and starts N local ranks (the launcher's rank = node index)")
      ->check(int_in_range("--nproc-per-node", 1, dtrain::config::HOSTFILE_MAX_SLOTS,
                           "ranks on one node, as dtrain launch's slots per host"));
  run_cmd->footer(
      "Example (every node of a PyTorchJob):\n  dtrain run --config /etc/dtrain/job.yaml\n"
      "The job token comes from cluster.rendezvous.token_file or token_env, never the command line.");

  std::string status_dir;
  auto* status = app.add_subcommand(
      "status", "is a run running, failed or finished: progress, checkpoint, restarts, node heartbeats");
  status->add_option("RUN_DIR", status_dir, "the run directory")->required()->check(CLI::ExistingDirectory);
  status->footer("Example:\n  dtrain status runs/tiny-sft");

  JobOptions doctor_opts;
  bool doctor_json = false, doctor_no_network = false;
  auto* doctor =
      app.add_subcommand("doctor",
                         "check every host before a long job: SSH, same dtrain build, slots vs GPUs/CPUs, driver, free "
                         "space, shared run directory, clock skew, collective connectivity and per-link bandwidth");
  add_job_options(doctor, doctor_opts, false);
  for (const char* flag : {"--dry-run", "--tee-all"}) doctor->remove_option(doctor->get_option(flag));
  doctor->add_flag("--json", doctor_json, "print the report as JSON instead of the table");
  doctor->add_flag("--no-network", doctor_no_network, "skip the connectivity check and the bandwidth table");
  doctor->footer(
      "Exit 0 when every check passed, 10 when one failed (each failure names host, check and what to "
      "do).\nExample:\n  dtrain doctor --hostfile hostfiles/two-nodes-8 --config configs/gpt2-124m.yaml");

  // Internal commands, started by dtrain itself: their arguments pass through untouched.
  auto* agent = app.add_subcommand("agent", "internal: node agent started by the launcher")->prefix_command();
  agent->group("");
  auto* worker = app.add_subcommand("worker", "internal: rank process started by the agent")->prefix_command();
  worker->group("");
  auto* doctor_node = app.add_subcommand("doctor-node", "internal: one node's part of dtrain doctor")->prefix_command();
  doctor_node->group("");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : static_cast<int>(dtrain::Exit::USAGE);
  }

  if (agent->parsed()) return run_guarded([&] { return dtrain::cli::run_agent(agent->remaining()); });
  if (worker->parsed()) return run_guarded([&] { return dtrain::cli::run_worker(worker->remaining()); });
  if (doctor_node->parsed()) return run_guarded([&] { return dtrain::cli::run_doctor_node(doctor_node->remaining()); });
  if (doctor->parsed())
    return run_guarded([&] {
      check_job_options(doctor, doctor_opts);
      return dtrain::cli::run_doctor(doctor_opts, doctor_json, !doctor_no_network);
    });
  if (eval->parsed())
    return run_guarded([&] { return dtrain::cli::run_eval(ev.dir, ev.data, ev.max_records, ev.config, ev.init); });
  if (export_cmd->parsed())
    return run_guarded([&] { return dtrain::cli::run_export(export_dir, export_out, export_init); });
  if (generate->parsed())
    return run_guarded([&] { return dtrain::cli::run_generate(gen.dir, gen.prompt, gen.max_new, gen.raw, gen.init); });
  if (prepare->parsed())
    return run_guarded([&] { return dtrain::cli::run_data_prepare(dp.input, dp.format, dp.tokenizer, dp.output); });
  if (plot->parsed()) return run_guarded([&] { return dtrain::cli::run_plot(plot_dir, plot_out, plot_w, plot_h); });
  if (status->parsed()) return run_guarded([&] { return dtrain::cli::run_status(status_dir); });
  if (run_cmd->parsed())
    return run_guarded([&] {
      check_output_dir(run_cmd, run_opts.output_dir);
      return dtrain::rank::external_run(run_opts, dtrain::cli::exit_now);
    });
  if (bench_train->parsed())
    return run_guarded([&] {
      return dtrain::cli::run_bench_train(bt.config, bt.sets, bt.steps, bt.warmup, bt.json, bt.device, bt.plan);
    });
  if (bench->parsed())
    return run_guarded([&] {
      check_job_options(bench, bench_opts);
      return dtrain::cli::run_bench(bench_cli, bench_opts);
    });
  if (launch->parsed())
    return run_guarded([&] {
      check_job_options(launch, launch_opts);
      return dtrain::cli::run_launch(launch_opts);
    });
  if (resume->parsed())
    return run_guarded([&] {
      check_job_options(resume, resume_opts);
      return dtrain::cli::run_resume(resume_dir, resume_opts);
    });
  return static_cast<int>(dtrain::Exit::USAGE);
}
