// Progress view: parsing the trainer's exact progress line, TTY rendering (in place,
// ETA, restarts) and plain rendering without control characters.
#include "launch/progress.h"

#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>

using namespace dtrain::launch;

namespace {

// The trainer's format string (lib/train/trainer.cpp), so a change there fails here.
// comm_mb < 0: one rank (no "sent"/"comm" fields).
std::string trainer_line(long long step, long long total, double loss, double lr, double gn, double scale, double tps,
                         double per_step, bool applied, double comm_mb = -1.0, double comm_ms = 0.0) {
  char comm_part[96] = "";
  if (comm_mb >= 0)
    std::snprintf(comm_part, sizeof comm_part, " | sent %.3f MB/step | comm %.1f ms/step", comm_mb, comm_ms);
  char buf[512];
  std::snprintf(
      buf, sizeof buf,
      "step %lld/%lld | loss %.4f | lr %.1e | grad_norm %.3f | loss_scale %.0f | tokens/s %.0f | %.2f s/step%s%s", step,
      total, loss, lr, gn, scale, tps, per_step, comm_part, applied ? "" : " | skipped (fp16 overflow)");
  return buf;
}

bool has_control(const std::string& s) {
  for (unsigned char c : s)
    if ((c < 0x20 && c != '\n') || c == 0x7f) return true;
  return false;
}

}  // namespace

TEST_CASE("progress: parse the trainer's line") {
  auto r = progress_parse(trainer_line(40, 200, 2.31415, 3e-4, 0.8123, 65536, 18234, 0.45, true));
  REQUIRE(r);
  CHECK(r->step == 40);
  CHECK(r->total_steps == 200);
  CHECK(r->loss == doctest::Approx(2.3142));
  CHECK(r->lr == doctest::Approx(3e-4));
  CHECK(r->grad_norm == doctest::Approx(0.812));
  CHECK(r->loss_scale == 65536);
  CHECK(r->tokens_per_s == 18234);
  CHECK(r->step_time_s == doctest::Approx(0.45));
  CHECK_FALSE(r->skipped);

  auto s = progress_parse(trainer_line(3, 10, 5.0, 1e-3, 0, 128, 10, 1.5, false));
  REQUIRE(s);
  CHECK(s->skipped);

  CHECK(r->sent_mb_per_step == -1.0);  // one rank: no communication fields

  // Several ranks: the bytes sent and the collectives' time, before a skip mark.
  auto c = progress_parse(trainer_line(7, 10, 3.0, 1e-3, 0.5, 1, 100, 0.25, false, 18.187627, 812.4));
  REQUIRE(c);
  CHECK(c->sent_mb_per_step == doctest::Approx(18.188));
  CHECK(c->comm_ms_per_step == doctest::Approx(812.4));
  CHECK(c->step_time_s == doctest::Approx(0.25));
  CHECK(c->skipped);
  ProgressView view(true, 0);  // the TTY view renders them; the plain view passes the line through
  std::string shown;
  REQUIRE(view.consume(trainer_line(7, 10, 3.0, 1e-3, 0.5, 1, 100, 0.25, true, 0.242371, 41.0), &shown));
  CHECK(shown.find("sent 0.24 MB/step, comm 41 ms") != std::string::npos);

  auto n = progress_parse(trainer_line(1, 2, NAN, 1e-3, INFINITY, 1, 1, 1, true));
  REQUIRE(n);
  CHECK(std::isnan(n->loss));
  CHECK(std::isinf(n->grad_norm));
}

