// Run status from synthetic run directories: running (live launcher), failed, finished,
// interrupted, lost, recycled pid, checkpoints, heartbeat ages, broken lines.
#include "report/status.h"

#include "core/error.h"
#include "core/unix_time.h"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <limits>

#include <sys/wait.h>
#include <unistd.h>

namespace fs = std::filesystem;
using namespace dtrain::report;
using dtrain::unix_ms;

namespace {
std::vector<nlohmann::json> as_json(const std::vector<dtrain::report::Event>& events) {
  std::vector<nlohmann::json> out;
  for (const auto& e : events) out.push_back(dtrain::report::event_json(e));
  return out;
}
}  // namespace

namespace {

struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& name) {
    path = fs::temp_directory_path() / fmt_name(name);
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  static std::string fmt_name(const std::string& n) { return "dtrain-status-" + n + "-" + std::to_string(::getpid()); }
  std::string str() const { return path.string(); }
};

void append(const fs::path& p, const std::string& line) { std::ofstream(p, std::ios::app) << line << "\n"; }

constexpr int64_t T0 = 1'700'000'000'000;

void write_events_and_metrics(const fs::path& dir) {
  append(dir / "events.jsonl", R"({"time_ms":1700000000000,"event":"round_start","round":0,"world_size":4})");
  append(
      dir / "events.jsonl",
      R"({"time_ms":1700000190000,"event":"failure","round":0,"node":1,"why":"rank 3 exited with code 137","exit_code":137})");
  append(dir / "events.jsonl", R"({"time_ms":1700000200000,"event":"round_start","round":1,"world_size":4})");
  append(dir / "metrics.jsonl", R"({"step":10,"loss":3.5,"lr":0.001,"tokens_per_s":1000})");
  append(dir / "metrics.jsonl", R"({"step":20,"loss":2.75,"lr":0.001,"tokens_per_s":18234})");
  append(dir / "metrics.jsonl", R"({"step":20,"eval_loss":2.5,"eval_ppl":12.2})");
  append(dir / "metrics.jsonl", R"({"step":30,"loss":2.)");  // being written: skipped
}

pid_t dead_pid() {
  pid_t p = ::fork();
  if (p == 0) ::_exit(0);
  ::waitpid(p, nullptr, 0);
  return p;
}

}  // namespace

TEST_CASE("status: running job with a live launcher, heartbeats and a checkpoint") {
  TempDir d("running");
  write_events_and_metrics(d.path);
  status_write_launcher(d.str(), "job-42");
  fs::create_directories(d.path / "checkpoints" / "step20");
  append(d.path / "checkpoints" / "step20" / "manifest.json", "{}");
  append(d.path / "checkpoints" / "latest", "step20");
  status_write_nodes(d.str(), 1, {{0, "n1", 1.2, "running"}, {1, "n2", -1, "starting"}});

  RunStatus st = status_read(d.str());
  CHECK(st.state == RunState::RUNNING);
  CHECK(st.launcher_alive);
  CHECK(st.launcher_pid == ::getpid());
  CHECK(st.job_id == "job-42");
  CHECK(st.rounds == 2);
  CHECK(st.restarts == 1);
  REQUIRE(st.failures.size() == 1);
  CHECK(st.failures[0].node == 1);
  CHECK(st.failures[0].exit_code == 137);
  REQUIRE(st.last_step);
  CHECK(*st.last_step == 20);
  CHECK(st.last_loss == 2.75);
  REQUIRE(st.last_eval_step);
  CHECK(st.last_eval_loss == 2.5);
  CHECK(st.checkpoint == "step20");
  REQUIRE(st.nodes.size() == 2);
  CHECK(st.nodes[0].host == "n1");

  // Render with the node file 2 s old: ages grow by that much.
  st.nodes_time_ms = T0;
  std::string text = status_format(st, T0 + 2000);
  CAPTURE(text);
  CHECK(text.find("state      running: launcher pid " + std::to_string(::getpid())) != std::string::npos);
  CHECK(text.find("(job job-42)") != std::string::npos);
  CHECK(text.find("step 20, loss 2.7500, 18.2k tokens/s; eval_loss 2.5000 at step 20") != std::string::npos);
  CHECK(text.find("checkpoint step20") != std::string::npos);
  CHECK(text.find("restarts   1") != std::string::npos);
  CHECK(text.find("round 0 failed") != std::string::npos);
  CHECK(text.find("node 1: rank 3 exited with code 137 [exit code 137]") != std::string::npos);
  CHECK(text.find("node0 n1 running last heartbeat 3.2 s ago") != std::string::npos);
  CHECK(text.find("node1 n2 starting no heartbeat yet") != std::string::npos);
  CHECK(text.find("as of 2.0 s ago") != std::string::npos);
  CHECK(status_report(d.str()).find("running") != std::string::npos);
}

