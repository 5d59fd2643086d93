// `dtrain plot RUN_DIR [-o FILE] [--force] [--width W --height H]`: writes a PNG chart of the
// run's metrics under the output rule (core/output_path.h): never one of the run's files,
// an existing file only when dtrain plotted it (or with --force), through a symlink.
#include "commands.h"

#include "core/output_path.h"
#include "report/plot.h"
#include "report/png.h"

#include <cstdio>
#include <filesystem>

namespace dtrain::cli {

int run_plot(const std::string& run_dir, const std::string& out_png, int width, int height, bool force) {
  namespace fs = std::filesystem;
  const fs::path run(run_dir);
  const std::string def = (run / "plot.png").string();
  const std::string out = out_png.empty() ? def : out_png;
  OutputRule rule;
  rule.what = out_png.empty() ? "plot (RUN_DIR/plot.png)" : "plot -o";
  // What the plot reads, and the run's other files: never its output, not even with --force.
  rule.inputs = {run_dir};
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(run, ec))
    if (e.path().filename() != "plot.png") rule.inputs.push_back(e.path().string());
  // The default name in the run directory: any PNG there is an older dtrain's plot.
  rule.own = [def](const std::string& target) { return report::png_is_dtrain_plot(target, same_path(target, def)); };
  rule.own_kind = "a dtrain plot (PNG)";
  rule.force = force;
  const OutputFile target = output_file_check(out, rule);
  report::PlotOptions opts;
  opts.width = width;
  opts.height = height;
  output_file_write(target, report::png_encode(report::plot_render(report::plot_data_read(run_dir), opts)));
  std::printf("wrote %s\n", out.c_str());
  return 0;
}

}  // namespace dtrain::cli
