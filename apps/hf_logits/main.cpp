// hf_logits: loads a Hugging Face model directory (config.json + safetensors, and a PEFT
// adapter beside them when present) with dtrain's importer, runs dtrain's model on it on
// the CPU or a CUDA device, and writes the logits [B, T, vocab] as raw little-endian fp32
// plus one JSON line (mean next-token loss, shapes) on stdout; with --grads, also the
// gradients of that mean loss for every trainable tensor (the adapters' under LoRA) as an
// fp32 safetensors file with HF/PEFT names and layouts. Asserts nothing: the GPU check's hf
// stage (scripts/gpu_hf_parity.py) compares it with transformers and peft, and
// scripts/compare_pytorch.py --parity with its own reference written from HF's modeling code.
//
//   hf_logits --model DIR --tokens FILE --batch B --seq T [--device cpu|cuda]
//             [--dtype f32|bf16|f16] --out LOGITS.f32 [--grads GRADS.safetensors]
//
// FILE holds B rows of T + 1 int32 token ids: inputs are each row's first T, targets the
// next T (the last position of a row predicts its T+1-th token).
//
// With --pref sigmoid|orpo|simpo the B rows are B/2 pairs (chosen rows, then rejected) and
// the loss is that preference objective (train/preference.h, the trainer's own code) over
// the rows' log-probability sums, with --prompt-len K masking the targets inside each row's
// first K tokens, --beta, --ftx, --label-smoothing, --gamma as training.pref_*, and DPO's
// reference sums from --ref: adapters_off (the base model under the adapters) or a file of
// B float64 values. The gradients are those of the mean pair loss.
#include "core/check.h"
#include "core/dtype.h"
#include "core/error.h"
#include "device/device.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "train/model_factory.h"
#include "train/preference.h"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

using namespace dtrain;

namespace {

int usage(const char* argv0, const std::string& why) {
  std::fprintf(stderr,
               "hf_logits: %s\nusage: %s --model DIR --tokens FILE --batch B --seq T [--device cpu|cuda] "
               "[--dtype f32|bf16|f16] --out FILE [--grads FILE]\n",
               why.c_str(), argv0);
  return 2;
}

std::vector<int32_t> read_tokens(const std::string& path, size_t count) {
  std::ifstream f(path, std::ios::binary);
  DT_ENFORCE(f.good(), IoError, "{}: cannot open the token file", path);
  std::vector<int32_t> v(count);
  f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(count * sizeof(int32_t)));
  DT_ENFORCE(f.gcount() == static_cast<std::streamsize>(count * sizeof(int32_t)), IoError,
             "{}: holds fewer than {} int32 token ids (batch x (seq + 1))", path, count);
  return v;
}

