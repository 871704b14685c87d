// Unit tests of hang blame (hang_blame.hpp): stacks as eu-stack, gdb and /proc print them are
// classified by their main thread, and the culprit chosen is the rank not waiting for its peers;
// the summary shows why before the stack.
#include <catch2/catch.hpp>

#include "drun/agent/failure_summary.hpp"
#include "hang_blame.hpp"

using namespace drun::agent;
using namespace drun::agent::detail;
using namespace std::chrono_literals;

namespace {

// eu-stack of a torch rank waiting in a gloo all_reduce (main thread 100; a gloo helper thread
// waits in its loop too, which must not matter).
constexpr const char* kGlooWaiter = R"(PID 100 - process
TID 100:
#0  0x00007f98182e3f16 __futex_abstimed_wait_common
#1  0x00007f98182e65d8 pthread_cond_wait@@GLIBC_2.3.2
#2  0x00007f9813ec2843 c10d::Work::wait(std::chrono::duration<long, std::ratio<1l, 1000l> >)
#3  0x00007f98177a9b4e
#4  0x0000000000517fc3 _PyObject_MakeTpCall
#5  0x0000000000627bd1 _start
TID 101:
#0  0x00007f9818366f36 epoll_wait
#1  0x00007f980f073ecf gloo::transport::tcp::Loop::run()
)";

// eu-stack of a rank in time.sleep whose gloo thread waits (it is not the main thread).
constexpr const char* kSleeper = R"(PID 200 - process
TID 200:
#0  0x00007f6d145eb545 clock_nanosleep@GLIBC_2.2.5
#1  0x00000000005d64b4
#2  0x000000000053acbc PyObject_Vectorcall
TID 201:
#0  0x00007f6d14624f36 epoll_wait
#1  0x00007f6d0b684ecf gloo::transport::tcp::Loop::run()
)";

// gdb lists the main thread last.
constexpr const char* kGdbStoreWait = R"(Thread 2 (Thread 0x7f00 (LWP 301) "python3"):
#0  0x00007f01 in __GI___poll (fds=0x1, nfds=1, timeout=-1) at poll.c:29
#1  0x00007f02 in ?? ()
Thread 1 (Thread 0x7f99 (LWP 300) "python3"):
#0  0x00007f03 in __libc_recv (fd=3) at recv.c:28
#1  0x00007f04 in c10d::detail::TCPClient::receiveBits (this=0x1) at TCPStore.cpp:100
#2  0x00007f05 in c10d::TCPStore::doGet (this=0x2, key=...) at TCPStore.cpp:400
)";

}  // namespace

TEST_CASE("hang blame: a main thread in a collective or a store call waits, elsewhere it does not", "[hangs]") {
  RankActivity waiter = classifyStack(kGlooWaiter, 100);
  CHECK(waiter.activity == Activity::Waiting);
  CHECK(waiter.where == "c10d::Work::wait");

  RankActivity sleeper = classifyStack(kSleeper, 200);
  CHECK(sleeper.activity == Activity::NotWaiting);
  CHECK(sleeper.where == "clock_nanosleep");

  RankActivity store = classifyStack(kGdbStoreWait, 300);
  CHECK(store.activity == Activity::Waiting);
  CHECK(store.where == "c10d::detail::TCPClient::receiveBits");

  // drun's own backend and libdrun_comm.
  CHECK(classifyStack("TID 7:\n#0  0x1 drun::comm::detail::OpProgress::wait(int)\n", 7).activity == Activity::Waiting);
  CHECK(classifyStack("TID 7:\n#0  0x1 drun::torch_backend::CollectiveWork::wait(std::chrono::duration)\n", 7).activity ==
        Activity::Waiting);
  // A helper thread that waits does not make the rank a waiter (the sleeper's gloo loop above);
  // a stack without the main thread's block says nothing.
  CHECK(classifyStack(kGlooWaiter, 999).activity == Activity::Unknown);
}

TEST_CASE("hang blame: /proc thread states, empty and hostile tool output", "[hangs]") {
  CHECK(classifyStack("thread 5 (python3): state S, waiting in hrtimer_nanosleep\n", 5).activity == Activity::NotWaiting);
  CHECK(classifyStack("thread 5 (worker): state R, running\n", 5).activity == Activity::NotWaiting);
  RankActivity futex = classifyStack("thread 5 (python3): state S, waiting in futex_do_wait\n", 5);
  CHECK(futex.activity == Activity::Unknown);  // a futex may be anything
  CHECK(futex.where == "futex_do_wait");
  CHECK(classifyStack("", 5).activity == Activity::Unknown);
  CHECK(classifyStack("TID 5:\n#0  0x00007f01\n#1  0x00007f02 ??\n", 5).activity == Activity::Unknown);  // no names
  CHECK(classifyStack(std::string("TID 5:\n#") + std::string(100000, '9'), 5).activity == Activity::Unknown);
  CHECK(classifyStack("TID 5:\n#0  0x1 " + std::string(5000, 'x') + "\n", 5).where.size() <= 120);
  CHECK(classifyStack(std::string("TID 5:\n#\0\xff\n", 10), 5).activity == Activity::Unknown);
  CHECK(classifyStack("TID 5:\n#0  0x1 evil\x1b[2J\n", 5).activity == Activity::Unknown);  // no escape reaches a terminal
}

