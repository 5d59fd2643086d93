// `dtrain plot RUN_DIR [-o FILE] [--size WxH]`: writes a PNG chart of the run's metrics.
#include "commands.h"

#include "report/plot.h"

#include <cstdio>
#include <filesystem>

namespace dtrain::cli {

int run_plot(const std::string& run_dir, const std::string& out_png, int width, int height) {
  const std::string out = out_png.empty() ? (std::filesystem::path(run_dir) / "plot.png").string() : out_png;
  report::PlotOptions opts;
  opts.width = width;
  opts.height = height;
  report::plot_run(run_dir, out, opts);
  std::printf("wrote %s\n", out.c_str());
  return 0;
}

}  // namespace dtrain::cli
