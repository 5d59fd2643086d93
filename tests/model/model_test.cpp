// Model (GPT-2 and Llama/GQA, tiny configs): forward vs a double-precision reference
// model, backward vs central finite differences of that reference on sampled parameters
// of every tensor, loss at init ~ ln(vocab), recompute of none, some or all layers bit-identical,
// gradient accumulation, hook order, overfitting one batch with plain SGD, bad input.
#include "model/model.h"

#include "core/error.h"
#include "core/rng.h"
#include "model/reference_model.h"
#include "ops/parallel.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

using namespace dtrain;
using namespace dtrain::model;
namespace R = dtrain::ops::ref;

namespace {

ModelConfig tiny_gpt2() {
  ModelConfig c;
  c.arch = ModelConfig::Arch::GPT2;
  c.vocab_size = 32;
  c.max_seq_len = 8;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_kv_head = 4;
  c.d_model = 16;
  c.d_ff = 64;
  c.tie_embeddings = true;
  return c;
}

ModelConfig tiny_llama(int n_kv = 2, bool tie = false) {
  ModelConfig c;
  c.arch = ModelConfig::Arch::LLAMA;
  c.vocab_size = 32;
  c.max_seq_len = 8;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_kv_head = n_kv;
  c.d_model = 16;
  c.d_ff = 40;
  c.norm_eps = 1e-5f;
  c.rope_theta = 10000.0f;
  c.tie_embeddings = tie;
  return c;
}

struct Batch {
  std::vector<int32_t> tok, tgt;
};

Batch make_batch(int B, int T, int V, uint64_t seed, bool mask = true) {
  Rng r(seed);
  Batch b;
  for (int i = 0; i < B * T; ++i) {
    b.tok.push_back(static_cast<int32_t>(r.below(static_cast<uint64_t>(V))));
    b.tgt.push_back(static_cast<int32_t>(r.below(static_cast<uint64_t>(V))));
  }
  if (mask) {
    b.tgt[1] = -100;
    b.tgt[static_cast<size_t>(B * T - 2)] = -100;
  }
  return b;
}

// Make the init less symmetric than GPT-2's (norm weights 1, biases 0, tiny matrices) so
// every term of the gradient is exercised with O(1) values.
void randomize(Model& m, uint64_t seed, float scale = 0.3f) {
  Rng r(seed);
  for (auto& pb : m.params())
    for (size_t i = 0; i < pb.size; ++i) pb.host_f32()[i] = r.normal(0.0f, scale) + (i % 7 == 0 ? 1.0f : 0.0f);
}

std::vector<float> grads_copy(Model& m) {
  std::vector<float> g;
  for (auto& pb : m.trainable_params()) g.insert(g.end(), pb.grad, pb.grad + pb.size);
  return g;
}

// Model backward vs double-reference finite differences on `per_tensor` sampled entries
// of every tensor. Bound: |g - fd| <= 2e-3 * max|fd| + 1e-3 * |fd| per entry.
void check_gradients(const ModelConfig& cfg, uint64_t seed) {
  Model m(cfg);
  randomize(m, seed);
  const int B = 2, T = 7;
  Batch b = make_batch(B, T, cfg.vocab_size, seed + 1);
  m.zero_grad();
  float loss = m.forward(b.tok.data(), b.tgt.data(), B, T);
  m.backward();
  testref::Params P = testref::params_of(m);
  R::Vec logits_ref;
  double ref = testref::ref_loss(cfg, P, b.tok, b.tgt, B, T, nullptr, &logits_ref);
  CHECK(std::abs(loss - ref) <= 1e-5 * std::abs(ref));

  Rng pick(seed + 2);
  std::vector<double> got, fd;
  for (auto& pb : m.params())
    for (auto& t : pb.layout.tensors) {
      for (int s = 0; s < 6; ++s) {
        size_t i = pick.below(t.numel());
        R::Vec& w = P.at(t.name);
        const double h = 1e-4, w0 = w[i];
        w[i] = w0 + h;
        double lp = testref::ref_loss(cfg, P, b.tok, b.tgt, B, T);
        w[i] = w0 - h;
        double lm = testref::ref_loss(cfg, P, b.tok, b.tgt, B, T);
        w[i] = w0;
        fd.push_back((lp - lm) / (2 * h));
        got.push_back(pb.grad[t.offset + i]);
      }
    }
  double mx = 0;
  for (double v : fd) mx = std::max(mx, std::abs(v));
  REQUIRE(mx > 1e-3);
  int bad = 0;
  for (size_t i = 0; i < fd.size(); ++i)
    if (std::abs(got[i] - fd[i]) > 2e-3 * mx + 1e-3 * std::abs(fd[i])) {
      if (++bad < 5) MESSAGE("entry ", i, ": model ", got[i], " vs fd ", fd[i]);
    }
  CHECK(bad == 0);
}

// Rows of T positions holding documents of the given lengths (each row's lengths sum to
// T): the model's doc_start.
std::vector<int32_t> doc_starts_of(const std::vector<std::vector<int>>& rows) {
  std::vector<int32_t> ds;
  for (const auto& lens : rows) {
    int start = 0;
    for (int len : lens) {
      for (int j = 0; j < len; ++j) ds.push_back(start);
      start += len;
    }
  }
  return ds;
}

// Packed documents kept apart (doc_start) give each document's own computation: every
// position's loss equals that of the document run alone as a row of its length, and the
// gradient of the packed mean equals the sum of the documents' gradients weighted by
// their share of the targets. Rows of 32 with documents of 1..20 tokens, boundaries off
// the attention's 64-row blocks.
void check_packed_equals_alone(ModelConfig cfg, uint64_t seed) {
  const std::vector<std::vector<int>> docs = {{5, 11, 1, 15}, {20, 12}};
  const int B = 2, T = 32;
  cfg.max_seq_len = T;
  Batch b = make_batch(B, T, cfg.vocab_size, seed);
  const std::vector<int32_t> ds = doc_starts_of(docs);
  Model m(cfg);
  randomize(m, seed + 1, 0.2f);
  m.zero_grad();
  m.forward(b.tok.data(), b.tgt.data(), B, T, nullptr, ds.data());
  CHECK(m.inputs_documents());
  const int total = m.num_targets();
  const std::vector<float> packed_losses = m.token_losses_to_host();
  m.backward();
  const std::vector<float> g_packed = grads_copy(m);

  m.zero_grad();
  std::vector<float> alone_losses;
  for (int r = 0; r < B; ++r) {
    int start = 0;
    for (int len : docs[static_cast<size_t>(r)]) {
      const size_t o = static_cast<size_t>(r) * T + static_cast<size_t>(start);
      const std::vector<int32_t> tok(b.tok.begin() + static_cast<ptrdiff_t>(o),
                                     b.tok.begin() + static_cast<ptrdiff_t>(o + len));
      const std::vector<int32_t> tgt(b.tgt.begin() + static_cast<ptrdiff_t>(o),
                                     b.tgt.begin() + static_cast<ptrdiff_t>(o + len));
      m.forward(tok.data(), tgt.data(), 1, len);
      CHECK_FALSE(m.inputs_documents());
      const std::vector<float> l = m.token_losses_to_host();
      alone_losses.insert(alone_losses.end(), l.begin(), l.end());
      if (m.num_targets() > 0) m.backward(static_cast<float>(m.num_targets()) / static_cast<float>(total));
      start += len;
    }
  }
  REQUIRE(alone_losses.size() == packed_losses.size());
  for (size_t i = 0; i < packed_losses.size(); ++i) {
    CAPTURE(i);
    CHECK(packed_losses[i] == doctest::Approx(alone_losses[i]).epsilon(1e-5));
  }
  const std::vector<float> g_alone = grads_copy(m);
  REQUIRE(g_alone.size() == g_packed.size());
  double mx = 0, err = 0;
  for (size_t i = 0; i < g_alone.size(); ++i) {
    mx = std::max(mx, std::abs(static_cast<double>(g_alone[i])));
    err = std::max(err, std::abs(static_cast<double>(g_packed[i]) - g_alone[i]));
  }
  REQUIRE(mx > 1e-4);
  CHECK(err <= 1e-5 * mx);
  // Without the starts the documents see each other: some position's loss differs.
  m.forward(b.tok.data(), b.tgt.data(), B, T);
  const std::vector<float> across = m.token_losses_to_host();
  double diff = 0;
  for (size_t i = 0; i < across.size(); ++i)
    diff = std::max(diff, std::abs(static_cast<double>(across[i]) - packed_losses[i]));
  CHECK(diff > 1e-3);
}

// Every count of recomputed layers (0 .. n_layer: none, some spread over the depth, all)
// gives the losses and gradients of none, bit for bit.
void check_recompute_identical(const ModelConfig& cfg, int B = 3, int T = 8) {
  Batch b1 = make_batch(B, T, cfg.vocab_size, 5), b2 = make_batch(B, T, cfg.vocab_size, 6);
  std::vector<float> g0;
  float loss0[2] = {0, 0};
  for (int k = 0; k <= cfg.n_layer; ++k) {
    CAPTURE(k);
    Model m(cfg);
    m.init_weights(9);
    m.set_recompute_layers(k);
    CHECK(m.recompute_layers() == k);
    m.zero_grad();
    const float l1 = m.forward(b1.tok.data(), b1.tgt.data(), B, T);
    m.backward(0.5f);
    const float l2 = m.forward(b2.tok.data(), b2.tgt.data(), B, T);  // gradient accumulation
    m.backward(0.5f);
    const std::vector<float> g = grads_copy(m);
    if (k == 0) {
      g0 = g;
      loss0[0] = l1;
      loss0[1] = l2;
      continue;
    }
    CHECK(l1 == loss0[0]);
    CHECK(l2 == loss0[1]);
    REQUIRE(g.size() == g0.size());
    CHECK(std::memcmp(g.data(), g0.data(), g.size() * sizeof(float)) == 0);
  }
}

// One projection GEMM per group (q/k/v, gate/up) against one per projection: two
// micro-batches with packed documents, under LoRA (dropout on) when `lora`, and the
// losses and trainable gradients compared. The fused GEMMs sum the input gradient over
// the group in one pass, so the bits may differ: within 1e-5 of the largest value.
void check_fused_equals_unfused(const ModelConfig& cfg, bool lora, bool expect_qkv, bool expect_gate_up) {
  const int B = 2, T = 8;
  const std::vector<int32_t> ds = doc_starts_of({{3, 5}, {8}});
  Batch b1 = make_batch(B, T, cfg.vocab_size, 17), b2 = make_batch(B, T, cfg.vocab_size, 18);
  float loss[2][2] = {};
  std::vector<float> g[2];
  for (int fused = 0; fused < 2; ++fused) {
    CAPTURE(fused);
    Model m(cfg);
    randomize(m, 41);
    if (lora) {
      LoraConfig l;
      l.rank = 4;
      l.alpha = 8.0f;
      l.dropout = 0.1f;
      l.seed = 3;
      l.targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
      m.lora_enable(l);
      Rng r(43);  // B = 0 would hide the adapters' share of every gradient
      for (auto& pb : m.lora_params())
        for (size_t i = 0; i < pb.size; ++i) pb.host_f32()[i] = r.normal(0.0f, 0.3f);
    }
    m.set_fused_projections(fused == 1);
    CHECK(m.fused_qkv() == (fused == 1 && expect_qkv));
    CHECK(m.fused_gate_up() == (fused == 1 && expect_gate_up));
    m.zero_grad();
    loss[fused][0] = m.forward(b1.tok.data(), b1.tgt.data(), B, T, nullptr, ds.data());
    m.backward(0.5f);
    loss[fused][1] = m.forward(b2.tok.data(), b2.tgt.data(), B, T, nullptr, ds.data());
    m.backward(0.5f);
    g[fused] = grads_copy(m);
  }
  CHECK(loss[1][0] == doctest::Approx(loss[0][0]).epsilon(1e-6));
  CHECK(loss[1][1] == doctest::Approx(loss[0][1]).epsilon(1e-6));
  REQUIRE(g[0].size() == g[1].size());
  double scale = 0, err = 0;
  for (size_t i = 0; i < g[0].size(); ++i) {
    scale = std::max(scale, std::fabs(double(g[0][i])));
    err = std::max(err, std::fabs(double(g[1][i]) - g[0][i]));
  }
  CHECK(scale > 0);
  CHECK(err <= 1e-5 * scale);
}

}  // namespace

