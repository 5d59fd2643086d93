// The parameter types of the device op table (op_table.h) beyond pointers, sizes and
// dtypes. They are the ops' own plain structs (ops/op_params.h: data only, no CPU code),
// named here in the device layer: lib/ops sits below the device and computes with them,
// kernels/ takes them as they are, so one definition serves the CPU op, the CUDA kernel
// and the table, with no conversion on either side.
#pragma once

#include "ops/op_params.h"

namespace dtrain::device {

using ops::AdamWConfig;
using ops::AdamWTensor;
using ops::RopeFreq;

}  // namespace dtrain::device
