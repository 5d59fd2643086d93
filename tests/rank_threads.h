// N ranks as threads in one test process, joined by Gloo over an in-memory HashStore on
// 127.0.0.1: the multi-rank harness of the train tests.
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

// Runs body(comm, rank) on n threads over a fresh store (comm == nullptr when n == 1).
// Returns each rank's exception text ("" when it passed).
inline std::vector<std::string> run_ranks(int n, const std::function<void(dtrain::comm::Communicator*, int)>& body) {
  std::vector<std::string> errors(static_cast<size_t>(n));
  if (n == 1) {
    try {
      body(nullptr, 0);
    } catch (const std::exception& e) {
      errors[0] = e.what();
    }
    return errors;
  }
  auto store = std::make_shared<gloo::rendezvous::HashStore>();
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        dtrain::comm::GlooOptions o;
        o.address = "127.0.0.1";
        o.timeout = std::chrono::milliseconds(30000);
        auto comm = dtrain::comm::comm_create_gloo(store, r, n, o);
        body(comm.get(), r);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

}  // namespace dtrain::test
