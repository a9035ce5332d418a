#include "stoker/core/fault.h"

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>

namespace stoker::fault {

namespace detail {
std::atomic<bool> armed{false};
std::atomic<bool> holding{false};
}  // namespace detail

namespace {
struct State {
  std::mutex mutex;
  std::map<std::string, int64_t, std::less<>> counts;
  std::string kind;  // the kind to fail
  int64_t nth = 0;
  bool fired = false;
};

State& state() {
  static State* s = new State();  // never destroyed: points may run in threads at exit
  return *s;
}

struct Hold {
  std::mutex mutex;
  std::condition_variable cv;
  std::string point;  // the point held
  bool held = false;  // a thread waits there
};

Hold& hold_state() {
  static Hold* h = new Hold();  // never destroyed, as State
  return *h;
}
}  // namespace

bool detail::hit(std::string_view kind) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (!armed.load(std::memory_order_relaxed)) return false;  // disarmed meanwhile
  auto it = s.counts.find(kind);
  if (it == s.counts.end()) it = s.counts.emplace(std::string(kind), 0).first;
  const int64_t n = ++it->second;
  if (s.nth > 0 && n == s.nth && kind == s.kind) {
    s.fired = true;
    return true;
  }
  return false;
}

std::string describe(std::string_view kind, std::string_view what) {
  int64_t nth;
  {
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mutex);
    nth = s.nth;  // the one that fired: due() said so
  }
  return "injected fault: " + std::string(kind) + " #" + std::to_string(nth) + " (" +
         std::string(what) + ")";
}

void arm(std::string_view kind, int64_t nth) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.counts.clear();
  s.kind = std::string(kind);
  s.nth = nth;
  s.fired = false;
  detail::armed.store(true, std::memory_order_relaxed);
}

void disarm() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  detail::armed.store(false, std::memory_order_relaxed);
}

int64_t count(std::string_view kind) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  auto it = s.counts.find(kind);
  return it == s.counts.end() ? 0 : it->second;
}

std::vector<std::pair<std::string, int64_t>> counts() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  return {s.counts.begin(), s.counts.end()};
}

bool fired() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.fired;
}

void detail::wait_if_held(std::string_view point) {
  Hold& h = hold_state();
  std::unique_lock<std::mutex> lock(h.mutex);
  if (!holding.load(std::memory_order_relaxed) || h.held || point != h.point) return;
  h.held = true;
  h.cv.notify_all();
  h.cv.wait(lock, [&] { return !holding.load(std::memory_order_relaxed); });
}

void hold(std::string_view point) {
  Hold& h = hold_state();
  std::lock_guard<std::mutex> lock(h.mutex);
  h.point = std::string(point);
  h.held = false;
  detail::holding.store(true, std::memory_order_relaxed);
}

bool wait_held(int64_t timeout_ms) {
  Hold& h = hold_state();
  std::unique_lock<std::mutex> lock(h.mutex);
  return h.cv.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return h.held; });
}

void release() {
  Hold& h = hold_state();
  {
    std::lock_guard<std::mutex> lock(h.mutex);
    detail::holding.store(false, std::memory_order_relaxed);
  }
  h.cv.notify_all();
}

}  // namespace stoker::fault
