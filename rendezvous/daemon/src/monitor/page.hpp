// The live page of drun-rendezvous --http ("/"): plain HTML + JS in the binary, no framework,
// nothing downloaded. It polls api/jobs every second (passing on its own ?token=) and draws
// every job: state, round, world size, restarts, nodes, a time line of rounds with each failure,
// loss and restart marked (the root cause in the mark's title, shown on hover), waiting nodes
// and hung ranks. Untrusted text goes in through textContent/setAttribute only.
#pragma once

namespace drun::rdzv::monitor {

extern const char* const kPageHtml;

}  // namespace drun::rdzv::monitor
