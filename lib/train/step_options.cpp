// step_options_from: a training config's step options (train_step.h), the one derivation
// the trainer's loop and `dtrain bench train`'s step both read.
#include "train/train_step.h"

namespace dtrain::train {

TrainStepOptions step_options_from(const config::TrainConfig& cfg, int micro_batch, int grad_accum, int seq_len,
                                   bool fp16_scaled) {
  TrainStepOptions o;
  o.micro_batch = micro_batch;
  o.grad_accum = grad_accum;
  o.seq_len = seq_len;
  if (fp16_scaled) o.loss_scaler = loss_scaler_config_from(cfg.fp16);
  o.cuda_graph = cfg.training.cuda_graph;
  return o;
}

}  // namespace dtrain::train
