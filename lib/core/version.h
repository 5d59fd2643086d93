// The dtrain version string, from the CMake project version.
#pragma once
namespace dtrain {
const char* version();
}
