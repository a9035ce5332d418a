// Fault injection (docs/RELIABILITY.md, "Fault injection"): a switch that makes the Nth
// acquisition of a kind fail (a thread started, a file opened or mapped, a batch buffer
// allocated; the Python layer's kinds count here too), so that a test can make every
// acquisition of a loader's life fail in turn and check that nothing is left behind.
//
// Off unless a test arms it: then each point costs one relaxed atomic load. Thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace stoker::fault {

namespace detail {
extern std::atomic<bool> armed;
extern std::atomic<bool> holding;
bool hit(std::string_view kind);
void wait_if_held(std::string_view point);
}  // namespace detail

// Counts an acquisition of `kind` and says whether it is the one to fail. The caller fails it
// the way the real failure fails (an exception, a refused mapping).
inline bool due(std::string_view kind) {
  return detail::armed.load(std::memory_order_relaxed) && detail::hit(kind);
}

// The reason an injected failure of `kind` gives (call it once due() said true):
// "injected fault: <kind> #<n> (<what>)".
std::string describe(std::string_view kind, std::string_view what);

// From now on, count every kind's acquisitions from 0; the `nth` of `kind` fails (nth = 0 or an
// empty kind: none fails, they are only counted).
void arm(std::string_view kind, int64_t nth);
// Back to off; counts and what fired stay readable until the next arm().
void disarm();
int64_t count(std::string_view kind);
// The kinds counted since arm(), with their counts.
std::vector<std::pair<std::string, int64_t>> counts();
// Whether the failure armed has happened.
bool fired();

// A point where a race can happen (between a check and what it guards): a test holds the first
// thread to reach it there (hold()) while it does what races with it, so that the race happens
// every time. Off unless a test holds a point: one relaxed atomic load.
inline void hold_point(std::string_view point) {
  if (detail::holding.load(std::memory_order_relaxed)) detail::wait_if_held(point);
}
// From now on, the first thread to reach hold_point(point) waits there until release().
void hold(std::string_view point);
// Waits up to timeout_ms for that thread to reach the point; whether it has.
bool wait_held(int64_t timeout_ms);
// Lets the thread held go on; the point holds no other.
void release();

}  // namespace stoker::fault
