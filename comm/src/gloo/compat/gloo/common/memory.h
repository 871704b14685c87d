// Stand-ins for the header Debian's libgloo-dev (2022-05) leaves out although
// gloo/transport/tcp/pair.h includes it; comm/CMakeLists.txt puts this folder on the include path
// only when the installed Gloo has no gloo/common/memory.h.
//
// libdrun_comm includes pair.h only to reach a pair's socket and lock (gloo_backend.cpp,
// shutdownConnections), both declared before any member whose type comes from here, so their
// offsets do not depend on these types. Nothing here is ever constructed or called: the pointers
// exist so that pair.h's declarations are complete types.
#pragma once

#include <memory>

namespace gloo {

template <typename T>
class NonOwningPtr {
  std::shared_ptr<T> ptr_;
};

template <typename T>
class WeakNonOwningPtr {
  std::weak_ptr<T> ptr_;
};

}  // namespace gloo
