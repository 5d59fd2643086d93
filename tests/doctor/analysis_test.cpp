// The doctor's judgement on made-up observations: median, slowest link and slow nodes,
// each per-node check's verdict (build ids named, shared directory, slots, disk, clock),
// the table and JSON renderings and the preflight's one-line-per-failure message.
#include "doctor/analysis.h"
#include "doctor/doctor.h"

#include <doctest/doctest.h>

using namespace dtrain::doctor;

namespace {

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

const Finding* find(const std::vector<Finding>& fs, int node, const std::string& check) {
  for (const Finding& f : fs)
    if (f.node == node && f.check == check) return &f;
  return nullptr;
}

Expectations expectations(int nodes) {
  Expectations ex;
  ex.version = "0.1.0";
  ex.build_id = std::string(64, 'a');
  ex.device = "auto";
  ex.run_dir = "/shared/run";
  ex.dtrain_path = "/opt/dtrain";
  ex.min_free_gb = 1.0;
  ex.max_clock_skew = 2.0;
  ex.nonces["launcher"] = "L";
  for (int k = 0; k < nodes; ++k) {
    ex.nonces[node_nonce_name(k)] = "N" + std::to_string(k);
    ex.launcher_seen[node_nonce_name(k)] = "N" + std::to_string(k);
  }
  ex.launcher_seen["launcher"] = "L";
  return ex;
}

// A healthy node k of `nodes` that sees everyone's nonce.
NodeObservation healthy(int k, int nodes, const Expectations& ex) {
  NodeObservation o;
  o.node = k;
  o.host = "root@10.0.0." + std::to_string(10 + k);
  o.slots = 2;
  NodeFacts f;
  f.hostname = "n" + std::to_string(k);
  f.version = ex.version;
  f.build_id = ex.build_id;
  f.cpus = 4;
  f.gpus = 0;
  f.free_bytes = int64_t{50} << 30;
  f.free_path = ex.run_dir;
  o.facts = f;
  o.clock_offset_s = 0.001;
  o.clock_uncertainty_s = 0.0005;
  std::map<std::string, std::string> seen = {{"launcher", "L"}};
  for (int j = 0; j < nodes; ++j) seen[node_nonce_name(j)] = "N" + std::to_string(j);
  o.seen = seen;
  return o;
}

}  // namespace

TEST_CASE("median of odd, even and empty sets") {
  CHECK(median({3, 1, 2}) == 2);
  CHECK(median({4, 1, 3, 2}) == doctest::Approx(2.5));
  CHECK(median({}) == 0);
  CHECK(median({7}) == 7);
}

TEST_CASE("rate_text picks decimal units") {
  CHECK(rate_text(2.5e9) == "2.50 GB/s");
  CHECK(rate_text(6.25e6) == "6.2 MB/s");
  CHECK(rate_text(512e3) == "512 KB/s");
}

TEST_CASE("one throttled node: its links are the slowest, it is flagged, the others are not") {
  // Node 2's veth is throttled: both of its links are slow, whichever direction.
  std::vector<LinkSample> links = {{0, 1, 2.0e9, 1.9e9}, {0, 2, 6.0e6, 1.8e9}, {1, 2, 5.5e6, 1.7e9}};
  NetworkSummary s = network_summarize(links, 3, 2.0);
  REQUIRE(s.slowest == 2);
  CHECK(s.links[2].bandwidth() == doctest::Approx(5.5e6));
  CHECK(s.node_best[0] == doctest::Approx(1.9e9));
  CHECK(s.node_best[2] == doctest::Approx(6.0e6));
  CHECK(s.median_node == doctest::Approx(1.9e9));
  CHECK(s.slow_nodes == std::vector<int>{2});
  CHECK(s.slow_links == std::vector<int>{1, 2});
}

TEST_CASE("even links: nobody flagged, the slowest still named; unmeasured links ignored") {
  std::vector<LinkSample> links = {{0, 1, 1.0e9, 1.1e9}, {0, 2, 0.9e9, 1.0e9}, {1, 2, 0, 0}};
  NetworkSummary s = network_summarize(links, 3, 2.0);
  CHECK(s.slowest == 1);
  CHECK(s.slow_nodes.empty());
  CHECK(s.slow_links.empty());
  NetworkSummary none = network_summarize({}, 2, 2.0);
  CHECK(none.slowest == -1);
  CHECK(none.median_node == 0);
}