TEST_CASE("status: failed job (launcher gone, last event a failure)") {
  TempDir d("failed");
  write_events_and_metrics(d.path);
  append(
      d.path / "events.jsonl",
      R"({"time_ms":1700000300000,"event":"failure","round":1,"node":0,"why":"node 0 (n1) missed heartbeats","exit_code":4})");
  nlohmann::json l{{"pid", dead_pid()}, {"host", "x"}, {"job_id", "j"}, {"started_ms", T0}};
  // Same host as this one, so liveness is checked.
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  l["host"] = host;
  append(d.path / "launcher.json", l.dump());

  RunStatus st = status_read(d.str());
  CHECK_FALSE(st.launcher_alive);
  CHECK(st.state == RunState::FAILED);
  CHECK(st.failures.size() == 2);
  CHECK(st.checkpoint.empty());
  std::string text = status_format(st, 1700000360000);
  CAPTURE(text);
  // No checkpoint was saved: resume is not offered as a way to continue.
  CHECK(text.find("state      failed 1m00s ago (exit code 4); no usable checkpoint to continue from: dtrain resume " +
                  d.str() + " would start again from step 0") != std::string::npos);
  CHECK(text.find("checkpoint none") != std::string::npos);
  CHECK(text.find("restarts   1") != std::string::npos);
}

TEST_CASE("status: finished job") {
  TempDir d("finished");
  write_events_and_metrics(d.path);
  append(d.path / "events.jsonl", R"({"time_ms":1700000400000,"event":"finished","round":1})");
  fs::create_directories(d.path / "checkpoints");
  append(d.path / "checkpoints" / "latest", "step30");  // names a missing directory
  RunStatus st = status_read(d.str());
  CHECK(st.state == RunState::FINISHED);
  CHECK(st.checkpoint.empty());
  std::string text = status_format(st, 1700000405000);
  CAPTURE(text);
  CHECK(text.find("state      finished 5.0 s ago") != std::string::npos);
  CHECK(text.find("checkpoints/latest names step30, but checkpoints/step30 does not exist") != std::string::npos);
  fs::create_directories(d.path / "checkpoints" / "step30");  // no manifest: a torn write
  CHECK(status_format(status_read(d.path.string()), 0).find("checkpoints/step30 has no manifest.json") !=
        std::string::npos);
}

