// --include / --exclude / --num-nodes / --num-gpus with DeepSpeed's semantics, stricter
// about typos: unknown hosts, out-of-range or repeated slots and empty results all fail
// with the offending part of the filter quoted.
#include "config/host_filter.h"

#include "core/check.h"

#include <algorithm>
#include <set>

namespace dtrain::config {

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  for (;;) {
    size_t pos = s.find(sep, start);
    if (pos == std::string_view::npos) {
      parts.push_back(s.substr(start));
      return parts;
    }
    parts.push_back(s.substr(start, pos - start));
    start = pos + 1;
  }
}

std::string host_names(const Hostfile& hf) {
  std::string out;
  for (const HostEntry& h : hf.hosts) out += (out.empty() ? "" : ", ") + h.host;
  return out;
}

// ----------------------------------------------------------------------------
// include / exclude

// Slots named for one host in a filter; `all` when the spec was a bare host.
struct SpecSlots {
  bool all = false;
  std::set<int> slots;
};

// Parses `filter` (the --include or --exclude value) against `hf`: host index -> slots.
std::vector<std::pair<size_t, SpecSlots>> filter_parse(const Hostfile& hf, std::string_view filter,
                                                       std::string_view flag) {
  std::vector<std::pair<size_t, SpecSlots>> out;
  std::set<size_t> seen_hosts;
  for (std::string_view raw : split(filter, '@')) {
    std::string_view spec = trim(raw);
    if (spec.empty())
      DT_THROW(ConfigError,
               "{} \"{}\": empty node spec (use host[:slot,slot][@host[:slot,...]], e.g. "
               "worker-0@worker-1:0,2)",
               flag, filter);
    // host, host:slots, or for IPv6 hosts [addr] / [addr]:slots (a bare addr matches
    // too when it is exactly a hostfile host).
    auto find_host = [&](std::string_view n) {
      return std::find_if(hf.hosts.begin(), hf.hosts.end(),
                          [&](const HostEntry& h) { return host_key(h.host) == host_key(std::string(n)); });
    };
    size_t colon = spec.find(':');
    std::string_view name = trim(spec.substr(0, colon));
    if (spec.front() == '[') {
      const size_t close = spec.find(']');
      if (close == std::string_view::npos || (close + 1 < spec.size() && spec[close + 1] != ':'))
        DT_THROW(ConfigError, "{} \"{}\": bad node spec \"{}\" (an IPv6 host in brackets: [fe80::1]:0,1)", flag, filter,
                 spec);
      name = spec.substr(1, close - 1);
      colon = close + 1 < spec.size() ? close + 1 : std::string_view::npos;
    } else if (colon != std::string_view::npos && find_host(spec) != hf.hosts.end()) {
      name = spec;
      colon = std::string_view::npos;
    } else if (spec.find(':', colon == std::string_view::npos ? 0 : colon + 1) != std::string_view::npos) {
      DT_THROW(ConfigError,
               "{} \"{}\": \"{}\" has more than one ':'; write an IPv6 host in brackets, [fe80::1] or "
               "[fe80::1]:0,1 for some of its slots",
               flag, filter, spec);
    }
    auto it = find_host(name);
    if (it == hf.hosts.end())
      DT_THROW(ConfigError, "{} \"{}\": host \"{}\" is not in hostfile {} (hosts: {})", flag, filter, name,
               hf.path.empty() ? "<none>" : hf.path, host_names(hf));
    size_t idx = static_cast<size_t>(it - hf.hosts.begin());
    if (!seen_hosts.insert(idx).second)
      DT_THROW(ConfigError, "{} \"{}\": host \"{}\" is named twice; list its slots once as {}:a,b", flag, filter,
               it->host, it->host);

    SpecSlots ss;
    if (colon == std::string_view::npos) {
      ss.all = true;
    } else {
      std::string_view list = spec.substr(colon + 1);
      for (std::string_view raw_slot : split(list, ',')) {
        std::string_view t = trim(raw_slot);
        bool digits =
            !t.empty() && t.size() <= 9 && std::all_of(t.begin(), t.end(), [](char c) { return c >= '0' && c <= '9'; });
        if (!digits)
          DT_THROW(ConfigError,
                   "{} \"{}\": bad slot \"{}\" for host \"{}\" (slots are device numbers: "
                   "{}:0,2)",
                   flag, filter, t, it->host, it->host);
        int slot = std::stoi(std::string(t));
        if (std::find(it->slot_ids.begin(), it->slot_ids.end(), slot) == it->slot_ids.end())
          DT_THROW(ConfigError, "{} \"{}\": host \"{}\" has no slot {} (it has slots=0..{}{})", flag, filter, it->host,
                   slot, it->slots - 1,
                   static_cast<int>(it->slot_ids.size()) == it->slots ? "" : ", some filtered out");
        if (!ss.slots.insert(slot).second)
          DT_THROW(ConfigError, "{} \"{}\": slot {} of host \"{}\" is listed twice", flag, filter, slot, it->host);
      }
    }
    out.emplace_back(idx, std::move(ss));
  }
  return out;
}

}  // namespace

