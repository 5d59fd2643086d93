// The doctor report as a table for people and as JSON for scripts.
#include "doctor/doctor.h"

#include <fmt/format.h>

#include <algorithm>

namespace dtrain::doctor {

namespace {

const Finding* find(const Report& r, int node, const char* check) {
  const Finding* worst = nullptr;
  for (const Finding& f : r.findings)
    if (f.node == node && f.check == check && (!worst || f.status > worst->status)) worst = &f;
  return worst;
}

// A table cell: the check's short value, "FAIL"/"warn" in front when it is not ok,
// "-" when the check did not run.
std::string cell(const Report& r, const NodeObservation& n, const char* check, const std::string& value) {
  const Finding* f = find(r, n.node, check);
  if (!f) return "-";
  if (f->status == Status::OK) return value.empty() ? "ok" : value;
  return std::string(status_name(f->status)) + (value.empty() ? "" : " " + value);
}

std::string pad(const std::string& s, size_t w) { return s.size() >= w ? s + " " : s + std::string(w - s.size(), ' '); }

std::string node_name(const Report& r, int k) {
  for (const auto& n : r.nodes)
    if (n.node == k) return fmt::format("node {} ({})", k, n.host);
  return fmt::format("node {}", k);
}

// Rows as columns padded to their widest cell, one line each, trailing spaces cut.
std::string table_text(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width(rows.empty() ? 0 : rows[0].size(), 0);
  for (const auto& row : rows)
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size() + 1);
  std::string out;
  for (const auto& row : rows) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) line += pad(row[c], width[c] + 1);
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  return out;
}

// A node's row of the node table (columns as node_table's head).
std::vector<std::string> node_row(const Report& r, const NodeObservation& n, bool any_gpu) {
  std::vector<std::string> row = {std::to_string(n.node), n.host};
  const NodeFacts* f = n.facts ? &*n.facts : nullptr;
  row.push_back(cell(r, n, "ssh", ""));
  row.push_back(f ? cell(r, n, "build", f->build_id.substr(0, 16)) : cell(r, n, "node", ""));
  const bool gpu = f && f->gpus > 0 && r.expect.device != "cpu";
  row.push_back(f ? cell(r, n, "slots", fmt::format("{}/{} {}", n.slots, gpu ? f->gpus : f->cpus, gpu ? "gpu" : "cpu"))
                  : "-");
  if (any_gpu) row.push_back(f ? cell(r, n, "driver", f->driver) : "-");
  row.push_back(f && f->free_bytes >= 0
                    ? cell(r, n, "disk", fmt::format("{:.1f}G", static_cast<double>(f->free_bytes) / (1 << 30)))
                    : cell(r, n, "disk", ""));
  row.push_back(cell(r, n, "shared_dir", ""));
  row.push_back(n.clock_offset_s ? cell(r, n, "clock", fmt::format("{:+.3f}s", *n.clock_offset_s)) : "-");
  if (r.network) {
    // Connectivity, or SLOW when the node's bandwidth was flagged.
    const Finding* bw = find(r, n.node, "bandwidth");
    row.push_back(bw && bw->status == Status::FAIL && cell(r, n, "connectivity", "") == "ok"
                      ? "SLOW"
                      : cell(r, n, "connectivity", ""));
  }
  return row;
}

// One row per node: ssh, build, slots, driver (with GPUs), disk, shared dir, clock, network.
std::string node_table(const Report& r) {
  bool any_gpu = false;
  for (const auto& n : r.nodes) any_gpu = any_gpu || (n.facts && n.facts->gpus > 0);
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> head = {"node", "host", "ssh", "build", "slots"};
  if (any_gpu) head.push_back("driver");
  for (const char* h : {"free", "shared", "clock"}) head.push_back(h);
  if (r.network) head.push_back("net");
  rows.push_back(head);
  for (const NodeObservation& n : r.nodes) rows.push_back(node_row(r, n, any_gpu));
  return table_text(rows);
}

