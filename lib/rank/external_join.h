// `dtrain run`'s join: what every process checks in the round's store before it trains,
// since no launcher vouches for the set. Each process claims its rank (a second claimant
// of one rank is refused, naming both), and every rank but 0 compares its effective config
// with the one rank 0 published (a difference is refused, naming the keys), so a mixed set
// fails at join with a reason instead of in the first collective.
#pragma once

#include "config/train_config.h"
#include "rendezvous/store.h"

#include <chrono>
#include <string>
#include <utility>
#include <vector>

namespace dtrain::rank {

/// The effective config as canonical "key=value" lines (config_key_values), less the keys
/// that may differ between processes of one job: cluster.* (how this process reaches the
/// others: its interface, token file, environment), doctor.* and elastic.* (dtrain launch
/// only), training.output_dir and tensorboard.output_path (the shared run directory may be
/// mounted elsewhere on each node).
std::string external_config_text(const config::TrainConfig& cfg);

/// The keys whose values differ between rank 0's text and this process's, as
/// "training.max_steps (rank 0: 40, rank 3: 20)"; a key only one side has shows "(unset)".
std::vector<std::string> external_config_diff(const std::string& rank0, const std::string& mine, int rank);

/// Claims `rank` in the round's store (ADD "join/claims/rank<R>"; "join/who/rank<R>/<n>" =
/// `who`, e.g. "node7 (pid 4242)"). When another process claimed it first: sets the stop
/// key (prefix + stop_key) naming both, so the whole set ends now rather than at a
/// timeout, and throws UsageError naming both. `timeout` bounds reading the first
/// claimant's name.
void external_join_claim(rendezvous::PrefixStore& store, int rank, const std::string& who, const std::string& stop_key,
                         std::chrono::milliseconds timeout);

/// Rank 0: publishes its config text as "join/config".
void external_config_publish(rendezvous::PrefixStore& store, const std::string& text);

/// Every other rank: reads rank 0's config text (waiting at most `timeout`) and throws
/// ConfigError naming the differing keys (at most 12, then how many more) and what to do.
void external_config_check(rendezvous::PrefixStore& store, const std::string& text, int rank,
                           std::chrono::milliseconds timeout);

}  // namespace dtrain::rank
