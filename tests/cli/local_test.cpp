// End-to-end local launch through the real `dtrain` binary (no SSH, no root): 3 ranks on
// this machine run the allreduce sweep and print the full nccl-tests table.
#include "cli_harness.h"
#include "skip.h"

using namespace dtrain::cli_test;

TEST_CASE("local launch: dtrain bench allreduce --nproc-per-node 3 -b 1K -e 64K") {
  std::string bin = dtrain_bin();
  if (bin.empty()) {
    ::dtrain::test::skip_test(
        "local CLI test skipped: $DTRAIN_BIN is not set or not executable (run through ctest after a full build)");
    return;
  }
  TempDir tmp("dtrain-cli-local");
  const std::string& dir = tmp.path();
  REQUIRE(!dir.empty());
  auto r = run({bin, "bench", "allreduce", "--nproc-per-node", "3", "-b", "1K", "-e", "64K", "--master-port", "0",
                "--output-dir", dir + "/run"},
               {}, 60s);
  INFO("output:\n" << r.out);
  REQUIRE(!r.timed_out);
  CHECK(r.rc == 0);
  auto rows = table_rows(r.out);
  REQUIRE(rows.size() == 7);
  for (size_t i = 0; i < rows.size(); ++i) {
    CHECK(rows[i].bytes == (size_t{1024} << i));
    REQUIRE(rows[i].cols.size() == 13);
    CHECK(rows[i].cols[8] == "0");
    CHECK(rows[i].cols[12] == "0");
  }
  for (int rank = 0; rank < 3; ++rank) CHECK(contains(r.out, "#  Rank  " + std::to_string(rank) + " Group  0 Pid"));
  CHECK(!contains(r.out, "#  Rank  3 "));
  CHECK(contains(r.out, "# Out of bounds values : 0 OK"));
}
