// The store's size checks, shared by the wire encoder and the store core.
#include "drun/common/error.hpp"
#include "drun/store/store_core.hpp"

namespace drun::rdzv {
std::string shownKey(const std::string& key) {
  constexpr size_t kShown = 64;
  return key.size() <= kShown ? key : key.substr(0, kShown) + "...";
}

void checkKeyLimit(const std::string& key, const StoreLimits& limits) {
  if (key.size() > limits.maxKeyBytes)
    throw InvalidArgument("key '" + shownKey(key) + "' is " + std::to_string(key.size()) +
                          " bytes, over the limit of " + std::to_string(limits.maxKeyBytes));
}

void checkValueLimit(const std::string& key, const Bytes& value, const StoreLimits& limits) {
  if (value.size() > limits.maxValueBytes)
    throw InvalidArgument("value of key '" + shownKey(key) + "' is " + std::to_string(value.size()) +
                          " bytes, over the limit of " + std::to_string(limits.maxValueBytes));
}

void checkKeyCountLimit(size_t count, const StoreLimits& limits) {
  if (count > limits.maxKeysPerRequest)
    throw InvalidArgument(std::to_string(count) + " keys in one request, over the limit of " +
                          std::to_string(limits.maxKeysPerRequest));
}

}  // namespace drun::rdzv
