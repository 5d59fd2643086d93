// Run plot: read metrics, events and the monitor's samples, lay out two or three panels, draw grid, ticks, lines, eval
// markers, restart / resize / resume markers and line-end labels into an indexed image,
// write the PNG.
#include "report/jsonl.h"
#include "report/plot.h"
#include "report/resource_status.h"
#include "report/round_history.h"

#include "core/check.h"
#include "report/font.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <tuple>

namespace fs = std::filesystem;

namespace dtrain::report {

namespace {

using nlohmann::json;

bool number(const json& j, const char* key, double* v) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number()) return false;
  *v = it->get<double>();
  return std::isfinite(*v);
}

constexpr int kScale = 2;  // text scale: 10x14-pixel glyphs

void line(Image& img, int x0, int y0, int x1, int y1, uint8_t c, int thick) {
  const int dx = std::abs(x1 - x0), dy = -std::abs(y1 - y0);
  const int sx = x0 < x1 ? 1 : -1, sy = y0 < y1 ? 1 : -1;
  int err = dx + dy;
  for (;;) {
    for (int t = 0; t < thick; ++t) {
      img.set(x0 + t, y0, c);
      img.set(x0, y0 + t, c);
    }
    if (x0 == x1 && y0 == y1) break;
    const int e2 = 2 * err;
    if (e2 >= dy) err += dy, x0 += sx;
    if (e2 <= dx) err += dx, y0 += sy;
  }
}

void rect_fill(Image& img, int x0, int y0, int x1, int y1, uint8_t c) {
  for (int y = y0; y <= y1; ++y)
    for (int x = x0; x <= x1; ++x) img.set(x, y, c);
}

// The data range of a panel: min..max padded by 5 %, never empty.
void fit_range(const std::vector<PlotPoint>& a, const std::vector<PlotPoint>& b, double* lo, double* hi) {
  *lo = INFINITY;
  *hi = -INFINITY;
  for (const auto* v : {&a, &b})
    for (const auto& p : *v) *lo = std::min(*lo, p.value), *hi = std::max(*hi, p.value);
  if (!std::isfinite(*lo)) *lo = 0, *hi = 1;
  if (*hi - *lo < 1e-12) {
    const double pad = std::max(std::abs(*lo) * 0.1, 1e-3);
    *lo -= pad;
    *hi += pad;
  } else {
    const double pad = (*hi - *lo) * 0.05;
    *lo -= pad;
    *hi += pad;
  }
}

void draw_series(Image& img, const PlotPanel& p, const std::vector<PlotPoint>& pts, uint8_t c, bool markers) {
  for (size_t i = 0; i < pts.size(); ++i) {
    const int x = p.px(static_cast<double>(pts[i].step)), y = p.py(pts[i].value);
    if (i > 0 && pts[i - 1].segment == pts[i].segment)
      line(img, p.px(static_cast<double>(pts[i - 1].step)), p.py(pts[i - 1].value), x, y, c, 2);
    if (markers || pts.size() == 1) rect_fill(img, x - 3, y - 3, x + 3, y + 3, c);
  }
}

// Grid, frame, tick labels and the panel title.
void draw_axes(Image& img, const PlotPanel& p, const std::string& title, bool x_labels) {
  const uint8_t grid = img.color(PLOT_GRID), ink = img.color(PLOT_INK);
  auto yt = plot_ticks(p.ymin, p.ymax, 6);
  const double ystep = yt.size() > 1 ? yt[1] - yt[0] : 1.0;
  for (double v : yt) {
    const int y = p.py(v);
    line(img, p.x0, y, p.x1, y, grid, 1);
    std::string s = plot_tick_label(v, ystep);
    text_draw(img, p.x0 - 8 - text_width(s, kScale), y - FONT_H * kScale / 2, s, ink, kScale);
  }
  auto xt = plot_ticks(p.xmin, p.xmax, 8);
  const double xstep = std::max(1.0, xt.size() > 1 ? xt[1] - xt[0] : 1.0);
  for (double v : xt) {
    if (v != std::floor(v)) continue;  // steps are whole numbers
    const int x = p.px(v);
    line(img, x, p.y0, x, p.y1, grid, 1);
    if (x_labels) {
      std::string s = plot_tick_label(v, xstep);
      text_draw(img, x - text_width(s, kScale) / 2, p.y1 + 8, s, ink, kScale);
    }
  }
  line(img, p.x0, p.y0, p.x1, p.y0, ink, 1);
  line(img, p.x0, p.y1, p.x1, p.y1, ink, 1);
  line(img, p.x0, p.y0, p.x0, p.y1, ink, 1);
  line(img, p.x1, p.y0, p.x1, p.y1, ink, 1);
  text_draw(img, p.x0, p.y0 - FONT_H * kScale - 6, title, ink, kScale);  // above the panel: no line hides it
}