TEST_CASE("progress: other lines are not progress lines") {
  CHECK_FALSE(progress_parse(""));
  CHECK_FALSE(progress_parse("train: gpt2 124M params"));
  CHECK_FALSE(progress_parse("eval step 40 | eval_loss 2.1 | eval_ppl 8.1"));
  CHECK_FALSE(progress_parse("step 4 | loss 2.0"));                // no total
  CHECK_FALSE(progress_parse("step 4/x | loss 2.0"));              // bad total
  CHECK_FALSE(progress_parse("step 4/10 | lr 1e-3"));              // no loss
  CHECK_FALSE(progress_parse("step 4/10 | loss two"));             // bad number
  CHECK_FALSE(progress_parse("step -4/10 | loss 2"));              // negative step
  CHECK(progress_parse("step 4/10 | loss 2.0 | future_field 7"));  // unknown fields tolerated
}

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
  std::string out;
  CHECK(std::isnan(v.eta_seconds()));
  CHECK(v.consume(trainer_line(10, 110, 2.5, 3e-4, 0.5, 1024, 20000, 2.0, true), &out));
  CHECK(out.rfind("\r\x1b[2K", 0) == 0);
  CHECK(out.find('\n') == std::string::npos);
  CHECK(out.find("step 10/110") != std::string::npos);
  CHECK(out.find("loss 2.5000") != std::string::npos);
  CHECK(out.find("20.0k tok/s") != std::string::npos);
  CHECK(out.find("ETA 3m20s") != std::string::npos);  // 100 steps x 2.0 s
  CHECK(out.find("restarts 2") != std::string::npos);
  CHECK(out.find("scale 1024") != std::string::npos);
  CHECK(v.eta_seconds() == doctest::Approx(200.0));

  // The ETA follows a smoothed step time: 0.7 * 2.0 + 0.3 * 1.0 = 1.7 s over 90 steps.
  CHECK(v.consume(trainer_line(20, 110, 2.4, 3e-4, 0.5, 1024, 20000, 1.0, true), &out));
  CHECK(v.eta_seconds() == doctest::Approx(90 * 1.7));

  // Another line first ends the status line, so it is not overwritten.
  CHECK_FALSE(v.consume("eval step 20 | eval_loss 2.2 | eval_ppl 9.0", &out));
  CHECK(out == "\neval step 20 | eval_loss 2.2 | eval_ppl 9.0\n");
  CHECK_FALSE(v.consume("train: next", &out));
  CHECK(out == "train: next\n");
  CHECK(v.interrupt() == "");
  CHECK(v.consume(trainer_line(30, 110, 2.3, 3e-4, 0.5, 1024, 20000, 1.0, true), &out));
  CHECK(v.interrupt() == "\n");
  CHECK(v.interrupt() == "");

  // The last step stays on screen.
  CHECK(v.consume(trainer_line(110, 110, 2.0, 3e-4, 0.5, 1024, 20000, 1.0, true), &out));
  CHECK(out.back() == '\n');
  CHECK(out.find("ETA 0s") != std::string::npos);
  CHECK(v.interrupt() == "");
}

TEST_CASE("progress: plain view passes lines through without control characters, with percentage and ETA") {
  ProgressView v(false, 0);
  std::string out;
  const std::string line = trainer_line(5, 50, 3.25, 1e-4, 1.25, 1, 512, 0.25, true);
  CHECK(v.consume(line, &out));
  CHECK(out == line + " | 10% | ETA 11s\n");  // 45 steps left at 0.25 s/step (issue 44: sbatch logs had neither)
  v.set_restarts(1);
  CHECK(v.consume(line, &out));
  CHECK(out == line + " | 10% | ETA 11s | restarts 1\n");
  CHECK(v.interrupt() == "");
  CHECK_FALSE(v.consume("colour \x1b[31mred\x1b[0m\ttab\r", &out));
  CHECK_FALSE(has_control(out));
  CHECK(out == "colour ?[31mred?[0m tab?\n");
  for (int i = 1; i <= 50; ++i) {
    CHECK(v.consume(trainer_line(i, 50, 3.0, 1e-4, 1, 1, 512, 0.25, i % 7 != 0), &out));
    CHECK_FALSE(has_control(out));
  }
}

TEST_CASE("progress: a straggler flag shows on every progress line until cleared, on a TTY and in plain view") {
  for (bool tty : {true, false}) {
    CAPTURE(tty);
    ProgressView v(tty, 0);
    std::string out;
    v.set_flag("straggler rank 2 (node3) 3.1x");
    CHECK(v.consume(trainer_line(5, 50, 3.25, 1e-4, 1.25, 1, 512, 0.25, true), &out));
    CHECK(out.find("| straggler rank 2 (node3) 3.1x") != std::string::npos);
    v.set_flag("");
    CHECK(v.consume(trainer_line(6, 50, 3.25, 1e-4, 1.25, 1, 512, 0.25, true), &out));
    CHECK(out.find("straggler") == std::string::npos);
  }
}
