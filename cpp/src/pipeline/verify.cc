#include "stoker/pipeline/verify.h"

#include <cstdio>
#include <new>

#include "stoker/core/crc32c.h"

namespace stoker::pipeline {

namespace {

decode::DecodeOptions full_decode_options(const VerifyOptions& o) {
  decode::DecodeOptions d;
  d.max_pixels = o.max_pixels;
  d.max_scans = o.max_scans;
  d.max_decode_memory = o.max_decode_memory;
  // Every scan and every restart interval is read: the point is to touch every byte.
  d.progressive_shortcut = false;
  d.restart_roi = false;
  d.read_to_end = true;
  return d;
}

}  // namespace

SampleVerifier::SampleVerifier(std::shared_ptr<const format::Dataset> dataset,
                               VerifyOptions options)
    : dataset_(std::move(dataset)),
      options_(options),
      check_crc_(options.check_crc && dataset_->has_crc()),
      decoder_(full_decode_options(options)) {
  STOKER_CHECK(options_.max_pixels > 0, ErrorCode::kInvalidArgument, "max_pixels must be > 0");
  STOKER_CHECK(options_.max_scans > 0, ErrorCode::kInvalidArgument, "max_scans must be > 0");
}

void SampleVerifier::verify(int64_t index, VerifyResult& result) {
  STOKER_CHECK(index >= 0 && index < dataset_->size(), ErrorCode::kInvalidArgument,
               "sample index " + std::to_string(index) + " out of range");
  result.crc_checked = check_crc_;
  ++result.checked;
  std::string member;
  auto fail = [&](Error error) {
    result.failures.push_back(
        {index, error.with_location(dataset_->shard_name(index), dataset_->key(index))
                    .with_member(member)});
  };
  try {
    dataset_->members(index, members_);
    for (const format::MemberRef& m : members_) {
      member = m.name;
      dataset_->file(index, m.file)->read(m.offset, m.size, bytes_);
      result.bytes += bytes_.size();
      if (check_crc_ && m.has_crc) {
        const uint32_t crc = crc32c(bytes_.data(), bytes_.size());
        if (crc != m.crc32c) {
          char detail[64];
          std::snprintf(detail, sizeof detail, " (index %08x, bytes %08x)", m.crc32c, crc);
          throw_error(ErrorCode::kCorruptData,
                      std::string("CRC32C mismatch: the shard changed after packing") + detail);
        }
      }
      if (options_.decode && m.raw == nullptr && format::is_image_member_name(member)) {
        decoder_.open(bytes_.data(), bytes_.size());
        decoder_.decode_full();
        if (options_.fail_on_warnings && decoder_.warnings() > 0)
          throw_error(ErrorCode::kCorruptData, "damaged JPEG data: " + decoder_.first_warning() +
                                                   " (" + std::to_string(decoder_.warnings()) +
                                                   " libjpeg warning(s))");
      }
    }
  } catch (const Error& e) {
    fail(e);
  } catch (const std::bad_alloc&) {
    fail(Error(ErrorCode::kResourceLimit, "out of memory"));
  } catch (const std::exception& e) {
    fail(Error(ErrorCode::kInternal, e.what()));
  }
}

VerifyResult verify_range(std::shared_ptr<const format::Dataset> dataset, int64_t begin,
                          int64_t end, const VerifyOptions& options) {
  STOKER_CHECK(dataset != nullptr, ErrorCode::kInvalidArgument, "no dataset");
  STOKER_CHECK(0 <= begin && begin <= end && end <= dataset->size(), ErrorCode::kInvalidArgument,
               "range [" + std::to_string(begin) + ", " + std::to_string(end) +
                   ") is outside the dataset's " + std::to_string(dataset->size()) + " samples");
  VerifyResult result;
  result.crc_checked = options.check_crc && dataset->has_crc();
  SampleVerifier verifier(std::move(dataset), options);
  for (int64_t i = begin; i < end; ++i) verifier.verify(i, result);
  return result;
}

}  // namespace stoker::pipeline
