#include "drun/agent/output_mux.hpp"

#include <unistd.h>

#include <algorithm>
#include <boost/asio/post.hpp>
#include <string_view>
#include <system_error>
#include <utility>

#include "drun/common/error.hpp"
#include "handler_guard.hpp"
#include "output_mux_impl.hpp"

namespace drun::agent {

namespace asio = boost::asio;

namespace {

void replaceAll(std::string& text, std::string_view macro, const std::string& value) {
  for (size_t at = text.find(macro); at != std::string::npos; at = text.find(macro, at)) {
    text.replace(at, macro.size(), value);
    at += value.size();
  }
}

}  // namespace

std::string expandPrefix(const std::string& tmpl, const OutputOptions& options, int localRank,
                         int globalRank) {
  std::string out = tmpl;
  if (out.find("${") == std::string::npos) return out;
  replaceAll(out, "${rank}", std::to_string(globalRank));
  replaceAll(out, "${local_rank}", std::to_string(localRank));
  replaceAll(out, "${role_name}", options.roleName);
  replaceAll(out, "${hostname}", options.hostname);
  return out;
}

OutputMux::Impl::Impl(asio::io_context& io, OutputOptions options)
    : io(io),
      options(std::move(options)),
      console(this->options.console ? this->options.console : ConsoleWriter::standard()) {
  for (ConsoleStream target : {ConsoleStream::Out, ConsoleStream::Err}) {
    partialLineDelay[static_cast<int>(target)] = ::isatty(console->fd(target)) == 1
                                                     ? this->options.partialLineDelay
                                                     : this->options.partialLinePipeDelay;
    auto broken = [this, target, executor = io.get_executor(), life = std::weak_ptr<int>(life)] {
      // On the console's thread, its lock held: only post.
      asio::post(executor, [this, target, life] {
        if (!life.expired()) detail::guarded("worker output", [&] { consoleBroken(target); });
      });
    };
    if (!console->whenBroken(target, this, broken)) broken();
  }
}

OutputMux::Impl::~Impl() {
  // What the workers left in pipes paused by back-pressure still goes to the files and the
  // console queue, which outlives the mux and drains at exit.
  detail::guarded("worker output", [&] {
    for (Source* src : allSources())
      for (Stream* stream : {&src->out, &src->err}) {
        sweep(*stream);
        if (!stream->eof && stream->text.holdsPartial()) {
          stream->text.flushPartial('\n', sinkOf(*stream));
          flushBatch(*stream);
        }
        console->endLine(stream->target(), &stream->line);  // the source goes away
      }
  });
  console->cancel(this);  // no resume callback runs once this returns
  files->cancel(this);
}

OutputMux::Impl::Source& OutputMux::Impl::prepare(int localRank, int globalRank, const Source* continuing) {
  if (auto it = sources.find(localRank); it != sources.end()) return *it->second;
  auto src = std::make_unique<Source>();
  src->out.source = src->err.source = src.get();
  src->err.isStderr = true;
  src->err.tailInto = &src->tail;
  src->out.tailInto = &src->outTail;
  label(*src, localRank, globalRank, continuing);
  // Entered only now: a rank whose files could not be opened leaves no empty entry behind.
  return *sources.emplace(localRank, std::move(src)).first->second;
}

void OutputMux::Impl::label(Source& src, int localRank, int globalRank, const Source* continuing) {
  src.localRank = localRank;
  src.globalRank = globalRank;
  src.prefix = expandPrefix(options.prefixTemplate, options, localRank, globalRank);
  src.out.line.prefix = src.err.line.prefix = src.prefix;
  StdRouting routing = options.defaultRouting;
  if (auto it = options.routing.find(localRank); it != options.routing.end())
    routing = it->second;
  bool console = consoleAllowed(localRank);
  src.out.toConsole = console;
  src.err.toConsole = console;
  if (options.attemptDir) {
    std::filesystem::path dir = *options.attemptDir / std::to_string(localRank);
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec)
      throw Error("cannot create worker log directory " + dir.string() + ": " + ec.message());
    src.out.file = continuing ? continuing->out.file : files->open(dir / "stdout.log", options.logRotation);
    src.err.file = continuing ? continuing->err.file : files->open(dir / "stderr.log", options.logRotation);
    for (Stream* stream : {&src.out, &src.err}) addFilters(*stream);
    // A redirected stream stays off the console unless it is also tee'd (torchrun: tee wins).
    src.out.toConsole = console && (!(routing.redirect & 1) || (routing.tee & 1));
    src.err.toConsole = console && (!(routing.redirect & 2) || (routing.tee & 2));
  }
}

