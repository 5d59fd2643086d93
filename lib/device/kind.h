// Which device a rank or a benchmark runs on, as a type: the config (training.device
// after `auto` is decided), the CLI (--device), the agent's DTRAIN_DEVICE and the JSON a
// run writes spell it "cpu" or "cuda"; past the parse it travels as device::Kind.
#pragma once

#include <string_view>

namespace dtrain::device {

enum class Kind { CPU, CUDA };

/// "cpu" or "cuda".
const char* kind_name(Kind k);

/// Kind from "cpu" or "cuda"; UsageError naming `what` (where the value came from, e.g.
/// "--device" or "DTRAIN_DEVICE") and the bad value otherwise.
Kind kind_parse(std::string_view name, std::string_view what);

}  // namespace dtrain::device
