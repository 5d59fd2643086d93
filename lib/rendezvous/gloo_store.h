// GlooStore: Gloo's rendezvous::Store interface over a StoreClient and a key prefix, so
// gloo::rendezvous::Context::connectFullMesh can exchange pair addresses through the
// launcher's store.
#pragma once

#include "rendezvous/store.h"

#include <gloo/rendezvous/store.h>

#include <chrono>
#include <string>
#include <vector>

namespace dtrain::rendezvous {

// Every key is prefixed with `prefix` (e.g. store_prefix(job, round) + "gloo/"). get()
// blocks until the key exists (connectFullMesh calls it without a prior wait); get() and
// wait(keys) are bounded by `timeout` (so is wait(keys, 0), Gloo's "no timeout"). Failures and timeouts throw CommError naming the
// keys. Holds a reference: the client must outlive the store; since a blocked get holds
// the client, give each rank its own client.
class GlooStore : public gloo::rendezvous::Store {
 public:
  GlooStore(StoreClient& client, std::string prefix, std::chrono::milliseconds timeout = std::chrono::seconds(30));

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

  const std::string& prefix() const { return prefix_; }

 private:
  StoreClient& client_;
  std::string prefix_;
  std::chrono::milliseconds timeout_;
};

}  // namespace dtrain::rendezvous