TEST_CASE("layout: HF names, contiguous offsets, decay and transpose flags") {
  auto gl = layout_build(tiny_gpt2());
  REQUIRE(gl.size() == 4);
  CHECK(gl[0].tensors[0].name == "transformer.wte.weight");
  CHECK(gl[1].name == "layers.0");
  CHECK(gl[1].layer == 0);
  CHECK(gl[3].layer == 2);
  const TensorSpec* ca = gl[2].find("transformer.h.1.attn.c_attn.weight");
  REQUIRE(ca);
  CHECK(ca->shape == std::vector<int64_t>{48, 16});
  CHECK(ca->hf_transposed);
  CHECK(ca->decay);
  CHECK_FALSE(gl[2].find("transformer.h.1.attn.c_attn.bias")->decay);
  CHECK_FALSE(gl[2].find("transformer.h.1.ln_2.weight")->decay);
  CHECK(gl[3].find("lm_head.weight") == nullptr);  // tied
  for (auto& b : gl) {
    size_t off = 0;
    for (auto& t : b.tensors) {
      CHECK(t.offset == off);
      off += t.numel();
    }
    CHECK(off == b.size);
  }
  auto ll = layout_build(tiny_llama(2));
  const TensorSpec* k = ll[1].find("model.layers.0.self_attn.k_proj.weight");
  REQUIRE(k);
  CHECK(k->shape == std::vector<int64_t>{8, 16});  // n_kv_head * head_dim
  CHECK_FALSE(k->hf_transposed);
  CHECK(ll[3].find("lm_head.weight") != nullptr);
  CHECK(ll[3].find("model.norm.weight") != nullptr);
}

