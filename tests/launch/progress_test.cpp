// Progress view over rank 0's progress records (read with the one record parser, as the
// supervisor reads them): TTY rendering (in place, ETA, restarts, the named metrics in
// short), plain rendering (the human line with share and ETA, no control characters),
// the straggler flag.
#include "launch/progress.h"

#include "report/progress_record.h"

#include <doctest/doctest.h>

#include <cmath>
#include <string>

using namespace dtrain::launch;
using dtrain::report::ProgressRecord;

namespace {

ProgressRecord rec(long long step, long long total, double loss, double lr, double gn, double scale, double tps,
                   double per_step, bool applied, double sent_bytes = -1.0, double comm_s = -1.0) {
  ProgressRecord r;
  r.step = step;
  r.total_steps = total;
  r.loss = loss;
  r.lr = lr;
  r.grad_norm = gn;
  r.loss_scale = scale;
  r.tokens_per_s = tps;
  r.step_time_s = per_step;
  r.skipped = !applied;
  r.comm_bytes_per_step = sent_bytes;
  r.comm_s_per_step = comm_s;
  return r;
}

// What the supervisor does with rank 0's line: the record parser, then the view.
std::string shown(ProgressView& v, const ProgressRecord& r) {
  std::string error;
  auto back = dtrain::report::progress_record_parse(dtrain::report::progress_record_line(r), &error);
  REQUIRE_MESSAGE(back.has_value(), error);
  std::string out;
  v.show(*back, &out);
  return out;
}

bool has_control(const std::string& s) {
  for (unsigned char c : s)
    if ((c < 0x20 && c != '\n') || c == 0x7f) return true;
  return false;
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("progress: durations") {
  CHECK(progress_format_duration(42.2) == "42s");
  CHECK(progress_format_duration(185) == "3m05s");
  CHECK(progress_format_duration(3720) == "1h02m");
  CHECK(progress_format_duration(90000) == "1d01h");
  CHECK(progress_format_duration(-1) == "?");
  CHECK(progress_format_duration(NAN) == "?");
}

TEST_CASE("progress: TTY view redraws one line in place") {
  ProgressView v(true, 2);
  CHECK(std::isnan(v.eta_seconds()));
  std::string out = shown(v, rec(10, 110, 2.5, 3e-4, 0.5, 1024, 20000, 2.0, true));
  CHECK(out.rfind("\r\x1b[2K", 0) == 0);
  CHECK(out.find('\n') == std::string::npos);
  CHECK(has(out, "step 10/110 (9%)"));
  CHECK(has(out, "loss 2.5000"));
  CHECK(has(out, "20.0k tok/s"));
  CHECK(has(out, "ETA 3m20s"));  // 100 steps x 2.0 s
  CHECK(has(out, "restarts 2"));
  CHECK(has(out, "scale 1024"));
  CHECK(v.eta_seconds() == doctest::Approx(200.0));

  // The ETA follows a smoothed step time: 0.7 * 2.0 + 0.3 * 1.0 = 1.7 s over 90 steps.
  shown(v, rec(20, 110, 2.4, 3e-4, 0.5, 1024, 20000, 1.0, true));
  CHECK(v.eta_seconds() == doctest::Approx(90 * 1.7));

  // Other output first ends the status line, so it is not overwritten.
  CHECK(v.interrupt() == "\n");
  CHECK(v.interrupt() == "");

  // Several ranks: the bytes sent and the collectives' time; a skipped step is marked.
  out = shown(v, rec(30, 110, 2.3, 3e-4, 0.5, 1024, 20000, 1.0, false, 242371, 0.041));
  CHECK(has(out, "sent 0.24 MB/step, comm 41 ms"));
  CHECK(has(out, "| skipped"));

  // The last step stays on screen.
  out = shown(v, rec(110, 110, 2.0, 3e-4, 0.5, 1024, 20000, 1.0, true));
  CHECK(out.back() == '\n');
  CHECK(has(out, "ETA 0s"));
  CHECK(v.interrupt() == "");
}

TEST_CASE("progress: plain view writes the human line with percentage and ETA, without control characters") {
  ProgressView v(false, 0);
  const ProgressRecord r = rec(5, 50, 3.25, 1e-4, 1.25, 1, 512, 0.25, true);
  const std::string line = dtrain::report::progress_line(r);
  CHECK(line == "step 5/50 | loss 3.2500 | lr 1.0e-04 | grad_norm 1.250 | loss_scale 1 | tokens/s 512 | 0.25 s/step");
  CHECK(shown(v, r) ==
        line + " | 10% | ETA 11s\n");  // 45 steps left at 0.25 s/step (issue 44: sbatch logs had neither)
  v.set_restarts(1);
  CHECK(shown(v, r) == line + " | 10% | ETA 11s | restarts 1\n");
  CHECK(v.interrupt() == "");
  for (int i = 1; i <= 50; ++i) {
    const std::string out = shown(v, rec(i, 50, 3.0, 1e-4, 1, 1, 512, 0.25, i % 7 != 0, i % 2 ? 1e6 : -1, 0.01));
    CHECK_FALSE(has_control(out));
    CHECK(out.back() == '\n');
  }
}

TEST_CASE("progress: a record's named metrics show on the live line, in short on a TTY and in full in plain view") {
  ProgressRecord r = rec(20, 100, 0.4512, 5e-6, 3.5, 1, 900, 0.5, true);
  r.metrics = {{"rewards/chosen", 0.5123},  {"rewards/rejected", -0.6812}, {"rewards/accuracies", 14.0 / 15.0},
               {"rewards/margins", 1.1935}, {"logps/chosen", -123.456},    {"logps/rejected", -150.25}};
  ProgressView tty(true, 0);
  const std::string t = shown(tty, r);
  CAPTURE(t);
  CHECK(has(t,
            "| gnorm 3.500 | chosen 0.512 rejected -0.681 acc 0.933 margin 1.19 logp_chosen -123 "
            "logp_rejected -150"));
  CHECK_FALSE(has_control(t.substr(5)));  // after the redraw prefix

  ProgressView plain(false, 0);
  const std::string p = shown(plain, r);
  CAPTURE(p);
  CHECK(has(p,
            "| 0.50 s/step | rewards/chosen 0.5123 | rewards/rejected -0.6812 | rewards/accuracies 0.9333 | "
            "rewards/margins 1.1935 | logps/chosen -123.4560 | logps/rejected -150.2500 | 20% | ETA 40s\n"));
  CHECK_FALSE(has_control(p));

  // SFT: no metrics, nothing more on the line.
  ProgressView plain2(false, 0);
  r.metrics.clear();
  CHECK(shown(plain2, r) == dtrain::report::progress_line(r) + " | 20% | ETA 40s\n");
}

TEST_CASE("progress: a straggler flag shows on every progress line until cleared, on a TTY and in plain view") {
  for (bool tty : {true, false}) {
    CAPTURE(tty);
    ProgressView v(tty, 0);
    v.set_flag("straggler rank 2 (node3) 3.1x");
    CHECK(has(shown(v, rec(5, 50, 3.25, 1e-4, 1.25, 1, 512, 0.25, true)), "| straggler rank 2 (node3) 3.1x"));
    v.set_flag("");
    CHECK_FALSE(has(shown(v, rec(6, 50, 3.25, 1e-4, 1.25, 1, 512, 0.25, true)), "straggler"));
  }
}
