// Run plot: CRC/Adler reference values, a minimal independent PNG reader (chunks, CRCs,
// inflate of stored and fixed-Huffman blocks) applied to a plot of a synthetic run,
// pixels of each line where the data puts them, restart markers apart from elastic
// resize markers, ticks, bad input; python3's zlib cross-checks the stream when python3
// is installed.
#include "temp_dir.h"
#include "report/plot.h"

#include "core/error.h"
#include "report/font.h"
#include "report/png_reader.h"

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
using namespace dtrain::test;

namespace {

// Any pixel of colour c within r pixels of (x, y).
bool near(const Decoded& d, int x, int y, Rgb c, int r) {
  for (int dy = -r; dy <= r; ++dy)
    for (int dx = -r; dx <= r; ++dx) {
      int xx = x + dx, yy = y + dy;
      if (xx >= 0 && yy >= 0 && xx < d.width && yy < d.height && d.at(xx, yy) == c) return true;
    }
  return false;
}

using dtrain::test::TempDir;

// Writes img as a PNG at path with the code under test and returns the file's bytes.
std::string png_file(const Image& img, const fs::path& path) {
  png_write(img, path.string());
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

double loss_at(int64_t s) { return 4.0 * std::exp(-double(s) / 60.0) + 1.0; }
double tps_at(int64_t s) { return 20000.0 + 3000.0 * std::sin(double(s) / 10.0); }

// 1..100 then a restart resuming at step 81 up to 150; eval every 25 steps.
void write_run(const fs::path& dir) {
  std::ofstream m(dir / "metrics.jsonl"), e(dir / "events.jsonl");
  e << R"({"time_ms":1000,"event":"round_start","round":0,"world_size":2})"
    << "\n";
  for (int64_t s = 1; s <= 100; ++s)
    m << nlohmann::json{{"step", s}, {"loss", loss_at(s)}, {"tokens_per_s", tps_at(s)}}.dump() << "\n";
  e << R"({"time_ms":2000,"event":"failure","round":0,"node":1,"why":"x","exit_code":137})"
    << "\n";
  e << R"({"time_ms":3000,"event":"round_start","round":1,"world_size":2})"
    << "\n";
  for (int64_t s = 81; s <= 150; ++s) {
    m << nlohmann::json{{"step", s}, {"loss", loss_at(s)}, {"tokens_per_s", tps_at(s)}}.dump() << "\n";
    if (s % 25 == 0)
      m << nlohmann::json{{"step", s}, {"eval_loss", loss_at(s) + 0.3}, {"eval_ppl", 9.0}}.dump() << "\n";
  }
  m << R"({"step":151,"loss":1.)"
    << "\n";  // being written
}

}  // namespace

TEST_CASE("png: deflate round trip on awkward data") {
  std::string data;
  for (int i = 0; i < 200000; ++i) data.push_back(char((i * 7919) % 251 < 30 ? 0 : (i / 300) % 256));
  data += std::string(70000, 'x');  // runs across the 64 KiB block boundary
  auto z = zlib_compress(reinterpret_cast<const uint8_t*>(data.data()), data.size());
  CHECK(inflate(z) == data);
  auto e = zlib_compress(nullptr, 0);
  CHECK(inflate(e).empty());
}

TEST_CASE("plot: a synthetic run draws where its data is") {
  TempDir d("run");
  write_run(d.path);
  PlotData data = plot_data_read(d.path.string());
  CHECK(data.train.size() == 170);
  CHECK(data.eval.size() == 3);
  CHECK(data.tokens.size() == 170);
  REQUIRE(data.marks.size() == 1);
  CHECK(data.marks[0].step == 81);
  CHECK(data.marks[0].kind == PlotMarkKind::RESTART);
  CHECK(data.marks[0].number == 1);
  CHECK(data.restarts == 1);
  CHECK(data.unplaced == 0);
  CHECK(data.train[99].segment == 0);
  CHECK(data.train[100].segment == 1);

  PlotLayout lay;
  Image img = plot_render(data, PlotOptions{}, &lay);
  CHECK(img.width == 1200);
  CHECK(img.height == 800);
  const fs::path png_path = d.path / "plot.png";
  const std::string bytes = png_file(img, png_path);
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
    e << R"({"time_ms":100,"event":"round_start","round":0})"
      << "\n";
    e << R"({"time_ms":500,"event":"round_start","round":1})"
      << "\n";
    e << R"({"time_ms":900,"event":"round_start","round":2})"
      << "\n";
    for (int s = 1; s <= 10; ++s)
      m << nlohmann::json{{"step", s}, {"loss", 2.0}, {"time_ms", 100 + s * 50}}.dump() << "\n";
  }
  PlotData data = plot_data_read(d.path.string());
  REQUIRE(data.marks.size() == 1);
  CHECK(data.marks[0].step == 8);  // first record at or after t=500
  CHECK(data.marks[0].number == 1);
  CHECK(data.restarts == 2);
  CHECK(data.unplaced == 1);
  Image img = plot_render(data, PlotOptions{640, 400});
  CHECK(img.width == 640);