// A training record's place in time: the step axis the resource samples are put on.
struct TimedStep {
  int64_t time_ms = 0, step = 0;
  int segment = 0;
};

// The monitor's samples as the four percentage lines (PlotResources), one point per monitor
// interval (the records' interval_s, 1 s without it), placed on the steps by `steps`.
PlotResources resources_read(const fs::path& dir, std::vector<TimedStep> steps) {
  PlotResources r;
  if (steps.size() < 2) return r;
  std::stable_sort(steps.begin(), steps.end(),
                   [](const TimedStep& a, const TimedStep& b) { return a.time_ms < b.time_ms; });
  struct Mean {
    double sum = 0;
    int n = 0;
    void add(double v) { sum += v, ++n; }
  };
  std::map<int64_t, std::array<Mean, 4>> buckets;  // by time bucket: cpu, mem, gpu, gpu_mem
  std::vector<json> records;
  double interval_ms = 0;
  for (const std::string& f : resource_files(dir.string()))
    for (json& j : read_jsonl(f)) {
      double v = 0;
      if (!is_resource_record(j) || !number(j, "time_ms", &v)) continue;
      if (number(j, "interval_s", &v)) interval_ms = std::max(interval_ms, v * 1e3);
      records.push_back(std::move(j));
    }
  const auto width = static_cast<int64_t>(std::max(1000.0, interval_ms));
  for (const json& j : records) {
    double t = 0, v = 0, total = 0;
    number(j, "time_ms", &t);
    std::array<Mean, 4>& b = buckets[static_cast<int64_t>(t) / width];
    if (number(j, "node_cpu_pct", &v)) b[0].add(v);
    if (number(j, "mem_available_bytes", &v) && number(j, "mem_total_bytes", &total) && total > 0)
      b[1].add(100.0 * (1.0 - v / total));
    if (number(j, "gpu_util_pct", &v)) b[2].add(v);
    if (number(j, "gpu_mem_used_bytes", &v) && number(j, "gpu_mem_total_bytes", &total) && total > 0)
      b[3].add(100.0 * v / total);
  }
  std::vector<PlotPoint>* lines[4] = {&r.cpu, &r.mem, &r.gpu, &r.gpu_mem};
  for (const auto& [bucket, means] : buckets) {
    const int64_t t = bucket * width + width / 2;
    // The last training record at or before t and the one after it.
    auto after =
        std::upper_bound(steps.begin(), steps.end(), t, [](int64_t x, const TimedStep& s) { return x < s.time_ms; });
    if (after == steps.begin() || after == steps.end()) continue;  // outside the logged steps
    const TimedStep& a = *(after - 1);
    const TimedStep& b = *after;
    double step = static_cast<double>(a.step);
    if (b.segment == a.segment && b.step > a.step && b.time_ms > a.time_ms)
      step += static_cast<double>(b.step - a.step) * static_cast<double>(t - a.time_ms) /
              static_cast<double>(b.time_ms - a.time_ms);
    for (int i = 0; i < 4; ++i)
      if (means[i].n > 0)
        lines[i]->push_back({static_cast<int64_t>(std::llround(step)), means[i].sum / means[i].n, a.segment});
  }
  return r;
}

}  // namespace

// ---------------------------------------------------------------------------

int PlotPanel::px(double x) const {
  const double t = xmax > xmin ? (x - xmin) / (xmax - xmin) : 0.5;
  return x0 + static_cast<int>(std::lround(t * (x1 - x0)));
}

int PlotPanel::py(double y) const {
  const double t = ymax > ymin ? (y - ymin) / (ymax - ymin) : 0.5;
  return y1 - static_cast<int>(std::lround(t * (y1 - y0)));
}