TEST_CASE("parameter counts of GPT-2 small and TinyLlama-1.1B") {
  auto count = [](const ModelConfig& c) {
    size_t n = 0;
    for (auto& b : layout_build(c)) n += b.size;
    return n;
  };
  ModelConfig g;
  g.arch = ModelConfig::Arch::GPT2;
  g.vocab_size = 50257;
  g.max_seq_len = 1024;
  g.n_layer = 12;
  g.n_head = g.n_kv_head = 12;
  g.d_model = 768;
  g.d_ff = 3072;
  CHECK(count(g) == 124439808u);
  ModelConfig l;
  l.arch = ModelConfig::Arch::LLAMA;
  l.vocab_size = 32000;
  l.max_seq_len = 2048;
  l.n_layer = 22;
  l.n_head = 32;
  l.n_kv_head = 4;
  l.d_model = 2048;
  l.d_ff = 5632;
  l.tie_embeddings = false;
  CHECK(count(l) == 1100048384u);
  Model m(tiny_gpt2());
  CHECK(m.num_params() == count(tiny_gpt2()));
  CHECK(m.num_trainable_params() == m.num_params());
}

TEST_CASE("config validation names the bad field") {
  ModelConfig c = tiny_llama(3);  // 4 heads, 3 kv heads
  CHECK_THROWS_AS(c.validate(), ConfigError);
  c = tiny_gpt2();
  c.n_kv_head = 2;
  CHECK_THROWS_AS(c.validate(), ConfigError);
  c = tiny_gpt2();
  c.d_model = 18;
  CHECK_THROWS_AS(Model{c}, ConfigError);
}

