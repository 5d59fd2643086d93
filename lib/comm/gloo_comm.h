// Gloo backend: collectives over TCP between host-memory buffers, the CPU path used by
// tests, CI and laptops. Peers find each other through a gloo::rendezvous::Store
// (dtrain's rendezvous store adapter, or gloo's HashStore/FileStore in tests).
#pragma once

#include "comm/communicator.h"

#include <gloo/rendezvous/store.h>

#include <chrono>
#include <memory>
#include <string>

namespace dtrain::comm {

struct GlooOptions {
  /// Network interface to bind ("eth0", "ib0"); empty = not by interface.
  std::string interface;
  /// Hostname or IP address to bind ("127.0.0.1"); empty with an empty interface =
  /// this machine's hostname as it resolves. Set at most one of interface/address.
  std::string address;
  /// Bound on connecting the mesh and on every collective: a peer that stops
  /// answering surfaces as CommError after this long.
  std::chrono::milliseconds timeout{60000};
};

/// Connects `size` ranks into a full TCP mesh through `store` and returns this rank's
/// communicator. Every rank calls it with the same store contents and size. Throws
/// UsageError for bad options and CommError when the mesh cannot be formed in time.
std::unique_ptr<Communicator> comm_create_gloo(std::shared_ptr<gloo::rendezvous::Store> store, int rank, int size,
                                               const GlooOptions& opts);

}  // namespace dtrain::comm
