#include "drun/common/death_notice.hpp"

#include <mutex>

namespace drun {
namespace {

struct NoticeSlot {
  std::mutex mutex;
  std::optional<DeathNotice> notice;
  std::function<void(const std::optional<DeathNotice>&)> sink;
};

NoticeSlot& slot() {
  static NoticeSlot* instance = new NoticeSlot;  // never destroyed: publishers may run at exit
  return *instance;
}

}  // namespace

void publishDeathNotice(std::optional<DeathNotice> notice) {
  NoticeSlot& s = slot();
  std::lock_guard lock(s.mutex);
  s.notice = std::move(notice);
  if (s.sink) s.sink(s.notice);
}

void onDeathNotice(std::function<void(const std::optional<DeathNotice>&)> sink) {
  NoticeSlot& s = slot();
  std::lock_guard lock(s.mutex);
  s.sink = std::move(sink);
  if (s.sink) s.sink(s.notice);
}

}  // namespace drun
