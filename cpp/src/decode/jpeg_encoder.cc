#include <turbojpeg.h>

#include <memory>

#include "stoker/core/error.h"
#include "stoker/decode/image_decoder.h"

namespace stoker::decode {

std::vector<uint8_t> encode_jpeg(const uint8_t* rgb, int width, int height, ptrdiff_t stride,
                                 int quality) {
  STOKER_CHECK(quality >= 1 && quality <= 100, ErrorCode::kInvalidArgument,
               "JPEG quality must be 1-100");
  std::unique_ptr<void, int (*)(tjhandle)> handle(tjInitCompress(), tjDestroy);
  STOKER_CHECK(handle, ErrorCode::kResourceLimit, "cannot create a JPEG encoder");
  unsigned char* jpeg = nullptr;
  unsigned long size = 0;
  const int rc = tjCompress2(handle.get(), rgb, width, static_cast<int>(stride), height, TJPF_RGB,
                             &jpeg, &size, TJSAMP_420, quality, 0);
  std::unique_ptr<unsigned char, void (*)(unsigned char*)> owned(jpeg, tjFree);
  if (rc != 0)
    throw_error(ErrorCode::kInternal,
                std::string("JPEG encode failed: ") + tjGetErrorStr2(handle.get()));
  return std::vector<uint8_t>(jpeg, jpeg + size);
}

}  // namespace stoker::decode
