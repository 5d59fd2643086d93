// The parameter types of the device op table (op_table.h) beyond pointers, sizes and
// dtypes. They are core's plain structs (core/op_params.h: data only), named here in the
// device layer: lib/ops (below the device) computes with them and kernels/ takes them as
// they are, so one definition serves the CPU op, the CUDA kernel and the table, with no
// conversion on either side and no ops header under the device interface.
#pragma once

#include "core/op_params.h"

namespace dtrain::device {

using dtrain::AdamWConfig;
using dtrain::AdamWTensor;
using dtrain::RopeFreq;

}  // namespace dtrain::device
