// SLURM's compressed host lists ("n[1-4,7]", "gpu[001-016]", "a1,b[2-3]c", "r[1-2]n[1-3]") expanded
// into host names, in SLURM's order.
//
// Grammar (what SLURM's hostlist_create accepts, plus suffixes after a bracket group):
//   list  := item { sep item }         sep: ',' (or blank/tab, as SLURM) outside brackets;
//                                       empty items are skipped, as SLURM does
//   item  := { literal | group }       the groups' values multiply: the first group varies slowest
//   group := '[' range { ',' range } ']'
//   range := NUM [ '-' NUM ]           lo <= hi; the width of lo's digits pads every value
//                                       ("[008-011]" -> 008 009 010 011, "[8-11]" -> 8 9 10 11)
//   literal: any other character; '\' makes the next character literal ("a\[1\]" is "a[1]")
// Errors (InvalidArgument naming the list and the position): unbalanced or nested brackets, an
// empty group or range, a range bound that is not a decimal number (or beyond 2^32), a reversed
// range, a trailing '\', an empty list, and an expansion beyond HostlistOptions::maxHosts (checked
// before anything is expanded, so "n[0-4294967295]x[0-4294967295]" costs nothing), or a host name
// longer than HostlistOptions::maxNameLength (so the expansion's memory is bounded too).
//
// A pure function: no I/O, thread-safe.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace drun::launch {

struct HostlistOptions {
  size_t maxHosts = 65536;  // a larger expansion is an error (SLURM's own MAX_RANGE is 2^20)
  size_t maxNameLength = 255;  // a longer host name is an error (DNS names have at most 253)
};

// Throws InvalidArgument.
std::vector<std::string> expandHostlist(std::string_view list, const HostlistOptions& options = {});

}  // namespace drun::launch
