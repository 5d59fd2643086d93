// GlooStore: maps Gloo's byte-vector Store calls onto the rendezvous client.
#include "rendezvous/gloo_store.h"

#include "core/check.h"

namespace dtrain::rendezvous {

GlooStore::GlooStore(StoreClient& client, std::string prefix, std::chrono::milliseconds timeout)
    : client_(client), prefix_(std::move(prefix)), timeout_(timeout) {}

void GlooStore::set(const std::string& key, const std::vector<char>& data) {
  client_.set(prefix_ + key, std::string_view(data.data(), data.size()));
}

std::vector<char> GlooStore::get(const std::string& key) {
  const std::string value = client_.get(prefix_ + key, timeout_);
  return std::vector<char>(value.begin(), value.end());
}

void GlooStore::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void GlooStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  std::vector<std::string> scoped;
  scoped.reserve(keys.size());
  for (const auto& k : keys) scoped.push_back(prefix_ + k);
  // Gloo spells "no timeout" as zero; we stay bounded by the configured timeout instead.
  const std::chrono::milliseconds bound = timeout.count() > 0 ? timeout : timeout_;
  if (client_.wait(scoped, bound)) return;
  std::string missing;
  for (const auto& k : scoped) missing += (missing.empty() ? "'" : ", '") + k + "'";
  DT_THROW(CommError,
           "Gloo rendezvous: keys {} not set within {} ms on the store at {} (a peer rank may have failed "
           "or not started)",
           missing, bound.count(), client_.endpoint());
}

}  // namespace dtrain::rendezvous
