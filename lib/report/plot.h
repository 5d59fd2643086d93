// `dtrain plot RUN_DIR`: a PNG chart of a run from metrics.jsonl and events.jsonl: the
// loss panel (train line, eval points) and the tokens/s panel over steps, with tick
// labels, restarts, elastic resizes and resumes as distinct labelled vertical lines and
// each line named at its right end.
#pragma once

#include "report/png.h"

#include <cstdint>
#include <string>
#include <vector>

namespace dtrain::report {

struct PlotPoint {
  int64_t step = 0;
  double value = 0.0;
  int segment = 0;  ///< consecutive points of one segment are joined; a restart or resume starts a new one
};

/// What began a later round (round_history.h's causes that have a first step to mark).
enum class PlotMarkKind {
  RESTART,  ///< after a failure: resumes from the last complete checkpoint (steps may repeat)
  RESIZE,   ///< an elastic job regrew at a checkpoint: resumes at the very next step
  RESUME    ///< `dtrain resume` started the run again
};

struct PlotMark {
  int64_t step = 0;  ///< the round's first logged step
  PlotMarkKind kind = PlotMarkKind::RESTART;
  int number = 0;  ///< the restart / resize / resume it is (1-based, as `dtrain status` counts)
};

/// The resource panel (the monitor's samples, RUN_DIR/resources/rank<R>.jsonl): percentages
/// over the whole job, each the mean of the samples of one monitor interval: node CPU, host
/// memory in use (1 - MemAvailable / MemTotal), GPU utilisation and GPU memory in use.
/// Samples are placed on the step axis by the training records' time_ms (interpolated
/// between two records, cut at a restart); samples outside the logged steps are left out.
struct PlotResources {
  std::vector<PlotPoint> cpu, mem, gpu, gpu_mem;
  bool empty() const { return cpu.empty() && mem.empty() && gpu.empty() && gpu_mem.empty(); }
};

/// What a run's files say, ready to draw.
struct PlotData {
  std::string title;                           ///< the run directory's name
  std::vector<PlotPoint> train;                ///< train loss per logged step
  std::vector<PlotPoint> eval;                 ///< eval loss
  std::vector<PlotPoint> tokens;               ///< tokens/s per logged step
  std::vector<PlotMark> marks;                 ///< where later rounds began, in log order
  int restarts = 0, resizes = 0, resumes = 0;  ///< totals (events.jsonl, or restart marks found without it)
  int not_started = 0;                         ///< rounds that could not start (no node ran: nothing to mark)
  int unplaced = 0;                            ///< later rounds that started but no step could be tied to
  PlotResources resources;                     ///< empty: no monitor samples (or no time_ms to place them)
};

/// Reads <run_dir>/metrics.jsonl (records with step + loss / eval_loss / tokens_per_s;
/// the monitor's files under resources/ for PlotResources;
/// malformed lines skipped) and <run_dir>/events.jsonl, whose rounds are classified by
/// round_history (report/round_history.h). A round after the first is marked at the first
/// metrics record whose "time_ms" is at or after its round_start event's time_ms when
/// records carry time_ms, else where the logged step goes backwards (a restart or resume
/// from an earlier checkpoint; a resize continues at the next step and cannot be found
/// that way). IoError when run_dir is missing or holds no training record.
PlotData plot_data_read(const std::string& run_dir);

struct PlotOptions {
  int width = 1200, height = 800;  ///< at least 400 x 300
};

/// Where a panel is on the image and which data range it shows (tests map data to pixels).
struct PlotPanel {
  int x0 = 0, y0 = 0, x1 = 0, y1 = 0;  ///< plot area, inclusive pixel bounds
  double xmin = 0, xmax = 1, ymin = 0, ymax = 1;
  int px(double x) const;
  int py(double y) const;
};

struct PlotLayout {
  PlotPanel loss, tokens;
  PlotPanel resources;  ///< drawn only when the data has resource samples
  bool has_resources = false;
};

/// The palette colours used (tests look for them). Markers also differ in dash pattern:
/// a restart is dashed, a resize dotted, a resume dash-dotted.
inline constexpr Rgb PLOT_TRAIN{31, 119, 180}, PLOT_EVAL{255, 127, 14}, PLOT_TOKENS{44, 160, 44},
    PLOT_RESTART{214, 39, 40}, PLOT_RESIZE{148, 103, 189}, PLOT_RESUME{140, 86, 75}, PLOT_GRID{225, 225, 225},
    PLOT_INK{40, 40, 40}, PLOT_BACKGROUND{255, 255, 255}, PLOT_CPU{23, 190, 207}, PLOT_MEM{127, 127, 127},
    PLOT_GPU{227, 119, 194}, PLOT_GPU_MEM{188, 189, 34};

/// Draws the chart. ConfigError for a size below 400x300 or above 16384.
Image plot_render(const PlotData& data, const PlotOptions& opts, PlotLayout* layout = nullptr);

/// plot_render(plot_data_read(run_dir)) written as a PNG to out_png.
void plot_run(const std::string& run_dir, const std::string& out_png, const PlotOptions& opts = {});

/// "Nice" tick values (1, 2, 5 x 10^k steps) covering [lo, hi], about `target` of them.
std::vector<double> plot_ticks(double lo, double hi, int target);

/// Tick label: "0.5", "12", "2.5K", "1.2M", "1E-04"; `step` is the tick spacing.
std::string plot_tick_label(double v, double step);

}  // namespace dtrain::report
