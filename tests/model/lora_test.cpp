// LoRA: PEFT names and shapes, frozen base (no base gradients), B = 0 leaves the output
// unchanged, adapter gradients vs finite differences of the double reference, merge
// equals base + adapter, SGD touches only adapters, dropout (exact at 0, recompute-stable,
// off in eval mode), config validation.
#include "model/lora.h"

#include "core/error.h"
#include "device/device.h"
#include "model/model.h"
#include "model/reference_model.h"
#include "ops/parallel.h"

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <vector>

using namespace dtrain;
using namespace dtrain::model;
namespace R = dtrain::ops::ref;

namespace {
ModelConfig tiny(ModelConfig::Arch arch) {
  ModelConfig c;
  c.arch = arch;
  c.vocab_size = 32;
  c.max_seq_len = 8;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_kv_head = arch == ModelConfig::Arch::GPT2 ? 4 : 2;
  c.d_model = 16;
  c.d_ff = arch == ModelConfig::Arch::GPT2 ? 64 : 40;
  c.tie_embeddings = arch == ModelConfig::Arch::GPT2;
  return c;
}

LoraConfig lora_cfg(ModelConfig::Arch arch, float dropout = 0.0f) {
  LoraConfig l;
  l.rank = 4;
  l.alpha = 8.0f;
  l.dropout = dropout;
  l.seed = 5;
  l.targets = arch == ModelConfig::Arch::GPT2 ? std::vector<std::string>{"c_attn", "c_proj"}
                                              : std::vector<std::string>{"q_proj", "v_proj", "down_proj"};
  return l;
}

struct Batch {
  std::vector<int32_t> tok, tgt;
};
Batch batch(int N, uint64_t seed) {
  Rng r(seed);
  Batch b;
  for (int i = 0; i < N; ++i) {
    b.tok.push_back(int32_t(r.below(32)));
    b.tgt.push_back(int32_t(r.below(32)));
  }
  b.tgt[2] = -100;
  return b;
}

void randomize_b(Model& m, uint64_t seed) {
  Rng r(seed);
  for (auto& pb : m.lora_params())
    for (auto& t : pb.layout.tensors)
      if (t.name.find("lora_B") != std::string::npos)
        for (size_t i = 0; i < t.numel(); ++i) pb.host_f32()[t.offset + i] = r.normal(0.0f, 0.3f);
}

std::vector<float> copy_all(std::vector<ParamBuffer>& bufs, bool grad) {
  std::vector<float> v;
  for (auto& pb : bufs) v.insert(v.end(), grad ? pb.grad : pb.host_f32(), (grad ? pb.grad : pb.host_f32()) + pb.size);
  return v;
}
}  // namespace