void OutputMux::Impl::addFilters(Stream& stream) {
  const auto& substrings = stream.isStderr ? options.duplicateStderrFilters : options.duplicateStdoutFilters;
  if (substrings.empty()) return;
  auto& file = filteredFiles[stream.isStderr];
  if (!file) file = files->open(*options.attemptDir / (stream.isStderr ? "filtered_stderr.log" : "filtered_stdout.log"), options.logRotation);
  stream.filtered.addTarget(substrings, file);
}

OutputMux::Impl::Source& OutputMux::Impl::prepareStandby(int slot) {
  auto src = std::make_unique<Source>();
  src->out.source = src->err.source = src.get();
  src->err.isStderr = true;
  src->err.tailInto = &src->tail;
  src->out.tailInto = &src->outTail;
  src->localRank = src->globalRank = standbySource(slot);
  src->prefix = options.prefixTemplate;
  for (const char* macro : {"${rank}", "${local_rank}"})
    replaceAll(src->prefix, macro, "standby " + std::to_string(slot));
  src->prefix = expandPrefix(src->prefix, options, 0, 0);
  src->out.line.prefix = src->err.line.prefix = src->prefix;
  src->out.toConsole = src->err.toConsole = !options.consoleLocalRanks;
  return *sources.emplace(standbySource(slot), std::move(src)).first->second;
}

void OutputMux::Impl::startSource(Source& src, int stdoutFd, int stderrFd, std::function<void()> onClosed) {
  if (src.attached) throw std::logic_error("OutputMux: local rank attached twice");
  src.attached = true;
  src.onClosed = std::move(onClosed);
  startReading(src.out, stdoutFd);
  if (stderrFd >= 0) {
    startReading(src.err, stderrFd);
  } else {
    src.err.eof = true;  // merged into stdout's pipe
    src.out.tailInto = &src.tail;
    src.out.filtered.addTargets(src.err.filtered);
  }
}

const OutputMux::Impl::Source* OutputMux::Impl::retire(int localRank) {
  auto it = sources.find(localRank);
  if (it == sources.end()) return nullptr;
  retired.push_back(std::move(it->second));
  sources.erase(it);
  return retired.back().get();
}

OutputMux::OutputMux(asio::io_context& io, OutputOptions options)
    : impl_(std::make_unique<Impl>(io, std::move(options))) {}

OutputMux::~OutputMux() = default;

void OutputMux::prepare(int localRank, int globalRank) { impl_->prepare(localRank, globalRank); }

void OutputMux::attach(int localRank, int globalRank, int stdoutFd, int stderrFd,
                       std::function<void()> onClosed) {
  impl_->startSource(impl_->prepare(localRank, globalRank), stdoutFd, stderrFd, std::move(onClosed));
}

void OutputMux::reattach(int localRank, int globalRank, int stdoutFd, int stderrFd,
                         std::function<void()> onClosed) {
  const Impl::Source* previous = impl_->retire(localRank);
  impl_->startSource(impl_->prepare(localRank, globalRank, previous), stdoutFd, stderrFd, std::move(onClosed));
}

void OutputMux::attachStandby(int slot, int stdoutFd, int stderrFd, std::function<void()> onClosed) {
  if (impl_->sources.count(standbySource(slot))) throw std::logic_error("OutputMux: standby slot attached twice");
  impl_->startSource(impl_->prepareStandby(slot), stdoutFd, stderrFd, std::move(onClosed));
}

void OutputMux::adopt(int slot, int localRank, int globalRank) {
  auto it = impl_->sources.find(standbySource(slot));
  if (it == impl_->sources.end()) throw std::logic_error("OutputMux::adopt: no standby in that slot");
  std::unique_ptr<Impl::Source> src = std::move(it->second);
  impl_->sources.erase(it);
  const Impl::Source* previous = impl_->retire(localRank);
  impl_->label(*src, localRank, globalRank, previous);
  impl_->sources.emplace(localRank, std::move(src));
}

void OutputMux::sweep(int localRank) { impl_->sweepRank(localRank); }

bool OutputMux::closed(int localRank) const {
  auto it = impl_->sources.find(localRank);
  return it != impl_->sources.end() && it->second->out.eof && it->second->err.eof;
}

std::deque<std::string> OutputMux::stderrTail(int localRank) const {
  auto it = impl_->sources.find(localRank);
  if (it == impl_->sources.end()) return {};
  return it->second->tail;
}

std::deque<std::string> OutputMux::stdoutTail(int localRank) const {
  auto it = impl_->sources.find(localRank);
  if (it == impl_->sources.end()) return {};
  return it->second->outTail;
}

}  // namespace drun::agent