TEST_CASE("status: interrupted, lost, recycled pid, empty and missing run dirs") {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  {
    TempDir d("interrupted");
    append(d.path / "events.jsonl", R"({"time_ms":1,"event":"round_start","round":0})");
    append(d.path / "events.jsonl",
           R"j({"time_ms":2,"event":"failure","round":0,"node":-2,"why":"interrupted (Ctrl-C)","exit_code":130})j");
    CHECK(status_read(d.str()).state == RunState::INTERRUPTED);
  }
  {
    TempDir d("lost");
    append(d.path / "events.jsonl", R"({"time_ms":1,"event":"round_start","round":0})");
    append(d.path / "launcher.json", nlohmann::json{{"pid", dead_pid()}, {"host", host}}.dump());
    RunStatus st = status_read(d.str());
    CHECK(st.state == RunState::LOST);
    CHECK(status_format(st, 5).find("is gone without a final event") != std::string::npos);
  }
  {
    // Our own pid but another start time: a recycled pid, not the launcher.
    TempDir d("recycled");
    append(d.path / "events.jsonl", R"({"time_ms":1,"event":"round_start","round":0})");
    append(d.path / "launcher.json", nlohmann::json{{"pid", ::getpid()}, {"host", host}, {"pid_start", 1}}.dump());
    CHECK(status_read(d.str()).state == RunState::LOST);
  }
  {
    // Launcher on another host: its pid cannot be checked, the events say running.
    TempDir d("remote");
    append(d.path / "events.jsonl", R"({"time_ms":1,"event":"round_start","round":0})");
    append(d.path / "launcher.json", nlohmann::json{{"pid", 1}, {"host", "another-login-node"}}.dump());
    RunStatus st = status_read(d.str());
    CHECK(st.state == RunState::RUNNING);
    CHECK(status_format(st, 5).find("liveness not checkable") != std::string::npos);
  }
  {
    // config.yaml written, no round yet: a run that has not started.
    TempDir d("fresh");
    append(d.path / "config.yaml", "training: {}");
    RunStatus st = status_read(d.str());
    CHECK(st.state == RunState::NOT_STARTED);
    std::string text = status_format(st, 5);
    CHECK(text.find("no training step logged yet") != std::string::npos);
    CHECK(text.find("checkpoint none") != std::string::npos);
  }
  {
    // Nothing a run writes: not a run directory at all.
    TempDir d("empty");
    fs::create_directories(d.path / "something-else");
    CHECK_THROWS_WITH_AS(status_read(d.str()), doctest::Contains("is not a dtrain run directory"), dtrain::UsageError);
  }
  CHECK_THROWS_AS(status_read("/nonexistent/run/dir"), dtrain::IoError);
}

TEST_CASE("status: corrupt launcher.json, nodes.json or events.jsonl lines are IoErrors naming file and line") {
  {
    TempDir d("corrupt-events");
    append(d.path / "events.jsonl", R"({"time_ms":1,"event":"round_start","round":0})");
    append(d.path / "events.jsonl", "");  // a blank line is harmless
    append(d.path / "events.jsonl", R"(not json)");
    append(d.path / "events.jsonl", R"({"time_ms":2,"event":"finished","round":0})");
    CHECK_THROWS_WITH_AS(status_read(d.str()), doctest::Contains("events.jsonl:3: corrupt line \"not json\""),
                         dtrain::IoError);
  }
  {
    // A JSON value that is not an object is as corrupt as broken text.
    TempDir d("array-event");
    append(d.path / "events.jsonl", "[1]");
    CHECK_THROWS_WITH_AS(status_read(d.str()), doctest::Contains("events.jsonl:1: corrupt"), dtrain::IoError);
  }
  {
    // Only the last line may be cut (no newline yet): it is skipped.
    TempDir d("torn-tail");
    append(d.path / "events.jsonl", R"({"time_ms":1,"event":"round_start","round":0})");
    std::ofstream(d.path / "events.jsonl", std::ios::app) << R"({"time_ms":2,"event":"fin)";
    RunStatus st = status_read(d.str());
    CHECK(st.rounds == 1);
  }
  {
    TempDir d("corrupt-launcher");
    append(d.path / "config.yaml", "training: {}");
    append(d.path / "launcher.json", "{\"pid\": 1,\n\"host\": }");
    CHECK_THROWS_WITH_AS(status_read(d.str()), doctest::Contains("launcher.json:2: corrupt"), dtrain::IoError);
  }
  {
    TempDir d("corrupt-nodes");
    append(d.path / "config.yaml", "training: {}");
    append(d.path / "nodes.json", "\"nodes\"");
    CHECK_THROWS_WITH_AS(status_read(d.str()), doctest::Contains("nodes.json is corrupt"), dtrain::IoError);
  }
}