  TempDir one("one");
  std::ofstream(one.path / "metrics.jsonl") << R"({"step":1,"loss":3.0,"tokens_per_s":5})"
                                            << "\n";
  PlotLayout lay;
  Image i1 = plot_render(plot_data_read(one.path.string()), PlotOptions{}, &lay);
  CHECK(i1.at(lay.loss.px(1), lay.loss.py(3.0)) == i1.color(PLOT_TRAIN));
}

TEST_CASE("plot: an elastic resize is marked apart from a restart; a round that could not start is counted") {
  TempDir d("resize");
  {
    // Round 0: steps 1..40, fails; round 1 cannot start (too few hosts); round 2 resumes
    // from step 31 and stops at its checkpoint at step 60 to take a host back (resize);
    // round 3 goes on at step 61.
    std::ofstream m(d.path / "metrics.jsonl"), e(d.path / "events.jsonl");
    e << R"({"time_ms":1000,"event":"round_start","round":0,"world_size":3})"
      << "\n"
      << R"({"time_ms":1500,"event":"failure","round":0,"node":2,"why":"lost","exit_code":4,"retry":true})"
      << "\n"
      << R"({"time_ms":1600,"event":"membership","round":1,"hosts":[],"changes":[],"problem":"too few"})"
      << "\n"
      << R"({"time_ms":1600,"event":"round_not_started","round":1,"why":"too few"})"
      << "\n"
      << R"({"time_ms":1600,"event":"failure","round":1,"node":-1,"why":"too few","exit_code":4,"retry":true})"
      << "\n"
      << R"({"time_ms":2000,"event":"round_start","round":2,"world_size":2})"
      << "\n"
      << R"({"time_ms":2400,"event":"resize","round":2,"step":60,"why":"n3 passed the probe again"})"
      << "\n"
      << R"({"time_ms":3000,"event":"round_start","round":3,"world_size":3})"
      << "\n"
      << R"({"time_ms":3500,"event":"finished","round":3})"
      << "\n";
    auto rec = [&](int64_t s, int64_t t) {
      m << nlohmann::json{{"step", s}, {"loss", loss_at(s)}, {"tokens_per_s", tps_at(s)}, {"time_ms", t}}.dump()
        << "\n";
    };
    for (int64_t s = 1; s <= 40; ++s) rec(s, 1000 + 10 * s);
    for (int64_t s = 31; s <= 60; ++s) rec(s, 2000 + 10 * (s - 30));
    for (int64_t s = 61; s <= 100; ++s) rec(s, 3000 + 10 * (s - 60));
  }
  PlotData data = plot_data_read(d.path.string());
  REQUIRE(data.marks.size() == 2);
  CHECK(data.marks[0].step == 31);
  CHECK(data.marks[0].kind == PlotMarkKind::RESTART);
  CHECK(data.marks[0].number == 2);  // restart 1 was the round that could not start
  CHECK(data.marks[1].step == 61);
  CHECK(data.marks[1].kind == PlotMarkKind::RESIZE);
  CHECK(data.marks[1].number == 1);
  CHECK(data.restarts == 2);
  CHECK(data.not_started == 1);
  CHECK(data.resizes == 1);
  CHECK(data.resumes == 0);
  CHECK(data.unplaced == 0);
  // The restart breaks the line (steps went back); the resize does not (no step lost).
  CHECK(data.train[39].segment == 0);
  CHECK(data.train[40].segment == 1);
  CHECK(data.train[70].segment == 1);

  PlotLayout lay;
  const Decoded dec = png_decode(png_file(plot_render(data, PlotOptions{}, &lay), d.path / "plot.png"));
  // Count each marker colour down a marker's column (both panels, 2 px wide).
  auto column = [&](int64_t step, Rgb c) {
    const int x = lay.loss.px(double(step));
    int n = 0;
    for (const PlotPanel* p : {&lay.loss, &lay.tokens})
      for (int y = p->y0 + 1; y < p->y1; ++y) n += dec.at(x, y) == c || dec.at(x + 1, y) == c;
    return n;
  };
  const int panel_px = (lay.loss.y1 - lay.loss.y0 - 1) + (lay.tokens.y1 - lay.tokens.y0 - 1);
  CAPTURE(panel_px);
  CHECK(column(31, PLOT_RESTART) > panel_px / 3);
  CHECK(column(31, PLOT_RESIZE) == 0);
  CHECK(column(61, PLOT_RESIZE) > panel_px / 5);
  CHECK(column(61, PLOT_RESTART) == 0);
  // The patterns differ too: a restart is dashed (half inked), a resize dotted (a third).
  CHECK(column(61, PLOT_RESIZE) < column(31, PLOT_RESTART));
  // The train line joins step 60 to 61 across the resize.
  CHECK(near(dec, lay.loss.px(60.5), lay.loss.py((loss_at(60) + loss_at(61)) / 2), PLOT_TRAIN, 2));

  // Untimed records: a step going back is the next restart or resume events.jsonl names;
  // a resize (no step goes back) cannot be placed and is counted as unplaced.
  TempDir u("untimed");
  {
    std::ofstream m(u.path / "metrics.jsonl"), e(u.path / "events.jsonl");
    e << R"({"time_ms":1,"event":"round_start","round":0})"
      << "\n"
      << R"({"time_ms":2,"event":"resize","round":0,"step":10})"
      << "\n"
      << R"({"time_ms":3,"event":"round_start","round":1})"
      << "\n"
      << R"({"time_ms":4,"event":"failure","round":1,"retry":false})"
      << "\n"
      << R"({"time_ms":5,"event":"round_start","round":0})"
      << "\n";
    for (int64_t s : {1, 5, 10, 11, 15, 11, 20}) m << nlohmann::json{{"step", s}, {"loss", loss_at(s)}}.dump() << "\n";
  }
  PlotData ud = plot_data_read(u.path.string());
  REQUIRE(ud.marks.size() == 1);
  CHECK(ud.marks[0].step == 11);
  CHECK(ud.marks[0].kind == PlotMarkKind::RESUME);
  CHECK(ud.marks[0].number == 1);
  CHECK(ud.resizes == 1);
  CHECK(ud.unplaced == 1);
  Image ui = plot_render(ud, PlotOptions{});
  CHECK(ui.width == 1200);
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

TEST_CASE("plot: the monitor's samples make a resource panel on the step axis") {
  TempDir d("res");
  {
    std::ofstream m(d.path / "metrics.jsonl");
    for (int s = 1; s <= 50; ++s)  // one step every 100 ms from t = 10 s
      m << nlohmann::json{{"step", s}, {"loss", loss_at(s)}, {"tokens_per_s", tps_at(s)}, {"time_ms", 9900 + 100 * s}}
               .dump()
        << "\n";
  }
  fs::create_directories(d.path / "resources");
  for (int rank : {0, 1}) {
    std::ofstream r(d.path / "resources" / ("rank" + std::to_string(rank) + ".jsonl"));
    for (int64_t t = 10000; t <= 15000; t += 1000)
      r << nlohmann::json{{"kind", "resource"},
                          {"time_ms", t + rank * 10},
                          {"rank", rank},
                          {"node", rank},
                          {"interval_s", 1.0},
                          {"node_cpu_pct", rank == 0 ? 40.0 : 60.0},
                          {"mem_available_bytes", 6},
                          {"mem_total_bytes", 8},
                          {"gpu_util_pct", 90.0},
                          {"gpu_mem_used_bytes", 30},
                          {"gpu_mem_total_bytes", 80}}
               .dump()
        << "\n";
    r << R"({"kind":"resource","time_ms":20000,"node_cpu_pct":5})"
      << "\n";  // after the last step: left out
    r << R"({"step":3,"loss":1.0})"
      << "\n";  // not a resource record
  }
  PlotData data = plot_data_read(d.path.string());
  const PlotResources& rs = data.resources;
  REQUIRE(rs.cpu.size() == 5);  // buckets 10..14 s; the 15 s bucket's centre is past step 50
  CHECK(rs.mem.size() == 5);
  CHECK(rs.gpu.size() == 5);
  CHECK(rs.gpu_mem.size() == 5);
  for (size_t i = 0; i < rs.cpu.size(); ++i) {
    CAPTURE(i);
    CHECK(rs.cpu[i].value == doctest::Approx(50.0));  // the two nodes' mean
    CHECK(rs.mem[i].value == doctest::Approx(25.0));
    CHECK(rs.gpu[i].value == doctest::Approx(90.0));
    CHECK(rs.gpu_mem[i].value == doctest::Approx(37.5));
    // the bucket's centre (10.5 s, 11.5 s, ...) between the steps logged around it
    CHECK(rs.cpu[i].step == 6 + 10 * static_cast<int64_t>(i));
  }

  PlotLayout lay;
  Image img = plot_render(data, PlotOptions{}, &lay);
  REQUIRE(lay.has_resources);
  CHECK(lay.resources.y0 > lay.tokens.y1);
  const fs::path png_path = d.path / "plot.png";
  Decoded dec = png_decode(png_file(img, png_path));
  for (size_t i : {1, 3}) {
    const int x = lay.resources.px(double(rs.cpu[i].step));
    CHECK(near(dec, x, lay.resources.py(50.0), PLOT_CPU, 2));
    CHECK(near(dec, x, lay.resources.py(25.0), PLOT_MEM, 2));
    CHECK(near(dec, x, lay.resources.py(90.0), PLOT_GPU, 2));
    CHECK(near(dec, x, lay.resources.py(37.5), PLOT_GPU_MEM, 2));
  }

  // Without samples there is no third panel.
  fs::remove_all(d.path / "resources");
  PlotData plain = plot_data_read(d.path.string());
  CHECK(plain.resources.empty());
  plot_render(plain, PlotOptions{}, &lay);
  CHECK_FALSE(lay.has_resources);
}