TEST_CASE("GPT-2 forward matches the double reference and its gradients match finite differences") {
  check_gradients(tiny_gpt2(), 100);
}

TEST_CASE("Llama (GQA NH=4 NKV=2, untied) gradients match finite differences") {
  check_gradients(tiny_llama(2, false), 200);
}

TEST_CASE("Llama (MQA NKV=1, tied embeddings) gradients match finite differences") {
  check_gradients(tiny_llama(1, true), 300);
}

TEST_CASE("untrained loss is about ln(vocab) and logits match the reference") {
  for (auto cfg : {tiny_gpt2(), tiny_llama()}) {
    Model m(cfg);
    m.init_weights(1);
    Batch b = make_batch(4, 8, cfg.vocab_size, 2, false);
    float loss = m.forward(b.tok.data(), b.tgt.data(), 4, 8);
    CHECK(std::abs(loss - std::log(32.0f)) < 0.05f);
    R::Vec logits;
    testref::ref_loss(cfg, testref::params_of(m), b.tok, b.tgt, 4, 8, nullptr, &logits);
    CHECK(R::max_rel_err(m.logits(), logits) <= 1e-4);
    // no targets: logits only, NaN loss, and backward is refused
    CHECK(std::isnan(m.forward(b.tok.data(), nullptr, 4, 8)));
    CHECK_THROWS_AS(m.backward(), UsageError);
  }
}

TEST_CASE("init_weights: GPT-2 statistics, deterministic per seed") {
  Model a(tiny_gpt2()), b(tiny_gpt2());
  a.init_weights(7);
  b.init_weights(7);
  for (size_t i = 0; i < a.params().size(); ++i)
    CHECK(std::memcmp(a.params()[i].data, b.params()[i].data, a.params()[i].size * 4) == 0);
  TensorView ln = a.tensor("transformer.h.0.ln_1.weight"), bias = a.tensor("transformer.h.0.mlp.c_fc.bias");
  CHECK(ln.f32()[3] == 1.0f);
  CHECK(bias.f32()[3] == 0.0f);
  TensorView fc = a.tensor("transformer.h.0.mlp.c_fc.weight"), pr = a.tensor("transformer.h.1.mlp.c_proj.weight");
  auto sd = [](const TensorView& t) {
    double s = 0;
    for (int64_t i = 0; i < t.numel(); ++i) s += double(t.f32()[i]) * t.f32()[i];
    return std::sqrt(s / double(t.numel()));
  };
  CHECK(sd(fc) == doctest::Approx(0.02).epsilon(0.1));
  CHECK(sd(pr) == doctest::Approx(0.02 / std::sqrt(4.0)).epsilon(0.1));
  CHECK(a.tensor("no.such.tensor").data == nullptr);
  Model c(tiny_gpt2());
  c.init_weights(8);
  CHECK(std::memcmp(a.params()[1].data, c.params()[1].data, a.params()[1].size * 4) != 0);
}

