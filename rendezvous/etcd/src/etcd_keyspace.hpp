// How one Store key lives in etcd, so that adds and appends from N agents to one key (a round's
// `count`, `joined`, `present`) never race: a key K is a family of etcd keys, all in [K, K+"\x01"):
//   K             its value as set (set, multiSet, compareSet, an add of a delta other than +-1)
//   K "\0+"       one put per add(K, +1): its etcd version counts them
//   K "\0-"       one put per add(K, -1)
//   K "\0a" ID    one key per append, ID unique; appended in create-revision order
// A put is never refused, so an add is one transaction (the put, then a read of the counters at
// the same revision: each caller gets its own, consistent total) and an append is one put.
// Reading K is one range over its family; set and compareSet replace the whole family. Store keys
// may not contain '\0' (InvalidArgument). A key both added to and appended to reads as the sum.
// Threading: pure functions.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "drun/etcd/etcd_client.hpp"
#include "drun/store/store.hpp"

namespace drun::rdzv::etcd_keys {

// The end of K's family: every etcd key of K is in [K, familyEnd(K)).
std::string familyEnd(const std::string& key);
// The start of K's generated keys (everything of the family but K itself).
std::string generatedStart(const std::string& key);
std::string incrementKey(const std::string& key);
std::string decrementKey(const std::string& key);
std::string appendKey(const std::string& key, const std::string& uniqueId);
// A process-wide unique, never reused id for appendKey.
std::string uniqueId();

// The value of `key` from its family's key-values (a range over the family, or a watch's
// snapshot); nullopt when none exists. Non-integer K with counters: K's value (add refuses that).
std::optional<std::string> foldFamily(const std::string& key, const std::vector<EtcdKeyValue>& family);
// The int64 that `text` holds in decimal; nullopt when it holds anything else.
std::optional<int64_t> parseInteger(const std::string& text);
// The Store key that an etcd key (generated or not) belongs to.
std::string familyOf(const std::string& etcdKey);
// Distinct Store keys among etcd keys in key order (a range's): what numKeys and deletePrefix count.
int64_t familiesIn(const std::vector<EtcdKeyValue>& kvs);
// A will with nothing in it (setWill({}) clears one).
bool isEmptyWill(const Store::Will& will);
// Throws InvalidArgument when a caller's key cannot be mapped ('\0' in it).
void checkKey(const std::string& key);

}  // namespace drun::rdzv::etcd_keys
