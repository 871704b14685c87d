// Assertions for threads other than the test's own. Catch2 v2 is not thread-safe: an assertion
// that fails (or an INFO) on one thread while another asserts races on Catch's result state and
// its reporter's stream, and can corrupt the heap. Threads that
// assert inside a ThreadChecks::Scope record failures there instead; the test's thread reports
// them (report(), once the threads are joined) as Catch failures naming the thread.
//
//   runThreads(3, [&](int r) { T_CHECK(v[r] == 3); });   // "rank 0", "rank 1", "rank 2"
//
// or by hand:
//
//   ThreadChecks checks;
//   std::thread t([&] { ThreadChecks::Scope scope(checks, "rank 1"); T_CHECK(v == 3); });
//   t.join();
//   checks.report();
//
// The T_ macros decompose their expression as CHECK does (`v == 3` fails as "v == 3 with
// expansion 2 == 3") but touch no Catch state. Outside a Scope they are Catch's own macros, so a
// helper shared by both kinds of thread may use them.
#pragma once

#include <catch2/catch.hpp>

#include <exception>
#include <future>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace drun::test {

class ThreadChecks {
 public:
  // Binds this thread's T_ assertions to `checks`, naming the thread `name` in its failures.
  class Scope {
   public:
    Scope(ThreadChecks& checks, std::string name) : previous_(current()) {
      current() = {&checks, std::move(name)};
    }
    ~Scope() { current() = std::move(previous_); }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    struct Binding {
      ThreadChecks* checks = nullptr;
      std::string name;
    };
    Binding previous_;
    friend class ThreadChecks;
    static Binding& current() {
      thread_local Binding binding;
      return binding;
    }
  };

  // Thrown by T_REQUIRE to end the thread's part (the test's thread sees it from join or get).
  struct Abort : std::runtime_error {
    using std::runtime_error::runtime_error;
  };

  // Adds `what` to this thread's name in the failures recorded while it lives (Catch's INFO, for
  // a scope's thread; nothing outside one).
  class Note {
   public:
    explicit Note(const std::string& what) : saved_(Scope::current().name) {
      if (inScope()) Scope::current().name += ", " + what;
    }
    ~Note() { Scope::current().name = std::move(saved_); }
    Note(const Note&) = delete;
    Note& operator=(const Note&) = delete;

   private:
    std::string saved_;
  };

  static bool inScope() { return Scope::current().checks != nullptr; }

  // Records a failure of this thread's scope.
  static void fail(const char* file, int line, const std::string& what) {
    auto& b = Scope::current();
    std::lock_guard lock(b.checks->mutex_);
    b.checks->failures_.push_back(b.name + ": " + file + ":" + std::to_string(line) + ": " + what);
  }

  // The failures recorded so far, which are then no longer kept.
  std::vector<std::string> take() {
    std::lock_guard lock(mutex_);
    return std::exchange(failures_, {});
  }

  // On the test's thread: each recorded failure as a Catch failure.
  void report() {
    for (const auto& f : take()) FAIL_CHECK(f);
  }

  ~ThreadChecks() { report(); }  // a test that forgets to report still fails

 private:
  std::mutex mutex_;
  std::vector<std::string> failures_;
};

// Runs fn(r) for r in [0, n) on n threads, each in a scope named "rank r"; once all are done,
// reports what they recorded, then rethrows the first exception one of them threw.
template <class Fn>
void runThreads(int n, Fn&& fn) {
  ThreadChecks checks;
  std::vector<std::future<void>> threads;
  for (int r = 0; r < n; ++r)
    threads.push_back(std::async(std::launch::async, [&, r] {
      ThreadChecks::Scope scope(checks, "rank " + std::to_string(r));
      fn(r);
    }));
  for (auto& t : threads) t.wait();
  checks.report();
  for (auto& t : threads) t.get();
}

namespace thread_checks_detail {
// The expression as Catch would print it, or nothing where it holds.
inline bool holds(const Catch::ITransientExpression& e, std::string& shown) {
  if (e.getResult()) return true;
  std::ostringstream os;
  e.streamReconstructedExpression(os);
  shown = os.str();
  return false;
}
template <class T>
bool holds(const Catch::ExprLhs<T>& e, std::string& shown) {
  return holds(e.makeUnaryExpr(), shown);
}
// What a thrown exception says (Catch's translation, without its state: a std::exception's what()).
inline std::string thrownMessage() {
  try {
    throw;
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception not derived from std::exception";
  }
}
}  // namespace thread_checks_detail

}  // namespace drun::test