TEST_CASE("init_weights: tensors over one chunk draw each chunk from its own stream, the same for any thread count") {
  // A Llama whose embedding (vocab x d_model) spans 2.5 chunks; its layers' tensors fit in one.
  ModelConfig c = tiny_llama(2);
  c.vocab_size = 40960;
  c.d_model = 64;
  c.n_head = 4;
  c.d_ff = 128;
  REQUIRE(static_cast<size_t>(c.vocab_size) * c.d_model > 2 * kInitChunk);
  const int threads = ops::num_threads();
  std::vector<float> v[2];
  for (int run = 0; run < 2; ++run) {
    ops::set_num_threads(run == 0 ? 1 : 4);
    Model m(c);
    m.init_weights(11);
    const TensorView e = m.tensor("model.embed_tokens.weight");
    REQUIRE(e.data != nullptr);
    v[run].assign(e.f32(), e.f32() + e.numel());
  }
  ops::set_num_threads(threads);
  CHECK(v[0] == v[1]);
  // The first chunk is the tensor's own stream (its index 1 in the model), as one stream per
  // tensor gives; the second another stream: no chunk repeats the first's values.
  Rng first(splitmix64(11 ^ splitmix64(1)));
  bool same = true;
  for (size_t k = 0; k < kInitChunk && same; ++k) same = v[0][k] == first.normal(0.0f, 0.02f);
  CHECK(same);
  CHECK(std::memcmp(v[0].data(), v[0].data() + kInitChunk, 1024 * sizeof(float)) != 0);
  CHECK(v[0][kInitChunk] == Rng(splitmix64(splitmix64(11 ^ splitmix64(1)) + 1)).normal(0.0f, 0.02f));
}

TEST_CASE("recompute of none, some or all layers gives bit-identical losses and gradients (GPT-2, Llama)") {
  check_recompute_identical(tiny_gpt2());
  check_recompute_identical(tiny_llama(2));
  // Four layers: recomputed and kept layers side by side in every pattern the counts give.
  ModelConfig g4 = tiny_gpt2(), l4 = tiny_llama(2);
  g4.n_layer = l4.n_layer = 4;
  check_recompute_identical(g4);
  check_recompute_identical(l4);
  // sizes where the ops and GEMMs run on the thread pool
  ModelConfig g = tiny_gpt2(), l = tiny_llama(2);
  for (ModelConfig* c : {&g, &l}) {
    c->vocab_size = 256;
    c->max_seq_len = 32;
    c->d_model = 64;
    c->d_ff = 192;
  }
  check_recompute_identical(g, 4, 32);
  check_recompute_identical(l, 4, 32);
}

TEST_CASE(
    "packed documents with doc_start: each document's losses and gradients as if alone (GPT-2, Llama GQA, "
    "sliding window)") {
  check_packed_equals_alone(tiny_gpt2(), 31);
  check_packed_equals_alone(tiny_llama(2), 32);
  ModelConfig w = tiny_llama(1, true);
  w.arch = ModelConfig::Arch::MISTRAL;
  w.sliding_window = 6;  // a window shorter than some documents: both bounds at once
  check_packed_equals_alone(w, 33);
  // A malformed layout is refused before it reaches the device.
  Model m(tiny_llama());
  Batch b = make_batch(1, 8, 32, 1);
  std::vector<int32_t> bad = {0, 0, 2, 2, 1, 1, 1, 1};  // position 4 cannot start at 1
  CHECK_THROWS_AS(m.forward(b.tok.data(), b.tgt.data(), 1, 8, nullptr, bad.data()), UsageError);
  bad = {1, 1, 1, 1, 1, 1, 1, 1};  // position 0 starts at 0
  CHECK_THROWS_AS(m.forward(b.tok.data(), b.tgt.data(), 1, 8, nullptr, bad.data()), UsageError);
}

