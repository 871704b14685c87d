// drun.torch._backend: the Python module that makes ProcessGroupDrun reachable from
// torch.distributed. python/drun/torch/__init__.py registers create_process_group as the
// creator of the backend "drun" (torch 1.13: creator(store, rank, size, timeout) -> ProcessGroup).
// For in-process recovery it also gives Python the workers' store as a torch Store (WorkerStore),
// the abort of a gloo group (abort_gloo) and the world group made over the workers' store.
// torch.distributed must be imported first (it registers the Store and ProcessGroup types
// this module's signatures use). The GIL is released while a group is created and while a call
// waits on a store or the network.
#include <pybind11/chrono.h>
#include <pybind11/stl.h>
#include <torch/python.h>

#include "drun/common/error.hpp"
#include "gloo_abort.hpp"
#include "process_group_drun.hpp"
#include "worker_store.hpp"

namespace py = pybind11;
using drun::torch_backend::ProcessGroupDrun;
using drun::torch_backend::WorkerStore;
using drun::torch_backend::WorkerStoreOptions;

namespace {

std::optional<py::bytes> bytesOrNone(const std::optional<std::string>& value) {
  if (!value) return std::nullopt;
  return py::bytes(*value);
}

// The drun group behind a torch ProcessGroup; ValueError for another backend's.
ProcessGroupDrun& drunGroup(const c10::intrusive_ptr<c10d::ProcessGroup>& group) {
  auto* drun = dynamic_cast<ProcessGroupDrun*>(group.get());
  if (!drun) throw py::value_error("not a drun process group: " + group->getBackendName());
  return *drun;
}

}  // namespace

PYBIND11_MODULE(_backend, m) {
  m.doc() = "drun's torch.distributed backend (libdrun_comm), registered by drun.torch";
  m.def("create_process_group", &ProcessGroupDrun::create, py::arg("store"), py::arg("rank"),
        py::arg("size"), py::arg("timeout"), py::call_guard<py::gil_scoped_release>(),
        "The backend creator init_process_group / new_group call: (store, rank, size, timeout).");
  m.def("create_world_process_group", &ProcessGroupDrun::createWorld, py::arg("rank"),
        py::arg("size"), py::arg("timeout"), py::call_guard<py::gil_scoped_release>(),
        "The default group under in-process recovery: libdrun_comm's env:// init (the workers' "
        "store, this process's generation) instead of the torch store.");
  m.def(
      "transport",
      [](const c10::intrusive_ptr<c10d::ProcessGroup>& group) {
        return drunGroup(group).transport();
      },
      py::arg("group"), "How a drun group's ranks talk: 'shm', 'tcp' or 'hierarchical'.");
  m.def(
      "reform",
      [](const c10::intrusive_ptr<c10d::ProcessGroup>& group, std::chrono::milliseconds timeout) {
        ProcessGroupDrun& drun = drunGroup(group);
        py::gil_scoped_release release;
        return drun.reform(timeout);
      },
      py::arg("group"), py::arg("timeout"),
      "Moves the default drun group to the newest generation in place; returns that generation.");
  m.def(
      "hand_over", [](const c10::intrusive_ptr<c10d::ProcessGroup>& group) { return drunGroup(group).handOver(); },
      py::arg("group"), py::call_guard<py::gil_scoped_release>(),
      "After a reform that resized the world: a new group on the same communicator, with its new rank "
      "and size (torch's groups keep theirs); the old one runs nothing more.");
  m.def(
      "stop_queue", [](const c10::intrusive_ptr<c10d::ProcessGroup>& group) { drunGroup(group).stopQueue(); },
      py::arg("group"), py::call_guard<py::gil_scoped_release>(),
      "At the interpreter's exit: runs what the group queued and ends its threads (later collectives fail).");
  m.def(
      "generation",
      [](const c10::intrusive_ptr<c10d::ProcessGroup>& group) {
        return drunGroup(group).generation();
      },
      py::arg("group"), "The generation a drun group's communicator formed (0 without recovery).");
  m.def("abort_gloo", &drun::torch_backend::abortGloo, py::arg("group"),
        py::call_guard<py::gil_scoped_release>(),
        "Shuts down the sockets of a gloo group's pairs: its pending work fails at once.");

  py::class_<WorkerStore, c10d::Store, c10::intrusive_ptr<WorkerStore>>(
      m, "WorkerStore", "torch Store over the workers' store (drun's TcpStore), under a prefix")
      .def(py::init([](const std::string& host, uint16_t port, const std::string& prefix,
                       const std::string& token, std::chrono::milliseconds timeout) {
             py::gil_scoped_release release;
             return c10::make_intrusive<WorkerStore>(
                 WorkerStoreOptions{host, port, prefix, token, timeout});
           }),
           py::arg("host"), py::arg("port"), py::arg("prefix"), py::arg("token"), py::arg("timeout"))
      .def(
          "try_get",
          [](WorkerStore& s, const std::string& key) {
            std::optional<std::string> value;
            {
              py::gil_scoped_release release;
              value = s.tryGet(key);
            }
            return bytesOrNone(value);
          },
          py::arg("key"), "The value, or None at once when the key is absent.")
      .def(
          "watch",
          [](WorkerStore& s, const std::string& key, std::optional<std::string> known,
             std::chrono::milliseconds timeout) {
            std::optional<std::string> value;
            {
              py::gil_scoped_release release;
              try {
                value = s.watch(key, known, timeout);
              } catch (const drun::TimeoutError&) {
                value = known;  // unchanged within the timeout
              }
            }
            return bytesOrNone(value);
          },
          py::arg("key"), py::arg("known"), py::arg("timeout"),
          "Waits until the key's value differs from `known` (None = absent) or the timeout; "
          "returns the value then (`known` when it did not change).")
      .def("interrupt", &WorkerStore::interrupt, py::call_guard<py::gil_scoped_release>(),
           "Ends the connection: a watch in another thread returns at once.")
      .def("abandon", &WorkerStore::abandon, py::arg("reason"),
           "Every blocking call now and later fails within 200 ms, naming the reason.")
      .def("settle", &WorkerStore::settle, py::arg("key"), py::arg("count"),
           "add() on the key returns `count` from now on, without the store (a barrier passed).")
      .def_property_readonly("endpoint", &WorkerStore::endpoint);
}
