// drun.torch._backend: the Python module that makes ProcessGroupDrun reachable from
// torch.distributed. python/drun/torch/__init__.py registers create_process_group as the
// creator of the backend "drun" (torch 1.13: creator(store, rank, size, timeout) -> ProcessGroup).
// torch.distributed must be imported first (it registers the Store and ProcessGroup types
// this module's signatures use). The GIL is released while a group is created.
#include <pybind11/chrono.h>
#include <torch/python.h>

#include "process_group_drun.hpp"

namespace py = pybind11;
using drun::torch_backend::ProcessGroupDrun;

PYBIND11_MODULE(_backend, m) {
  m.doc() = "drun's torch.distributed backend (libdrun_comm), registered by drun.torch";
  m.def("create_process_group", &ProcessGroupDrun::create, py::arg("store"), py::arg("rank"),
        py::arg("size"), py::arg("timeout"), py::call_guard<py::gil_scoped_release>(),
        "The backend creator init_process_group / new_group call: (store, rank, size, timeout).");
  m.def(
      "transport",
      [](const c10::intrusive_ptr<c10d::ProcessGroup>& group) {
        auto* drun = dynamic_cast<ProcessGroupDrun*>(group.get());
        if (!drun) throw py::value_error("not a drun process group: " + group->getBackendName());
        return drun->transport();
      },
      py::arg("group"), "How a drun group's ranks talk: 'shm', 'tcp' or 'hierarchical'.");
}