// The network section: the links' bandwidth both ways, the slowest link and slow nodes.
std::string network_text(const Report& r) {
  int answered = 0;
  for (const auto& n : r.nodes) answered += n.allreduce_ok.has_value();
  std::string out = fmt::format(
      "\nnetwork: allreduce + barrier over gloo across {} node(s); bandwidth per link, each "
      "direction timed for about the link budget\n",
      answered);
  if (r.net.links.empty()) return out;
  std::vector<std::vector<std::string>> lrows = {{"link", "a -> b", "b -> a", ""}};
  for (size_t i = 0; i < r.net.links.size(); ++i) {
    const LinkSample& l = r.net.links[i];
    std::string mark;
    if (std::find(r.net.slow_links.begin(), r.net.slow_links.end(), static_cast<int>(i)) != r.net.slow_links.end())
      mark = "SLOW";
    if (r.net.slowest == static_cast<int>(i)) mark += mark.empty() ? "slowest" : " (slowest)";
    lrows.push_back({fmt::format("node {} <-> node {}", l.a, l.b), rate_text(l.ab), rate_text(l.ba), mark});
  }
  out += table_text(lrows);
  if (r.net.slowest >= 0) {
    const LinkSample& s = r.net.links[static_cast<size_t>(r.net.slowest)];
    out +=
        fmt::format("slowest link: {} <-> {} at {}\n", node_name(r, s.a), node_name(r, s.b), rate_text(s.bandwidth()));
  }
  out += fmt::format("median node (its fastest link): {}", rate_text(r.net.median_node));
  if (r.net.slow_nodes.empty()) out += fmt::format("; no node more than {}x below it\n", r.expect.slow_factor);
  else {
    std::string names;
    for (int k : r.net.slow_nodes) names += (names.empty() ? "" : ", ") + node_name(r, k);
    out += fmt::format("; more than {}x below it: {}\n", r.expect.slow_factor, names);
  }
  return out;
}

}  // namespace

std::string report_table(const Report& r) {
  std::string out = fmt::format("dtrain doctor: {} node(s), run directory {}, launcher dtrain {} build {}\n\n",
                                r.nodes.size(), r.run_dir, r.expect.version, r.expect.build_id.substr(0, 16));
  out += node_table(r);
  if (r.network) out += network_text(r);

  int fails = 0, warns = 0;
  std::string problems;
  for (const Finding& f : r.findings) {
    if (f.status == Status::OK) continue;
    (f.status == Status::FAIL ? fails : warns)++;
    problems +=
        fmt::format("  {} {}{}: {}\n", status_name(f.status),
                    f.node >= 0 ? fmt::format("node {} ({}) ", f.node, f.host) : std::string(), f.check, f.detail);
    if (!f.advice.empty()) problems += fmt::format("       what to do: {}\n", f.advice);
  }
  if (!problems.empty()) out += "\nproblems:\n" + problems;
  out += fmt::format("\n{}: {} failure(s), {} warning(s); checked in {:.1f} s\n", fails ? "FAILED" : "PASSED", fails,
                     warns, r.seconds);
  return out;
}

nlohmann::json report_json(const Report& r) {
  nlohmann::json j;
  j["ok"] = r.ok();
  j["run_dir"] = r.run_dir;
  j["seconds"] = r.seconds;
  j["launcher"] = {{"version", r.expect.version}, {"build_id", r.expect.build_id}};
  j["nodes"] = nlohmann::json::array();
  for (const NodeObservation& n : r.nodes) {
    nlohmann::json o = {{"node", n.node}, {"host", n.host}, {"slots", n.slots}};
    if (!n.start_error.empty()) o["start_error"] = n.start_error;
    if (!n.end_error.empty()) o["end_error"] = n.end_error;
    if (n.facts) {
      const NodeFacts& f = *n.facts;
      o["hostname"] = f.hostname;
      o["version"] = f.version;
      o["build_id"] = f.build_id;
      o["cpus"] = f.cpus;
      o["gpus"] = f.gpus;
      o["driver"] = f.driver;
      o["free_bytes"] = f.free_bytes;
      o["free_path"] = f.free_path;
    }
    if (n.clock_offset_s) o["clock_offset_s"] = *n.clock_offset_s;
    if (n.clock_uncertainty_s) o["clock_uncertainty_s"] = *n.clock_uncertainty_s;
    if (n.allreduce_ok) o["allreduce_ok"] = *n.allreduce_ok;
    o["ok"] = std::none_of(r.findings.begin(), r.findings.end(),
                           [&](const Finding& f) { return f.node == n.node && f.status == Status::FAIL; });
    j["nodes"].push_back(o);
  }
  j["links"] = nlohmann::json::array();
  for (const LinkSample& l : r.net.links)
    j["links"].push_back({{"a", l.a}, {"b", l.b}, {"a_to_b_bytes_per_s", l.ab}, {"b_to_a_bytes_per_s", l.ba}});
  if (r.net.slowest >= 0) {
    const LinkSample& s = r.net.links[static_cast<size_t>(r.net.slowest)];
    j["slowest_link"] = {{"a", s.a}, {"b", s.b}, {"bytes_per_s", s.bandwidth()}};
  } else {
    j["slowest_link"] = nullptr;
  }
  j["median_node_bytes_per_s"] = r.net.median_node;
  j["slow_nodes"] = r.net.slow_nodes;
  j["findings"] = nlohmann::json::array();
  for (const Finding& f : r.findings)
    j["findings"].push_back({{"node", f.node},
                             {"host", f.host},
                             {"check", f.check},
                             {"status", f.status == Status::OK     ? "ok"
                                        : f.status == Status::WARN ? "warn"
                                                                   : "fail"},
                             {"detail", f.detail},
                             {"advice", f.advice}});
  return j;
}

}  // namespace dtrain::doctor
