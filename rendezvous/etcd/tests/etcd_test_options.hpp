// Client and store options for tests against a private etcd cluster (etcd_cluster.hpp): short
// deadlines and a short lease, so that a failing test fails within seconds.
// Threading: pure functions.
#pragma once

#include <string>
#include <vector>

#include "drun/etcd/etcd_client.hpp"
#include "drun/etcd/etcd_store.hpp"
#include "etcd_cluster.hpp"

namespace drun::test {

inline rdzv::EtcdClientOptions etcdClientOptions(const std::vector<std::string>& endpoints) {
  rdzv::EtcdClientOptions o;
  o.endpoints = endpoints;
  o.callTimeout = std::chrono::seconds(5);
  o.attemptTimeout = std::chrono::seconds(1);
  return o;
}

inline rdzv::EtcdStoreOptions etcdStoreOptions(const EtcdCluster& cluster, const std::string& scope = "job") {
  rdzv::EtcdStoreOptions o;
  o.client = etcdClientOptions(cluster.endpoints());
  o.prefix = "/t/";
  o.scope = scope;
  o.leaseTtl = std::chrono::seconds(2);
  o.connectTimeout = std::chrono::seconds(5);
  return o;
}

}  // namespace drun::test
