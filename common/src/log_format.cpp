// log::parseFormat, apart from the logger (log.cpp): the command line's parser and its fuzz target
// read --log-format without spdlog.
#include <string>

#include "drun/common/error.hpp"
#include "drun/common/log.hpp"

namespace drun::log {

Format parseFormat(std::string_view text, std::string_view what) {
  if (text == "text") return Format::Text;
  if (text == "json") return Format::Json;
  throw InvalidArgument(std::string(what) + ": expected text or json, got '" + std::string(text) + "'");
}

}  // namespace drun::log
