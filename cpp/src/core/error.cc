#include "stoker/core/error.h"

#include <utility>

namespace stoker {

const char* error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument: return "invalid argument";
    case ErrorCode::kCorruptData: return "corrupt data";
    case ErrorCode::kIO: return "I/O error";
    case ErrorCode::kUnsupported: return "unsupported";
    case ErrorCode::kResourceLimit: return "resource limit";
    case ErrorCode::kInternal: return "internal error";
    case ErrorCode::kErrorBudget: return "error budget exceeded";
  }
  return "unknown error";
}

namespace {
std::string describe(ErrorCode code, const std::string& reason, const std::string& shard,
                     const std::string& key, const std::string& member) {
  std::string s;
  if (!shard.empty()) s += shard + ": ";
  if (!key.empty()) s += "sample '" + key + "': ";
  if (!member.empty()) s += "member '" + member + "': ";
  s += error_code_name(code);
  s += ": ";
  s += reason;
  return s;
}
}  // namespace

Error::Error(ErrorCode code, std::string reason, std::string shard, std::string key,
             std::string member)
    : std::runtime_error(describe(code, reason, shard, key, member)),
      code_(code),
      reason_(std::move(reason)),
      shard_(std::move(shard)),
      key_(std::move(key)),
      member_(std::move(member)) {}

Error Error::with_location(const std::string& shard, const std::string& key) const {
  return Error(code_, reason_, shard_.empty() ? shard : shard_, key_.empty() ? key : key_, member_);
}

Error Error::with_member(const std::string& member) const {
  return Error(code_, reason_, shard_, key_, member_.empty() ? member : member_);
}

void throw_error(ErrorCode code, std::string reason) { throw Error(code, std::move(reason)); }

}  // namespace stoker
