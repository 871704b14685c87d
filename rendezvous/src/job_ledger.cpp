#include "job_ledger.hpp"

#include "drun/rendezvous/keys.hpp"

namespace drun::rdzv {

JobLedger readLedger(Store& store, const RoundBaseline& base) {
  auto counter = [&](const std::string& key) {
    return keys::parseCounter(store.tryGet(key)).value_or(0);
  };
  JobLedger ledger;
  ledger.base = base;
  ledger.failed = store.check({keys::failure(base.runId, base.round)});
  ledger.left = counter(keys::left(base.runId, base.round));
  ledger.lost = counter(keys::lost(base.runId, base.round));
  ledger.finished = counter(keys::finished(base.runId, base.round));
  ledger.waiting = counter(keys::waiting(base.runId, base.round));
  return ledger;
}

int64_t survivorsOf(Store& store, const RoundBaseline& base) {
  JobLedger ledger;
  ledger.base = base;
  ledger.left = keys::parseCounter(store.tryGet(keys::left(base.runId, base.round))).value_or(0);
  return ledger.survivors();
}

}  // namespace drun::rdzv
