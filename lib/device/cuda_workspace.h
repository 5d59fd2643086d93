// Memory the CUDA device holds for its libraries beside the buffers it hands out, for
// memory reports (`dtrain bench train`): the figure is kernels/'s, declared once there.
#pragma once

#include <cstddef>

namespace dtrain::device {

/// Bytes of cuBLASLt workspace one CUDA device holds (0 in a build without CUDA).
size_t cuda_workspace_bytes();

}  // namespace dtrain::device