TEST_CASE("recomputed layers spread evenly over the depth; counts out of range are refused") {
  auto at = [](int layers, int n) {
    std::string s;
    for (int l = 0; l < n; ++l) s += recompute_layer_at(l, layers, n) ? 'r' : '.';
    return s;
  };
  CHECK(at(0, 4) == "....");
  CHECK(at(1, 4) == "...r");
  CHECK(at(2, 4) == ".r.r");
  CHECK(at(3, 4) == ".rrr");
  CHECK(at(4, 4) == "rrrr");
  CHECK(at(3, 8) == "..r..r.r");
  for (int n = 1; n <= 40; ++n)
    for (int k = 0; k <= n; ++k) {
      const std::string s = at(k, n);
      CHECK(std::count(s.begin(), s.end(), 'r') == k);
    }
  Model m(tiny_llama());
  CHECK_THROWS_AS(m.set_recompute_layers(-1), UsageError);
  CHECK_THROWS_AS(m.set_recompute_layers(m.config().n_layer + 1), UsageError);
  m.set_recompute(true);
  CHECK(m.recompute_layers() == m.config().n_layer);
}

TEST_CASE("backward accumulates: two identical micro-batches give twice the gradient") {
  Model m(tiny_llama());
  m.init_weights(3);
  Batch b = make_batch(2, 8, 32, 4);
  m.zero_grad();
  m.forward(b.tok.data(), b.tgt.data(), 2, 8);
  m.backward();
  auto g1 = grads_copy(m);
  m.forward(b.tok.data(), b.tgt.data(), 2, 8);
  m.backward();
  auto g2 = grads_copy(m);
  for (size_t i = 0; i < g1.size(); ++i) REQUIRE(g2[i] == doctest::Approx(2 * g1[i]).epsilon(1e-5).scale(1e-9));
  m.zero_grad();
  for (float v : grads_copy(m)) REQUIRE(v == 0.0f);
  // grad_scale multiplies the gradient
  m.forward(b.tok.data(), b.tgt.data(), 2, 8);
  m.backward(4.0f);
  auto g4 = grads_copy(m);
  for (size_t i = 0; i < g1.size(); ++i) REQUIRE(g4[i] == doctest::Approx(4 * g1[i]).epsilon(1e-5).scale(1e-9));
}

TEST_CASE("hooks run per buffer in forward and reverse order in backward") {
  Model m(tiny_gpt2());
  m.init_weights(1);
  std::vector<std::string> ev;
  m.set_hooks({[&](int i) { ev.push_back("f" + std::to_string(i)); },
               [&](int i) { ev.push_back("b" + std::to_string(i)); },
               [&](int i) { ev.push_back("a" + std::to_string(i)); }});
  Batch b = make_batch(1, 4, 32, 1);
  m.set_recompute(true);
  m.forward(b.tok.data(), b.tgt.data(), 1, 4);
  m.backward();
  std::vector<std::string> want = {"f-1", "f0", "f1", "f2", "b2", "a2", "b1", "a1", "b0", "a0", "b-1", "a-1"};
  CHECK(ev == want);
}

TEST_CASE("a tiny model overfits one batch with plain SGD") {
  for (auto cfg : {tiny_gpt2(), tiny_llama()}) {
    Model m(cfg);
    m.init_weights(42);
    Batch b = make_batch(2, 8, cfg.vocab_size, 43, false);
    float first = 0, last = 0;
    for (int step = 0; step < 50; ++step) {
      m.zero_grad();
      last = m.forward(b.tok.data(), b.tgt.data(), 2, 8);
      if (step == 0) first = last;
      m.backward();
      for (auto& pb : m.params())
        for (size_t i = 0; i < pb.size; ++i) pb.host_f32()[i] -= 0.5f * pb.grad[i];
    }
    MESSAGE(std::string(arch_name(cfg.arch)), ": loss ", first, " -> ", last);
    CHECK(last < 0.5f * first);
  }
}

TEST_CASE("bad input is rejected with UsageError") {
  Model m(tiny_gpt2());
  Batch b = make_batch(1, 8, 32, 1);
  CHECK_THROWS_AS(m.forward(b.tok.data(), b.tgt.data(), 1, 9), UsageError);  // T > max_seq_len
  CHECK_THROWS_AS(m.backward(), UsageError);
  b.tok[3] = 32;
  CHECK_THROWS_AS(m.forward(b.tok.data(), b.tgt.data(), 1, 8), UsageError);
  b.tok[3] = 0;
  b.tgt[3] = 40;
  CHECK_THROWS_AS(m.forward(b.tok.data(), b.tgt.data(), 1, 8), UsageError);
}