TEST_CASE("status: a launcher that ended without its final records does not show nodes as running") {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  TempDir d("ended-unrecorded");
  // The launcher's last nodes.json (the disk filled up after it) still says running.
  append(d.path / "events.jsonl", R"({"time_ms":1,"event":"round_start","round":0})");
  append(d.path / "launcher.json", nlohmann::json{{"pid", dead_pid()}, {"host", host}}.dump());
  status_write_nodes(d.str(), 0, {{0, "n1", 0.5, "running"}, {1, "n2", -1, "starting"}});
  RunStatus st = status_read(d.str());
  CHECK(st.state == RunState::LOST);
  std::string text = status_format(st, unix_ms());
  CAPTURE(text);
  CHECK(text.find("node0 n1 unknown: the launcher ended without recording how this node ended") != std::string::npos);
  CHECK(text.find("node1 n2 unknown") != std::string::npos);
  CHECK(text.find("running") == std::string::npos);
  CHECK(text.find("could not write events.jsonl") != std::string::npos);
}

TEST_CASE("status: a launcher that exited but is not yet reaped (a zombie) is not running") {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  pid_t z = ::fork();
  if (z == 0) ::_exit(3);
  REQUIRE(z > 0);
  // Bounded wait until the child has exited (it stays a zombie until waitpid below).
  siginfo_t info{};
  REQUIRE(::waitid(P_PID, static_cast<id_t>(z), &info, WEXITED | WNOWAIT) == 0);
  TempDir d("zombie");
  append(d.path / "events.jsonl", R"({"time_ms":1,"event":"round_start","round":0})");
  append(d.path / "events.jsonl",
         R"({"time_ms":2,"event":"failure","round":0,"node":0,"why":"rank 0 exited with code 3","exit_code":3})");
  append(d.path / "launcher.json", nlohmann::json{{"pid", z}, {"host", host}}.dump());
  RunStatus st = status_read(d.str());
  ::waitpid(z, nullptr, 0);
  CHECK_FALSE(st.launcher_alive);
  CHECK(st.state == RunState::FAILED);
}

TEST_CASE(
    "status: a dtrain run job (rank 0 keeps the record): running, failed with the platform's restart, lost, "
    "finished") {
  TempDir d("external");
  append(d.path / "config.yaml", "training: {}");
  // The first round's event, as rank 0 of dtrain run writes it: this process is rank 0.
  std::vector<nlohmann::json> first = as_json(status_external_round_start(d.str(), 3, "torchrun"));
  REQUIRE(first.size() == 1);  // nothing before it to close
  nlohmann::json start = first[0];
  CHECK(start.at("round") == 0);
  CHECK(start.at("world_size") == 3);
  CHECK(start.at("pid") == ::getpid());
  append(d.path / "events.jsonl", start.dump());
  RunStatus st = status_read(d.str());
  CHECK(st.state == RunState::RUNNING);
  CHECK(st.started_by == "torchrun");
  CHECK(status_format(st, unix_ms()).find("dtrain run under torchrun, rank 0 pid " + std::to_string(::getpid())) !=
        std::string::npos);

  // The round fails: the platform restarts it, not dtrain resume.
  append(d.path / "events.jsonl", nlohmann::json{{"time_ms", unix_ms()},
                                                 {"event", "failure"},
                                                 {"round", 0},
                                                 {"node", -1},
                                                 {"why", "the job stops: rank 2 on c failed: bad data"},
                                                 {"exit_code", 5}}
                                      .dump());
  st = status_read(d.str());
  CHECK(st.state == RunState::FAILED);
  std::string text = status_format(st, unix_ms());
  CHECK(text.find("torchrun restarts the processes") != std::string::npos);
  CHECK(text.find("dtrain resume") == std::string::npos);
  CHECK(text.find("round 0 failed") != std::string::npos);

  // The restarted set's rank 0 counts the rounds before it; killed, it leaves the round open.
  std::vector<nlohmann::json> second = as_json(status_external_round_start(d.str(), 2, "srun"));
  REQUIRE(second.size() == 1);  // round 0 ended with its failure event
  nlohmann::json again = second[0];
  CHECK(again.at("round") == 1);
  again["pid"] = dead_pid();
  append(d.path / "events.jsonl", again.dump());
  st = status_read(d.str());
  CHECK(st.state == RunState::LOST);
  CHECK(st.restarts == 1);
  CHECK(status_format(st, unix_ms()).find("rank 0 of dtrain run (pid") != std::string::npos);

  // The next rank 0 closes the killed one's round before opening its own.
  std::vector<nlohmann::json> third = as_json(status_external_round_start(d.str(), 2, "srun"));
  REQUIRE(third.size() == 2);
  CHECK(third[0].at("event") == "failure");
  CHECK(third[0].at("round") == 1);
  CHECK(third[0].at("why").get<std::string>().find("ended without a final event: its rank 0 (pid") == 0);
  CHECK(third[1].at("round") == 2);
  third[1]["host"] = "pod-0";  // from another host the pid cannot be checked: an open round counts as running
  for (const auto& ev : third) append(d.path / "events.jsonl", ev.dump());
  st = status_read(d.str());
  CHECK(st.state == RunState::RUNNING);
  CHECK(status_format(st, unix_ms()).find("liveness not checkable") != std::string::npos);

  CHECK(st.failures.size() == 2);
  CHECK(st.restarts == 2);
  append(d.path / "events.jsonl", R"({"time_ms":1,"event":"finished","round":2})");
  CHECK(status_read(d.str()).state == RunState::FINISHED);
}

