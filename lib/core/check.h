// The formatting check macros: DT_THROW, DT_ENFORCE, DT_ENFORCE_EQ/LE/LT/GE/GT (both
// values printed), DT_CHECK for internal invariants. Each message ends with
// [file:line host=.. rank=..].
#pragma once

#include "core/error.h"

#include <fmt/format.h>

// DT_THROW(ConfigError, "fmt {}", x): throw with file:line and context appended.
#define DT_THROW(Type, ...) throw ::dtrain::Type(fmt::format(__VA_ARGS__) + ::dtrain::detail::where(__FILE__, __LINE__))

// DT_ENFORCE(cond, Type, "fmt", ...): invariant or input check.
#define DT_ENFORCE(cond, Type, ...)                                                         \
  do {                                                                                      \
    if (!(cond)) DT_THROW(Type, "{} (check '{}' failed)", fmt::format(__VA_ARGS__), #cond); \
  } while (0)

// DT_ENFORCE_OP(a, op, b, Type, "fmt", ...): prints both values.
#define DT_ENFORCE_OP(a, op, b, Type, ...)                                                                    \
  do {                                                                                                        \
    const auto& dt_a_ = (a);                                                                                  \
    const auto& dt_b_ = (b);                                                                                  \
    if (!(dt_a_ op dt_b_))                                                                                    \
      DT_THROW(Type, "{} ({} = {} must be " #op " {} = {})", fmt::format(__VA_ARGS__), #a, dt_a_, #b, dt_b_); \
  } while (0)
#define DT_ENFORCE_EQ(a, b, Type, ...) DT_ENFORCE_OP(a, ==, b, Type, __VA_ARGS__)
#define DT_ENFORCE_LE(a, b, Type, ...) DT_ENFORCE_OP(a, <=, b, Type, __VA_ARGS__)
#define DT_ENFORCE_LT(a, b, Type, ...) DT_ENFORCE_OP(a, <, b, Type, __VA_ARGS__)
#define DT_ENFORCE_GE(a, b, Type, ...) DT_ENFORCE_OP(a, >=, b, Type, __VA_ARGS__)
#define DT_ENFORCE_GT(a, b, Type, ...) DT_ENFORCE_OP(a, >, b, Type, __VA_ARGS__)

// DT_CHECK(cond): internal invariant (a bug if it fails).
#define DT_CHECK(cond) DT_ENFORCE(cond, InternalError, "internal invariant")
