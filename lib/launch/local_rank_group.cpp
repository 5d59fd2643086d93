// Local rank group: spawn, forward, watch with the culprit rule, stop together.
#include "launch/local_rank_group.h"

#include "core/env.h"
#include "launch/culprit.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <thread>

namespace dtrain::launch {

using namespace std::chrono_literals;

LocalRankGroup::LocalRankGroup(std::vector<LocalRankSpec> ranks, std::chrono::milliseconds stop_grace)
    : grace_(stop_grace), said_(ranks.size()), ended_(ranks.size()), ended_at_(ranks.size()) {
  try {
    for (size_t i = 0; i < ranks.size(); ++i) {
      LocalRankSpec& r = ranks[i];
      auto cb = [this, i, prefix = r.prefix](Stream s, std::string_view line) {
        std::string out = prefix;
        out.append(line);
        out.push_back('\n');
        std::lock_guard<std::mutex> lock(out_mu_);
        // Why the rank failed (e.g. "cannot write checkpoint file F: No space left on
        // device"), for the failure report beside its exit code.
        if (s == Stream::STDERR &&
            (line.rfind("dtrain: error: ", 0) == 0 || line.rfind("dtrain: internal error: ", 0) == 0))
          said_[i] = std::string(line.substr(0, 1000));
        std::FILE* f = s == Stream::STDOUT ? stdout : stderr;
        std::fwrite(out.data(), 1, out.size(), f);
        std::fflush(f);
      };
      procs_.push_back(spawn_local(r.argv, r.env, "", r.stdin_data, cb, true, r.env_mode));
    }
  } catch (...) {
    stop();
    throw;
  }
}

LocalRankGroup::~LocalRankGroup() { stop(); }

LocalRankGroupStatus LocalRankGroup::poll() {
  const auto now = std::chrono::steady_clock::now();
  std::vector<FailureSeen> failed;
  size_t succeeded = 0;
  for (size_t i = 0; i < procs_.size(); ++i) {
    if (!ended_[i] && (ended_[i] = procs_[i]->wait_for(0ms))) ended_at_[i] = now;
    if (!ended_[i]) continue;
    if (ended_[i]->success()) ++succeeded;
    else
      failed.push_back(
          {static_cast<int>(i), ended_[i]->exited ? ended_[i]->code : 128 + ended_[i]->signal, ended_at_[i]});
  }
  LocalRankGroupStatus st;
  if (failed.empty()) {
    if (succeeded == procs_.size()) st.state = LocalRankGroupStatus::State::SUCCEEDED;
    return st;
  }
  const std::optional<size_t> c = culprit_pick(failed, now);
  if (!c) {
    st.state = LocalRankGroupStatus::State::FAILING;
    return st;
  }
  const auto i = static_cast<size_t>(failed[*c].who);
  st.state = LocalRankGroupStatus::State::FAILED;
  st.local_rank = static_cast<int>(i);
  st.exit = *ended_[i];
  st.exit_code = failed[*c].exit_code;
  std::lock_guard<std::mutex> lock(out_mu_);
  st.said = said_[i];
  return st;
}

void LocalRankGroup::stop() {
  std::vector<std::thread> stoppers;
  for (auto& p : procs_)
    if (p->running()) stoppers.emplace_back([&p, this] { p->terminate(grace_); });
  for (auto& t : stoppers) t.join();
}

std::map<std::string, std::string> rank_thread_env(int local_ranks) {
  const long cores = std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN));
  const std::string per_rank = std::to_string(std::max(1L, cores / std::max(1, local_ranks)));
  std::map<std::string, std::string> env;
  for (const char* k : {"OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"})
    if (!env_get(k)) env[k] = per_rank;
  return env;
}

}  // namespace dtrain::launch