// The trainable buffers' gradients on the host, as HF lays the tensors out (GPT-2's
// Conv1D weights transposed back to [in, out]).
void grads_write(const model::Model& m, const std::string& path) {
  std::vector<std::vector<float>> store;
  std::vector<model::StTensorRef> refs;
  const auto& bufs = m.lora_on() ? m.lora_params() : m.params();
  for (const auto& pb : bufs) {
    DT_ENFORCE(pb.grad != nullptr, UsageError, "buffer {} has no gradient", pb.layout.name);
    std::vector<float> g(pb.size);
    m.device().copy_d2h(g.data(), pb.grad, pb.size * sizeof(float));
    for (const auto& t : pb.layout.tensors) {
      std::vector<float> v(g.begin() + static_cast<std::ptrdiff_t>(t.offset),
                           g.begin() + static_cast<std::ptrdiff_t>(t.offset + t.numel()));
      std::vector<int64_t> shape = t.shape;
      if (t.hf_transposed) {
        const int64_t rows = t.shape[0], cols = t.shape[1];
        std::vector<float> tr(v.size());
        for (int64_t i = 0; i < rows; ++i)
          for (int64_t j = 0; j < cols; ++j)
            tr[static_cast<size_t>(j * rows + i)] = v[static_cast<size_t>(i * cols + j)];
        v = std::move(tr);
        std::swap(shape[0], shape[1]);
      }
      store.push_back(std::move(v));
      refs.push_back({t.name, DType::F32, shape, nullptr});
    }
  }
  for (size_t i = 0; i < refs.size(); ++i) refs[i].data = store[i].data();
  model::safetensors_write(path, refs, {{"format", "pt"}});
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_dir, tokens_path, out_path, grads_path, device = "cpu", dtype_s = "f32", pref, ref;
  int B = 0, T = 0, prompt_len = 0;
  train::PrefOptions po;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) return usage(argv[0], "option " + a + " needs a value");
    const std::string v = argv[++i];
    if (a == "--model") model_dir = v;
    else if (a == "--tokens") tokens_path = v;
    else if (a == "--out") out_path = v;
    else if (a == "--grads") grads_path = v;
    else if (a == "--device") device = v;
    else if (a == "--dtype") dtype_s = v;
    else if (a == "--batch") B = std::atoi(v.c_str());
    else if (a == "--seq") T = std::atoi(v.c_str());
    else if (a == "--pref") pref = v;
    else if (a == "--ref") ref = v;
    else if (a == "--prompt-len") prompt_len = std::atoi(v.c_str());
    else if (a == "--beta") po.beta = std::atof(v.c_str());
    else if (a == "--ftx") po.ftx = std::atof(v.c_str());
    else if (a == "--label-smoothing") po.label_smoothing = std::atof(v.c_str());
    else if (a == "--gamma") po.simpo_gamma = std::atof(v.c_str());
    else return usage(argv[0], "unknown option " + a);
  }
  if (model_dir.empty() || tokens_path.empty() || out_path.empty() || B <= 0 || T <= 0)
    return usage(argv[0], "--model, --tokens, --out, --batch and --seq are required (batch and seq > 0)");
  if (device != "cpu" && device != "cuda") return usage(argv[0], "--device is cpu or cuda");
  DType dt{};
  if (!dtype_parse(dtype_s, &dt)) return usage(argv[0], "--dtype is f32, bf16 or f16");
  if (device == "cpu" && dt != DType::F32) return usage(argv[0], "the CPU device computes in f32 only");
  if (!pref.empty()) {
    if (pref != "sigmoid" && pref != "orpo" && pref != "simpo")
      return usage(argv[0], "--pref is sigmoid, orpo or simpo");
    if (B % 2 != 0) return usage(argv[0], "--pref needs an even --batch (pairs)");
    po.loss = pref == "orpo"    ? train::PrefLoss::ORPO
              : pref == "simpo" ? train::PrefLoss::SIMPO
                                : train::PrefLoss::SIGMOID;
    if ((po.loss == train::PrefLoss::SIGMOID) != !ref.empty())
      return usage(argv[0], "--ref is for --pref sigmoid (and needed)");
  }
  try {
    std::unique_ptr<model::Model> host = train::model_load_hf_dir(model_dir);
    const model::ModelConfig& cfg = host->config();
    DT_ENFORCE(T <= cfg.max_seq_len, UsageError, "--seq {} is over the model's max_seq_len {}", T, cfg.max_seq_len);
    const std::vector<int32_t> rows = read_tokens(tokens_path, static_cast<size_t>(B) * (T + 1));
    std::vector<int32_t> tokens, targets;
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < T; ++t) {
        tokens.push_back(rows[static_cast<size_t>(b) * (T + 1) + t]);
        targets.push_back(t + 1 < prompt_len ? -100 : rows[static_cast<size_t>(b) * (T + 1) + t + 1]);
      }
    std::unique_ptr<device::Device> dev;
    std::unique_ptr<model::Model> dm;
    model::Model* m = host.get();
    if (device == "cuda") {
      device::cuda_require(0);
      dev = device::cuda_create(0);
      dm = std::make_unique<model::Model>(cfg, *dev, dt);
      dm->weights_copy_from(*host);
      m = dm.get();
    }
    m->set_training(false);
    if (!pref.empty()) {
      // The trainer's own micro-batch (train/preference.h), with the mean pair loss's scale.
      std::vector<double> ref_sums;
      if (ref == "adapters_off") {
        DT_ENFORCE(m->lora_on(), UsageError, "--ref adapters_off needs a model with a LoRA adapter");
        po.reference = train::PrefReference::ADAPTERS_OFF;
      } else if (!ref.empty()) {
        std::ifstream f(ref, std::ios::binary);
        ref_sums.resize(static_cast<size_t>(B));
        f.read(reinterpret_cast<char*>(ref_sums.data()), static_cast<std::streamsize>(B * sizeof(double)));
        DT_ENFORCE(f.gcount() == static_cast<std::streamsize>(B * sizeof(double)), IoError,
                   "{}: holds fewer than {} float64 reference sums", ref, B);
        po.reference = train::PrefReference::PRECOMPUTED;
      }
      const double P = B / 2.0;
      m->zero_grad();
      const train::PrefResult r =
          train::pref_micro_batch(*m, tokens.data(), targets.data(), B, T, po, ref_sums, 1.0 / P);
      nlohmann::json j{{"model", model_dir}, {"device", device}, {"pref", pref}, {"loss", r.loss_sum / P}};
      for (const auto& [k, v] : r.stats.means()) j[k] = v;
      if (!grads_path.empty()) grads_write(*m, grads_path);
      std::printf("%s\n", j.dump().c_str());
      return 0;
    }
    const float loss = m->forward(tokens.data(), targets.data(), B, T);
    const std::vector<float> logits = m->logits_to_host();
    std::ofstream o(out_path, std::ios::binary | std::ios::trunc);
    o.write(reinterpret_cast<const char*>(logits.data()), static_cast<std::streamsize>(logits.size() * sizeof(float)));
    o.close();
    DT_ENFORCE(o.good(), IoError, "{}: writing the logits failed", out_path);
    if (!grads_path.empty()) {
      m->zero_grad();
      m->backward(1.0f);
      grads_write(*m, grads_path);
    }
    nlohmann::json j{{"model", model_dir},
                     {"device", device},
                     {"dtype", dtype_name(dt)},
                     {"batch", B},
                     {"seq", T},
                     {"vocab", cfg.vocab_size},
                     {"loss", loss},
                     {"lora", m->lora_on()},
                     {"params", m->num_params()},
                     {"logits", out_path}};
    std::printf("%s\n", j.dump().c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hf_logits: %s\n", e.what());
    return 1;
  }
}