// ----------------------------------------------------------------------------
// Public API

Hostfile hostfile_select(const Hostfile& hf, const HostSelection& sel) {
  DT_ENFORCE(!hf.hosts.empty(), ConfigError, "hostfile {} has no hosts to select from", hf.path);
  if (!sel.include.empty() && !sel.exclude.empty())
    DT_THROW(ConfigError, "--include \"{}\" and --exclude \"{}\" are mutually exclusive; give only one", sel.include,
             sel.exclude);
  auto count_ok = [](int n) { return n == -1 || n >= 1; };
  if (!count_ok(sel.num_nodes)) DT_THROW(ConfigError, "--num-nodes must be a positive number, got {}", sel.num_nodes);
  if (!count_ok(sel.num_gpus)) DT_THROW(ConfigError, "--num-gpus must be a positive number, got {}", sel.num_gpus);

  Hostfile out = hf;
  std::string what = "the hostfile";
  if (!sel.include.empty()) {
    for (HostEntry& h : out.hosts) h.slot_ids.clear();
    for (auto& [idx, ss] : filter_parse(hf, sel.include, "--include"))
      out.hosts[idx].slot_ids = ss.all ? hf.hosts[idx].slot_ids : std::vector<int>(ss.slots.begin(), ss.slots.end());
    what = fmt::format("--include \"{}\"", sel.include);
  } else if (!sel.exclude.empty()) {
    for (auto& [idx, ss] : filter_parse(hf, sel.exclude, "--exclude")) {
      std::vector<int>& ids = out.hosts[idx].slot_ids;
      if (ss.all) ids.clear();
      else std::erase_if(ids, [&](int s) { return ss.slots.count(s) > 0; });
    }
    what = fmt::format("--exclude \"{}\"", sel.exclude);
  }
  std::erase_if(out.hosts, [](const HostEntry& h) { return h.slot_ids.empty(); });
  if (out.hosts.empty()) DT_THROW(ConfigError, "{} leaves no host with a slot to run on", what);

  if (sel.num_nodes != -1) {
    int have = static_cast<int>(out.hosts.size());
    if (sel.num_nodes > have)
      DT_THROW(ConfigError, "--num-nodes {} asks for more nodes than {} provides ({})", sel.num_nodes, what, have);
    out.hosts.resize(static_cast<size_t>(sel.num_nodes));
  }
  if (sel.num_gpus != -1) {
    for (HostEntry& h : out.hosts) {
      int have = static_cast<int>(h.slot_ids.size());
      if (sel.num_gpus > have)
        DT_THROW(ConfigError,
                 "--num-gpus {} asks for more slots than host \"{}\" has ({} after {}); lower "
                 "--num-gpus or drop the host with --exclude {}",
                 sel.num_gpus, h.host, have, what, h.host);
      h.slot_ids.resize(static_cast<size_t>(sel.num_gpus));
    }
  }
  return out;
}

}  // namespace dtrain::config
