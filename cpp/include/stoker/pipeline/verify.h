// Verification of a dataset, sample by sample: read the stored bytes, compare their CRC32C with
// the index (stoker packs only), then decode the whole image, so that damage anywhere in it is
// found — unlike the loader, which decodes only what a crop needs. Nothing stops at the first
// failure: every failing sample is listed with its kind, shard, key and reason.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "stoker/core/error.h"
#include "stoker/decode/image_decoder.h"
#include "stoker/format/dataset.h"

namespace stoker::pipeline {

struct VerifyOptions {
  bool check_crc = true;  // compare CRC32C with the index when the dataset has CRCs
  bool decode = true;     // decode every image in full
  // A JPEG that libjpeg decodes only with warnings (truncated, damaged entropy data: it fills
  // what is missing with grey) fails with kCorruptData. false: such files pass.
  bool fail_on_warnings = true;
  int64_t max_pixels = int64_t{1} << 28;  // as decode::DecodeOptions
  int max_scans = 256;
  int64_t max_decode_memory = decode::DecodeOptions{}.max_decode_memory;
};

struct VerifyFailure {
  int64_t index = 0;  // the sample's position in the dataset
  Error error;        // its code, shard, key and reason
};

struct VerifyResult {
  std::vector<VerifyFailure> failures;  // in index order
  int64_t checked = 0;                  // samples looked at, failed ones included
  uint64_t bytes = 0;                   // image bytes read
  bool crc_checked = false;             // CRCs were compared (check_crc and the index has them)
};

// Checks samples one at a time. Holds one decoder and one read buffer: not thread-safe, use one
// per thread (the dataset itself is shared safely). Keeps the dataset alive.
class SampleVerifier {
 public:
  SampleVerifier(std::shared_ptr<const format::Dataset> dataset, VerifyOptions options);

  // Checks sample `index` and adds it to `result`: counted, and listed when it fails. Throws only
  // for an index out of range (kInvalidArgument).
  void verify(int64_t index, VerifyResult& result);

 private:
  std::shared_ptr<const format::Dataset> dataset_;
  VerifyOptions options_;
  bool check_crc_;
  decode::ImageDecoder decoder_;
  std::vector<uint8_t> bytes_;
  std::vector<format::MemberRef> members_;
};

// Checks the samples [begin, end) on the calling thread. Throws Error(kInvalidArgument) for a
// range outside the dataset; every per-sample problem is a failure in the result instead.
VerifyResult verify_range(std::shared_ptr<const format::Dataset> dataset, int64_t begin,
                          int64_t end, const VerifyOptions& options = {});

}  // namespace stoker::pipeline
