// Heartbeat thread (stamp, reconnect after failures, prompt stop) and the missed-beat
// check the supervisor runs against the server's clock.
#include "rendezvous/heartbeat.h"

#include "core/error.h"
#include "core/log.h"
#include "core/unix_time.h"

#include <algorithm>

namespace dtrain::rendezvous {

using std::chrono::milliseconds;

std::string heartbeat_key(const std::string& name, const std::string& prefix) { return prefix + "hb/" + name; }
std::string heartbeat_progress_key(const std::string& name, const std::string& prefix) {
  return prefix + "progress/" + name;
}

Heartbeat::Heartbeat(const std::string& host, uint16_t port, const std::string& token, const std::string& name,
                     milliseconds interval, const std::string& prefix, milliseconds timeout)
    : host_(host), port_(port), token_(token), key_(heartbeat_key(name, prefix)),
      progress_key_(heartbeat_progress_key(name, prefix)), interval_(std::max(interval, milliseconds(1))),
      timeout_(timeout > milliseconds(0) ? timeout : std::max(interval_, milliseconds(1000))) {
  client_ = std::make_unique<StoreClient>(host_, port_, token_, timeout_);
  // A silently dead server must not hold the thread (and the destructor) for long.
  client_->set_request_timeout(timeout_);
  stamp();  // throws: the caller learns at once that the store is unreachable
  thread_ = std::thread([this] { run(); });
}

Heartbeat::~Heartbeat() { stop_thread(); }

void Heartbeat::stop_thread() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::string Heartbeat::last_error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_error_;
}

void Heartbeat::progress(const std::string& value) {
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (value == progress_) return;
    progress_ = value;
    progress_pending_ = progress_ != progress_published_;
    // Changes an interval or more apart are published at once, so their server time is
    // exact; faster ones ride on the regular beats (one SET per interval at most).
    wake = progress_pending_ && std::chrono::steady_clock::now() - progress_at_ >= interval_;
    if (wake) wake_ = true;
  }
  if (wake) cv_.notify_all();
}

void Heartbeat::finish(const std::string& value) {
  stop_thread();
  try {
    if (!client_) {
      client_ = std::make_unique<StoreClient>(host_, port_, token_, timeout_);
      client_->set_request_timeout(timeout_);
    }
    client_->set(key_, value);
  } catch (const CommError& e) {
    log_warn("heartbeat '{}': could not record '{}': {}", key_, value, e.what());
  }
}

void Heartbeat::stamp() {
  client_->set(key_, std::to_string(unix_ms()));
  ++beats_;
  std::string value;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!progress_pending_) return;
    value = progress_;
  }
  client_->set(progress_key_, value);
  std::lock_guard<std::mutex> lock(mu_);
  progress_published_ = value;
  progress_pending_ = progress_ != progress_published_;
  progress_at_ = std::chrono::steady_clock::now();
}

void Heartbeat::beat() {
  std::string error;
  try {
    if (!client_) {
      client_ = std::make_unique<StoreClient>(host_, port_, token_, timeout_);
      client_->set_request_timeout(timeout_);
    }
    stamp();
  } catch (const CommError& e) {
    // Reconnect on the next beat; the supervisor sees the gap in the server's timestamps.
    client_.reset();
    error = e.what();
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (!error.empty() && last_error_.empty()) log_warn("heartbeat '{}' failed: {}", key_, error);
  if (error.empty() && !last_error_.empty()) log_info("heartbeat '{}' restored", key_);
  last_error_ = std::move(error);
}

void Heartbeat::run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (cv_.wait_for(lock, interval_, [this] { return stop_ || wake_; }) && stop_) return;
    wake_ = false;
    lock.unlock();
    beat();
    lock.lock();
  }
}

// ----------------------------------------------------------------------------

std::vector<std::string> heartbeat_missed(const StoreServer& server, const std::string& prefix,
                                          const std::vector<std::string>& expected, milliseconds max_age) {
  const auto beats = server.heartbeats(prefix + "hb/");
  const auto now = std::chrono::steady_clock::now();
  std::vector<std::string> missed;
  for (const auto& name : expected) {
    auto it = beats.find(name);
    if (it == beats.end() || now - it->second > max_age) missed.push_back(name);
  }
  return missed;
}

}  // namespace dtrain::rendezvous
