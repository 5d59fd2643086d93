// Internal to the model module: the parts of ModelActivations' arena (a layer's saved
// activations, the backward scratch) and the shape the model lays it out for, shared by
// model_activations.cpp (layout, allocation) and model.cpp (forward, backward).
#pragma once

#include "model/model_activations.h"

#include <cstddef>
#include <vector>

namespace dtrain::model {

// What one layer's backward needs (one set per layer, or one shared set under recompute).
struct ModelActivations::LayerActs {
  void *ln1 = nullptr, *q = nullptr, *k = nullptr, *v = nullptr, *atty = nullptr, *res2 = nullptr;
  void *ln2 = nullptr, *fc = nullptr, *up = nullptr, *act = nullptr;
  float *ln1_mean = nullptr, *ln1_rstd = nullptr, *ln2_mean = nullptr, *ln2_rstd = nullptr;
  float *att = nullptr;                          // what the device's attention saves (Device::attention_saved_floats)
  void *qpre = nullptr, *kpre = nullptr;         // qk_norm: q, k before their per-head norms
  float *qn_rstd = nullptr, *kn_rstd = nullptr;  // qk_norm: per (token, head) statistics
  std::vector<void *> lora_h;                    // per projection: dropout(x) A^T [N, r] (null when not adapted)
  std::vector<void *> lora_xd;                   // per projection: dropout(x) [N, in] (null without dropout)
};

// Arrays no backward reads from an earlier layer: forward temporaries, the head's
// activations and the backward gradients of the layer at hand.
struct ModelActivations::Scratch {
  void *qkv = nullptr, *attproj = nullptr, *mlp = nullptr, *lnf = nullptr, *logits = nullptr;
  float *lnf_mean = nullptr, *lnf_rstd = nullptr, *losses = nullptr, *loss_mean = nullptr;
  float *num_targets = nullptr;  // the last inputs' unmasked-target count (backward's default)
  int32_t *tokens = nullptr, *targets = nullptr;
  int32_t *doc_start = nullptr;  // the inputs' document starts (packed documents), when given
  void *dres = nullptr, *dln = nullptr, *dqkv = nullptr, *dq = nullptr, *dk = nullptr, *dv = nullptr;
  void *datty = nullptr, *dfc = nullptr, *dup = nullptr, *dact = nullptr, *dh = nullptr, *dxd = nullptr;
  void *dqpre = nullptr, *dkpre = nullptr;  // qk_norm: gradients of q, k before their norms
};

// What the arena is laid out for besides the config: the batch and the adapters (which
// projections carry one in some layer, their rank, whether dropout keeps its masked
// inputs). Model::allocate fills it.
struct ModelActivations::ArenaShape {
  int B = 0, T = 0;
  size_t r = 0;               // LoRA rank (0 without adapters)
  bool xd = false;            // LoRA dropout: the masked inputs are kept
  std::vector<int> proj_in;   // [proj] its input width
  std::vector<char> adapted;  // [proj] adapted in some layer
  bool dact = true;           // d(act) is stored (Model::allocate says when)
};

}  // namespace dtrain::model
