// dtrain command line: parses arguments (CLI11), dispatches to the cmd_* functions, and
// maps typed exceptions to process exit codes. The only place that catches dtrain::Error.
#include "bench_options.h"
#include "commands.h"

#include "core/error.h"
#include "core/log.h"
#include "core/version.h"

#include <CLI/CLI.hpp>

#include <csignal>
#include <cstdio>
#include <exception>

namespace {

using dtrain::cli::JobOptions;

// The options every job-running subcommand shares.
void add_job_options(CLI::App* cmd, JobOptions& o, bool config_required) {
  auto* c = cmd->add_option("--config", o.config, "training config (YAML, or DeepSpeed JSON)");
  if (config_required) c->required();
  c->check(CLI::ExistingFile);
  cmd->add_option("--hostfile", o.hostfile, "DeepSpeed-style hostfile (\"host slots=N\" per line); default: localhost")
      ->check(CLI::ExistingFile);
  cmd->add_option("--output-dir", o.output_dir, "the run directory (overrides training.output_dir)");
  cmd->add_option("--set", o.sets, "override a config key, typed like its YAML value (repeatable): --set zero_optimization.stage=2")
      ->type_name("KEY=VALUE")->allow_extra_args(false);
  auto* inc = cmd->add_option("--include", o.include, "use only these hosts/slots: host[:slot,slot][@host...]");
  auto* exc = cmd->add_option("--exclude", o.exclude, "leave out these hosts/slots: host[:slot,slot][@host...]");
  inc->excludes(exc);
  cmd->add_option("--num-nodes", o.num_nodes, "use the first N hosts of the hostfile")->check(CLI::PositiveNumber);
  cmd->add_option("--num-gpus", o.num_gpus, "use the first N slots of each host")->check(CLI::PositiveNumber);
  cmd->add_option("--nproc-per-node", o.nproc_per_node,
                  "ranks on localhost when no hostfile is given (default: visible GPUs, else 1)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--master-addr", o.master_addr, "address the nodes use to reach this launcher's rendezvous");
  cmd->add_option("--master-port", o.master_port, "rendezvous port (0 = pick a free one)")->check(CLI::Range(0, 65535));
  cmd->add_flag("--tee-all", o.tee_all, "show every rank's output on the terminal (default: rank 0 and all errors)");
  cmd->add_flag("--dry-run", o.dry_run, "print the placement and each node's command and environment, then exit");
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
  app.footer("Exit codes: 0 success, 2 usage/config error, 3 I/O, 4 launch/SSH, 5 communication, "
             "6 training, 7 checkpoint, 8 device; a failed rank's own code otherwise.\n"
             "Run 'dtrain <command> --help' for a command's options.");

  JobOptions launch_opts;
  auto* launch = app.add_subcommand("launch", "run a training job on the hosts of a hostfile");
  add_job_options(launch, launch_opts, false);
  launch->footer("Example:\n  dtrain launch --hostfile hostfiles/two-nodes-8 --config configs/gpt2-124m.yaml "
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

  // Internal commands, started by dtrain itself: their arguments pass through untouched.
  auto* agent = app.add_subcommand("agent", "internal: node agent started by the launcher")->prefix_command();
  agent->group("");
  auto* worker = app.add_subcommand("worker", "internal: rank process started by the agent")->prefix_command();
  worker->group("");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : static_cast<int>(dtrain::Exit::USAGE);
  }

  if (agent->parsed()) return run_guarded([&] { return dtrain::cli::run_agent(agent->remaining()); });
  if (worker->parsed()) return run_guarded([&] { return dtrain::cli::run_worker(worker->remaining()); });
  if (bench->parsed())
    return run_guarded([&] { return dtrain::cli::run_bench(bench_cli, bench_opts); });
  if (launch->parsed()) return run_guarded([&] { return dtrain::cli::run_launch(launch_opts); });
  if (resume->parsed()) return run_guarded([&] { return dtrain::cli::run_resume(resume_dir, resume_opts); });
  return static_cast<int>(dtrain::Exit::USAGE);
}
