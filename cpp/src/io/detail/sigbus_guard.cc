#include "io/detail/sigbus_guard.h"

#include <atomic>
#include <csetjmp>
#include <csignal>
#include <cstring>
#include <mutex>

namespace stoker::io::detail {

namespace {

// Set while this thread copies from a mapping. volatile: memcpy is known not to read it, and the
// compiler would otherwise drop the store before the copy as dead.
thread_local sigjmp_buf* volatile t_jump = nullptr;
struct sigaction g_previous {};
std::once_flag g_installed;

void on_sigbus(int sig, siginfo_t* info, void* context) {
  if (sigjmp_buf* const jump = t_jump) {
    t_jump = nullptr;
    siglongjmp(*jump, 1);
  }
  // Not a guarded copy's: whoever handled SIGBUS before stoker does.
  if (g_previous.sa_flags & SA_SIGINFO) {
    if (g_previous.sa_sigaction != nullptr) g_previous.sa_sigaction(sig, info, context);
    return;
  }
  if (g_previous.sa_handler == SIG_IGN) return;
  if (g_previous.sa_handler == SIG_DFL) {
    std::signal(SIGBUS, SIG_DFL);  // returning re-executes the access: the default action
    return;
  }
  g_previous.sa_handler(sig);
}

void install() {
  struct sigaction action {};
  action.sa_sigaction = on_sigbus;
  sigemptyset(&action.sa_mask);
  // SA_NODEFER: SIGBUS is not blocked in the handler, so nothing is left blocked after the jump.
  action.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
  sigaction(SIGBUS, &action, &g_previous);
}

}  // namespace

bool guarded_copy(void* dst, const void* src, size_t n) {
  std::call_once(g_installed, install);
  sigjmp_buf jump;
  if (sigsetjmp(jump, 0) != 0) return false;  // from on_sigbus: t_jump is already reset
  t_jump = &jump;
  std::atomic_signal_fence(std::memory_order_seq_cst);
  std::memcpy(dst, src, n);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  t_jump = nullptr;
  return true;
}

}  // namespace stoker::io::detail
