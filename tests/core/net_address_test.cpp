// IPv6 literal recognition, bracket removal and host:port text.
#include "core/net_address.h"

#include <doctest/doctest.h>

using namespace dtrain;

TEST_CASE("ipv6_literal: addresses with and without zones; names, IPv4 and junk are not") {
  for (const char* yes :
       {"::1", "::", "fe80::1", "2001:db8::7", "fe80::1%eth0", "fe80::1%2", "::ffff:10.0.0.1", "1:2:3:4:5:6:7:8"})
    CHECK_MESSAGE(ipv6_literal(yes), yes);
  for (const char* no : {"", "localhost", "10.0.0.1", "[::1]", "::1::", "1:2:3", "fe80::1%", "fe80::1%e/x",
                         "fe80::1%eth 0", "node1:22", "::1]:22", "gggg::1"})
    CHECK_MESSAGE(!ipv6_literal(no), no);
}

TEST_CASE("address_unbracket and host_port_text") {
  CHECK(address_unbracket("[::1]") == "::1");
  CHECK(address_unbracket("[fe80::1%lo]") == "fe80::1%lo");
  CHECK(address_unbracket("::1") == "::1");
  CHECK(address_unbracket("[node1]") == "[node1]");  // not an address: left for the caller to reject
  CHECK(address_unbracket("10.0.0.1") == "10.0.0.1");
  CHECK(host_port_text("::1", 29500) == "[::1]:29500");
  CHECK(host_port_text("fe80::1%eth0", 22) == "[fe80::1%eth0]:22");
  CHECK(host_port_text("10.0.0.1", 29500) == "10.0.0.1:29500");
  CHECK(host_port_text("node1", 22) == "node1:22");
}
