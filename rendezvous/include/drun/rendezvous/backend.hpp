// The rendezvous backends (--rdzv-backend) and what each can do. A backend's name is read by
// parseRendezvousBackend() and written by toString() only; the launcher, the factory, drun status
// and the agent ask capabilities() instead of comparing names.
//
// Threading: constants and pure functions; thread-safe.
#pragma once

#include <optional>
#include <string_view>

namespace drun::rdzv {

enum class RendezvousBackend {
  C10d,    // drun's TCP store, served by one node of the job or by drun-rendezvous
  Etcd,    // an etcd v3 cluster holds the store (its member list is the endpoint)
  Static,  // fixed node ranks and count, MASTER_ADDR/MASTER_PORT given: no store at all
};

struct BackendCapabilities {
  bool needsEndpoint;  // a multi-node job needs --rdzv-endpoint (the store, or etcd's members)
  bool hostsStore;     // a node of the job may serve the store itself (rdzv_conf is_host)
  bool elastic;        // --nnodes MIN:MAX, lost nodes replaced, waiting nodes taken in
  bool sharedStore;    // the job's state sits in a store: an exit barrier, drun status reads it
};

constexpr BackendCapabilities capabilities(RendezvousBackend backend) {
  switch (backend) {
    case RendezvousBackend::C10d: return {.needsEndpoint = true, .hostsStore = true, .elastic = true, .sharedStore = true};
    case RendezvousBackend::Etcd: return {.needsEndpoint = true, .hostsStore = false, .elastic = true, .sharedStore = true};
    case RendezvousBackend::Static: break;
  }
  return {.needsEndpoint = false, .hostsStore = false, .elastic = false, .sharedStore = false};
}

// "c10d", "etcd", "static": the name --rdzv-backend takes.
constexpr const char* toString(RendezvousBackend backend) {
  switch (backend) {
    case RendezvousBackend::C10d: return "c10d";
    case RendezvousBackend::Etcd: return "etcd";
    case RendezvousBackend::Static: break;
  }
  return "static";
}

// A --rdzv-backend name: toString()'s, or "etcd-v3" (torchrun's name of the etcd backend).
// nullopt for any other (torchrun's "etcd-v2" included: drun speaks etcd's v3 API only).
constexpr std::optional<RendezvousBackend> parseRendezvousBackend(std::string_view name) {
  if (name == "etcd-v3") return RendezvousBackend::Etcd;
  for (RendezvousBackend b : {RendezvousBackend::C10d, RendezvousBackend::Etcd, RendezvousBackend::Static})
    if (name == toString(b)) return b;
  return std::nullopt;
}

}  // namespace drun::rdzv
