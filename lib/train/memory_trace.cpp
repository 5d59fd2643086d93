// The per-phase memory trace (memory_trace.h).
#include "train/memory_trace.h"

#include <fmt/format.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>

namespace dtrain::train {

namespace {

size_t status_kb(const char* key_format) {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return 0;
  char line[256];
  size_t kb = 0;
  while (std::fgets(line, sizeof line, f))
    if (std::sscanf(line, key_format, &kb) == 1) break;
  std::fclose(f);
  return kb * 1024;
}

// Resets VmHWM to the resident bytes now (Linux's clear_refs, value 5); false where the
// kernel refuses it.
bool reset_peak() {
  std::FILE* f = std::fopen("/proc/self/clear_refs", "w");
  if (!f) return false;
  const bool ok = std::fputs("5", f) >= 0;
  return std::fclose(f) == 0 && ok;
}

std::string gib(size_t b) { return fmt::format("{:.2f}", static_cast<double>(b) / (1024.0 * 1024.0 * 1024.0)); }

}  // namespace

size_t process_peak_rss_bytes() { return status_kb("VmHWM: %zu kB"); }
size_t process_rss_bytes() { return status_kb("VmRSS: %zu kB"); }

MemoryTrace::MemoryTrace(bool enabled) : enabled_(enabled) {}

void MemoryTrace::mark(const std::string& phase) {
  if (!enabled_) return;
  const size_t peak = process_peak_rss_bytes();
  max_peak_ = std::max(max_peak_, peak);
  auto it = std::find_if(phases_.begin(), phases_.end(), [&](const Phase& p) { return p.name == phase; });
  if (it == phases_.end()) it = phases_.insert(phases_.end(), Phase{phase});
  if (peak >= it->peak) {
    it->peak = peak;
    it->start = last_rss_;
  }
  ++it->runs;
  if (dev_) {
    const device::Device::MemoryStats m = dev_->memory_stats();
    it->dev_used_peak = std::max(it->dev_used_peak, m.used_peak);
    it->dev_reserved = std::max(it->dev_reserved, m.reserved);
    dev_->memory_peak_reset();
  }
  if (resettable_) resettable_ = reset_peak();
  last_rss_ = process_rss_bytes();
}

size_t MemoryTrace::peak() const {
  const size_t now = process_peak_rss_bytes();
  return enabled_ ? std::max(max_peak_, now) : now;
}

std::string MemoryTrace::summary() const {
  std::string s;
  for (const Phase& p : phases_) {
    if (!s.empty()) s += ", ";
    s += fmt::format("{} {} GiB (+{}", p.name, gib(p.peak), gib(p.peak > p.start ? p.peak - p.start : 0));
    if (dev_) s += fmt::format("; {} used {}, held {}", dev_->kind() == device::Kind::CPU ? "allocator" : "device",
                               gib(p.dev_used_peak), gib(p.dev_reserved));
    s += ")";
  }
  if (!resettable_) s += " (the kernel refused to reset the high-water mark: cumulative peaks)";
  return s;
}

}  // namespace dtrain::train
