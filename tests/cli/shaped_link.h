// The opening the link-shaping tests share (monitor_throttle_test, monitor_network_idle_test):
// $DTRAIN_BIN and `tc` before the namespace cluster is started, then the cluster itself.
// Each returns false after reporting the test skipped (or failed, when the cluster could
// not be started although everything it needs is there).
#pragma once

#include "cli_harness.h"
#include "skip.h"

#include <string>

namespace dtrain::cli_test {

inline bool can_shape_links(const std::string& test) {
  if (dtrain_bin().empty()) {
    ::dtrain::test::skip_test(test + " skipped: $DTRAIN_BIN is not set or not executable");
    return false;
  }
  if (shell("command -v tc").empty()) {
    ::dtrain::test::skip_test(test + " skipped: no 'tc' command (iproute2) to shape the link");
    return false;
  }
  return true;
}

inline bool cluster_ready(const Cluster& cluster, const std::string& test) {
  if (cluster.usable()) return true;
  ::dtrain::test::skip_test(test + " skipped: " + cluster.skip_reason());
  if (cluster.failed()) FAIL("the test cluster could not be started: " << cluster.skip_reason());
  return false;
}

}  // namespace dtrain::cli_test
