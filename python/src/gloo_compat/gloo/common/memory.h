// Declarations that Gloo's gloo/transport/tcp/pair.h names but Debian's libgloo-dev does not
// install (gloo/common/memory.h). gloo_abort.cpp includes pair.h only to reach two members of a
// Pair that libgloo built; it never makes or copies the types below, so only their names and
// the one member each pair.h's declarations rely on are given here. Searched after the system's
// include directories (-idirafter): an installed gloo/common/memory.h wins.
#pragma once

#include <memory>

namespace gloo {

template <typename T>
class WeakNonOwningPtr;

// A strong reference made from a WeakNonOwningPtr while the object lives.
template <typename T>
class NonOwningPtr final {
 public:
  NonOwningPtr() = default;
  explicit NonOwningPtr(const WeakNonOwningPtr<T>& weak) : ptr_(weak.ptr_.lock()) {}
  T* operator->() const noexcept { return ptr_.get(); }
  explicit operator bool() const noexcept { return static_cast<bool>(ptr_); }

 private:
  std::shared_ptr<T> ptr_;
};

// A weak reference to an object that a ShareableNonOwningPtr roots.
template <typename T>
class WeakNonOwningPtr final {
 public:
  WeakNonOwningPtr() = default;

 private:
  std::weak_ptr<T> ptr_;
  friend class NonOwningPtr<T>;
};

template <typename T>
class ShareableNonOwningPtr;

}  // namespace gloo