std::vector<double> plot_ticks(double lo, double hi, int target) {
  std::vector<double> out;
  if (!(hi > lo) || !std::isfinite(lo) || !std::isfinite(hi) || target < 1) return out;
  const double raw = (hi - lo) / target;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * mag >= raw) {
      step = m * mag;
      break;
    }
  for (double v = std::ceil(lo / step) * step; v <= hi + step * 1e-9; v += step)
    out.push_back(std::abs(v) < step * 1e-9 ? 0.0 : v);
  return out;
}

std::string plot_tick_label(double v, double step) {
  auto decimals = [](double s) { return std::max(0, static_cast<int>(std::ceil(-std::log10(s) - 1e-9))); };
  if (step < 1e-3 && v != 0) return fmt::format("{:.0E}", v);
  const double a = std::abs(v);
  if (a >= 1e6) return fmt::format("{:.{}f}M", v / 1e6, decimals(step / 1e6));
  if (a >= 1e4) return fmt::format("{:.{}f}K", v / 1e3, decimals(step / 1e3));
  return fmt::format("{:.{}f}", v, decimals(step));
}

PlotData plot_data_read(const std::string& run_dir) {
  const fs::path dir(run_dir);
  std::error_code ec;
  DT_ENFORCE(fs::is_directory(dir, ec), IoError, "{} is not a run directory (no such directory)", run_dir);
  PlotData d;
  d.title = fs::path(run_dir).lexically_normal().filename().string();
  if (d.title.empty()) d.title = fs::path(run_dir).lexically_normal().parent_path().filename().string();

  // The later rounds that ran, each to be marked at its first logged step.
  const RoundHistory rounds = round_history(read_jsonl(dir / "events.jsonl"));
  d.restarts = rounds.restarts;
  d.resizes = rounds.resizes;
  d.resumes = rounds.resumes;
  d.not_started = rounds.not_started;
  std::vector<RoundRecord> later;
  for (const RoundRecord& r : rounds.rounds)
    if (r.started && r.cause != RoundCause::FIRST) later.push_back(r);
  auto mark_of = [](const RoundRecord& r) {
    const PlotMarkKind k = r.cause == RoundCause::RESIZE   ? PlotMarkKind::RESIZE
                           : r.cause == RoundCause::RESUME ? PlotMarkKind::RESUME
                                                           : PlotMarkKind::RESTART;
    return PlotMark{0, k, r.number};
  };

  int segment = 0;
  int64_t prev_step = INT64_MIN;
  std::vector<TimedStep> timed_steps;
  size_t next_round = 0;
  bool timed = false;
  for (const json& m : read_jsonl(dir / "metrics.jsonl")) {
    double s = 0, v = 0, t = 0;
    if (!number(m, "step", &s)) continue;
    const auto step = static_cast<int64_t>(s);
    const bool train = number(m, "loss", &v);
    if (train) {
      std::optional<PlotMark> mark;
      if (number(m, "time_ms", &t)) {
        // Rounds that began by this record's time; several at once: the last one ran it.
        timed = true;
        while (next_round < later.size() && later[next_round].time_ms >= 0 &&
               static_cast<int64_t>(t) >= later[next_round].time_ms) {
          if (prev_step != INT64_MIN) mark = mark_of(later[next_round]);
          ++next_round;
        }
      } else if (!timed && prev_step != INT64_MIN && step <= prev_step) {
        // Untimed log: the step went back, so a restart or resume (the next such round
        // in events.jsonl names which; none recorded: a restart).
        while (next_round < later.size() && later[next_round].cause == RoundCause::RESIZE) ++next_round;
        if (next_round < later.size()) mark = mark_of(later[next_round++]);
        else mark = PlotMark{0, PlotMarkKind::RESTART, 0};
      }
      if (mark) {
        mark->step = step;
        if (mark->kind != PlotMarkKind::RESIZE) ++segment;  // a resize goes on at the next step
        d.marks.push_back(*mark);
      }
      prev_step = step;
      if (timed && number(m, "time_ms", &t)) timed_steps.push_back({static_cast<int64_t>(t), step, segment});
      d.train.push_back({step, v, segment});
      if (number(m, "tokens_per_s", &v)) d.tokens.push_back({step, v, segment});
    }
    if (number(m, "eval_loss", &v)) d.eval.push_back({step, v, segment});
  }
  DT_ENFORCE(!d.train.empty(), IoError, "{} holds no training step yet; nothing to plot",
             (dir / "metrics.jsonl").string());
  // Without events.jsonl, restarts are what the steps showed.
  int found = 0;
  for (PlotMark& k : d.marks)
    if (k.kind == PlotMarkKind::RESTART && k.number == 0) k.number = ++found + d.restarts;
  d.restarts += found;
  d.unplaced = std::max(0, static_cast<int>(later.size()) - (static_cast<int>(d.marks.size()) - found));
  d.resources = resources_read(dir, std::move(timed_steps));
  return d;
}

