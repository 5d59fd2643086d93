// bench_tokenizer TOKENIZER TEXTS.json [SECONDS]: encodes each string of TEXTS.json (a JSON
// array, as scripts/gen_tokenizer_text.py writes) with dtrain's tokenizer over and over for
// about SECONDS (default 5) on the calling thread and prints one JSON line with tokens/s, in
// the same shape as scripts/hf_tokenizer_ref.js --bench, plus nfc_seconds: the NFC step alone
// over the same passes. scripts/tokenizer_bench.sh runs both pinned to one core.
#include "data/tokenizer.h"
#include "data/unicode_nfc.h"

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <exception>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: bench_tokenizer TOKENIZER TEXTS.json [SECONDS]\n");
    return 2;
  }
  try {
    auto tok = dtrain::data::tokenizer_load(argv[1]);
    std::ifstream in(argv[2], std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "bench_tokenizer: cannot open '%s'\n", argv[2]);
      return 2;
    }
    std::ostringstream ss;
    ss << in.rdbuf();
    const auto texts = nlohmann::json::parse(ss.str()).get<std::vector<std::string>>();
    const double limit = argc > 3 ? std::stod(argv[3]) : 5.0;
    size_t tokens = 0, bytes = 0, passes = 0;
    const auto t0 = std::chrono::steady_clock::now();
    auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
    while (elapsed() < limit && passes < 1000) {
      for (const std::string& t : texts) {
        tokens += tok->encode(t).size();
        bytes += t.size();
      }
      ++passes;
    }
    const double s = elapsed();
    // The NFC step alone over the same passes (what a tokenizer.json NFC normalizer costs of
    // the encode time, measured in the same process under the same load).
    const auto n0 = std::chrono::steady_clock::now();
    size_t nfc_bytes = 0;
    for (size_t p = 0; p < passes; ++p)
      for (const std::string& t : texts) {
        std::string storage;
        nfc_bytes += dtrain::data::nfc_view(t, storage).size();
      }
    const double nfc_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - n0).count();
    std::printf(
        "{\"passes\":%zu,\"tokens\":%zu,\"bytes\":%zu,\"seconds\":%.3f,\"tokens_per_s\":%.0f,"
        "\"nfc_seconds\":%.4f,\"nfc_bytes\":%zu}\n",
        passes, tokens, bytes, s, tokens / s, nfc_s, nfc_bytes);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_tokenizer: %s\n", e.what());
    return 1;
  }
}