TEST_CASE("status: an elastic job's membership history, its resize, and a straggler named with its host") {
  TempDir d("elastic");
  const fs::path ev = d.path / "events.jsonl";
  append(
      ev,
      R"({"time_ms":1700000000000,"event":"membership","round":0,"hosts":["n1","n2","n3"],"world_size":3,"changes":[{"host":"n1","change":"joined","cause":"initial membership"}],"batch":"batch unchanged"})");
  append(ev, R"({"time_ms":1700000000000,"event":"round_start","round":0,"world_size":3})");
  append(
      ev,
      R"({"time_ms":1700000010000,"event":"failure","round":0,"node":2,"why":"node 2 (n3): SSH connection lost","exit_code":4})");
  append(
      ev,
      R"({"time_ms":1700000012000,"event":"membership","round":1,"hosts":["n1","n2"],"world_size":2,"changes":[{"host":"n3","change":"left","cause":"failed the probe: connection refused"}],"batch":"train_batch_size 12 kept: gradient_accumulation_steps 1 -> 2 on 2 ranks"})");
  append(ev, R"({"time_ms":1700000012000,"event":"round_start","round":1,"world_size":2})");
  append(ev, R"({"time_ms":1700000030000,"event":"resize","round":1,"step":10,"why":"n3 passed the probe again"})");
  append(
      ev,
      R"({"time_ms":1700000031000,"event":"membership","round":2,"hosts":["n1","n2","n3"],"world_size":3,"changes":[{"host":"n3","change":"joined","cause":"passed the probe again"}],"batch":"batch unchanged"})");
  append(ev, R"({"time_ms":1700000031000,"event":"round_start","round":2,"world_size":3})");
  append(ev, R"({"time_ms":1700000040000,"event":"finished","round":2})");
  // Rank 2 (on n3) slow in the last 3 records; the rule from nodes.json: 1.5x for 3.
  const fs::path m = d.path / "metrics.jsonl";
  append(m, R"({"step":11,"loss":2.0,"rank_compute_ms":[10,10,10],"rank_comm_ms":[1,1,1]})");
  append(m, R"({"step":12,"loss":2.0,"rank_compute_ms":[10,11,40],"rank_comm_ms":[30,29,1]})");
  append(m, R"({"step":13,"loss":2.0,"rank_compute_ms":[10,11,40],"rank_comm_ms":[30,29,1]})");
  append(m, R"({"step":14,"loss":2.0,"rank_compute_ms":[10,11,40],"rank_comm_ms":[30,29,1]})");
  NodeHealth a{0, "n1", -1, "done", 0, 1}, b{1, "n2", -1, "done", 1, 1}, c{2, "n3", -1, "done", 2, 1};
  status_write_nodes(d.str(), 2, {a, b, c}, 1.5, 3);

  RunStatus st = status_read(d.str());
  CHECK(st.state == RunState::FINISHED);
  CHECK(st.rounds == 3);
  CHECK(st.resizes == 1);
  CHECK(st.restarts == 1);  // the resize is not a restart
  REQUIRE(st.membership.size() == 3);
  CHECK(st.membership[1].hosts == std::vector<std::string>{"n1", "n2"});
  CHECK(st.membership[1].world_size == 2);
  REQUIRE(st.stragglers.size() == 1);
  CHECK(st.stragglers[0].rank == 2);
  CHECK(st.stragglers[0].host == "n3");
  CHECK(st.stragglers[0].records == 3);
  const std::string text = status_format(st, T0 + 60000);
  CAPTURE(text);
  CHECK(text.find("membership 3 change(s)") != std::string::npos);
  CHECK(text.find("round 1 (") != std::string::npos);
  CHECK(text.find("2 node(s), 2 rank(s): n1 n2") != std::string::npos);
  CHECK(text.find("left n3: failed the probe: connection refused") != std::string::npos);
  CHECK(text.find("gradient_accumulation_steps 1 -> 2") != std::string::npos);
  CHECK(text.find("joined n3: passed the probe again") != std::string::npos);
  CHECK(text.find("resizes    1") != std::string::npos);
  CHECK(text.find("rank 2 on n3: compute 40.0 ms/step, 3.6x the median 11.0 ms (3 records)") != std::string::npos);

  // Two records only: below the window, nothing flagged.
  TempDir d2("elastic2");
  append(d2.path / "events.jsonl", R"({"time_ms":1700000000000,"event":"round_start","round":0,"world_size":3})");
  append(d2.path / "metrics.jsonl", R"({"step":1,"loss":2.0,"rank_compute_ms":[10,11,40],"rank_comm_ms":[30,29,1]})");
  append(d2.path / "metrics.jsonl", R"({"step":2,"loss":2.0,"rank_compute_ms":[10,11,40],"rank_comm_ms":[30,29,1]})");
  status_write_nodes(d2.str(), 0, {a, b, c}, 1.5, 3);
  CHECK(status_read(d2.str()).stragglers.empty());
}