// ---------------------------------------------------------------------------
// Rendering

namespace {

// Margins: the title band above, x labels below, y labels left, line names right.
constexpr int kLeft = 110, kRightPad = 140, kTop = 64, kBottomPad = 60, kPanelGap = 44;

// Title band, loss panel (60 %), tokens panel, x labels; room right for names. With
// resource samples: loss 45 %, tokens 25 %, resources 30 %. Every panel spans the steps
// of every series.
PlotLayout plot_layout(const PlotData& data, const PlotOptions& opts) {
  const int left = kLeft, right = opts.width - kRightPad, top = kTop, bottom = opts.height - kBottomPad,
            gap = kPanelGap;
  const bool res = !data.resources.empty();
  const int span = bottom - top - (res ? 2 : 1) * gap;
  const int split = top + span * (res ? 45 : 60) / 100;
  const int split2 = res ? split + gap + span * 25 / 100 : bottom;
  PlotPanel loss{left, top, right, split}, tok{left, split + gap, right, split2}, rp{left, split2 + gap, right, bottom};
  int64_t smin = INT64_MAX, smax = INT64_MIN;
  for (const auto* v : {&data.train, &data.eval, &data.tokens})
    for (const auto& p : *v) smin = std::min(smin, p.step), smax = std::max(smax, p.step);
  if (smin > smax) smin = 0, smax = 1;
  if (smin == smax) --smin, ++smax;
  loss.xmin = tok.xmin = rp.xmin = static_cast<double>(smin);
  loss.xmax = tok.xmax = rp.xmax = static_cast<double>(smax);
  fit_range(data.train, data.eval, &loss.ymin, &loss.ymax);
  fit_range(data.tokens, {}, &tok.ymin, &tok.ymax);
  rp.ymin = 0, rp.ymax = 100;
  return {loss, tok, rp, res};
}

// "RUN <title>" with the counts of restarts, resizes and resumes.
void title_draw(Image& img, const PlotData& data, uint8_t ink) {
  std::string title = "RUN " + data.title;
  auto count = [&](int n, const char* what) {
    if (n > 0) title += fmt::format("  -  {} {}{}", n, what, n > 1 ? "S" : "");
  };
  count(data.restarts, "RESTART");
  if (data.not_started > 0) title += fmt::format(" ({} NOT STARTED)", data.not_started);
  count(data.resizes, "RESIZE");
  count(data.resumes, "RESUME");
  if (data.unplaced > 0) title += fmt::format("  -  {} AT UNKNOWN STEPS", data.unplaced);
  text_draw(img, kLeft, 10, title, ink, kScale);
}

// Later rounds: verticals through both panels in the kind's colour and dash pattern
// (restart dashed, resize dotted, resume dash-dotted), labels staggered so close ones
// stay legible.
void marks_draw(Image& img, const std::vector<PlotMark>& marks, const PlotLayout& l) {
  for (size_t i = 0; i < marks.size(); ++i) {
    const PlotMark& mk = marks[i];
    const bool restart = mk.kind == PlotMarkKind::RESTART, resize = mk.kind == PlotMarkKind::RESIZE;
    const uint8_t c = img.color(restart ? PLOT_RESTART : resize ? PLOT_RESIZE : PLOT_RESUME);
    auto ink_at = [&](int y) {
      if (restart) return (y / 6) % 2 == 0;                // 6 on, 6 off
      if (resize) return y % 6 < 2;                        // 2 on, 4 off
      return y % 16 < 8 || (y % 16 >= 11 && y % 16 < 13);  // dash, dot
    };
    const int x = l.loss.px(static_cast<double>(mk.step));
    for (const PlotPanel* p : {&l.loss, &l.tokens, &l.resources}) {
      if (p == &l.resources && !l.has_resources) continue;
      for (int y = p->y0; y <= p->y1; ++y)
        if (ink_at(y)) img.set(x, y, c), img.set(x + 1, y, c);
    }
    std::string label = fmt::format("{} {}", restart ? "RESTART" : resize ? "RESIZE" : "RESUME", mk.number);
    int lx = x + 6;
    if (lx + text_width(label, kScale) > l.loss.x1) lx = x - 6 - text_width(label, kScale);
    text_draw(img, lx, l.loss.y0 + 8 + static_cast<int>(i % 4) * 18, label, c, kScale);
  }
}

// A line's name at its right end, moved clear of avoid_y (another name's row); returns
// the row used, or -1000 for an empty line.
int end_label_draw(Image& img, const PlotPanel& p, const std::vector<PlotPoint>& pts, const std::string& name,
                   uint8_t c, int avoid_y) {
  if (pts.empty()) return -1000;
  int y = p.py(pts.back().value) - FONT_H * kScale / 2;
  if (std::abs(y - avoid_y) < FONT_H * kScale + 4) y = avoid_y + (y >= avoid_y ? 1 : -1) * (FONT_H * kScale + 4);
  y = std::clamp(y, p.y0, p.y1 - FONT_H * kScale);
  text_draw(img, std::max(p.px(static_cast<double>(pts.back().step)), p.x1) + 8, y, name, c, kScale);
  return y;
}

}  // namespace

