// How a rank process ends itself from a watch thread (its parent agent went away, or the
// job's stop key appeared): lib/ never exits the process, so the entry points take the
// exit from apps/, which calls std::_Exit.
#pragma once

#include <functional>

namespace dtrain::rank {

/// Ends the process with `exit_code` at once (no destructors: other threads still run).
using ProcessExit = std::function<void(int exit_code)>;

}  // namespace dtrain::rank
