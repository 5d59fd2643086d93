// End to end through dtrain-emu (the EMU tree's binary: dtrain's CUDA and NCCL code on
// the CPU execution engine): `bench allreduce --backend nccl` on 2 local ranks and on 2
// namespace nodes over real sshd, every row with #wrong 0. Built only in the EMU tree.
#include "cli_harness.h"

using namespace dtrain::cli_test;

namespace {

void check_table(const RunResult& r, size_t rows_expected) {
  auto rows = table_rows(r.out);
  REQUIRE(rows.size() == rows_expected);
  for (size_t i = 0; i < rows.size(); ++i) {
    REQUIRE(rows[i].cols.size() == 13);
    CHECK(rows[i].cols[8] == "0");   // out-of-place #wrong
    CHECK(rows[i].cols[12] == "0");  // in-place #wrong
  }
  CHECK(contains(r.out, "# Out of bounds values : 0 OK"));
}

}  // namespace

TEST_CASE("dtrain-emu bench allreduce --backend nccl: 2 local ranks") {
  const std::string bin = dtrain_bin();
  REQUIRE_MESSAGE(!bin.empty(), "$DTRAIN_BIN (dtrain-emu) is not set: run through ctest in the EMU tree");
  TempDir tmp("dtrain-emu-local");
  const std::string& dir = tmp.path();
  REQUIRE(!dir.empty());
  // Loopback only: the engine's NCCL picks the interface as NCCL does.
  auto r = run({bin, "bench", "allreduce", "--backend", "nccl", "--nproc-per-node", "2", "-b", "1K", "-e", "256K", "-n",
                "3", "-w", "1", "--output-dir", dir + "/run"},
               {{"NCCL_SOCKET_IFNAME", "lo"}}, 180s);
  INFO("output:\n" << r.out);
  REQUIRE(!r.timed_out);
  CHECK(r.rc == 0);
  check_table(r, 9);
  CHECK(contains(r.out, "cuda_emu"));  // the device lines name the engine
}

TEST_CASE("dtrain-emu bench allreduce --backend nccl: 2 namespace nodes over sshd") {
  const std::string bin = dtrain_bin();
  REQUIRE(!bin.empty());
  Cluster cluster(2, 1);
  if (!cluster.usable()) {
    if (cluster.failed()) FAIL("the test cluster could not be started: " << cluster.skip_reason());
    std::printf("namespace cluster unavailable (%s): skipped\n", cluster.skip_reason().c_str());
    std::fflush(stdout);
    std::exit(77);
  }
  std::vector<std::string> argv = {bin,
                                   "bench",
                                   "allreduce",
                                   "--backend",
                                   "nccl",
                                   "--hostfile",
                                   cluster.hostfile("hf-2x1", {1, 1}),
                                   "--master-port",
                                   "0",
                                   "--output-dir",
                                   cluster.dir() + "/run-nccl",
                                   "-b",
                                   "1K",
                                   "-e",
                                   "256K",
                                   "-n",
                                   "3",
                                   "-w",
                                   "1"};
  for (auto& s : cluster.ssh_sets()) argv.push_back(s);
  // No NCCL_SOCKET_IFNAME: each rank's NCCL takes its namespace's veth address.
  auto r = run(argv, {{"DTRAIN_LOG_LEVEL", "debug"}}, 240s);
  INFO("output:\n" << r.out);
  REQUIRE(!r.timed_out);
  CHECK(r.rc == 0);
  check_table(r, 9);
}
