// stoker's one exception type. Every failure carries a code (what kind of failure) and, where
// known, the shard and the key of the sample it happened on, so a user can find the bad file.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace stoker {

enum class ErrorCode : int {
  kInvalidArgument = 0,  // the caller asked for something impossible
  kCorruptData = 1,      // bytes that do not parse: truncated, wrong checksum, bad markers
  kIO = 2,               // open/read/write failed, or a file changed size under us
  kUnsupported = 3,      // valid but not something stoker decodes (12-bit JPEG, lossless, ...)
  kResourceLimit = 4,    // would exceed a configured limit (pixels, scans, memory)
  kInternal = 5,         // a bug in stoker
  kErrorBudget = 6,      // a loader skipped more samples in a pass than max_errors allows
};

const char* error_code_name(ErrorCode code);

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, std::string reason, std::string shard = {}, std::string key = {},
        std::string member = {});

  ErrorCode code() const { return code_; }
  const std::string& reason() const { return reason_; }
  const std::string& shard() const { return shard_; }
  const std::string& key() const { return key_; }
  const std::string& member() const { return member_; }  // the sample's file (KEY.<member>)

  // The same error, now naming where it happened (keeps an existing shard/key).
  Error with_location(const std::string& shard, const std::string& key) const;
  // The same error, naming the member of the sample it happened on (keeps an existing one).
  Error with_member(const std::string& member) const;

 private:
  ErrorCode code_;
  std::string reason_;
  std::string shard_;
  std::string key_;
  std::string member_;
};

[[noreturn]] void throw_error(ErrorCode code, std::string reason);

}  // namespace stoker

#define STOKER_CHECK(cond, code, reason)                  \
  do {                                                    \
    if (!(cond)) ::stoker::throw_error((code), (reason)); \
  } while (0)
