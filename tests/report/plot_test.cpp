// Run plot: CRC/Adler reference values, a minimal independent PNG reader (chunks, CRCs,
// inflate of stored and fixed-Huffman blocks) applied to a plot of a synthetic run,
// pixels of each line where the data puts them, restart markers, ticks, bad input;
// python3's zlib cross-checks the stream when python3 is installed.
#include "report/plot.h"

#include "core/error.h"
#include "report/font.h"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <unistd.h>

namespace fs = std::filesystem;
using namespace dtrain::report;

namespace {

// ---- a minimal PNG reader, independent of the writer

uint32_t be32(const std::string& s, size_t at) {
  return (uint32_t(uint8_t(s[at])) << 24) | (uint32_t(uint8_t(s[at + 1])) << 16) | (uint32_t(uint8_t(s[at + 2])) << 8) |
         uint32_t(uint8_t(s[at + 3]));
}

uint32_t crc_bitwise(const std::string& s) {  // bit by bit, no table: independent of png_crc32
  uint32_t c = 0xffffffffu;
  for (unsigned char b : s) {
    c ^= b;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xedb88320u & (0u - (c & 1u)));
  }
  return ~c;
}

struct BitReader {
  const std::string& s;
  size_t pos = 0;
  int bit = 0;
  uint32_t get(int n) {
    uint32_t v = 0;
    for (int i = 0; i < n; ++i) {
      if (pos >= s.size()) throw std::runtime_error("deflate stream ends early");
      v |= uint32_t((uint8_t(s[pos]) >> bit) & 1u) << i;
      if (++bit == 8) bit = 0, ++pos;
    }
    return v;
  }
  uint32_t get_rev(int n) {  // Huffman code bits, MSB first
    uint32_t v = 0;
    for (int i = 0; i < n; ++i) v = (v << 1) | get(1);
    return v;
  }
};

// Fixed-Huffman literal/length symbol: read 7 bits, then extend as the code table says.
int fixed_litlen(BitReader& br) {
  uint32_t c = br.get_rev(7);
  if (c <= 0x17) return int(c) + 256;
  c = (c << 1) | br.get(1);
  if (c >= 0x30 && c <= 0xbf) return int(c - 0x30);
  if (c >= 0xc0 && c <= 0xc7) return int(c - 0xc0) + 280;
  c = (c << 1) | br.get(1);
  REQUIRE(c >= 0x190);
  REQUIRE(c <= 0x1ff);
  return int(c - 0x190) + 144;
}

std::string inflate(const std::string& z) {
  REQUIRE(z.size() >= 6);
  REQUIRE((uint8_t(z[0]) * 256 + uint8_t(z[1])) % 31 == 0);
  REQUIRE((uint8_t(z[0]) & 0x0f) == 8);
  static const int lbase[] = {3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 15, 17, 19, 23, 27, 31, 35, 43, 51, 59, 67, 83, 99, 115, 131, 163, 195, 227, 258};
  static const int lext[] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0};
  static const int dbase[] = {1, 2, 3, 4, 5, 7, 9, 13, 17, 25, 33, 49, 65, 97, 129, 193, 257, 385, 513, 769, 1025, 1537, 2049, 3073, 4097, 6145, 8193, 12289, 16385, 24577};
  static const int dext[] = {0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13};
  std::string out;
  BitReader br{z, 2, 0};
  for (bool final = false; !final;) {
    final = br.get(1);
    uint32_t type = br.get(2);
    if (type == 0) {
      if (br.bit) br.bit = 0, ++br.pos;
      uint32_t len = uint8_t(z[br.pos]) | (uint8_t(z[br.pos + 1]) << 8);
      uint32_t nlen = uint8_t(z[br.pos + 2]) | (uint8_t(z[br.pos + 3]) << 8);
      REQUIRE((len ^ 0xffffu) == nlen);
      out += z.substr(br.pos + 4, len);
      br.pos += 4 + len;
    } else {
      REQUIRE(type == 1);  // the writer emits fixed-Huffman blocks only
      for (;;) {
        int sym = fixed_litlen(br);
        if (sym < 256) {
          out.push_back(char(sym));
        } else if (sym == 256) {
          break;
        } else {
          int l = sym - 257;
          REQUIRE(l < 29);
          int len = lbase[l] + int(br.get(lext[l]));
          int d = int(br.get_rev(5));
          REQUIRE(d < 30);
          size_t dist = size_t(dbase[d]) + br.get(dext[d]);
          if (dist > out.size()) throw std::runtime_error("distance beyond the output");
          for (int i = 0; i < len; ++i) out.push_back(out[out.size() - dist]);
        }
      }
    }
  }
  if (br.bit) ++br.pos;
  REQUIRE(br.pos + 4 == z.size());
  uint32_t a = 1, b = 0;
  for (unsigned char c : out) a = (a + c) % 65521, b = (b + a) % 65521;
  CHECK(be32(z, br.pos) == ((b << 16) | a));
  return out;
}

