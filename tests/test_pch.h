// The test suites' precompiled header (CMakeLists.txt, dtrain_add_test): the third-party
// and standard headers most test files include, parsed once per build tree instead of
// once per test file (a test file's own headers come after it; their include guards
// make these lines no-ops there). Only headers whose meaning no test-specific macro
// changes belong here.
#pragma once

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>