// Outside a ThreadChecks::Scope: Catch's own assertion, and the T_ macro ends (inside its
// do/while).
#define DRUN_T_CATCH_OUTSIDE_SCOPE_(catchAssertion)   \
  if (!::drun::test::ThreadChecks::inScope()) {       \
    catchAssertion;                                   \
    break;                                            \
  }

#define DRUN_T_FAIL_(what, thenAbort)                                        \
  do {                                                                       \
    ::drun::test::ThreadChecks::fail(__FILE__, __LINE__, what);              \
    if (thenAbort) throw ::drun::test::ThreadChecks::Abort("T_REQUIRE failed"); \
  } while (false)

#define DRUN_T_TEST_(macro, thenAbort, ...)                                                     \
  do {                                                                                          \
    DRUN_T_CATCH_OUTSIDE_SCOPE_(macro(__VA_ARGS__)) \
    std::string shown_;                                                                         \
    bool held_ = false;                                                                         \
    try {                                                                                       \
      CATCH_INTERNAL_START_WARNINGS_SUPPRESSION                                                 \
      CATCH_INTERNAL_SUPPRESS_PARENTHESES_WARNINGS                                              \
      held_ = ::drun::test::thread_checks_detail::holds(Catch::Decomposer() <= __VA_ARGS__, shown_);          \
      CATCH_INTERNAL_STOP_WARNINGS_SUPPRESSION                                                  \
    } catch (...) {                                                                             \
      shown_ = "threw: " + ::drun::test::thread_checks_detail::thrownMessage();                               \
    }                                                                                           \
    if (!held_) DRUN_T_FAIL_(#macro "(" #__VA_ARGS__ ") with expansion " + shown_, thenAbort);  \
  } while (false)

#define T_CHECK(...) DRUN_T_TEST_(CHECK, false, __VA_ARGS__)
#define T_REQUIRE(...) DRUN_T_TEST_(REQUIRE, true, __VA_ARGS__)
#define T_CHECK_FALSE(...) T_CHECK(!(__VA_ARGS__))

// expr throws an exception of type `type` (or derived).
#define T_CHECK_THROWS_AS(expr, type)                                                          \
  do {                                                                                         \
    DRUN_T_CATCH_OUTSIDE_SCOPE_(CHECK_THROWS_AS(expr, type)) \
    try {                                                                                      \
      static_cast<void>(expr);                                                                 \
      DRUN_T_FAIL_("CHECK_THROWS_AS(" #expr ", " #type "): nothing was thrown", false);      \
    } catch (const type&) {                                                                    \
    } catch (...) {                                                                            \
      DRUN_T_FAIL_("CHECK_THROWS_AS(" #expr ", " #type "): threw another exception: " +      \
                       ::drun::test::thread_checks_detail::thrownMessage(),                                  \
                   false);                                                                     \
    }                                                                                          \
  } while (false)

// expr throws, and the exception's message satisfies the string matcher (Catch::Contains...).
#define T_CHECK_THROWS_WITH(expr, matcher)                                                     \
  do {                                                                                         \
    DRUN_T_CATCH_OUTSIDE_SCOPE_(CHECK_THROWS_WITH(expr, matcher)) \
    try {                                                                                      \
      static_cast<void>(expr);                                                                 \
      DRUN_T_FAIL_("CHECK_THROWS_WITH(" #expr ", " #matcher "): nothing was thrown", false); \
    } catch (...) {                                                                            \
      /* the matcher used within one full expression each time: a combined matcher (a && b)    \
         keeps pointers to its parts, temporaries of that expression */                        \
      const std::string message_ = ::drun::test::thread_checks_detail::thrownMessage();                      \
      if (!(matcher).match(message_))                                                          \
        DRUN_T_FAIL_("CHECK_THROWS_WITH(" #expr "): \"" + message_ + "\" " + (matcher).toString(), false); \
    }                                                                                          \
  } while (false)

#define T_CHECK_NOTHROW(...)                                                                   \
  do {                                                                                         \
    DRUN_T_CATCH_OUTSIDE_SCOPE_(CHECK_NOTHROW(__VA_ARGS__)) \
    try {                                                                                      \
      static_cast<void>(__VA_ARGS__);                                                          \
    } catch (...) {                                                                            \
      DRUN_T_FAIL_("CHECK_NOTHROW(" #__VA_ARGS__ ") threw: " + ::drun::test::thread_checks_detail::thrownMessage(), false); \
    }                                                                                          \
  } while (false)
