// CUDA execution engine (test-only): memory faults in kernels. A SIGSEGV / SIGBUS handler
// turns hits on allocation and shared-memory guard pages into a record the launch reports
// with the faulting source line (addr2line); any other fault is logged and passed on.
#include "kernel_exec_internal.h"

#include <dlfcn.h>
#include <link.h>
#include <signal.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

namespace cuda_emu {

thread_local constinit OpFault* t_op_fault = nullptr;

namespace {

// ----------------------------------------------------------------------------
// Memory faults. The handler runs on the faulting thread's alternate stack; it only
// touches POD state and async-signal-safe calls.
struct sigaction g_prev[2];
constexpr int FAULT_SIGNALS[2] = {SIGSEGV, SIGBUS};

// A line assembled without allocation, written with one write(2) so concurrent
// faults on several workers do not interleave.
struct SigLine {
  char buf[1024];
  size_t len = 0;
  void str(const char* s) {
    while (*s && len + 1 < sizeof buf) buf[len++] = *s++;
  }
  void num(unsigned long long v, unsigned base) {
    char tmp[24];
    int n = 0;
    do {
      tmp[n++] = "0123456789abcdef"[v % base];
      v /= base;
    } while (v);
    if (base == 16) str("0x");
    while (n > 0 && len + 1 < sizeof buf) buf[len++] = tmp[--n];
  }
  void dims(uint3 v) {
    str("(");
    num(v.x, 10);
    str(",");
    num(v.y, 10);
    str(",");
    num(v.z, 10);
    str(")");
  }
  void flush() {
    buf[len++] = '\n';
    ssize_t r = write(2, buf, len);
    (void)r;
  }
};

void fault_handler(int sig, siginfo_t* si, void* uctx) {
  Worker* w = t_worker;
  Launch* L = w ? w->running : nullptr;
  const char* addr = static_cast<const char*>(si->si_addr);
  if (!L && t_op_fault) {  // stream-ordered work outside a kernel
    OpFault* f = t_op_fault;
    FaultInfo info;
    if (fault_resolve(addr, &info)) {
      int expected = 0;
      if (f->state.compare_exchange_strong(expected, 1)) {
        f->addr = addr;
        f->info = info;
        const auto* uc = static_cast<const ucontext_t*>(uctx);
#if defined(__x86_64__)
        f->pc = static_cast<uintptr_t>(uc->uc_mcontext.gregs[REG_RIP]);
        f->access = (uc->uc_mcontext.gregs[REG_ERR] & 2) ? 2 : 1;
#elif defined(__aarch64__)
        f->pc = static_cast<uintptr_t>(uc->uc_mcontext.pc);
#else
        (void)uc;
#endif
        f->state.store(2);
      }
      return;  // the access now succeeds; the executor reports it when the op ends
    }
  }
  if (L) {
    FaultRecord r{};
    r.addr = addr;
    r.block = t_block.block_idx;
    if (t_thread_idx) r.thread = *t_thread_idx;
    const auto* uc = static_cast<const ucontext_t*>(uctx);
#if defined(__x86_64__)
    r.pc = static_cast<uintptr_t>(uc->uc_mcontext.gregs[REG_RIP]);
    r.access = (uc->uc_mcontext.gregs[REG_ERR] & 2) ? 2 : 1;
#elif defined(__aarch64__)
    r.pc = static_cast<uintptr_t>(uc->uc_mcontext.pc);
#else
    (void)uc;
#endif
    bool resolved = false;
    if (addr >= w->smem_guard() && addr < w->smem_guard() + page_size()) {
      if (mprotect(w->smem_guard(), page_size(), PROT_READ | PROT_WRITE) == 0) {
        w->smem_guard_open = 1;
        r.smem = true;
        r.smem_size = w->smem_size;
        r.smem_offset = addr - w->smem_base;
        resolved = true;
      }
    } else {
      resolved = fault_resolve(addr, &r.info);
    }
    if (resolved) {
      int expected = 0;
      if (L->fault_state.compare_exchange_strong(expected, 1)) {
        L->fault = r;
        L->fault_state.store(2);
      }
      return;  // the access now succeeds; the launch reports it when it ends
    }
    const Carrier* c = w->current;
    const bool overflow = c && addr < c->stack_lo && addr >= c->stack_lo - page_size();
    SigLine m;
    m.str(overflow ? "cuda_emu: stack overflow (256 KiB per device thread) in kernel "
                   : "cuda_emu: fatal memory fault in kernel ");
    m.str(L->k->name.c_str());
    m.str(" (launched at ");
    m.str(L->k->file);
    m.str(":");
    m.num(static_cast<unsigned>(L->k->line), 10);
    m.str(") block ");
    m.dims(r.block);
    m.str(" thread ");
    m.dims(r.thread);
    m.str(": address ");
    m.num(reinterpret_cast<uintptr_t>(addr), 16);
    m.str(" pc ");
    m.num(r.pc, 16);
    m.flush();
  }
  const struct sigaction& prev = g_prev[sig == SIGBUS ? 1 : 0];
  if ((prev.sa_flags & SA_SIGINFO) && prev.sa_sigaction) {
    prev.sa_sigaction(sig, si, uctx);
    return;
  }
  if (prev.sa_handler != SIG_DFL && prev.sa_handler != SIG_IGN && prev.sa_handler) {
    prev.sa_handler(sig);
    return;
  }
  signal(sig, SIG_DFL);  // returning re-executes the access: a real crash
}

}  // namespace

// (Re)installs the handler: test frameworks install and restore their own around
// every test case, so it is checked at each launch.
void fault_handler_ensure() {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  for (int i = 0; i < 2; ++i) {
    struct sigaction cur {};
    sigaction(FAULT_SIGNALS[i], nullptr, &cur);
    if ((cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == fault_handler) continue;
    g_prev[i] = cur;
    struct sigaction sa {};
    sa.sa_sigaction = fault_handler;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(FAULT_SIGNALS[i], &sa, nullptr);
  }
}

// "file:line (in function), inlined at ..." for a code address, via addr2line.
std::string code_location(uintptr_t pc) {
  struct Query {
    uintptr_t pc = 0, base = 0;
    std::string path;
    bool found = false;
  } q;
  q.pc = pc;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        auto* q = static_cast<Query*>(data);
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          const auto& ph = info->dlpi_phdr[i];
          const uintptr_t lo = info->dlpi_addr + ph.p_vaddr;
          if (ph.p_type == PT_LOAD && q->pc >= lo && q->pc < lo + ph.p_memsz) {
            q->base = info->dlpi_addr;
            q->path = info->dlpi_name && info->dlpi_name[0] ? info->dlpi_name : "";
            q->found = true;
            return 1;
          }
        }
        return 0;
      },
      &q);
  const std::string fallback = "pc " + hex(pc);
  if (q.found && q.path.empty()) {  // the executable; addr2line's own /proc/self/exe is not it
    char exe[4096];
    const ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len <= 0) return fallback;
    q.path.assign(exe, static_cast<size_t>(len));
  }
  if (!q.found || q.path.find('\'') != std::string::npos) return fallback;
  const std::string cmd = "addr2line -f -C -i -e '" + q.path + "' " + hex(pc - q.base) + " 2>/dev/null";
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) return fallback;
  std::vector<std::string> lines;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, f)) {
    std::string s(buf);
    while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
    lines.push_back(s);
  }
  pclose(f);
  // Pairs of (function, file:line), innermost first; the outer lines are call sites of
  // inlined code. Library headers add nothing a kernel author can act on.
  std::string out;
  int shown = 0;
  for (size_t i = 0; i + 1 < lines.size() && shown < 4; i += 2) {
    std::string loc = lines[i + 1];
    if (loc.rfind("??", 0) == 0 || (i > 0 && loc.rfind("/usr/", 0) == 0)) continue;
    if (loc.front() == '/') {  // build/kernels/../../kernels/x.cu:7 -> /src/kernels/x.cu:7
      const size_t colon = loc.find(':');
      loc = std::filesystem::path(loc.substr(0, colon)).lexically_normal().string() +
            (colon == std::string::npos ? "" : loc.substr(colon));
    }
    out += shown == 0 ? loc + " (in " + lines[i] + ")" : (shown == 1 ? ", inlined at " : ", ") + loc;
    ++shown;
  }
  return out.empty() ? fallback : out + " [" + fallback + "]";
}

