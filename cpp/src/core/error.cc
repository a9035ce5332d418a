#include "stoker/core/error.h"

#include <utility>

namespace stoker {

const char* error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument:
      return "invalid argument";
    case ErrorCode::kCorruptData:
      return "corrupt data";
    case ErrorCode::kIO:
      return "I/O error";
    case ErrorCode::kUnsupported:
      return "unsupported";
    case ErrorCode::kResourceLimit:
      return "resource limit";
    case ErrorCode::kInternal:
      return "internal error";
    case ErrorCode::kErrorBudget:
      return "error budget exceeded";
  }
  return "unknown error";
}

namespace {
std::string describe(ErrorCode code, const std::string& reason, const std::string& shard,
                     const std::string& key) {
  std::string s;
  if (!shard.empty()) s += shard + ": ";
  if (!key.empty()) s += "sample '" + key + "': ";
  s += error_code_name(code);
  s += ": ";
  s += reason;
  return s;
}
}  // namespace

Error::Error(ErrorCode code, std::string reason, std::string shard, std::string key)
    : std::runtime_error(describe(code, reason, shard, key)),
      code_(code),
      reason_(std::move(reason)),
      shard_(std::move(shard)),
      key_(std::move(key)) {}

Error Error::with_location(const std::string& shard, const std::string& key) const {
  return Error(code_, reason_, shard_.empty() ? shard : shard_, key_.empty() ? key : key_);
}

void throw_error(ErrorCode code, std::string reason) { throw Error(code, std::move(reason)); }

}  // namespace stoker