TEST_CASE("changing (B, T) between calls re-allocates and gives the same results as a fresh model") {
  ModelConfig cfg = tiny_llama(2);
  Batch big = make_batch(2, 8, 32, 50), small = make_batch(1, 5, 32, 51);
  Model fresh_big(cfg), fresh_small(cfg), m(cfg);
  for (Model* x : {&fresh_big, &fresh_small, &m}) x->init_weights(52);
  float want_big = fresh_big.forward(big.tok.data(), big.tgt.data(), 2, 8);
  float want_small = fresh_small.forward(small.tok.data(), small.tgt.data(), 1, 5);
  CHECK(m.forward(big.tok.data(), big.tgt.data(), 2, 8) == want_big);
  CHECK(m.forward(small.tok.data(), small.tgt.data(), 1, 5) == want_small);
  m.zero_grad();
  m.backward();
  fresh_small.zero_grad();
  fresh_small.backward();
  for (size_t i = 0; i < m.params().size(); ++i)
    CHECK(std::memcmp(m.params()[i].grad, fresh_small.params()[i].grad, m.params()[i].size * 4) == 0);
  CHECK(m.forward(big.tok.data(), big.tgt.data(), 2, 8) == want_big);
}

// ---------------------------------------------------------------------------
// Storage release (what the ZeRO engine does at stages 2-3): hooks lend working
// buffers, the results are those of a model owning its storage.

namespace {

size_t floats_of(Model& m, bool lora) {
  size_t n = 0;
  for (auto& pb : lora ? m.lora_params() : m.params()) n += pb.size;
  return n;
}

// The model's parameters and gradients with every array released and lent by hooks
// (parameters from `keep`, gradients into `wgrad`), like ZeRO stage 3.
void check_released_matches(const ModelConfig& cfg) {
  Model ref(cfg), m(cfg);
  ref.init_weights(5);
  m.init_weights(5);
  const size_t nb = m.params().size();
  std::vector<std::vector<float>> keep(nb), wgrad(nb);
  std::vector<size_t> all;
  for (size_t i = 0; i < nb; ++i) {
    keep[i].assign(m.params()[i].host_f32(), m.params()[i].host_f32() + m.params()[i].size);
    wgrad[i].assign(m.params()[i].size, 0.0f);
    all.push_back(i);
  }
  const size_t full = m.allocated_bytes();
  CHECK(full == 2 * 4 * floats_of(m, false));
  m.storage_release(true, all);
  CHECK(m.allocated_bytes() == 0);
  CHECK(m.storage_released());
  for (auto& pb : m.params()) CHECK((pb.data == nullptr && pb.grad == nullptr));

  const int B = 2, T = 6, L = cfg.n_layer;
  Batch b = make_batch(B, T, cfg.vocab_size, 8);
  // Without hooks the released buffers are missing: refused, not a crash.
  CHECK_THROWS_AS(m.forward(b.tok.data(), b.tgt.data(), B, T), UsageError);

  auto lend = [&](int l, bool grad) {
    for (size_t i : {static_cast<size_t>(l + 1), size_t{0}}) {
      if (i == 0 && l != -1 && !(l == L && cfg.tie_embeddings)) continue;
      m.params()[i].data = keep[i].data();
      if (grad) m.params()[i].grad = wgrad[i].data();
    }
  };
  auto take_back = [&](int l) {
    m.params()[static_cast<size_t>(l + 1)].data = nullptr;
    m.params()[static_cast<size_t>(l + 1)].grad = nullptr;
  };
  // Parameters only: backward finds no gradient storage and refuses.
  m.set_hooks({[&](int l) { lend(l, false); }, [&](int l) { lend(l, false); }, [&](int) {}});
  m.forward(b.tok.data(), b.tgt.data(), B, T);
  CHECK_THROWS_AS(m.backward(), UsageError);

  m.set_hooks({[&](int l) { lend(l, false); }, [&](int l) { lend(l, true); }, take_back});
  ref.zero_grad();
  const float want = ref.forward(b.tok.data(), b.tgt.data(), B, T);
  ref.backward();
  CHECK(m.forward(b.tok.data(), b.tgt.data(), B, T) == want);
  m.backward();
  for (size_t i = 0; i < nb; ++i) {
    CAPTURE(i);
    CHECK(std::memcmp(wgrad[i].data(), ref.params()[i].grad, wgrad[i].size() * sizeof(float)) == 0);
  }
  CHECK(m.allocated_bytes() == 0);

  // Whole again: zeroed storage of the right size, usable without hooks.
  m.set_hooks({});
  m.storage_restore();
  CHECK_FALSE(m.storage_released());
  CHECK(m.allocated_bytes() == full);
  for (auto& pb : m.params())
    for (size_t i = 0; i < pb.size; ++i) REQUIRE((pb.host_f32()[i] == 0.0f && pb.grad[i] == 0.0f));
  m.init_weights(5);
  CHECK(m.forward(b.tok.data(), b.tgt.data(), B, T) == want);
}

}  // namespace

