#include "job_ledger.hpp"

#include "drun/rendezvous/keys.hpp"
#include "drun/store/store_batch.hpp"

namespace drun::rdzv {

// One batch: one round trip, and on etcd one transaction (a snapshot of the nine).
JobLedger readLedger(LivenessStore& store, const RoundBaseline& base) {
  StoreBatch reads;
  const size_t failure = reads.tryGet(keys::failure(base.runId, base.round));
  const size_t left = reads.tryGet(keys::left(base.runId, base.round));
  const size_t lost = reads.tryGet(keys::lost(base.runId, base.round));
  const size_t finished = reads.tryGet(keys::finished(base.runId, base.round));
  const size_t waiting = reads.tryGet(keys::waiting(base.runId, base.round));
  const size_t ending = reads.tryGet(keys::ending(base.runId, base.round));
  const size_t replaced = reads.tryGet(keys::replaced(base.runId, base.round));
  const size_t dropped = reads.tryGet(keys::dropped(base.runId, base.round));
  const size_t grown = reads.tryGet(keys::grown(base.runId, base.round));
  store.runBatch(reads);
  auto counter = [&](size_t op) { return keys::parseCounter(reads.value(op)).value_or(0); };
  JobLedger ledger;
  ledger.base = base;
  ledger.failed = reads.value(failure).has_value();
  ledger.left = counter(left);
  ledger.lost = counter(lost);
  ledger.finished = counter(finished);
  ledger.waiting = counter(waiting);
  ledger.replaced = counter(replaced);
  ledger.dropped = counter(dropped);
  ledger.grown = counter(grown);
  ledger.ending = keys::parseEnding(reads.value(ending));
  return ledger;
}

int64_t survivorsOf(LivenessStore& store, const RoundBaseline& base) {
  JobLedger ledger;
  ledger.base = base;
  StoreBatch reads;
  const size_t left = reads.tryGet(keys::left(base.runId, base.round));
  const size_t replaced = reads.tryGet(keys::replaced(base.runId, base.round));
  const size_t grown = reads.tryGet(keys::grown(base.runId, base.round));
  store.runBatch(reads);
  ledger.left = keys::parseCounter(reads.value(left)).value_or(0);
  ledger.replaced = keys::parseCounter(reads.value(replaced)).value_or(0);
  ledger.grown = keys::parseCounter(reads.value(grown)).value_or(0);
  return ledger.survivors();
}

}  // namespace drun::rdzv
