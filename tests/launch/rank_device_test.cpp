// training.device: each node's verdict from the GPUs its agent sees, the job's agreement
// across nodes, the backend that follows, and the plan lines --dry-run prints.
#include "launch/rank_device.h"

#include "config/hostfile.h"

#include <doctest/doctest.h>

using namespace dtrain;
using namespace dtrain::launch;

namespace {
bool contains(const std::string& s, std::string_view part) { return s.find(part) != std::string::npos; }
}  // namespace

TEST_CASE("node_device_verdict: cpu, cuda and auto against the visible devices") {
  CHECK(node_device_verdict("cpu", 0, {0, 1}, "n1").device == "cpu");
  CHECK(node_device_verdict("cpu", 8, {0, 1}, "n1").device == "cpu");
  CHECK(node_device_verdict("cuda", 2, {0, 1}, "n1").device == "cuda");
  CHECK(node_device_verdict("cuda", 8, {6, 7}, "n1").device == "cuda");
  CHECK(node_device_verdict("auto", 2, {0, 1}, "n1").device == "cuda");
  CHECK(node_device_verdict("auto", 1, {0, 1}, "n1").device == "cpu");
  CHECK(node_device_verdict("auto", 0, {0}, "n1").device == "cpu");

  NodeDeviceVerdict none = node_device_verdict("cuda", 0, {0}, "gpu-a17");
  CHECK(none.device.empty());
  CHECK(contains(none.problem, "gpu-a17 sees no CUDA device"));
  CHECK(contains(none.problem, "training.device: cpu"));

  NodeDeviceVerdict few = node_device_verdict("cuda", 2, {0, 1, 2, 3}, "gpu-b2");
  CHECK(few.device.empty());
  CHECK(contains(few.problem, "gpu-b2 sees 2 CUDA device(s)"));
  CHECK(contains(few.problem, "device(s) 0,1,2,3"));
  // A slot beyond the visible count is a problem even when the rank count fits.
  CHECK_FALSE(node_device_verdict("cuda", 2, {3}, "h").problem.empty());

  CHECK_FALSE(node_device_verdict("gpu", 2, {0}, "h").problem.empty());
}

TEST_CASE("rank_device_agree: one backend per job") {
  using V = NodeDeviceVerdict;
  CHECK(rank_device_agree({{"a", V{"cuda", ""}}, {"b", V{"cuda", ""}}}).device == "cuda");
  CHECK(rank_device_agree({{"a", V{"cpu", ""}}, {"b", V{"cpu", ""}}}).device == "cpu");
  V mixed = rank_device_agree({{"a", V{"cuda", ""}}, {"b", V{"cpu", ""}}, {"c", V{"cuda", ""}}});
  CHECK(mixed.device.empty());
  CHECK(contains(mixed.problem, "a has the GPUs"));
  CHECK(contains(mixed.problem, "b has not"));
  V own = rank_device_agree({{"a", V{"cuda", ""}}, {"node 1", V{"", "training.device = cuda, but b sees no"}}});
  CHECK(own.device.empty());
  CHECK(contains(own.problem, "b sees no"));
}

TEST_CASE("rank_backend_name follows the device") {
  CHECK(rank_backend_name("cuda", 4) == "nccl");
  CHECK(rank_backend_name("cpu", 4) == "gloo");
  CHECK(rank_backend_name("cuda", 1) == "none (1 rank)");
  CHECK(rank_backend_name("cpu", 1) == "none (1 rank)");
}

TEST_CASE("rank_device_plan_lines: one line per node naming device and backend") {
  config::Hostfile hf = config::hostfile_parse("gpu1 slots=2\ngpu2 slots=2\n", "hf");
  Plan plan = plan_placement(hf, "gpu1", 29500);
  auto cuda = rank_device_plan_lines(plan, "cuda");
  REQUIRE(cuda.size() == 2);
  CHECK(cuda[0] == "node 0 (gpu1): ranks 0-1 on cuda devices 0,1 (CUDA_VISIBLE_DEVICES), collectives over nccl");
  CHECK(cuda[1] == "node 1 (gpu2): ranks 2-3 on cuda devices 0,1 (CUDA_VISIBLE_DEVICES), collectives over nccl");
  auto cpu = rank_device_plan_lines(plan, "cpu");
  CHECK(cpu[1] == "node 1 (gpu2): ranks 2-3 on the cpu, collectives over gloo");
  auto aut = rank_device_plan_lines(plan, "auto");
  CHECK(contains(aut[0], "if gpu1 sees them, else the cpu"));
  CHECK(contains(aut[0], "nccl when every node has its GPUs, else gloo"));

  config::Hostfile one = config::hostfile_parse("localhost slots=1\n", "hf");
  auto single = rank_device_plan_lines(plan_placement(one, "localhost", 29500), "cuda");
  REQUIRE(single.size() == 1);
  CHECK(single[0] == "node 0 (localhost): rank 0 on cuda device 0 (CUDA_VISIBLE_DEVICES), no collectives (1 rank)");
}

TEST_CASE("device_verdict_value / device_verdict_parse: what one agent or rank publishes, another reads back") {
  const auto ok = device_verdict_parse(device_verdict_value(NodeDeviceVerdict{"cuda", ""}, "gpu07"), "node 1");
  CHECK(ok.first == "gpu07");
  CHECK(ok.second.device == "cuda");
  CHECK(ok.second.problem.empty());
  const auto bad = device_verdict_parse(
      device_verdict_value(NodeDeviceVerdict{"", "gpu07 sees 1 CUDA device(s)"}, "gpu07"), "node 1");
  CHECK(bad.first == "node 1");
  CHECK(bad.second.device.empty());
  CHECK(bad.second.problem == "gpu07 sees 1 CUDA device(s)");
}
