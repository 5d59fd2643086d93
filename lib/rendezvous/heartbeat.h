// Heartbeats through the rendezvous store: a thread that stamps "<prefix>hb/<name>" every
// interval on its own connection (and publishes the owner's progress under
// "<prefix>progress/<name>" when it changes), and the supervisor-side check for missed
// beats (ages are measured on the server's clock, see StoreServer::heartbeats).
#pragma once

#include "rendezvous/store.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace dtrain::rendezvous {

// "<prefix>hb/<name>".
std::string heartbeat_key(const std::string& name, const std::string& prefix = "");
// "<prefix>progress/<name>".
std::string heartbeat_progress_key(const std::string& name, const std::string& prefix = "");

// Sets heartbeat_key(name, prefix) to the current unix time in milliseconds (decimal) every
// interval. The constructor beats once before returning and throws CommError when the store
// cannot be reached. Later failures never throw: they are logged once, kept in last_error(),
// and the thread reconnects on the next beat. `timeout` bounds the connection and each
// beat (zero: max(interval, 1 s)). The destructor stops the thread; it returns within
// about that timeout even when the server hangs.
class Heartbeat {
 public:
  Heartbeat(const std::string& host, uint16_t port, const std::string& token, const std::string& name,
            std::chrono::milliseconds interval, const std::string& prefix = "",
            std::chrono::milliseconds timeout = std::chrono::milliseconds(0));
  ~Heartbeat();
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

  const std::string& key() const { return key_; }
  const std::string& progress_key() const { return progress_key_; }

  // Publishes `value` under progress_key(), once per change: with the next beat, or at
  // once when nothing was published for an interval (so the server's time of that SET is
  // within an interval of the change, and exact for changes an interval or more apart).
  // Never blocks on the network; callable from any thread.
  void progress(const std::string& value);

  // Stops the thread, then sets key() to `value` once more (best effort, bounded by the
  // request timeout), so a supervisor can tell an owner that finished from one that went
  // silent. The destructor then has nothing left to do.
  void finish(const std::string& value);
  // Successful beats so far (including the constructor's).
  uint64_t beats() const { return beats_.load(); }
  // The last failure's message, empty after a successful beat.
  std::string last_error() const;

 private:
  void stamp();
  void beat();
  void run();
  void stop_thread();

  std::string host_;
  uint16_t port_;
  std::string token_;
  std::string key_;
  std::string progress_key_;
  std::chrono::milliseconds interval_;
  std::chrono::milliseconds timeout_;
  std::unique_ptr<StoreClient> client_;  // heartbeat thread only (after construction)
  std::atomic<uint64_t> beats_{0};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool wake_ = false;                                    // progress() asks for an early beat
  std::string progress_;                                 // latest value given to progress()
  std::string progress_published_;                       // what the server has
  bool progress_pending_ = false;                        // progress_ differs from progress_published_
  std::chrono::steady_clock::time_point progress_at_{};  // last publication
  std::string last_error_;
  std::thread thread_;
};

// Names in `expected` whose heartbeat under `prefix` (keys "<prefix>hb/<name>") is older
// than max_age on the server's clock, or absent. Call after the peers had time to beat.
std::vector<std::string> heartbeat_missed(const StoreServer& server, const std::string& prefix,
                                          const std::vector<std::string>& expected, std::chrono::milliseconds max_age);

}  // namespace dtrain::rendezvous
