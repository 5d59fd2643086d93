// device::Kind's spelling: the one place "cpu" and "cuda" turn into the type and back.
#include "device/kind.h"

#include "core/check.h"

namespace dtrain::device {

const char* kind_name(Kind k) { return k == Kind::CUDA ? "cuda" : "cpu"; }

Kind kind_parse(std::string_view name, std::string_view what) {
  if (name == "cpu") return Kind::CPU;
  if (name == "cuda") return Kind::CUDA;
  DT_THROW(UsageError, "{}: the device must be cpu or cuda, got \"{}\"", what, name);
}

}  // namespace dtrain::device
