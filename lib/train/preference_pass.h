// Forward-only passes of a preference run over pairwise data: the reference model's
// log-probability sums of every training pair (computed once before training, kept in the
// run directory so a resumed run uses the same ones) and the held-out evaluation
// (preference accuracy and the chosen answers' loss).
#pragma once

#include "comm/communicator.h"
#include "data/dataset.h"
#include "model/model.h"

#include <cstdint>
#include <string>
#include <vector>

namespace dtrain::train {

/// The reference sums of every pair of `pairs` (a pairwise dataset) under `m` as it is
/// now, in eval mode with the adapters off when `adapters_off`: [2 * pairs.size()], pair i's
/// chosen at 2i and rejected at 2i + 1. Each rank runs the pairs i = rank (mod world) in
/// batches of `pairs_per_batch`; with `lockstep` (ZeRO-3, whose forwards gather layers with
/// collectives) every rank runs the same number of forwards. The table is summed over the
/// ranks (every rank gets all of it), as fp32.
std::vector<float> reference_logps_compute(model::Model& m, const data::TokenDataset& pairs, int pairs_per_batch,
                                           int rank, int world, comm::Communicator* comm, bool lockstep,
                                           bool adapters_off);

/// A fingerprint of a pairwise dataset (its size, sequence length and every token and
/// target), stored with the reference sums so they are never used for other data.
uint64_t pairs_fingerprint(const data::TokenDataset& pairs);

/// Writes the table to DIR/reference_logps.bin (replaced whole: temporary file + rename).
void reference_logps_save(const std::string& run_dir, const std::vector<float>& table, uint64_t fingerprint);
/// Reads it back; IoError / ConfigError naming the file when it is missing, damaged or
/// for other data (fingerprint or size differ), saying what to do.
std::vector<float> reference_logps_load(const std::string& run_dir, size_t pairs, uint64_t fingerprint);

/// Held-out pairs under `m` (eval mode): how many, in how many the chosen answer's
/// log-probability sum is above the rejected one's, and the chosen answers' loss.
struct PrefEval {
  double pairs = 0, preferred = 0, chosen_loss_sum = 0, chosen_targets = 0;
  double accuracy() const { return pairs > 0 ? preferred / pairs : 0.0; }
  double chosen_loss() const { return chosen_targets > 0 ? chosen_loss_sum / chosen_targets : 0.0; }
};
/// This rank's share (pairs i = rank mod world); sum the fields over the ranks. With
/// `lockstep`, every rank runs the same number of forwards.
PrefEval pref_eval(model::Model& m, const data::TokenDataset& pairs, int pairs_per_batch, int rank, int world,
                   bool lockstep);

}  // namespace dtrain::train
