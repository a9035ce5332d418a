#include "stoker/format/tar.h"

#include <algorithm>
#include <cctype>
#include <cstring>

#include "stoker/core/checked.h"
#include "stoker/core/error.h"

namespace stoker::format {

namespace {

void put_octal(char* field, size_t width, uint64_t value) {
  // width-1 octal digits, then NUL.
  std::memset(field, '0', width - 1);
  field[width - 1] = '\0';
  for (size_t i = width - 1; i-- > 0 && value;) {
    field[i] = static_cast<char>('0' + (value & 7));
    value >>= 3;
  }
}

uint32_t header_checksum(const uint8_t* h) {
  uint32_t sum = 0;
  for (size_t i = 0; i < kTarBlock; ++i) sum += (i >= 148 && i < 156) ? ' ' : h[i];
  return sum;
}

// Parses a numeric header field: octal (NUL/space terminated) or GNU base-256.
bool parse_number(const uint8_t* field, size_t width, uint64_t& out) {
  if (field[0] & 0x80) {                 // base-256, big-endian; the top bit is the marker
    if (field[0] != 0x80) return false;  // negative or huge
    uint64_t v = 0;
    for (size_t i = 1; i < width; ++i) {
      if (v >> 56) return false;
      v = (v << 8) | field[i];
    }
    out = v;
    return true;
  }
  size_t i = 0;
  while (i < width && field[i] == ' ') ++i;
  uint64_t v = 0;
  bool any = false;
  for (; i < width && field[i] >= '0' && field[i] <= '7'; ++i) {
    if (v >> 61) return false;
    v = (v << 3) | static_cast<uint64_t>(field[i] - '0');
    any = true;
  }
  if (i < width && field[i] != ' ' && field[i] != '\0') return false;
  out = v;
  return any || i == width || field[i] == '\0' || field[i] == ' ';
}

std::string field_string(const uint8_t* field, size_t width) {
  const auto* end = static_cast<const uint8_t*>(std::memchr(field, 0, width));
  return std::string(reinterpret_cast<const char*>(field), end ? end - field : width);
}

// The value of the 'path' record in a pax extended header, if any.
bool pax_path(const std::string& pax, std::string& path) {
  size_t pos = 0;
  bool found = false;
  while (pos < pax.size()) {
    const size_t space = pax.find(' ', pos);
    if (space == std::string::npos) return found;
    size_t len = 0;
    for (size_t i = pos; i < space; ++i) {
      if (!std::isdigit(static_cast<unsigned char>(pax[i])) || len > pax.size()) return found;
      len = len * 10 + static_cast<size_t>(pax[i] - '0');
    }
    if (len <= space - pos || pos + len > pax.size()) return found;
    const std::string record = pax.substr(space + 1, pos + len - space - 2);  // drop '\n'
    if (record.rfind("path=", 0) == 0) {
      path = record.substr(5);
      found = true;
    }
    pos += len;
  }
  return found;
}

}  // namespace

std::string make_tar_header(std::string_view name, uint64_t size) {
  STOKER_CHECK(!name.empty() && name.size() <= 100, ErrorCode::kInvalidArgument,
               "tar member name must be 1-100 bytes: '" + std::string(name) + "'");
  std::string h(kTarBlock, '\0');
  std::memcpy(h.data(), name.data(), name.size());
  put_octal(&h[100], 8, 0644);   // mode
  put_octal(&h[108], 8, 0);      // uid
  put_octal(&h[116], 8, 0);      // gid
  put_octal(&h[124], 12, size);  // size (11 octal digits: < 8 GiB per member)
  put_octal(&h[136], 12, 0);     // mtime: fixed, so a pack of the same files is byte-identical
  h[156] = '0';                  // regular file
  std::memcpy(&h[257], "ustar", 6);
  std::memcpy(&h[263], "00", 2);
  std::memcpy(&h[265], "stoker", 6);
  std::memcpy(&h[297], "stoker", 6);
  const uint32_t sum = header_checksum(reinterpret_cast<const uint8_t*>(h.data()));
  put_octal(&h[148], 7, sum);
  h[155] = ' ';
  return h;
}

void scan_tar(const io::ShardFile& file, const std::function<void(const TarMember&)>& visit) {
  const uint64_t file_size = file.size();
  uint8_t h[kTarBlock];
  uint64_t pos = 0;
  std::string long_name;  // from a preceding GNU 'L' or pax 'x' header
  std::vector<uint8_t> extra;
  while (pos + kTarBlock <= file_size) {
    file.read(pos, kTarBlock, h);
    bool zero = true;
    for (uint8_t b : h) zero = zero && b == 0;
    if (zero) return;  // end-of-archive
    uint64_t stored_sum = 0, size = 0;
    if (!parse_number(h + 148, 8, stored_sum) || stored_sum != header_checksum(h))
      throw Error(ErrorCode::kCorruptData,
                  "bad tar header checksum at offset " + std::to_string(pos), file.path());
    if (!parse_number(h + 124, 12, size))
      throw Error(ErrorCode::kCorruptData, "bad tar size field at offset " + std::to_string(pos),
                  file.path());
    const uint64_t data = pos + kTarBlock;
    if (!range_within(data, size, file_size))
      throw Error(ErrorCode::kCorruptData,
                  "tar member at offset " + std::to_string(pos) + " runs past the end of the file",
                  file.path());
    const char type = static_cast<char>(h[156]);
    if (type == 'L' || type == 'x') {
      STOKER_CHECK(size <= (1u << 20), ErrorCode::kCorruptData,
                   file.path() + ": extended tar header over 1 MiB");
      file.read(data, size, extra);
      std::string text(extra.begin(), extra.end());
      if (type == 'L') {
        long_name = field_string(reinterpret_cast<const uint8_t*>(text.data()), text.size());
      } else {
        std::string p;
        if (pax_path(text, p)) long_name = p;
      }
    } else {
      if (type == '0' || type == '\0' || type == '7') {
        TarMember m;
        if (!long_name.empty()) {
          m.name = long_name;
        } else {
          m.name = field_string(h, 100);
          const std::string prefix = field_string(h + 345, 155);
          if (std::memcmp(h + 257, "ustar", 5) == 0 && !prefix.empty())
            m.name = prefix + "/" + m.name;
        }
        m.offset = data;
        m.size = size;
        visit(m);
      }
      long_name.clear();
    }
    pos = checked_add(data, checked_add(size, tar_padding(size), "tar member"), "tar member");
  }
}

void split_webdataset_name(std::string_view name, std::string& key, std::string& extension) {
  const size_t slash = name.rfind('/');
  const size_t base = slash == std::string_view::npos ? 0 : slash + 1;
  const size_t dot = name.find('.', base);
  if (dot == std::string_view::npos) {
    key.assign(name);
    extension.clear();
    return;
  }
  key.assign(name.substr(0, dot));
  extension.assign(name.substr(dot + 1));
  std::transform(extension.begin(), extension.end(), extension.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
}

}  // namespace stoker::format