TEST_CASE("adapters get PEFT names and shapes; the base is frozen") {
  Model m(tiny(ModelConfig::Arch::LLAMA));
  m.init_weights(1);
  m.lora_enable(lora_cfg(ModelConfig::Arch::LLAMA));
  REQUIRE(m.lora_on());
  REQUIRE(m.lora_params().size() == 2);
  const auto& lb = m.lora_params()[1];
  CHECK(lb.layout.layer == 1);
  const TensorSpec* a = lb.layout.find("base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight");
  const TensorSpec* b = lb.layout.find("base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight");
  const TensorSpec* d = lb.layout.find("base_model.model.model.layers.1.mlp.down_proj.lora_A.weight");
  REQUIRE(a);
  REQUIRE(b);
  REQUIRE(d);
  CHECK(a->shape == std::vector<int64_t>{4, 16});
  CHECK(b->shape == std::vector<int64_t>{8, 4});
  CHECK(d->shape == std::vector<int64_t>{4, 40});
  CHECK(lb.layout.find("base_model.model.model.layers.1.self_attn.k_proj.lora_A.weight") == nullptr);
  for (auto& pb : m.params()) CHECK(pb.grad == nullptr);
  CHECK(&m.trainable_params() == &m.lora_params());
  CHECK(m.num_trainable_params() == 2 * (4 * 16 + 16 * 4 + 4 * 16 + 8 * 4 + 4 * 40 + 16 * 4));
  // A ~ U(-1/sqrt(in), 1/sqrt(in)) and not all zero; B == 0
  TensorView av = m.tensor(a->name), bv = m.tensor(b->name);
  float amax = 0;
  for (int i = 0; i < av.numel(); ++i) amax = std::max(amax, std::abs(av.f32()[i]));
  CHECK(amax > 0.0f);
  CHECK(amax <= 0.25f);
  for (int i = 0; i < bv.numel(); ++i) CHECK(bv.f32()[i] == 0.0f);
  CHECK_THROWS_AS(m.lora_enable(lora_cfg(ModelConfig::Arch::LLAMA)), UsageError);

  Model g(tiny(ModelConfig::Arch::GPT2));
  g.lora_enable(lora_cfg(ModelConfig::Arch::GPT2));
  const auto& gl = g.lora_params()[0].layout;
  CHECK(gl.find("base_model.model.transformer.h.0.attn.c_attn.lora_B.weight")->shape == std::vector<int64_t>{48, 4});
  CHECK(gl.find("base_model.model.transformer.h.0.attn.c_proj.lora_A.weight") != nullptr);
  CHECK(gl.find("base_model.model.transformer.h.0.mlp.c_proj.lora_A.weight") != nullptr);  // c_proj: both
  CHECK(gl.find("base_model.model.transformer.h.0.mlp.c_fc.lora_A.weight") == nullptr);
}

TEST_CASE("with B = 0 the LoRA model's forward equals the base model's") {
  for (auto arch : {ModelConfig::Arch::GPT2, ModelConfig::Arch::LLAMA}) {
    Model base(tiny(arch)), lm(tiny(arch));
    base.init_weights(3);
    lm.init_weights(3);
    lm.lora_enable(lora_cfg(arch));
    Batch b = batch(16, 4);
    float l0 = base.forward(b.tok.data(), b.tgt.data(), 2, 8);
    float l1 = lm.forward(b.tok.data(), b.tgt.data(), 2, 8);
    CHECK(l0 == l1);
    CHECK(std::memcmp(base.logits(), lm.logits(), 16 * 32 * sizeof(float)) == 0);
  }
}

TEST_CASE("adapter gradients match finite differences of the reference; base has none") {
  for (auto arch : {ModelConfig::Arch::GPT2, ModelConfig::Arch::LLAMA}) {
    const ModelConfig cfg = tiny(arch);
    Model m(cfg);
    m.init_weights(7);
    // larger base weights so the adapters see O(1) activations
    Rng r(8);
    for (auto& pb : m.params())
      for (size_t i = 0; i < pb.size; ++i) pb.host_f32()[i] += r.normal(0.0f, 0.2f);
    LoraConfig lc = lora_cfg(arch);
    m.lora_enable(lc);
    randomize_b(m, 9);
    Batch b = batch(14, 10);
    m.zero_grad();
    float loss = m.forward(b.tok.data(), b.tgt.data(), 2, 7);
    m.backward();
    testref::RefLora rl{lc.rank, lc.scale(), lc.targets};
    testref::Params P = testref::params_of(m);
    double ref = testref::ref_loss(cfg, P, b.tok, b.tgt, 2, 7, &rl);
    CHECK(std::abs(loss - ref) <= 1e-5 * std::abs(ref));
    std::vector<double> got, fd;
    Rng pick(11);
    for (auto& pb : m.lora_params())
      for (auto& t : pb.layout.tensors)
        for (int s = 0; s < 6; ++s) {
          size_t i = pick.below(t.numel());
          R::Vec& w = P.at(t.name);
          const double h = 1e-4, w0 = w[i];
          w[i] = w0 + h;
          double lp = testref::ref_loss(cfg, P, b.tok, b.tgt, 2, 7, &rl);
          w[i] = w0 - h;
          double lmi = testref::ref_loss(cfg, P, b.tok, b.tgt, 2, 7, &rl);
          w[i] = w0;
          fd.push_back((lp - lmi) / (2 * h));
          got.push_back(pb.grad[t.offset + i]);
        }
    double mx = 0;
    for (double v : fd) mx = std::max(mx, std::abs(v));
    REQUIRE(mx > 1e-3);
    for (size_t i = 0; i < fd.size(); ++i) CHECK(std::abs(got[i] - fd[i]) <= 2e-3 * mx + 1e-3 * std::abs(fd[i]));
  }
}

