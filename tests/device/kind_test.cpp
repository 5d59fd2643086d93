// device::Kind: the two spellings round-trip, and any other value is a UsageError that
// names where it came from and the value itself.
#include "device/kind.h"

#include "core/error.h"

#include <doctest/doctest.h>

#include <string>

using namespace dtrain;

TEST_CASE("kind_parse: cpu and cuda round-trip through kind_name") {
  CHECK(device::kind_parse("cpu", "--device") == device::Kind::CPU);
  CHECK(device::kind_parse("cuda", "--device") == device::Kind::CUDA);
  CHECK(std::string(device::kind_name(device::Kind::CPU)) == "cpu");
  CHECK(std::string(device::kind_name(device::Kind::CUDA)) == "cuda");
  for (device::Kind k : {device::Kind::CPU, device::Kind::CUDA})
    CHECK(device::kind_parse(device::kind_name(k), "x") == k);
}

TEST_CASE("kind_parse: another value is a UsageError naming the source and the value") {
  for (const char* bad : {"tpu", "", "CUDA", "auto", "cuda "}) {
    std::string what;
    try {
      device::kind_parse(bad, "DTRAIN_DEVICE");
    } catch (const UsageError& e) {
      what = e.what();
    }
    CAPTURE(bad);
    CHECK(what.find("DTRAIN_DEVICE") != std::string::npos);
    CHECK(what.find(std::string("\"") + bad + "\"") != std::string::npos);
    CHECK(what.find("cpu or cuda") != std::string::npos);
  }
}
