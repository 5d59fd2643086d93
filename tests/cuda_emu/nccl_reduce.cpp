// CUDA execution engine (test-only): NCCL's element-wise reductions (nccl_reduce.h).
#include "nccl_reduce.h"

#include "engine.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace cuda_emu::nccl {

namespace {

// Reductions: 16-bit floats accumulate in fp32 and round once; integers wrap.
template <typename S>
struct Arith {
  using A = S;
  static A load(S v) { return v; }
  static S store(A a) { return a; }
  static A add(A a, A b) {
    if constexpr (std::is_integral_v<S>) {
      using U = std::make_unsigned_t<S>;
      return static_cast<S>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
    } else {
      return a + b;
    }
  }
  static A mul(A a, A b) {
    if constexpr (std::is_integral_v<S>) {
      using U = std::conditional_t<(sizeof(S) < sizeof(unsigned)), unsigned, std::make_unsigned_t<S>>;
      return static_cast<S>(static_cast<U>(a) * static_cast<U>(b));
    } else {
      return a * b;
    }
  }
};
template <>
struct Arith<__half> {
  using A = float;
  static A load(__half v) { return __half2float(v); }
  static __half store(A a) { return __float2half_rn(a); }
  static A add(A a, A b) { return a + b; }
  static A mul(A a, A b) { return a * b; }
};
template <>
struct Arith<__nv_bfloat16> {
  using A = float;
  static A load(__nv_bfloat16 v) { return __bfloat162float(v); }
  static __nv_bfloat16 store(A a) { return __float2bfloat16_rn(a); }
  static A add(A a, A b) { return a + b; }
  static A mul(A a, A b) { return a * b; }
};

// out[i] = op over inputs[0..n)[i] in rank order. out may alias an input at the same
// index (in-place forms): each element is read before it is written.
template <typename S>
void reduce_typed(ncclRedOp_t op, void* out, const std::vector<const void*>& inputs, size_t count) {
  using T = Arith<S>;
  using A = typename T::A;
  S* dst = static_cast<S*>(out);
  const int n = static_cast<int>(inputs.size());
  if (count == 0) return;
  cuda_emu::parallel_for(count, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) {
      A acc = T::load(static_cast<const S*>(inputs[0])[i]);
      for (int r = 1; r < n; ++r) {
        const A v = T::load(static_cast<const S*>(inputs[r])[i]);
        switch (op) {
          case ncclProd: acc = T::mul(acc, v); break;
          case ncclMax: acc = v > acc ? v : acc; break;
          case ncclMin: acc = v < acc ? v : acc; break;
          default: acc = T::add(acc, v); break;
        }
      }
      if (op == ncclAvg) acc = static_cast<A>(acc / static_cast<A>(n));
      dst[i] = T::store(acc);
    }
  });
}

}  // namespace

void reduce(ncclDataType_t dt, ncclRedOp_t op, void* out, const std::vector<const void*>& in, size_t count) {
  switch (dt) {
    case ncclInt8: return reduce_typed<int8_t>(op, out, in, count);
    case ncclUint8: return reduce_typed<uint8_t>(op, out, in, count);
    case ncclInt32: return reduce_typed<int32_t>(op, out, in, count);
    case ncclUint32: return reduce_typed<uint32_t>(op, out, in, count);
    case ncclInt64: return reduce_typed<int64_t>(op, out, in, count);
    case ncclUint64: return reduce_typed<uint64_t>(op, out, in, count);
    case ncclFloat16: return reduce_typed<__half>(op, out, in, count);
    case ncclFloat32: return reduce_typed<float>(op, out, in, count);
    case ncclFloat64: return reduce_typed<double>(op, out, in, count);
    case ncclBfloat16: return reduce_typed<__nv_bfloat16>(op, out, in, count);
    default: return;
  }
}

size_t dtype_size(ncclDataType_t dt) {
  switch (dt) {
    case ncclInt8:
    case ncclUint8: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    default: return 8;
  }
}

}  // namespace cuda_emu::nccl