TEST_CASE("hang blame: of two silent ranks, the one not waiting is blamed, whatever their order", "[hangs]") {
  SurveyedRank waiter{0, true, 5100ms, "", classifyStack(kGlooWaiter, 100)};
  SurveyedRank sleeper{1, true, 5100ms, "", classifyStack(kSleeper, 200)};
  for (bool flipped : {false, true}) {
    std::vector<SurveyedRank> ranks = flipped ? std::vector{sleeper, waiter} : std::vector{waiter, sleeper};
    Blame b = chooseCulprit(ranks, 4, /*mayBlameWaiter=*/false);
    CHECK(b.culprit == 1);
    CHECK(b.why == "rank 5 is not waiting for its peers (its main thread is in clock_nanosleep); rank 4 waits in c10d::Work::wait");
  }
  // The waiter stopped first (silent longer): still not blamed.
  waiter.silentFor = 9000ms;
  CHECK(chooseCulprit({waiter, sleeper}, 0, true).culprit == 1);
}

TEST_CASE("hang blame: waiters are blamed only after their grace, and a channel's collective means waiting", "[hangs]") {
  SurveyedRank a{0, true, 3000ms, "", classifyStack(kGlooWaiter, 100)};
  SurveyedRank b{1, true, 2000ms, "all_reduce #3 of world", classifyStack(kSleeper, 200)};
  CHECK(chooseCulprit({a, b}, 0, false).culprit == -1);  // every candidate waits: its peer is elsewhere
  Blame late = chooseCulprit({a, b}, 0, true);
  CHECK(late.culprit == 0);  // the longest silent
  CHECK(late.why.rfind("every rank of this node waits for a peer (rank 0 waits in c10d::Work::wait)", 0) == 0);
  CHECK(late.why.find("rank 1 waits in all_reduce #3 of world") != std::string::npos);

  // Unknown beats waiting; a rank that is no candidate is only described.
  SurveyedRank unknown{2, true, 1000ms, "", {}};
  SurveyedRank beating{3, false, 0ms, "", classifyStack(kSleeper, 200)};
  Blame u = chooseCulprit({a, unknown, beating}, 0, false);
  CHECK(u.culprit == 2);
  CHECK(u.why == "rank 2 is not known to wait for its peers (its main thread cannot be read); rank 0 waits in "
                 "c10d::Work::wait; rank 3 is in clock_nanosleep");
  CHECK(chooseCulprit({beating}, 0, true).culprit == -1);  // no candidate, no blame

  std::vector<SurveyedRank> many(20, a);
  for (int i = 0; i < 20; ++i) many[i].localRank = i;
  many[7].activity = classifyStack(kSleeper, 200);
  Blame m = chooseCulprit(many, 0, false);
  CHECK(m.culprit == 7);
  CHECK(m.why.find("; and 11 more") != std::string::npos);
}

TEST_CASE("hang blame: the summary says why before the culprit's stack, with its Python line", "[hangs]") {
  drun::rdzv::FailureRecord record;
  record.rank = 1;
  record.localRank = 1;
  record.node = "vm";
  record.signal = 6;
  record.detail = "Fatal Python error: Aborted\n\nCurrent thread 0x00007f (most recent call first):\n"
                  "  File \"/tmp/job/hang.py\", line 12 in <module>\n";
  markHang(record, "no heartbeat for 5.1s (hang timeout 5.0s)", "faulthandler", "",
           "rank 1 is not waiting for its peers (its main thread is in clock_nanosleep); rank 0 waits in c10d::Work::wait");
  const std::string summary = formatFailureSummary(record);
  INFO(summary);
  CHECK(summary.find("hung: no heartbeat for 5.1s (hang timeout 5.0s)\n") != std::string::npos);
  const size_t why = summary.find(
      "\ndrun:   why: rank 1 is not waiting for its peers (its main thread is in clock_nanosleep, Python at hang.py:12 "
      "in <module>); rank 0 waits in c10d::Work::wait\n");
  const size_t stack = summary.find("File \"/tmp/job/hang.py\", line 12 in <module>");
  REQUIRE(why != std::string::npos);
  REQUIRE(stack != std::string::npos);
  CHECK(why < stack);
  CHECK(summary.find("drun:     why:") == std::string::npos);  // not repeated inside the stack

  // A native stack: the why, then the stack; no why: the summary as before.
  drun::rdzv::FailureRecord native = record;
  markHang(native, "no heartbeat for 2s (hang timeout 1.0s)", "eu-stack", "TID 9:\n#0  0x1 main\n", "rank 1 is not waiting for its peers (its main thread is in main)");
  CHECK(formatFailureSummary(native).find("why: rank 1 is not waiting for its peers (its main thread is in main)\ndrun:   its stack (eu-stack):\ndrun:     TID 9:") != std::string::npos);
  drun::rdzv::FailureRecord plain = record;
  markHang(plain, "no heartbeat for 2s (hang timeout 1.0s)", "eu-stack", "TID 9:\n");
  CHECK(formatFailureSummary(plain).find("why:") == std::string::npos);
}
