// Names and parsers for the communicator enums (reduce ops, backends), and the rank
// arithmetic of a split.
#include "comm/communicator.h"

#include "core/check.h"

#include <algorithm>
#include <cctype>
#include <string>

namespace dtrain::comm {

namespace {
std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}
}  // namespace

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::SUM: return "sum";
    case ReduceOp::AVG: return "avg";
    case ReduceOp::MAX: return "max";
  }
  return "?";
}

bool reduce_op_parse(std::string_view s, ReduceOp* out) {
  const std::string l = lower(s);
  if (l == "sum") {
    *out = ReduceOp::SUM;
    return true;
  }
  if (l == "avg" || l == "mean") {
    *out = ReduceOp::AVG;
    return true;
  }
  if (l == "max") {
    *out = ReduceOp::MAX;
    return true;
  }
  return false;
}

const char* backend_name(Backend b) { return b == Backend::GLOO ? "gloo" : "nccl"; }

bool backend_parse(std::string_view s, Backend* out) {
  const std::string l = lower(s);
  if (l == "gloo") {
    *out = Backend::GLOO;
    return true;
  }
  if (l == "nccl") {
    *out = Backend::NCCL;
    return true;
  }
  return false;
}

// ----------------------------------------------------------------------------
std::unique_ptr<Communicator> Communicator::split(int, int) {
  DT_THROW(CommError,
           "this {} communicator ({}) cannot split its ranks into groups (split is implemented by the gloo, nccl "
           "and device-local communicators)",
           backend_name(backend()), device_name());
}

SplitPlace split_place(const std::vector<std::pair<int, int>>& color_key, int rank) {
  DT_CHECK(rank >= 0 && static_cast<size_t>(rank) < color_key.size());
  const int color = color_key[static_cast<size_t>(rank)].first;
  if (color < 0) return {};
  // (key, rank) of every member: sorted, a member's place is its new rank.
  std::vector<std::pair<int, int>> members;
  for (size_t r = 0; r < color_key.size(); ++r)
    if (color_key[r].first == color) members.emplace_back(color_key[r].second, static_cast<int>(r));
  std::sort(members.begin(), members.end());
  SplitPlace p;
  p.size = static_cast<int>(members.size());
  for (size_t i = 0; i < members.size(); ++i)
    if (members[i].second == rank) p.rank = static_cast<int>(i);
  return p;
}

}  // namespace dtrain::comm
