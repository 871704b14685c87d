// Byte sizes as options give them: "1048576", "64K", "256M", "1G" (binary units; KiB, MiB, GiB
// alike). Pure; thread-safe.
#pragma once

#include <cstdint>
#include <string_view>

namespace drun {

// The bytes `text` names, 0 included; anything else (no digits, another unit, a sign, a fraction,
// more than 2^64) throws InvalidArgument naming `what`.
uint64_t parseByteSize(std::string_view text, std::string_view what);

}  // namespace drun
