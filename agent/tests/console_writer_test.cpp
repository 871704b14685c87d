// ConsoleWriter: order and whole lines, one lane for a shared file, back-pressure on and off,
// cancel(), the drain deadline (a reader that never reads), EPIPE.
#include "drun/agent/console_writer.hpp"

#include <atomic>
#include <future>

#include "test_support.hpp"

using namespace drun::agent;
using namespace drun::agent::test;

namespace {

// A pipe whose read end the test controls: nobody reads it until readAll() (on a thread).
struct TestPipe {
  int readFd = -1;
  int writeFd = -1;
  std::thread reader;
  std::string text;
  TestPipe() {
    int fds[2];
    REQUIRE(::pipe2(fds, O_CLOEXEC) == 0);
    readFd = fds[0];
    writeFd = fds[1];
  }
  ~TestPipe() {
    if (writeFd >= 0) ::close(writeFd);
    if (reader.joinable()) reader.join();
    if (readFd >= 0) ::close(readFd);
  }
  // Starts reading everything until EOF (closeWrite()) on a thread.
  void readAll() {
    reader = std::thread([this] {
      char buf[64 * 1024];
      for (;;) {
        ssize_t n = ::read(readFd, buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return;
        text.append(buf, static_cast<size_t>(n));
      }
    });
  }
  std::string waitText() {
    if (writeFd >= 0) ::close(std::exchange(writeFd, -1));
    if (reader.joinable()) reader.join();
    return text;
  }
  void closeRead() {
    if (readFd >= 0 && !reader.joinable()) ::close(std::exchange(readFd, -1));
  }
  // The writer abandoned a thread that may still be inside write(2) on the write end: closing that
  // under it is a race (TSan reports it) and could hand its number to the next open. The read end
  // goes (the write fails with EPIPE: the thread ends); the write end stays open until exit.
  void abandon() {
    closeRead();
    writeFd = -1;
  }
};

std::string line(char c, size_t size) { return std::string(size - 1, c) + "\n"; }

}  // namespace

TEST_CASE("lines reach the console whole and in order, stdout and stderr on one file in one lane",
          "[agent]") {
  TestPipe pipe;
  pipe.readAll();
  std::string expected;
  {
    ConsoleWriter writer(ConsoleWriterOptions{pipe.writeFd, pipe.writeFd});
    for (int i = 0; i < 2000; ++i) {
      std::string text = std::to_string(i) + (i % 2 ? " err" : " out") + "\n";
      expected += text;
      CHECK(writer.write(i % 2 ? ConsoleStream::Err : ConsoleStream::Out, text));
    }
    CHECK(writer.drain(10s));
  }  // the destructor joins the idle lane
  CHECK(pipe.waitText() == expected);
}

TEST_CASE("the destructor writes what is still queued", "[agent]") {
  TestPipe out, err;
  out.readAll();
  err.readAll();
  {
    ConsoleWriter writer(ConsoleWriterOptions{out.writeFd, err.writeFd});
    for (int i = 0; i < 100; ++i) {
      writer.write(ConsoleStream::Out, line('o', 1000));
      writer.write(ConsoleStream::Err, line('e', 1000));
    }
  }
  CHECK(out.waitText() == [] {
    std::string all;
    for (int i = 0; i < 100; ++i) all += line('o', 1000);
    return all;
  }());
  CHECK(err.waitText().size() == 100 * 1000);
}

TEST_CASE("back-pressure: congested above the high-water mark, resumed at the low-water mark",
          "[agent]") {
  TestPipe out, err;
  err.readAll();
  ConsoleWriterOptions options{out.writeFd, err.writeFd};
  options.highWaterBytes = 32 * 1024;
  options.lowWaterBytes = 8 * 1024;
  ConsoleWriter writer(options);
  CHECK_FALSE(writer.congested(ConsoleStream::Out));
  CHECK_FALSE(writer.whenWritable(ConsoleStream::Out, &out, [] {}));  // not congested: resume now

  // Nobody reads stdout: the pipe fills, then the queue; once more than both were written, the
  // lane stays congested. write() never blocks.
  auto start = std::chrono::steady_clock::now();
  int capacity = ::fcntl(out.writeFd, F_GETPIPE_SZ);
  REQUIRE(capacity > 0);
  int writes = (capacity + static_cast<int>(options.highWaterBytes)) / 4096 + 2;
  for (int i = 0; i < writes; ++i) REQUIRE(writer.write(ConsoleStream::Out, line('x', 4096)));
  CHECK(writer.congested(ConsoleStream::Out));
  CHECK(std::chrono::steady_clock::now() - start < 2s);
  // stderr is another lane: it still flows.
  CHECK_FALSE(writer.congested(ConsoleStream::Err));
  CHECK(writer.write(ConsoleStream::Err, "still flowing\n"));

  std::promise<void> resumed;
  auto resumedFuture = resumed.get_future();
  std::atomic<int> calls{0};
  REQUIRE(writer.whenWritable(ConsoleStream::Out, &out, [&] {
    if (calls++ == 0) resumed.set_value();
  }));
  std::atomic<bool> cancelledRan{false};
  REQUIRE(writer.whenWritable(ConsoleStream::Out, &err, [&] { cancelledRan = true; }));
  writer.cancel(&err);
  CHECK(resumedFuture.wait_for(0s) == std::future_status::timeout);

  out.readAll();  // the reader comes back
  REQUIRE(resumedFuture.wait_for(10s) == std::future_status::ready);
  CHECK_FALSE(writer.congested(ConsoleStream::Out));
  CHECK(writer.drain(10s));
  CHECK(calls == 1);
  CHECK_FALSE(cancelledRan);
  CHECK(out.waitText().size() == static_cast<size_t>(writes) * 4096);
  CHECK(err.waitText() == "still flowing\n");
}

TEST_CASE("drain gives up at its deadline and abandons a console nobody reads", "[agent]") {
  TestPipe out, err;
  err.readAll();
  auto writer = std::make_unique<ConsoleWriter>(ConsoleWriterOptions{out.writeFd, err.writeFd});
  for (int i = 0; i < 64; ++i) writer->write(ConsoleStream::Out, line('x', 4096));  // > the pipe
  writer->write(ConsoleStream::Err, "err line\n");

  CHECK_FALSE(writer->flush(100ms));  // waits, and gives up nothing
  CHECK_FALSE(writer->dropped(ConsoleStream::Out));
  auto start = std::chrono::steady_clock::now();
  CHECK_FALSE(writer->drain(300ms));
  auto took = std::chrono::steady_clock::now() - start;
  CHECK(took >= 250ms);
  CHECK(took < 3s);
  CHECK(writer->dropped(ConsoleStream::Out));
  CHECK_FALSE(writer->write(ConsoleStream::Out, "never written\n"));  // prints nothing more
  CHECK_FALSE(writer->congested(ConsoleStream::Out));
  CHECK_FALSE(writer->dropped(ConsoleStream::Err));  // the other lane was drained
  CHECK(writer->write(ConsoleStream::Err, "err after\n"));

  // Destroying it does not wait for the stuck write(2) (its thread is left to finish or die).
  start = std::chrono::steady_clock::now();
  writer.reset();
  CHECK(std::chrono::steady_clock::now() - start < 1s);
  CHECK(err.waitText() == "err line\nerr after\n");
  out.abandon();
}

TEST_CASE("EPIPE drops the console's lane, not the process", "[agent]") {
  TestPipe out;
  out.closeRead();  // nobody will ever read
  ConsoleWriter writer(ConsoleWriterOptions{out.writeFd, out.writeFd});
  CHECK(writer.write(ConsoleStream::Out, "lost\n"));
  REQUIRE(eventually([&] { return writer.dropped(ConsoleStream::Out); }));
  CHECK(writer.dropped(ConsoleStream::Err));  // the same file: the same lane
  CHECK_FALSE(writer.write(ConsoleStream::Err, "lost too\n"));
  CHECK_FALSE(writer.congested(ConsoleStream::Out));
  CHECK_FALSE(writer.whenWritable(ConsoleStream::Out, &out, [] {}));
  CHECK(writer.drain(0ms));  // nothing left to wait for
}

TEST_CASE("partial lines: another writer ends an open line and its rest gets a fresh prefix",
          "[agent]") {
  TestPipe out;
  out.readAll();
  {
    ConsoleWriter writer(ConsoleWriterOptions{out.writeFd, out.writeFd});
    LineSource a{"[0]:"}, b{"[1]:"};
    writer.write(ConsoleStream::Out, "[0]:Loading", &a);
    writer.write(ConsoleStream::Out, " 50%", &a);           // the same source: the same line
    writer.write(ConsoleStream::Err, "[1]:other line\n", &b);  // breaks in: a's line ends first
    writer.write(ConsoleStream::Out, " done\n", &a);          // a's rest: prefixed again
    writer.write(ConsoleStream::Out, "[0]:10%\r", &a);        // a redraw, open after '\r'
    writer.write(ConsoleStream::Out, "[0]:20%\r", &a);        // same source: redraws in place
    writer.write(ConsoleStream::Err, "drun: note\n");         // a writer without a name
    writer.write(ConsoleStream::Out, "[0]:30%", &a);
    writer.endLine(ConsoleStream::Out, &a);                   // the source goes away
    writer.endLine(ConsoleStream::Out, &b);                   // nothing open: nothing written
    writer.write(ConsoleStream::Out, "[1]:last\n", &b);
  }
  CHECK(out.waitText() ==
        "[0]:Loading 50%\n[1]:other line\n[0]: done\n[0]:10%\r[0]:20%\r\ndrun: note\n[0]:30%\n"
        "[1]:last\n");
}

TEST_CASE("a write error breaks the lane once and tells whoever asked", "[agent]") {
  TestPipe out;
  out.closeRead();
  ConsoleWriter writer(ConsoleWriterOptions{out.writeFd, out.writeFd});
  std::atomic<int> told{0};
  int owner = 0;
  CHECK(writer.whenBroken(ConsoleStream::Out, &owner, [&] { ++told; }));
  CHECK_FALSE(writer.broken(ConsoleStream::Out));
  writer.write(ConsoleStream::Out, "lost\n");
  REQUIRE(eventually([&] { return told.load() == 1; }));
  CHECK(writer.broken(ConsoleStream::Err));  // the same file: the same lane
  CHECK_FALSE(writer.whenBroken(ConsoleStream::Out, &owner, [&] { ++told; }));
  CHECK(told.load() == 1);
}

TEST_CASE("drain abandons a lane without breaking it", "[agent]") {
  TestPipe out;  // nobody reads: the writer blocks once the pipe is full
  ConsoleWriterOptions options{out.writeFd, out.writeFd};
  options.drainOnDestroy = 0ms;
  ConsoleWriter writer(options);
  writer.write(ConsoleStream::Out, std::string(256 * 1024, 'x') + "\n");
  CHECK_FALSE(writer.drain(50ms));
  CHECK(writer.dropped(ConsoleStream::Out));
  CHECK_FALSE(writer.broken(ConsoleStream::Out));
  out.abandon();
}

TEST_CASE("a line ended outside (a typed line's echo) gives the open line's rest a prefix",
          "[agent]") {
  TestPipe out;
  out.readAll();
  {
    ConsoleWriter writer(ConsoleWriterOptions{out.writeFd, out.writeFd});
    LineSource a{"[0]:"};
    writer.write(ConsoleStream::Out, "[0]:(Pdb) ", &a);
    writer.lineEndedOutside();  // the user typed "p x\n": the terminal is on a new line
    writer.write(ConsoleStream::Out, "42\n", &a);
    writer.write(ConsoleStream::Out, "[0]:(Pdb) ", &a);
    writer.endLine(ConsoleStream::Out, &a);
  }
  CHECK(out.waitText() == "[0]:(Pdb) [0]:42\n[0]:(Pdb) \n");
}