TEST_CASE("merge folds B A into the base: merged forward equals base + adapter forward") {
  for (auto arch : {ModelConfig::Arch::GPT2, ModelConfig::Arch::LLAMA}) {
    Model m(tiny(arch));
    m.init_weights(12);
    m.lora_enable(lora_cfg(arch));
    randomize_b(m, 13);
    Batch b = batch(16, 14);
    float with_adapter = m.forward(b.tok.data(), b.tgt.data(), 2, 8);
    std::vector<float> logits(m.logits(), m.logits() + 16 * 32);
    m.lora_merge();
    CHECK_FALSE(m.lora_on());
    for (auto& pb : m.params()) CHECK(pb.grad != nullptr);  // trainable again
    float merged = m.forward(b.tok.data(), b.tgt.data(), 2, 8);
    CHECK(merged == doctest::Approx(with_adapter).epsilon(1e-5));
    CHECK(R::max_rel_err(m.logits(), R::Vec(logits.begin(), logits.end())) <= 1e-5);
    m.backward();  // the merged model trains like a plain one
    CHECK_THROWS_AS(m.lora_merge(), UsageError);
  }
}

TEST_CASE("SGD on adapters changes only adapter parameters and lowers the loss") {
  for (auto arch : {ModelConfig::Arch::GPT2, ModelConfig::Arch::LLAMA}) {
    Model m(tiny(arch));
    m.init_weights(15);
    m.lora_enable(lora_cfg(arch));
    auto base0 = copy_all(m.params(), false);
    auto lora0 = copy_all(m.lora_params(), false);
    Batch b = batch(16, 16);
    float first = 0, last = 0;
    for (int step = 0; step < 10; ++step) {
      m.zero_grad();
      last = m.forward(b.tok.data(), b.tgt.data(), 2, 8);
      if (step == 0) first = last;
      m.backward();
      for (auto& pb : m.trainable_params())
        for (size_t i = 0; i < pb.size; ++i) pb.host_f32()[i] -= 1.0f * pb.grad[i];
    }
    auto base1 = copy_all(m.params(), false);
    auto lora1 = copy_all(m.lora_params(), false);
    CHECK(std::memcmp(base0.data(), base1.data(), base0.size() * 4) == 0);
    CHECK(lora0 != lora1);
    CHECK(last < first);
  }
}

TEST_CASE("LoRA dropout: exact at 0, masks stable under recompute, off in eval mode") {
  const auto arch = ModelConfig::Arch::LLAMA;
  Batch b = batch(16, 17);
  std::vector<float> g[2];
  float loss[2];
  for (int rc = 0; rc < 2; ++rc) {
    Model m(tiny(arch));
    m.init_weights(18);
    m.lora_enable(lora_cfg(arch, 0.3f));
    randomize_b(m, 19);
    m.set_recompute(rc == 1);
    m.zero_grad();
    loss[rc] = m.forward(b.tok.data(), b.tgt.data(), 2, 8);
    m.backward();
    g[rc] = copy_all(m.lora_params(), true);
  }
  CHECK(loss[0] == loss[1]);
  CHECK(std::memcmp(g[0].data(), g[1].data(), g[0].size() * 4) == 0);

  Model m(tiny(arch)), ref(tiny(arch));
  m.init_weights(18);
  ref.init_weights(18);
  m.lora_enable(lora_cfg(arch, 0.3f));
  ref.lora_enable(lora_cfg(arch, 0.0f));
  randomize_b(m, 19);
  randomize_b(ref, 19);
  float train1 = m.forward(b.tok.data(), b.tgt.data(), 2, 8);
  float train2 = m.forward(b.tok.data(), b.tgt.data(), 2, 8);
  CHECK(train1 != train2);  // a fresh mask per forward
  float nodrop = ref.forward(b.tok.data(), b.tgt.data(), 2, 8);
  CHECK(train1 != nodrop);
  m.set_training(false);
  CHECK(m.forward(b.tok.data(), b.tgt.data(), 2, 8) == nodrop);
  // replaying the forward count replays the mask
  m.set_training(true);
  m.set_forward_count(0);
  CHECK(m.forward(b.tok.data(), b.tgt.data(), 2, 8) == train1);
}

