// drun's version, as every command's --version prints it (project(drun VERSION ...) in the top
// CMakeLists.txt names the same).
#pragma once

namespace drun {

inline constexpr const char* kVersion = "0.1.0";

}  // namespace drun
