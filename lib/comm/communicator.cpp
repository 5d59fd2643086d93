// Names and parsers for the communicator enums (reduce ops, backends).
#include "comm/communicator.h"

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

}  // namespace dtrain::comm