TEST_CASE("the slow factor is a threshold: 3x below passes at factor 4, fails at factor 2") {
  std::vector<LinkSample> links = {{0, 1, 3e8, 3e8}, {0, 2, 1e8, 1e8}, {1, 2, 1e8, 1e8}, {0, 3, 3e8, 3e8}};
  CHECK(network_summarize(links, 4, 4.0).slow_nodes.empty());
  CHECK(network_summarize(links, 4, 2.0).slow_nodes == std::vector<int>{2});
}

TEST_CASE("healthy nodes: every check ok") {
  Expectations ex = expectations(3);
  std::vector<NodeObservation> nodes;
  for (int k = 0; k < 3; ++k) nodes.push_back(healthy(k, 3, ex));
  auto fs = analyze_nodes(nodes, ex);
  for (const Finding& f : fs) CHECK_MESSAGE(f.status == Status::OK, f.check << ": " << f.detail);
  for (const char* c : {"ssh", "build", "slots", "disk", "shared_dir", "clock"}) CHECK(find(fs, 1, c) != nullptr);
  CHECK(find(fs, 1, "driver") == nullptr);  // no GPUs, no driver check
}

TEST_CASE("a node with another build: named with both build ids") {
  Expectations ex = expectations(3);
  std::vector<NodeObservation> nodes;
  for (int k = 0; k < 3; ++k) nodes.push_back(healthy(k, 3, ex));
  nodes[1].facts->build_id = std::string(64, 'b');
  auto fs = analyze_nodes(nodes, ex);
  const Finding* f = find(fs, 1, "build");
  REQUIRE(f);
  CHECK(f->status == Status::FAIL);
  CHECK(has(f->detail, std::string(16, 'b')));
  CHECK(has(f->detail, std::string(16, 'a')));
  CHECK(has(f->advice, "/opt/dtrain"));
  CHECK(find(fs, 0, "build")->status == Status::OK);
  CHECK(find(fs, 2, "build")->status == Status::OK);
}

TEST_CASE("a node with its own private run directory: it and only it fails shared_dir") {
  Expectations ex = expectations(3);
  std::vector<NodeObservation> nodes;
  for (int k = 0; k < 3; ++k) nodes.push_back(healthy(k, 3, ex));
  // Node 2 sees only its own file; nobody sees node 2's.
  nodes[2].seen = std::map<std::string, std::string>{{"node2", "N2"}};
  for (int k = 0; k < 2; ++k) nodes[static_cast<size_t>(k)].seen->erase("node2");
  ex.launcher_seen.erase("node2");
  auto fs = analyze_nodes(nodes, ex);
  const Finding* f = find(fs, 2, "shared_dir");
  REQUIRE(f);
  CHECK(f->status == Status::FAIL);
  CHECK(has(f->detail, "/shared/run"));
  CHECK(has(f->detail, "cannot read"));
  CHECK(has(f->advice, "shared filesystem"));
  CHECK(find(fs, 0, "shared_dir")->status == Status::OK);
  CHECK(find(fs, 1, "shared_dir")->status == Status::OK);
}

TEST_CASE("a stale nonce (another session's content) does not count as shared") {
  Expectations ex = expectations(2);
  std::vector<NodeObservation> nodes = {healthy(0, 2, ex), healthy(1, 2, ex)};
  (*nodes[1].seen)["launcher"] = "old";
  CHECK(find(analyze_nodes(nodes, ex), 1, "shared_dir")->status == Status::FAIL);
}

TEST_CASE("slots: GPUs short of the claim fail, CPU oversubscription warns") {
  Expectations ex = expectations(2);
  std::vector<NodeObservation> nodes = {healthy(0, 2, ex), healthy(1, 2, ex)};
  nodes[0].facts->gpus = 1;
  nodes[0].facts->driver = "550.54.14";
  nodes[1].slots = 8;
  auto fs = analyze_nodes(nodes, ex);
  CHECK(find(fs, 0, "slots")->status == Status::FAIL);
  CHECK(has(find(fs, 0, "slots")->detail, "1 CUDA device"));
  CHECK(find(fs, 0, "driver")->status == Status::OK);
  CHECK(find(fs, 1, "slots")->status == Status::WARN);
  ex.device = "cuda";
  CHECK(find(analyze_nodes(nodes, ex), 1, "slots")->status == Status::FAIL);  // cuda asked, 0 GPUs
}

