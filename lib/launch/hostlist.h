// Slurm hostlist expressions ("node[001-003,007],gpu[1-2]-ib[0-1]") expanded into host
// names in exactly the order `scontrol show hostnames` prints them, with a ConfigError
// naming the expression, the column and the fix for anything malformed.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace dtrain::launch {

/// Most names one bracket range may produce (Slurm's own limit, MAX_RANGE).
inline constexpr size_t HOSTLIST_MAX_RANGE = 65536;
/// Most names a whole expression may produce: a larger one is a typo, not a cluster.
inline constexpr size_t HOSTLIST_MAX_HOSTS = 1u << 20;

/// Expands a Slurm hostlist expression. The grammar (Slurm 22.05's, checked against
/// `scontrol show hostnames`):
/// - items separated by ',' or whitespace outside brackets; empty items are skipped;
/// - an item is literal text with any number of bracket groups `[r,r,...]`, each range
///   `r` either `N` or `LO-HI` (decimal, LO <= HI, at most HOSTLIST_MAX_RANGE names);
///   numbers are zero-padded to the width of LO as written ("[08-11]" -> 08..11,
///   "[1-010]" -> 1..10);
/// - several groups form a cartesian product in Slurm's order: the last group varies
///   fastest, then the first, the second, ... ("a[1-2]b[3-4]c[5-6]" -> a1b3c5 a1b3c6
///   a2b3c5 a2b3c6 a1b4c5 ...); for two groups this is plain row-major order;
/// - duplicates are kept, in order (as Slurm does).
/// Extension: text after the last group ("node[1-2]-ib") is appended to every name;
/// Slurm 22.05 rejects it (Slurm never writes such lists itself).
/// ConfigError (expression, 1-based column, what to do) for unbalanced or nested
/// brackets, an empty group or range, non-digits in a range, LO > HI, a range or a list
/// that is too large, or characters that cannot be in a host name.
std::vector<std::string> hostlist_expand(std::string_view expr);

/// The inverse for display: consecutive names "prefix<digits>" with one prefix and one
/// digit width collapse into "prefix[lo-hi]" ranges ("n01,n02,n03,x" -> "n[01-03],x").
/// Order is kept (no sorting); hostlist_expand(hostlist_compress(v)) == v.
std::string hostlist_compress(const std::vector<std::string>& hosts);

}  // namespace dtrain::launch