TEST_CASE("storage release: with hooks lending the buffers, loss and gradients are unchanged (tied and untied)") {
  check_released_matches(tiny_gpt2());
  check_released_matches(tiny_llama(2));
}

TEST_CASE("storage release: exact byte accounting, partial restore, refusals") {
  Model m(tiny_llama(2));
  m.init_weights(1);
  const size_t full = m.allocated_bytes();
  const size_t n1 = m.params()[1].size * sizeof(float);
  m.storage_release(false, {1});
  CHECK(m.allocated_bytes() == full - n1);
  CHECK(m.param_released(1));
  CHECK_FALSE(m.param_released(0));
  CHECK(m.params()[1].data == nullptr);
  CHECK(m.params()[1].grad != nullptr);
  m.storage_release(false, {1});  // already released: no change
  CHECK(m.allocated_bytes() == full - n1);
  CHECK_THROWS_AS(m.storage_release(false, {m.params().size()}), UsageError);
  CHECK_THROWS_AS(m.init_weights(2), UsageError);
  CHECK_THROWS_AS(m.tensor(m.params()[1].layout.tensors[0].name), UsageError);
  CHECK(m.tensor(m.params()[0].layout.tensors[0].name).data != nullptr);
  LoraConfig lc;
  lc.targets = {"q_proj"};
  CHECK_THROWS_AS(m.lora_enable(lc), UsageError);
  m.storage_release(true, {});
  CHECK(m.grad_allocated_bytes() == 0);
  CHECK(m.param_allocated_bytes() == full / 2 - n1);
  m.zero_grad();  // nothing to zero, no crash
  m.storage_restore(true, {});
  CHECK(m.grad_allocated_bytes() == full / 2);
  CHECK(m.param_released(1));
  m.storage_restore(false, {1});
  CHECK(m.allocated_bytes() == full);
  CHECK_FALSE(m.storage_released());
  m.lora_enable(lc);  // whole again: allowed
  CHECK(m.lora_on());
}

TEST_CASE("storage release under LoRA frees the adapters' gradients; adapters index after the base buffers") {
  Model m(tiny_gpt2());
  m.init_weights(1);
  LoraConfig lc;
  lc.targets = {"c_attn"};
  m.lora_enable(lc);
  const size_t base = floats_of(m, false), ad = floats_of(m, true);
  CHECK(m.allocated_bytes() == 4 * (base + 2 * ad));  // base frozen: no gradient arrays
  const size_t nb = m.params().size();
  m.storage_release(true, {nb});  // the first adapter's parameters
  CHECK(m.grad_allocated_bytes() == 0);
  CHECK(m.param_allocated_bytes() == 4 * (base + ad - m.lora_params()[0].size));
  CHECK(m.lora_params()[0].data == nullptr);
  for (auto& pb : m.lora_params()) CHECK(pb.grad == nullptr);
  CHECK_THROWS_AS(m.lora_merge(), UsageError);
  m.storage_restore();
  CHECK(m.allocated_bytes() == 4 * (base + 2 * ad));
  for (auto& pb : m.lora_params()) CHECK(pb.grad != nullptr);
}

TEST_CASE("fused q/k/v and gate/up GEMMs give the losses and gradients of one GEMM per projection") {
  check_fused_equals_unfused(tiny_llama(2), false, true, true);       // GQA
  check_fused_equals_unfused(tiny_llama(1, true), true, true, true);  // MQA, tied, LoRA on all seven
  check_fused_equals_unfused(tiny_llama(4), true, true, true);
  ModelConfig q2 = tiny_llama(2);  // qwen2: the q/k/v biases (one vector after the weights) join the GEMM
  q2.arch = ModelConfig::Arch::QWEN2;
  q2.qkv_bias = true;
  check_fused_equals_unfused(q2, true, true, true);
  ModelConfig q3 = tiny_llama(2);  // qwen3: the per-head q/k norms read q and k dense
  q3.arch = ModelConfig::Arch::QWEN3;
  q3.qk_norm = true;
  check_fused_equals_unfused(q3, false, false, true);
  ModelConfig lb = tiny_llama(2);  // llama attention_bias and mlp_bias: every group with its biases
  lb.qkv_bias = lb.o_bias = lb.mlp_bias = true;
  check_fused_equals_unfused(lb, true, true, true);
  Model g(tiny_gpt2());  // GPT-2's c_attn is one weight already; there is no gate
  CHECK_FALSE(g.fused_qkv());
  CHECK_FALSE(g.fused_gate_up());
}