TEST_CASE("status: the last training record's named metrics (a preference run's), none for records without them") {
  TempDir d("named-metrics");
  write_events_and_metrics(d.path);  // records as runs before named metrics wrote them
  std::string text = status_format(status_read(d.str()), T0);
  CAPTURE(text);
  CHECK(text.find("progress   step 20, loss 2.7500") != std::string::npos);
  CHECK(text.find("\nmetrics    ") == std::string::npos);

  // As the trainer writes them (report::metrics_record_put): the last training record's, in order.
  for (int step : {30, 40}) {
    nlohmann::json r{{"step", step}, {"loss", 0.5}, {"tokens_per_s", 100.0}};
    metrics_record_put(r, {{"rewards/accuracies", step / 40.0},
                           {"rewards/margins", 1.25},
                           {"logps/chosen", std::numeric_limits<double>::quiet_NaN()}});
    append(d.path / "metrics.jsonl", r.dump());
  }
  append(d.path / "metrics.jsonl", R"({"step":40,"eval_loss":2.5,"eval_ppl":12.2})");
  const RunStatus st = status_read(d.str());
  REQUIRE(st.last_metrics.size() == 3);
  CHECK(st.last_metrics[0].first == "rewards/accuracies");
  CHECK(st.last_metrics[0].second == 1.0);
  text = status_format(st, T0);
  CHECK(text.find("progress   step 40, loss 0.5000") != std::string::npos);
  CHECK(text.find("metrics    rewards/accuracies 1.0000, rewards/margins 1.2500, logps/chosen nan (step 40)\n") !=
        std::string::npos);

  // A later record without them (another stage's run in the same directory): none shown.
  append(d.path / "metrics.jsonl", R"({"step":50,"loss":2.0})");
  CHECK(status_format(status_read(d.str()), T0).find("\nmetrics    ") == std::string::npos);
}
