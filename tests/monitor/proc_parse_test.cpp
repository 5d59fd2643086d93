// The resource monitor's /proc parsers against captured files (text as Linux 6.x writes
// it), and HostReader's rates over a directory laid out like /proc whose counters the
// test advances between two reads.
#include "monitor/proc_parse.h"
#include "monitor/sample.h"

#include "temp_dir.h"

#include <doctest/doctest.h>

#include <filesystem>

using namespace dtrain::monitor;

namespace {

const char* kStat =
    "cpu  10132153 290696 3084719 46828483 16683 0 25195 0 0 0\n"
    "cpu0 1393280 32966 572056 13343292 6130 0 17875 0 0 0\n"
    "intr 1462898 0 0 0\n"
    "ctxt 2440283\n";

// A process whose name holds spaces and a ')': fields count from the last ')'.
const char* kPidStat =
    "4242 (dtrain (rank) 0) S 4200 4242 4200 0 -1 4194560 23516 0 0 0 1234 567 0 0 20 0 9 0 118806 "
    "1939890176 13478 18446744073709551615 1 1 0 0 0 0 0 4096 0 0 0 0 17 3 0 0 0 0 0\n";

const char* kStatus =
    "Name:\tdtrain\nUmask:\t0022\nState:\tS (sleeping)\nVmPeak:\t 1900000 kB\nVmRSS:\t   53912 kB\n"
    "RssAnon:\t   40000 kB\nThreads:\t9\n";

const char* kMeminfo =
    "MemTotal:       32768000 kB\nMemFree:         1024000 kB\nMemAvailable:   20480000 kB\n"
    "Buffers:          204800 kB\n";

const char* kNetDev =
    "Inter-|   Receive                                                |  Transmit\n"
    " face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier "
    "compressed\n"
    "    lo: 1200000    3000    0    0    0     0          0         0  1200000    3000    0    0    0     0       0 "
    "         0\n"
    "  eth0:98765432  70000    0    0    0     0          0         0 12345678   50000    0    0    0     0       0 "
    "         0\n";

}  // namespace

TEST_CASE("proc parsers: captured /proc/stat, /proc/<pid>/stat, status, meminfo and net/dev") {
  const auto cpu = parse_proc_stat(kStat);
  REQUIRE(cpu);
  CHECK(cpu->total == 10132153ull + 290696 + 3084719 + 46828483 + 16683 + 0 + 25195 + 0);
  CHECK(cpu->busy == 10132153ull + 290696 + 3084719 + 0 + 25195 + 0);  // idle and iowait left out

  const auto ticks = parse_pid_stat_cpu(kPidStat);
  REQUIRE(ticks);
  CHECK(*ticks == 1234 + 567);

  CHECK(parse_status_rss(kStatus) == 53912 * 1024);

  const MemInfo m = parse_meminfo(kMeminfo);
  CHECK(m.total == 32768000ll * 1024);
  CHECK(m.available == 20480000ll * 1024);

  const auto net = parse_net_dev(kNetDev);
  REQUIRE(net.size() == 2);
  CHECK(net[0].iface == "lo");
  CHECK(net[1].iface == "eth0");
  CHECK(net[1].rx_bytes == 98765432);
  CHECK(net[1].tx_bytes == 12345678);
}

TEST_CASE("proc parsers: damaged or foreign text gives no figure, not a wrong one") {
  CHECK_FALSE(parse_proc_stat("cpu0 1 2 3 4\n"));                              // no aggregate line
  CHECK_FALSE(parse_proc_stat("cpu  1 2 x 4 5 6 7 8\n"));                      // not a number
  CHECK_FALSE(parse_pid_stat_cpu("4242 (dtrain S 1 2 3\n"));                   // no ')'
  CHECK_FALSE(parse_pid_stat_cpu("4242 (dtrain) S 1 2 3\n"));                  // too few fields
  CHECK_FALSE(parse_status_rss("Name:\tkthreadd\nState:\tS\n"));               // kernel threads have no VmRSS
  const MemInfo old = parse_meminfo("MemTotal:  1000 kB\nMemFree:  10 kB\n");  // before Linux 3.14
  CHECK(old.total == 1000 * 1024);
  CHECK(old.available == -1);
  CHECK(parse_net_dev("Inter-|   Receive\n face |bytes\n  eth0: 1 2 3\n").empty());
}

TEST_CASE("HostReader: CPU %, memory and per-interface rates from two readings of a /proc-like directory") {
  dtrain::test::TempDir d("monitor-proc");
  std::filesystem::create_directories(d.path / "self");
  std::filesystem::create_directories(d.path / "net");
  auto write_all = [&](uint64_t busy_add, uint64_t idle_add, uint64_t proc_ticks, uint64_t rx, uint64_t tx) {
    d.write("stat",
            "cpu  " + std::to_string(1000 + busy_add) + " 0 0 " + std::to_string(5000 + idle_add) + " 0 0 0 0 0 0\n");
    d.write("self/stat", "7 (x) S 1 1 1 0 -1 0 0 0 0 0 " + std::to_string(proc_ticks) + " 0 0 0 20 0 1 0 1 1 1\n");
    d.write("self/status", kStatus);
    d.write("meminfo", kMeminfo);
    d.write("net/dev", std::string("Inter-|\n face |\n  eth0: ") + std::to_string(rx) + " 0 0 0 0 0 0 0 " +
                           std::to_string(tx) + " 0 0 0 0 0 0 0\n");
  };
  write_all(0, 0, 100, 1000000, 500000);
  HostReader r(d.path.string(), d.path.string());
  const ResourceSample first = r.read();
  CHECK(first.interval_s == 0);
  CHECK_FALSE(first.cpu_pct);  // rates need two readings
  CHECK_FALSE(first.node_cpu_pct);
  CHECK(first.net.empty());
  CHECK(first.rss_bytes == 53912 * 1024);
  CHECK(first.mem_available_bytes == 20480000ll * 1024);
  REQUIRE(first.disk_free_bytes);
  CHECK(*first.disk_free_bytes > 0);

  write_all(300, 100, 100 + 50, 1000000 + 4000000, 500000 + 2000000);
  const ResourceSample s = r.read();
  REQUIRE(s.interval_s > 0);
  REQUIRE(s.node_cpu_pct);
  CHECK(*s.node_cpu_pct == doctest::Approx(75.0));  // 300 busy of 400 ticks
  REQUIRE(s.cpu_pct);
  REQUIRE(s.net.size() == 1);
  CHECK(s.net[0].iface == "eth0");
  // Rates are bytes over the measured interval.
  CHECK(s.net[0].rx_mbps * 1e6 * s.interval_s == doctest::Approx(4000000.0));
  CHECK(s.net[0].tx_mbps * 1e6 * s.interval_s == doctest::Approx(2000000.0));

  // A counter that went back (the interface was re-created): no rate this time.
  write_all(400, 200, 160, 10, 10);
  const ResourceSample again = r.read();
  CHECK(again.net.empty());

  const auto j = sample_json(s, {.rank = 3, .local_rank = 1, .node = 2, .round = 1, .host = "n2"});
  CHECK(is_resource_record(j));
  CHECK_FALSE(j.contains("step"));  // the training records' readers key on "step"
  CHECK(j["rank"] == 3);
  CHECK(j["node"] == 2);
  CHECK(j["host"] == "n2");
  CHECK(j["net"]["eth0"]["rx_mbps"].get<double>() == doctest::Approx(s.net[0].rx_mbps));
  CHECK(j["net_rx_mbps"].get<double>() == doctest::Approx(s.net[0].rx_mbps));
  CHECK_FALSE(j.contains("gpu_index"));
}
