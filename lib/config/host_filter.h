// Host selection: DeepSpeed's --include/--exclude resource filters, then --num-nodes and
// --num-gpus, applied to a parsed hostfile. Every bad filter is a ConfigError naming the
// host, slot or number at fault.
#pragma once

#include "config/hostfile.h"

#include <string>

namespace dtrain::config {

/// What the user asked for on the command line (or in the cluster config section).
///
/// include / exclude: `NODE_SPEC[@NODE_SPEC...]`, NODE_SPEC = `host[:slot[,slot...]]`
/// (DeepSpeed's parse_resource_filter). A bare host selects (include) or removes
/// (exclude) all its slots; `host:0,2` only those slots. An IPv6 host is written
/// `[fe80::1]` or `[fe80::1]:0,2` (bare `fe80::1` selects all its slots). Mutually exclusive. Host names
/// match case-insensitively. Unlike DeepSpeed, a host named twice in one filter and a
/// slot listed twice are errors rather than silently overwritten.
///
/// num_nodes: keep the first N hosts (hostfile order) after include/exclude.
/// num_gpus: keep the first N selected slots of every remaining host; every host must
/// have at least N. -1 = not given; any other value <= 0 is an error. Unlike DeepSpeed,
/// num_* may be combined with include/exclude (they apply after it).
struct HostSelection {
  std::string include{}, exclude{};
  int num_nodes = -1, num_gpus = -1;
};

/// Applies `sel` to `hf`, keeping hostfile order and ascending slot ids; hosts left with
/// no slot are dropped. ConfigError when the result would be empty.
Hostfile hostfile_select(const Hostfile& hf, const HostSelection& sel);

}  // namespace dtrain::config