struct Decoded {
  int width = 0, height = 0;
  std::vector<Rgb> pixels;
  Rgb at(int x, int y) const { return pixels[size_t(y) * size_t(width) + size_t(x)]; }
};

Decoded png_decode(const std::string& png) {
  REQUIRE(png.size() > 8);
  REQUIRE(png.substr(0, 8) == std::string("\x89PNG\r\n\x1a\n", 8));
  Decoded d;
  std::vector<Rgb> palette;
  std::string idat;
  bool ended = false;
  int depth = 0, ctype = 0;
  for (size_t at = 8; at < png.size();) {
    REQUIRE(!ended);
    uint32_t len = be32(png, at);
    REQUIRE(at + 12 + len <= png.size());
    std::string type = png.substr(at + 4, 4), body = png.substr(at + 8, len);
    CHECK(be32(png, at + 8 + len) == crc_bitwise(type + body));
    if (type == "IHDR") {
      REQUIRE(len == 13);
      d.width = int(be32(body, 0));
      d.height = int(be32(body, 4));
      depth = uint8_t(body[8]);
      ctype = uint8_t(body[9]);
    } else if (type == "PLTE") {
      REQUIRE(len % 3 == 0);
      for (size_t i = 0; i < len; i += 3) palette.push_back({uint8_t(body[i]), uint8_t(body[i + 1]), uint8_t(body[i + 2])});
    } else if (type == "IDAT") {
      idat += body;
    } else if (type == "IEND") {
      ended = true;
    }
    at += 12 + len;
  }
  REQUIRE(ended);
  REQUIRE(depth == 8);
  REQUIRE(ctype == 3);
  std::string raw = inflate(idat);
  REQUIRE(raw.size() == size_t(d.height) * size_t(d.width + 1));
  for (int y = 0; y < d.height; ++y) {
    size_t row = size_t(y) * size_t(d.width + 1);
    REQUIRE(raw[row] == 0);
    for (int x = 0; x < d.width; ++x) {
      size_t idx = uint8_t(raw[row + 1 + size_t(x)]);
      if (idx >= palette.size()) throw std::runtime_error("pixel index beyond the palette");
      d.pixels.push_back(palette[idx]);
    }
  }
  return d;
}

// Any pixel of colour c within r pixels of (x, y).
bool near(const Decoded& d, int x, int y, Rgb c, int r) {
  for (int dy = -r; dy <= r; ++dy)
    for (int dx = -r; dx <= r; ++dx) {
      int xx = x + dx, yy = y + dy;
      if (xx >= 0 && yy >= 0 && xx < d.width && yy < d.height && d.at(xx, yy) == c) return true;
    }
  return false;
}

struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& n) : path(fs::temp_directory_path() / ("dtrain-plot-" + n + "-" + std::to_string(::getpid()))) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

double loss_at(int64_t s) { return 4.0 * std::exp(-double(s) / 60.0) + 1.0; }
double tps_at(int64_t s) { return 20000.0 + 3000.0 * std::sin(double(s) / 10.0); }

// 1..100 then a restart resuming at step 81 up to 150; eval every 25 steps.
void write_run(const fs::path& dir) {
  std::ofstream m(dir / "metrics.jsonl"), e(dir / "events.jsonl");
  e << R"({"time_ms":1000,"event":"round_start","round":0,"world_size":2})" << "\n";
  for (int64_t s = 1; s <= 100; ++s) m << nlohmann::json{{"step", s}, {"loss", loss_at(s)}, {"tokens_per_s", tps_at(s)}}.dump() << "\n";
  e << R"({"time_ms":2000,"event":"failure","round":0,"node":1,"why":"x","exit_code":137})" << "\n";
  e << R"({"time_ms":3000,"event":"round_start","round":1,"world_size":2})" << "\n";
  for (int64_t s = 81; s <= 150; ++s) {
    m << nlohmann::json{{"step", s}, {"loss", loss_at(s)}, {"tokens_per_s", tps_at(s)}}.dump() << "\n";
    if (s % 25 == 0) m << nlohmann::json{{"step", s}, {"eval_loss", loss_at(s) + 0.3}, {"eval_ppl", 9.0}}.dump() << "\n";
  }
  m << R"({"step":151,"loss":1.)" << "\n";  // being written
}

}  // namespace