TEST_CASE("disk below the minimum and a skewed clock fail; an unreachable node fails ssh only") {
  Expectations ex = expectations(3);
  std::vector<NodeObservation> nodes = {healthy(0, 3, ex), healthy(1, 3, ex), healthy(2, 3, ex)};
  nodes[0].facts->free_bytes = int64_t{200} << 20;
  nodes[1].clock_offset_s = -7.5;
  nodes[2].facts.reset();
  nodes[2].seen.reset();
  nodes[2].clock_offset_s.reset();
  nodes[2].start_error = "cannot connect to 10.0.0.12:22: connection refused";
  auto fs = analyze_nodes(nodes, ex);
  CHECK(find(fs, 0, "disk")->status == Status::FAIL);
  CHECK(has(find(fs, 0, "disk")->detail, "doctor.min_free_gb"));
  CHECK(find(fs, 1, "clock")->status == Status::FAIL);
  CHECK(has(find(fs, 1, "clock")->detail, "-7.500"));
  CHECK(find(fs, 2, "ssh")->status == Status::FAIL);
  CHECK(find(fs, 2, "build") == nullptr);
  // Peers of the unreachable node are not blamed for not seeing its nonce.
  CHECK(find(fs, 0, "shared_dir")->status == Status::OK);
}

TEST_CASE("report: table, JSON and the preflight message name host, check and what to do") {
  Expectations ex = expectations(3);
  Report r;
  r.run_dir = ex.run_dir;
  r.expect = ex;
  r.network = true;
  for (int k = 0; k < 3; ++k) r.nodes.push_back(healthy(k, 3, ex));
  for (auto& n : r.nodes) n.allreduce_ok = true;
  r.nodes[1].facts->build_id = std::string(64, 'c');
  r.net = network_summarize({{0, 1, 2.0e9, 1.9e9}, {0, 2, 6.0e6, 1.8e9}, {1, 2, 5.5e6, 1.7e9}}, 3, 2.0);
  r.findings = analyze_nodes(r.nodes, ex);
  auto more = analyze_network(r.nodes, r.net, 2.0);
  r.findings.insert(r.findings.end(), more.begin(), more.end());
  CHECK_FALSE(r.ok());
  CHECK(r.failed_nodes() == std::vector<int>{1, 2});

  std::string t = report_table(r);
  CHECK(has(t, "slowest link: node 1 (root@10.0.0.11) <-> node 2 (root@10.0.0.12) at 5.5 MB/s"));
  CHECK(has(t, "more than 2x below it: node 2 (root@10.0.0.12)"));
  CHECK(has(t, "FAIL node 1 (root@10.0.0.11) build"));
  CHECK(has(t, "what to do:"));
  CHECK(has(t, "FAILED"));
  // Node 2's row says SLOW in the net column; node 0's says ok.
  auto row = [&](int k) {
    const std::string start = std::to_string(k) + " ", host = "root@10.0.0." + std::to_string(10 + k);
    for (size_t pos = 0; pos < t.size();) {
      size_t end = t.find('\n', pos);
      std::string line = t.substr(pos, end - pos);
      if (line.rfind(start, 0) == 0 && has(line, host)) return line;
      if (end == std::string::npos) break;
      pos = end + 1;
    }
    return std::string();
  };
  CHECK(row(2).size() > 4);
  CHECK(row(2).substr(row(2).size() - 4) == "SLOW");
  CHECK(row(0).substr(row(0).size() - 2) == "ok");

  auto j = report_json(r);
  CHECK(j["ok"] == false);
  CHECK(j["slowest_link"]["a"] == 1);
  CHECK(j["slowest_link"]["b"] == 2);
  CHECK(j["slow_nodes"] == nlohmann::json::array({2}));
  CHECK(j["nodes"][1]["ok"] == false);
  CHECK(j["nodes"][0]["ok"] == true);
  CHECK(j["nodes"][1]["build_id"] == std::string(64, 'c'));

  std::string m = preflight_message(r);
  CHECK(has(m, "node 1 (root@10.0.0.11): build: dtrain 0.1.0 build cccccccccccccccc differs"));
  auto v = preflight_verdict(r);
  CHECK(v.node == 1);
  CHECK(v.why == m);
}
