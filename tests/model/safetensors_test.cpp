// safetensors: round trips of F32/BF16/F16 with metadata, headers checked byte for byte
// against the format spec (and huggingface/safetensors' own serialisation vectors),
// validation errors for each kind of damage, truncation and random corruption.
#include "temp_dir.h"
#include "model/safetensors.h"

#include "core/error.h"

#include <doctest/doctest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <unistd.h>
#include <vector>

using namespace dtrain;
using namespace dtrain::model;
namespace fs = std::filesystem;

namespace {

using dtrain::test::TempDir;

std::vector<uint8_t> slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

void spit(const fs::path& p, const std::vector<uint8_t>& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// Builds a file from a header string (padded or not, as given) and data bytes.
std::vector<uint8_t> make_file(const std::string& header, const std::vector<uint8_t>& data) {
  std::vector<uint8_t> out(8);
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>((n >> (8 * i)) & 0xff);
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

std::vector<uint8_t> f32_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> out(v.size() * 4);
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

std::string error_of(const fs::path& p) {
  try {
    SafetensorsFile f(p.string());
  } catch (const IoError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("round trip F32, BF16 and F16 with metadata") {
  TempDir dir;
  const fs::path path = dir.path / "model.safetensors";
  std::vector<float> a(6), scalar = {3.5f};
  for (size_t i = 0; i < a.size(); ++i) a[i] = 0.5f * static_cast<float>(i) - 1.0f;
  std::vector<uint16_t> b(12), c(5);
  for (size_t i = 0; i < b.size(); ++i) b[i] = f32_to_bf16(static_cast<float>(i) * 0.25f);
  for (size_t i = 0; i < c.size(); ++i) c[i] = f32_to_f16(-static_cast<float>(i) * 0.125f);
  const std::map<std::string, std::string> meta = {{"format", "pt"}, {"dtrain", "step=7 \"quoted\"\n"}};
  safetensors_write(path.string(),
                    {{"z.weight", DType::F32, {2, 3}, a.data()},
                     {"h.0.bias", DType::BF16, {3, 4}, b.data()},
                     {"emb", DType::F16, {5}, c.data()},
                     {"scale", DType::F32, {}, scalar.data()},
                     {"empty", DType::F32, {0, 4}, nullptr}},
                    meta);
  CHECK_FALSE(fs::exists(path.string() + ".tmp." + std::to_string(::getpid())));
  SafetensorsFile f(path.string());
  CHECK(f.metadata() == meta);
  // Data order: F32 tensors by name, then BF16, then F16 (huggingface's order).
  CHECK(f.names() == std::vector<std::string>{"empty", "scale", "z.weight", "h.0.bias", "emb"});
  CHECK(f.info("z.weight").shape == std::vector<int64_t>{2, 3});
  CHECK(f.info("h.0.bias").dtype_name == "BF16");
  CHECK(f.info("scale").numel() == 1);
  CHECK(f.info("empty").numel() == 0);
  DType dt;
  CHECK(f.info("emb").dtype(&dt));
  CHECK(dt == DType::F16);

  std::vector<float> got(6);
  f.read_f32("z.weight", got.data(), got.size());
  CHECK(got == a);
  got.resize(12);
  f.read_f32("h.0.bias", got.data(), got.size());
  for (size_t i = 0; i < 12; ++i) CHECK(got[i] == bf16_to_f32(b[i]));
  CHECK(std::memcmp(f.raw("h.0.bias"), b.data(), 24) == 0);
  got.resize(5);
  f.read_f32("emb", got.data(), got.size());
  for (size_t i = 0; i < 5; ++i) CHECK(got[i] == f16_to_f32(c[i]));
  float s = 0;
  f.read_f32("scale", &s, 1);
  CHECK(s == 3.5f);
  f.read_f32("empty", nullptr, 0);

  CHECK_THROWS_AS(f.read_f32("z.weight", got.data(), 5), IoError);
  CHECK_THROWS_AS(f.info("nope"), IoError);
  CHECK_FALSE(f.contains("nope"));
  SafetensorsFile moved = std::move(f);
  CHECK(moved.names().size() == 5);
}

TEST_CASE("header bytes follow the spec exactly") {
  // One F32 tensor [1,2,3]: huggingface/safetensors' test_serialization vector.
  const std::vector<float> v = {0, 1, 2, 3, 4, 5};
  const std::string json = R"({"attn.0":{"dtype":"F32","shape":[1,2,3],"data_offsets":[0,24]}})";
  REQUIRE(json.size() == 64);  // already a multiple of 8: no padding
  CHECK(safetensors_header({{"attn.0", DType::F32, {1, 2, 3}, v.data()}}, {}) == json);
  const std::vector<uint8_t> hf_vector = {
      64,  0,  0,   0,  0,   0,  0,   0,   123, 34,  97,  116, 116, 110, 46,  48, 34, 58, 123, 34, 100, 116, 121, 112,
      101, 34, 58,  34, 70,  51, 50,  34,  44,  34,  115, 104, 97,  112, 101, 34, 58, 91, 49,  44, 50,  44,  51,  93,
      44,  34, 100, 97, 116, 97, 95,  111, 102, 102, 115, 101, 116, 115, 34,  58, 91, 48, 44,  50, 52,  93,  125, 125,
      0,   0,  0,   0,  0,   0,  128, 63,  0,   0,   0,   64,  0,   0,   64,  64, 0,  0,  128, 64, 0,   0,   160, 64};
  CHECK(make_file(json, f32_bytes(v)) == hf_vector);
  TempDir dir;
  const fs::path p = dir.path / "a.safetensors";
  safetensors_write(p.string(), {{"attn.0", DType::F32, {1, 2, 3}, v.data()}});
  CHECK(slurp(p) == hf_vector);

  // Shorter name: 57 bytes of JSON padded with 7 spaces to 64.
  const std::string json2 = R"({"attn0":{"dtype":"F32","shape":[1,1,2,3],"data_offsets":[0,24]}})";
  CHECK(safetensors_header({{"attn0", DType::F32, {1, 1, 2, 3}, v.data()}}, {}) == json2 + std::string(7, ' '));
  safetensors_write(p.string(), {{"attn0", DType::F32, {1, 1, 2, 3}, v.data()}});
  CHECK(slurp(p) == make_file(json2 + std::string(7, ' '), f32_bytes(v)));

  // No tensors: "{}" + 6 spaces; with metadata {"framework": "pt"}: 35 bytes + 5 spaces.
  CHECK(safetensors_header({}, {}) == "{}      ");
  CHECK(safetensors_header({}, {{"framework", "pt"}}) ==
        std::string(R"({"__metadata__":{"framework":"pt"}})") + "     ");

  // Mixed dtypes: F32 first, then BF16, then F16, names sorted within a dtype.
  const uint16_t h[2] = {0x3c00, 0x4000};
  const std::string mixed = safetensors_header({{"b", DType::F16, {2}, h},
                                                {"c", DType::BF16, {1}, h},
                                                {"a", DType::F16, {1}, h},
                                                {"d", DType::F32, {}, v.data()}},
                                               {{"k", "v"}});
  std::string expect = R"({"__metadata__":{"k":"v"},"d":{"dtype":"F32","shape":[],"data_offsets":[0,4]},)"
                       R"("c":{"dtype":"BF16","shape":[1],"data_offsets":[4,6]},)"
                       R"("a":{"dtype":"F16","shape":[1],"data_offsets":[6,8]},)"
                       R"("b":{"dtype":"F16","shape":[2],"data_offsets":[8,12]}})";
  expect.append((8 - expect.size() % 8) % 8, ' ');
  CHECK(mixed == expect);
  CHECK(mixed.size() % 8 == 0);
}

TEST_CASE("writer rejects bad input") {
  TempDir dir;
  const float x = 1;
  const std::string p = (dir.path / "x.safetensors").string();
  CHECK_THROWS_AS(safetensors_write(p, {{"a", DType::F32, {}, &x}, {"a", DType::F32, {}, &x}}), InternalError);
  CHECK_THROWS_AS(safetensors_write(p, {{"", DType::F32, {}, &x}}), InternalError);
  CHECK_THROWS_AS(safetensors_write(p, {{"a", DType::F32, {-1}, &x}}), InternalError);
  CHECK_THROWS_AS(safetensors_write(p, {{"a", DType::F32, {1}, nullptr}}), InternalError);
  CHECK_THROWS_AS(safetensors_write((dir.path / "no" / "x.safetensors").string(), {{"a", DType::F32, {}, &x}}),
                  IoError);
  CHECK_FALSE(fs::exists(p));
}

TEST_CASE("reader accepts other dtypes and old offset orders, converts only floats") {
  TempDir dir;
  const fs::path p = dir.path / "i64.safetensors";
  // Tensors listed out of offset order (older writers); an I64 buffer.
  std::vector<uint8_t> data(16 + 8, 0);
  data[0] = 7;
  const float one = 1.0f;
  std::memcpy(data.data() + 16, &one, 4);
  spit(p, make_file(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[16,24]},)"
                    R"("pos":{"dtype":"I64","shape":[2],"data_offsets":[0,16]}})",
                    data));
  SafetensorsFile f(p.string());
  CHECK(f.names() == std::vector<std::string>{"pos", "w"});
  CHECK(f.info("pos").elem_size == 8);
  CHECK(f.raw("pos")[0] == 7);
  float w[2];
  f.read_f32("w", w, 2);
  CHECK(w[0] == 1.0f);
  std::vector<float> tmp(2);
  CHECK_THROWS_AS(f.read_f32("pos", tmp.data(), 2), IoError);
}

TEST_CASE("each kind of damage is a clean IoError naming the file and tensor") {
  TempDir dir;
  const fs::path p = dir.path / "bad.safetensors";
  const std::vector<uint8_t> d8(8, 0);
  struct Case {
    std::string header;
    std::vector<uint8_t> data;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})", d8, "JSON"},
      {R"([1,2])", {}, "start with"},
      {R"({"t":{"dtype":"Q4","shape":[2],"data_offsets":[0,8]}})", d8, "unknown dtype 'Q4'"},
      {R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", d8, "'t'"},
      {R"({"t":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", d8, "non-negative"},
      {R"({"t":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", d8, "non-negative"},
      {R"({"t":{"shape":[2],"data_offsets":[0,8]}})", d8, "dtype"},
      {R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", d8, "data_offsets"},
      {R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", d8, "end before begin"},
      {R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", std::vector<uint8_t>(12, 0), "cover 8"},
      {R"({"t":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", d8, "truncated"},
      {R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", d8, "gap"},
      {R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"u":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
       d8, "overlap"},
      {R"({"__metadata__":{"a":1},"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", d8, "__metadata__"},
      {R"({"t":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,8]}})", d8, "overflow"},
      {std::string("{\"t\xff\":{}}"), {}, "UTF-8"},
      // A key given twice: a JSON parser keeps the last one silently.
      {R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
       d8, "the header has the key 't' twice"},
      {R"({"t":{"dtype":"F32","dtype":"I32","shape":[2],"data_offsets":[0,8]}})", d8,
       "the header has the key 'dtype' (in the entry of 't') twice"},
      {R"({"__metadata__":{"a":"1","a":"2"},"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", d8,
       "'a' (in the entry of '__metadata__') twice"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.header);
    spit(p, make_file(c.header, c.data));
    const std::string err = error_of(p);
    CHECK(err.find(p.string()) != std::string::npos);
    CHECK(err.find(c.expect) != std::string::npos);
  }
  // Header length past the end of the file, and absurd header lengths.
  std::vector<uint8_t> f = make_file("{}      ", {});
  f[0] = 200;
  spit(p, f);
  CHECK(error_of(p).find("runs past the end") != std::string::npos);
  f[7] = 0xff;
  spit(p, f);
  CHECK(error_of(p).find("100 MB") != std::string::npos);
  spit(p, {1, 2, 3});
  CHECK(error_of(p).find("shorter") != std::string::npos);
  CHECK_THROWS_AS(SafetensorsFile((dir.path / "missing.safetensors").string()), ConfigError);  // the input rule
}

TEST_CASE("truncation at every 37th byte and random corruption never crash") {
  TempDir dir;
  const fs::path good = dir.path / "good.safetensors";
  std::vector<float> a(40);
  std::vector<uint16_t> b(33);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i);
  for (size_t i = 0; i < b.size(); ++i) b[i] = f32_to_bf16(static_cast<float>(i));
  safetensors_write(good.string(), {{"a", DType::F32, {5, 8}, a.data()}, {"b", DType::BF16, {3, 11}, b.data()}},
                    {{"k", "v"}});
  const std::vector<uint8_t> bytes = slurp(good);
  const fs::path p = dir.path / "cut.safetensors";
  int cuts = 0;
  for (size_t len = 0; len < bytes.size(); len += 37) {
    CAPTURE(len);
    spit(p, std::vector<uint8_t>(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(len)));
    CHECK_THROWS_AS(SafetensorsFile(p.string()), IoError);
    ++cuts;
  }
  CHECK(cuts > 5);

  std::mt19937 rng(12345);
  int opened = 0, rejected = 0;
  for (int iter = 0; iter < 400; ++iter) {
    std::vector<uint8_t> m = bytes;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < flips; ++k) {
      // Bias towards the length field and the header, where damage matters.
      const size_t limit = iter % 2 ? m.size() : std::min<size_t>(m.size(), 8 + 200);
      m[rng() % limit] = static_cast<uint8_t>(rng());
    }
    spit(p, m);
    try {
      SafetensorsFile f(p.string());
      for (const std::string& n : f.names()) {
        const StTensorInfo& info = f.info(n);
        DType dt;
        if (!info.dtype(&dt)) continue;
        std::vector<float> out(static_cast<size_t>(info.numel()));
        f.read_f32(n, out.data(), out.size());
      }
      ++opened;
    } catch (const Error&) {
      ++rejected;
    }
  }
  CHECK(opened > 0);
  CHECK(rejected > 0);
}