namespace {
std::string alloc_fault_str(const FaultInfo& info) {
  const std::string alloc =
      std::to_string(info.size) + "-byte allocation at " + hex(reinterpret_cast<uintptr_t>(info.base));
  if (info.freed) return "offset " + std::to_string(info.offset) + " of a freed " + alloc + " (use after free)";
  if (info.offset < 0) return std::to_string(-info.offset) + " bytes before the start of a " + alloc;
  return "offset " + std::to_string(info.offset) + " of a " + alloc + " (" +
         std::to_string(info.offset - static_cast<long long>(info.size)) + " bytes past its end)";
}
}  // namespace

std::string op_fault_report(const OpFault& f) {
  const char* verb = f.access == 2 ? "wrote" : f.access == 1 ? "read" : "accessed";
  return std::string(verb) + " address " + hex(reinterpret_cast<uintptr_t>(f.addr)) + ": " + alloc_fault_str(f.info) +
         "; faulting code: " + code_location(f.pc);
}

std::string fault_report(const Launch& L) {
  const FaultRecord& r = L.fault;
  const KernelLaunch& k = *L.k;
  const char* verb = r.access == 2 ? "wrote" : r.access == 1 ? "read" : "accessed";
  std::string s = "kernel " + k.name + " (launched at " + where_str(k.file, k.line) + ") block " + dims_str(r.block) +
                  " thread " + dims_str(r.thread) + " " + verb + " address " +
                  hex(reinterpret_cast<uintptr_t>(r.addr)) + ": ";
  if (r.smem) {
    s += "offset " + std::to_string(r.smem_offset) + " of " + std::to_string(r.smem_size) +
         " bytes of dynamic shared memory (" + std::to_string(r.smem_offset - static_cast<long long>(r.smem_size)) +
         " bytes past the end)";
  } else {
    s += alloc_fault_str(r.info);
  }
  return s + "; faulting code: " + code_location(r.pc);
}

}  // namespace cuda_emu