TEST_CASE("png: checksums match reference values") {
  const std::string s = "123456789";
  CHECK(png_crc32(reinterpret_cast<const uint8_t*>(s.data()), s.size()) == 0xcbf43926u);
  CHECK(png_adler32(reinterpret_cast<const uint8_t*>(s.data()), s.size()) == 0x091e01deu);
  CHECK(png_crc32(reinterpret_cast<const uint8_t*>(s.data()), 4, png_crc32(reinterpret_cast<const uint8_t*>(s.data() + 0), 0)) ==
        crc_bitwise("1234"));
}

TEST_CASE("png: deflate round trip on awkward data") {
  std::string data;
  for (int i = 0; i < 200000; ++i) data.push_back(char((i * 7919) % 251 < 30 ? 0 : (i / 300) % 256));
  data += std::string(70000, 'x');  // runs across the 64 KiB block boundary
  auto z = zlib_compress(reinterpret_cast<const uint8_t*>(data.data()), data.size(), 301);
  CHECK(inflate(z) == data);
  auto e = zlib_compress(nullptr, 0, 0);
  CHECK(inflate(e).empty());
}

TEST_CASE("plot: a synthetic run draws where its data is") {
  TempDir d("run");
  write_run(d.path);
  PlotData data = plot_data_read(d.path.string());
  CHECK(data.train.size() == 170);
  CHECK(data.eval.size() == 3);
  CHECK(data.tokens.size() == 170);
  REQUIRE(data.restarts.size() == 1);
  CHECK(data.restarts[0] == 81);
  CHECK(data.restarts_unplaced == 0);
  CHECK(data.train[99].segment == 0);
  CHECK(data.train[100].segment == 1);

  PlotLayout lay;
  Image img = plot_render(data, PlotOptions{}, &lay);
  CHECK(img.width == 1200);
  CHECK(img.height == 800);
  const fs::path png_path = d.path / "plot.png";
  png_write(img, png_path.string());
  std::ifstream in(png_path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string bytes = ss.str();
  CHECK(bytes.size() < 200000);  // compressed: the raw image is 960 KB
  Decoded dec = png_decode(bytes);
  REQUIRE(dec.width == 1200);
  REQUIRE(dec.height == 800);

  std::set<Rgb> colours(dec.pixels.begin(), dec.pixels.end());
  CHECK(colours.size() >= 6);
  CHECK(colours.count(PLOT_TRAIN));
  CHECK(colours.count(PLOT_EVAL));
  CHECK(colours.count(PLOT_TOKENS));
  CHECK(colours.count(PLOT_RESTART));

  // Each line passes through its data points.
  for (int64_t s : {5, 40, 99, 120, 150}) {
    CAPTURE(s);
    CHECK(near(dec, lay.loss.px(double(s)), lay.loss.py(loss_at(s)), PLOT_TRAIN, 2));
    CHECK(near(dec, lay.tokens.px(double(s)), lay.tokens.py(tps_at(s)), PLOT_TOKENS, 2));
  }
  CHECK(near(dec, lay.loss.px(125), lay.loss.py(loss_at(125) + 0.3), PLOT_EVAL, 1));
  // The line is broken at the restart: nothing joins step 100 to step 81.
  const int xr = lay.loss.px(81);
  CHECK(near(dec, xr, (lay.loss.y0 + lay.loss.y1) / 2, PLOT_RESTART, 2));
  CHECK(near(dec, xr, (lay.tokens.y0 + lay.tokens.y1) / 2, PLOT_RESTART, 2));
  // Far from every line, the plot area is background or grid.
  const Rgb corner = dec.at(lay.loss.x1 - 3, lay.loss.y1 - 3);
  CHECK((corner == PLOT_BACKGROUND || corner == PLOT_GRID));
  // Line names sit right of the panels.
  bool train_label = false;
  for (int y = lay.loss.y0; y <= lay.loss.y1 && !train_label; ++y)
    for (int x = lay.loss.x1 + 4; x < dec.width && !train_label; ++x) train_label = dec.at(x, y) == PLOT_TRAIN;
  CHECK(train_label);

  // An independent inflater, where available, agrees (zlib's checks: adler, lengths).
  if (std::system("python3 -c 'import zlib' >/dev/null 2>&1") == 0) {
    const std::string py =
        "import sys,struct,zlib\n"
        "b=open(sys.argv[1],'rb').read(); i=8; idat=b''\n"
        "while i<len(b):\n"
        "  n=struct.unpack('>I',b[i:i+4])[0]; t=b[i+4:i+8]\n"
        "  assert zlib.crc32(b[i+4:i+8+n])==struct.unpack('>I',b[i+8+n:i+12+n])[0]\n"
        "  if t==b'IDAT': idat+=b[i+8:i+8+n]\n"
        "  i+=12+n\n"
        "assert len(zlib.decompress(idat))==800*1201\n";
    std::ofstream(d.path / "check.py") << py;
    std::string cmd = "python3 '" + (d.path / "check.py").string() + "' '" + png_path.string() + "'";
    CHECK(std::system(cmd.c_str()) == 0);
  }
}

TEST_CASE("plot: restarts from time_ms, unplaced restarts, single points") {
  TempDir d("timed");
  {
    std::ofstream m(d.path / "metrics.jsonl"), e(d.path / "events.jsonl");
    e << R"({"time_ms":100,"event":"round_start","round":0})" << "\n";
    e << R"({"time_ms":500,"event":"round_start","round":1})" << "\n";
    e << R"({"time_ms":900,"event":"round_start","round":2})" << "\n";
    for (int s = 1; s <= 10; ++s) m << nlohmann::json{{"step", s}, {"loss", 2.0}, {"time_ms", 100 + s * 50}}.dump() << "\n";
  }
  PlotData data = plot_data_read(d.path.string());
  REQUIRE(data.restarts.size() == 1);
  CHECK(data.restarts[0] == 8);  // first record at or after t=500
  CHECK(data.restarts_unplaced == 1);
  Image img = plot_render(data, PlotOptions{640, 400});
  CHECK(img.width == 640);

  TempDir one("one");
  std::ofstream(one.path / "metrics.jsonl") << R"({"step":1,"loss":3.0,"tokens_per_s":5})" << "\n";
  PlotLayout lay;
  Image i1 = plot_render(plot_data_read(one.path.string()), PlotOptions{}, &lay);
  CHECK(i1.at(lay.loss.px(1), lay.loss.py(3.0)) == i1.color(PLOT_TRAIN));
}

TEST_CASE("plot: bad input") {
  CHECK_THROWS_AS(plot_data_read("/nonexistent/run"), dtrain::IoError);
  TempDir d("empty");
  CHECK_THROWS_AS(plot_data_read(d.path.string()), dtrain::IoError);
  PlotData data;
  data.train.push_back({1, 1.0, 0});
  CHECK_THROWS_AS(plot_render(data, PlotOptions{100, 100}), dtrain::ConfigError);
  CHECK_THROWS_AS(png_write(Image(4, 4, PLOT_BACKGROUND), "/nonexistent/dir/x.png"), dtrain::IoError);
}

TEST_CASE("plot: ticks and labels") {
  auto t = plot_ticks(0.03, 0.97, 5);
  REQUIRE(t.size() == 4);
  CHECK(t[0] == doctest::Approx(0.2));
  CHECK(t[3] == doctest::Approx(0.8));
  CHECK(plot_ticks(1, 1, 5).empty());
  CHECK(plot_tick_label(0.5, 0.1) == "0.5");
  CHECK(plot_tick_label(12, 2) == "12");
  CHECK(plot_tick_label(25000, 5000) == "25K");
  CHECK(plot_tick_label(22500, 500) == "22.5K");
  CHECK(plot_tick_label(1.5e6, 5e5) == "1.5M");
  CHECK(plot_tick_label(2e-4, 1e-4) == "2E-04");
  for (char c : std::string("0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ .-+/:()%KME")) CHECK(font_has(c));
  CHECK(text_width("AB", 2) == 22);
}
