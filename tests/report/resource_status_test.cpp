// `dtrain status` over the resource monitor's records in the ranks' own files
// (resources/rank<R>.jsonl): the newest sample of every rank, grouped by node, beside
// training records that keep their meaning (progress, state); a resource alert in
// events.jsonl is listed and does not change the job's state; a later round's samples
// replace an earlier round's (ranks of a resized job), also when a `dtrain resume`
// counts rounds from 0 again; the live view reads only what is appended after it starts.
#include "report/plot.h"
#include "report/status.h"

#include "resource_files.h"
#include "temp_dir.h"

#include <doctest/doctest.h>

#include <fstream>

using namespace dtrain::report;

namespace {

using dtrain::test::rank_file;

void append(const std::filesystem::path& p, const std::string& line) { dtrain::test::append_line(p, line); }

}  // namespace

TEST_CASE("status: the latest resource sample per node and rank, and resource alerts") {
  dtrain::test::TempDir d("resource-status");
  const auto ev = d.path / "events.jsonl", met = d.path / "metrics.jsonl";
  const auto r0 = rank_file(d, 0), r1 = rank_file(d, 1), r2 = rank_file(d, 2);
  append(ev, R"({"time_ms":1700000000000,"event":"round_start","round":0,"world_size":3})");
  append(ev, R"({"time_ms":1700000100000,"event":"round_start","round":1,"world_size":3})");
  append(r0, R"({"kind":"resource","time_ms":1700000050000,"rank":0,"node":0,"host":"old","round":0,"cpu_pct":1})");
  // Round 0 had a rank 3 that round 1 has not.
  append(rank_file(d, 3), R"({"kind":"resource","time_ms":1700000060000,"rank":3,"node":2,"host":"gone","round":0})");
  append(met, R"({"step":10,"loss":3.5,"tokens_per_s":1000,"time_ms":1700000110000})");
  append(r0, R"({"kind":"resource","time_ms":1700000110000,"rank":0,"local_rank":0,"node":0,"host":"n0","round":1,)"
             R"("cpu_pct":50,"node_cpu_pct":20,"rss_bytes":1073741824,"mem_available_bytes":10737418240,)"
             R"("mem_total_bytes":34359738368,"disk_free_bytes":5368709120,"net_rx_mbps":1.5,"net_tx_mbps":0.5,)"
             R"("gpu_index":0,"gpu_util_pct":97,"gpu_mem_used_bytes":42949672960,"gpu_mem_total_bytes":85899345920,)"
             R"("gpu_temperature_c":65,"gpu_power_w":300,"gpu_sm_clock_mhz":1980,"gpu_throttle_reasons":64})");
  append(r0, R"({"kind":"resource","time_ms":1700000112000,"rank":0,"local_rank":0,"node":0,"host":"n0","round":1,)"
             R"("cpu_pct":99,"node_cpu_pct":30,"rss_bytes":2147483648,"mem_available_bytes":9663676416,)"
             R"("mem_total_bytes":34359738368})");
  append(r1, R"({"kind":"resource","time_ms":1700000111000,"rank":1,"node":0,"host":"n0","round":1,"cpu_pct":80})");
  append(r2, R"({"kind":"resource","time_ms":1700000111500,"rank":2,"node":1,"host":"n1","round":1,)"
             R"("node_cpu_pct":75,"net_rx_mbps":2,"net_tx_mbps":3})");
  append(met, R"({"step":20,"loss":2.75,"tokens_per_s":18234,"time_ms":1700000113000})");
  append(ev, R"({"time_ms":1700000112500,"event":"resource_alert","round":1,"node":1,"host":"n1","rank":2,)"
             R"("alert":"low_memory","why":"the node's available memory is 0.50 GiB"})");

  const RunStatus st = status_read(d.path.string());
  CHECK(st.state != RunState::NOT_STARTED);
  CHECK(st.last_event == "round_start");  // the alert is no job event
  REQUIRE(st.last_step);
  CHECK(*st.last_step == 20);  // training records read as before
  CHECK(st.last_loss == 2.75);
  REQUIRE(st.resources.size() == 2);  // node2's rank 3 is gone since round 1
  const NodeResources& n0 = st.resources[0];
  CHECK(n0.host == "n0");  // round 0's "old" sample was replaced
  CHECK(n0.time_ms == 1700000112000);
  REQUIRE(n0.node_cpu_pct);
  CHECK(*n0.node_cpu_pct == 30);  // from the newest sample
  REQUIRE(n0.ranks.size() == 2);
  CHECK(n0.ranks[0].rank == 0);
  CHECK(*n0.ranks[0].cpu_pct == 99);  // the newer of rank 0's two
  CHECK_FALSE(n0.ranks[0].gpu_index);
  CHECK(st.resources[1].host == "n1");
  REQUIRE(st.resource_alerts.size() == 1);
  CHECK(st.resource_alerts[0].alert == "low_memory");
  CHECK(st.resource_alerts[0].rank == 2);

  const std::string text = status_format(st, 1700000114000);
  CAPTURE(text);
  CHECK(text.find("resources  latest sample of every rank, by node (resources/rank<R>.jsonl") != std::string::npos);
  CHECK(text.find("  host n0 (node0, sampled 2.0 s ago): cpu 30 %, mem 9.0/32.0 GiB available") != std::string::npos);
  CHECK(text.find("    rank 0: cpu 99 %, rss 2.00 GiB") != std::string::npos);
  CHECK(text.find("  host n1 (node1, sampled 2.5 s ago): cpu 75 %, net rx 2.00 tx 3.00 MB/s") != std::string::npos);
  CHECK(text.find("alerts     1 resource alert(s)") != std::string::npos);
  CHECK(text.find("node1 n1 rank 2: low_memory: the node's available memory is 0.50 GiB") != std::string::npos);
}

TEST_CASE("status: GPU figures of a rank, a throttle named only for thermal or power reasons") {
  std::vector<NodeResources> nodes(1);
  nodes[0].host = "g";
  nodes[0].time_ms = 1000;
  RankResources r;
  r.rank = 3;
  r.gpu_index = 1;
  r.gpu_util_pct = 97;
  r.gpu_mem_used_bytes = int64_t{40} << 30;
  r.gpu_mem_total_bytes = int64_t{80} << 30;
  r.gpu_temperature_c = 65;
  r.gpu_power_w = 300;
  r.gpu_sm_clock_mhz = 1980;
  r.gpu_throttle_reasons = 0x1;  // idle
  nodes[0].ranks.push_back(r);
  std::string text = resource_lines(nodes, 1000);
  CAPTURE(text);
  CHECK(text.find("    rank 3: gpu1 97 % mem 40.00/80.0 GiB 65 C 300 W 1980 MHz\n") != std::string::npos);
  nodes[0].ranks[0].gpu_throttle_reasons = 0x40;
  text = resource_lines(nodes, 1000);
  CHECK(text.find("1980 MHz throttled (0x40)") != std::string::npos);
}

TEST_CASE("status: after dtrain resume (rounds from 0 again) the resumed ranks' samples, not the earlier launch's") {
  dtrain::test::TempDir d("resource-resume");
  // The first launch ended in round 2 with 2 ranks; the resumed one runs round 0 with 1.
  append(rank_file(d, 0), R"({"kind":"resource","time_ms":1000,"rank":0,"node":0,"host":"a","round":2,"cpu_pct":1})");
  append(rank_file(d, 1), R"({"kind":"resource","time_ms":1001,"rank":1,"node":1,"host":"b","round":2,"cpu_pct":2})");
  append(rank_file(d, 0), R"({"kind":"resource","time_ms":5000,"rank":0,"node":0,"host":"c","round":0,"cpu_pct":3})");
  std::ofstream(d.path / "resources" / "notes.txt") << "not a rank's file\n";
  const auto nodes = resource_read(d.path.string());
  REQUIRE(nodes.size() == 1);
  CHECK(nodes[0].host == "c");
  REQUIRE(nodes[0].ranks.size() == 1);
  CHECK(*nodes[0].ranks[0].cpu_pct == 3);
  CHECK(resource_files(d.path.string()).size() == 2);

  // A long run's file: its end is what counts (status reads only the last 64 KiB).
  {
    std::ofstream out(rank_file(d, 1), std::ios::app);
    for (int i = 0; i < 2000; ++i)
      out << R"({"kind":"resource","time_ms":)" << 6000 + i << R"(,"rank":1,"node":1,"host":"c","round":0,"cpu_pct":)"
          << i << "}\n";
  }
  const auto more = resource_read(d.path.string());
  REQUIRE(more.size() == 2);
  REQUIRE(more[1].ranks.size() == 1);
  CHECK(*more[1].ranks[0].cpu_pct == 1999);
  CHECK(resource_file(d.path.string(), 7) == (d.path / "resources" / "rank7.jsonl").string());
}

TEST_CASE("plot: resource records in metrics.jsonl (a run from before the per-rank files) leave the chart as it was") {
  dtrain::test::TempDir d("resource-plot");
  const auto met = d.path / "metrics.jsonl";
  append(met, R"({"kind":"resource","time_ms":1,"rank":0,"node":0,"host":"n0","cpu_pct":5})");
  append(met, R"({"step":1,"loss":3.0,"tokens_per_s":100,"time_ms":2})");
  append(met, R"({"kind":"resource","time_ms":3,"rank":1,"node":0,"host":"n0","cpu_pct":5})");
  append(met, R"({"step":2,"loss":2.5,"tokens_per_s":110,"time_ms":4})");
  const PlotData p = plot_data_read(d.path.string());
  REQUIRE(p.train.size() == 2);
  CHECK(p.train[1].value == 2.5);
  CHECK(p.tokens.size() == 2);
}

TEST_CASE("live view: one compact line per node, from the records appended since the tail began") {
  dtrain::test::TempDir d("resource-tail");
  const auto r0 = rank_file(d, 0), r1 = rank_file(d, 1), r2 = rank_file(d, 2);
  // An earlier round's record, there before the tail: not shown.
  append(r0, R"({"kind":"resource","time_ms":5,"rank":0,"node":0,"host":"earlier","node_cpu_pct":1})");
  ResourceTail tail(d.path.string());
  ResourceCollector c;
  CHECK_FALSE(tail.poll(c));  // nothing new
  append(r0, R"({"kind":"resource","time_ms":10,"rank":0,"node":0,"host":"n0","node_cpu_pct":40,)"
             R"("mem_available_bytes":2147483648,"mem_total_bytes":4294967296,"rss_bytes":1073741824,)"
             R"("gpu_index":0,"gpu_util_pct":90,"gpu_mem_used_bytes":10737418240,"gpu_mem_total_bytes":85899345920})");
  append(r1, R"({"kind":"resource","time_ms":11,"rank":1,"node":0,"host":"n0","rss_bytes":1073741824,)"
             R"("gpu_index":1,"gpu_util_pct":97,"gpu_mem_used_bytes":12884901888,"gpu_mem_total_bytes":85899345920})");
  std::filesystem::create_directories(r2.parent_path());
  std::ofstream(r2, std::ios::app) << R"({"kind":"resource","time_ms":12,"rank":2,"node":1)";  // being written
  REQUIRE(tail.poll(c));
  auto nodes = c.nodes();
  REQUIRE(nodes.size() == 1);  // the torn record waits for its newline
  CHECK(resource_compact_line(nodes[0]) ==
        "node0 n0: cpu 40 % | mem 2.0/4.0 GiB available | rss 2.00 GiB | gpu 90-97 %, mem 10.0-12.0/80 GiB");
  CHECK_FALSE(tail.poll(c));  // nothing new
  std::ofstream(r2, std::ios::app) << R"(,"host":"n1","node_cpu_pct":5,"net_rx_mbps":1,"net_tx_mbps":2})"
                                   << "\n";
  REQUIRE(tail.poll(c));
  nodes = c.nodes();
  REQUIRE(nodes.size() == 2);
  CHECK(resource_compact_line(nodes[1]) == "node1 n1: cpu 5 % | net 1.00/2.00 MB/s in/out");
}