TEST_CASE("LoRA config validation") {
  ModelConfig c = tiny(ModelConfig::Arch::LLAMA);
  LoraConfig l = lora_cfg(ModelConfig::Arch::LLAMA);
  l.targets = {"c_attn"};
  CHECK_THROWS_AS(l.validate(c), ConfigError);
  l.targets = {};
  CHECK_THROWS_AS(l.validate(c), ConfigError);
  l = lora_cfg(ModelConfig::Arch::LLAMA);
  l.rank = 0;
  CHECK_THROWS_AS(l.validate(c), ConfigError);
  l.rank = 4;
  l.dropout = 1.0f;
  CHECK_THROWS_AS(l.validate(c), ConfigError);
  CHECK(lora_tensor_name("model.layers.0.self_attn.q_proj", false) ==
        "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight");
}

TEST_CASE("LoRA dropout on the CPU device: the same bits on 1 and 3 threads, forward and backward") {
  const size_t n = 100003;  // large enough for the pool, not a multiple of its chunks
  std::vector<float> x(n), dout(n);
  for (size_t i = 0; i < n; ++i) {
    x[i] = std::sin(0.37f * static_cast<float>(i));
    dout[i] = std::cos(0.11f * static_cast<float>(i));
  }
  std::vector<float> out[2], dinp[2];
  const int threads[2] = {1, 3};
  for (int r = 0; r < 2; ++r) {
    ops::set_num_threads(threads[r]);
    out[r].assign(n, -1.0f);
    dinp[r].assign(n, 0.5f);
    device::cpu().dropout_forward(out[r].data(), x.data(), n, 0.3f, 77, DType::F32);
    device::cpu().dropout_backward(dinp[r].data(), dout.data(), n, 0.3f, 77, DType::F32);
  }
  ops::set_num_threads(2);
  CHECK(std::memcmp(out[0].data(), out[1].data(), n * 4) == 0);
  CHECK(std::memcmp(dinp[0].data(), dinp[1].data(), n * 4) == 0);
  size_t dropped = 0;
  for (size_t i = 0; i < n; ++i) dropped += out[0][i] == 0.0f && x[i] != 0.0f;
  CHECK(dropped > n / 4);  // p = 0.3 of them, give or take
  CHECK(dropped < n * 7 / 20);
}

TEST_CASE("CPU device zero(): exactly the given bytes, on 1 and 3 threads, sizes around the 64 KiB blocks") {
  for (int th : {1, 3})
    for (size_t bytes : {size_t{0}, size_t{5}, size_t{65536}, size_t{65537}, size_t{3 * 65536 + 3}, size_t{1 << 22}}) {
      CAPTURE(bytes);
      ops::set_num_threads(th);
      std::vector<unsigned char> buf(bytes + 16, 0xAB);
      device::cpu().zero(buf.data() + 8, bytes);
      for (size_t i = 0; i < buf.size(); ++i) REQUIRE(buf[i] == ((i >= 8 && i < 8 + bytes) ? 0 : 0xAB));
    }
  ops::set_num_threads(2);
}