Image plot_render(const PlotData& data, const PlotOptions& opts, PlotLayout* layout) {
  DT_ENFORCE(opts.width >= 400 && opts.height >= 300, ConfigError, "plot size {}x{} is too small; use at least 400x300",
             opts.width, opts.height);
  Image img(opts.width, opts.height, PLOT_BACKGROUND);
  const uint8_t ink = img.color(PLOT_INK), c_train = img.color(PLOT_TRAIN), c_eval = img.color(PLOT_EVAL),
                c_tok = img.color(PLOT_TOKENS);
  img.color(PLOT_GRID);

  const PlotLayout l = plot_layout(data, opts);
  const PlotPanel &loss = l.loss, &tok = l.tokens, &rp = l.resources;
  const bool res = l.has_resources;
  if (layout) *layout = l;

  title_draw(img, data, ink);
  draw_axes(img, loss, "LOSS", false);
  draw_axes(img, tok, "TOKENS/S", !res);
  if (res) draw_axes(img, rp, "RESOURCES %", true);
  const std::string xl = "STEP";
  text_draw(img, (loss.x0 + loss.x1) / 2 - text_width(xl, kScale) / 2, opts.height - kBottomPad + 34, xl, ink, kScale);
  marks_draw(img, data.marks, l);

  draw_series(img, loss, data.train, c_train, false);
  draw_series(img, loss, data.eval, c_eval, true);
  draw_series(img, tok, data.tokens, c_tok, false);
  const PlotResources& rs = data.resources;
  const uint8_t c_cpu = img.color(PLOT_CPU), c_mem = img.color(PLOT_MEM), c_gpu = img.color(PLOT_GPU),
                c_gmem = img.color(PLOT_GPU_MEM);
  if (res) {
    draw_series(img, rp, rs.cpu, c_cpu, false);
    draw_series(img, rp, rs.mem, c_mem, false);
    draw_series(img, rp, rs.gpu, c_gpu, false);
    draw_series(img, rp, rs.gpu_mem, c_gmem, false);
  }

  // Names at the right end of each line; the eval name moves clear of the train name.
  const int ty = end_label_draw(img, loss, data.train, "TRAIN", c_train, -1000);
  end_label_draw(img, loss, data.eval, "EVAL", c_eval, ty);
  end_label_draw(img, tok, data.tokens, "TOKENS/S", c_tok, -1000);
  if (res) {
    int y = -1000;
    for (auto [pts, name, c] : {std::tuple{&rs.cpu, "CPU", c_cpu}, std::tuple{&rs.mem, "MEM", c_mem},
                                std::tuple{&rs.gpu, "GPU", c_gpu}, std::tuple{&rs.gpu_mem, "GPU MEM", c_gmem}}) {
      const int yy = end_label_draw(img, rp, *pts, name, c, y);
      if (yy != -1000) y = yy;
    }
  }
  return img;
}

void plot_run(const std::string& run_dir, const std::string& out_png, const PlotOptions& opts) {
  png_write(plot_render(plot_data_read(run_dir), opts), out_png);
}

}  // namespace dtrain::report
