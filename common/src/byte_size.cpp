#include "drun/common/byte_size.hpp"

#include <cctype>
#include <charconv>
#include <string>

#include "drun/common/error.hpp"

namespace drun {

uint64_t parseByteSize(std::string_view text, std::string_view what) {
  size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  const std::string_view unit = text.substr(digits);
  int shift = -1;
  if (unit.empty()) shift = 0;
  if (unit == "K" || unit == "KiB") shift = 10;
  if (unit == "M" || unit == "MiB") shift = 20;
  if (unit == "G" || unit == "GiB") shift = 30;
  uint64_t value = 0;
  const bool read = digits > 0 && std::from_chars(text.data(), text.data() + digits, value).ec == std::errc();
  if (!read || shift < 0 || value > (UINT64_MAX >> shift))
    throw InvalidArgument(std::string(what) + " '" + std::string(text) +
                          "': expected bytes, e.g. 1048576, 64K, 256M, 1G");
  return value << shift;
}

}  // namespace drun
