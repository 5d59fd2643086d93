// N ranks as threads in one test process: the multi-rank harness of the comm, bench and
// train tests. run_threads is the bare loop (any communicator: the NCCL tests make their
// own); run_gloo_ranks joins the threads by Gloo over a fresh in-memory HashStore on
// 127.0.0.1.
#pragma once

#include "comm/gloo_comm.h"

#include <gloo/rendezvous/hash_store.h>

#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace dtrain::test {

// The exception text fn throws ("" when it returns).
inline std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// Runs body(rank) on n threads, one rank each. Returns each rank's exception text ("" when
// it passed).
inline std::vector<std::string> run_threads(int n, const std::function<void(int)>& body) {
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] { errors[static_cast<size_t>(r)] = error_of([&] { body(r); }); });
  for (auto& t : threads) t.join();
  return errors;
}

// Gloo on loopback with a timeout that turns a lost peer into a CommError, not a hang.
inline comm::GlooOptions loopback_gloo(std::chrono::milliseconds timeout = std::chrono::milliseconds(30000)) {
  comm::GlooOptions o;
  o.address = "127.0.0.1";
  o.timeout = timeout;
  return o;
}

// Runs body(comm) on n Gloo ranks (threads) over a fresh store. Returns each rank's
// exception text ("" when it passed).
inline std::vector<std::string> run_gloo_ranks(int n, const std::function<void(comm::Communicator&)>& body,
                                               comm::GlooOptions opts = loopback_gloo()) {
  auto store = std::make_shared<gloo::rendezvous::HashStore>();
  return run_threads(n, [&](int r) { body(*comm::comm_create_gloo(store, r, n, opts)); });
}

// The train tests' form: body(comm, rank), comm == nullptr (and no thread) when n == 1.
inline std::vector<std::string> run_ranks(int n, const std::function<void(comm::Communicator*, int)>& body) {
  if (n == 1) return {error_of([&] { body(nullptr, 0); })};
  return run_gloo_ranks(n, [&](comm::Communicator& c) { body(&c, c.rank()); });
}

}  // namespace dtrain::test
