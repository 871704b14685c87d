// What the key-scheme fuzzer checks on one input, shared by the libFuzzer target (keys_fuzz.cpp)
// and the corpus replay test (rendezvous/tests/keys_corpus_test.cpp).
//
// Every value read from the store is untrusted. Each parser in keys.hpp must, on any bytes,
// either return or throw ProtocolError (parseJoined: skip and count malformed lines), never
// crash, hang or throw anything else; a value it accepts must re-encode to a value the parser
// accepts again and that re-encodes to the same bytes (encoder and parser agree).
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "drun/common/error.hpp"
#include "drun/rendezvous/keys.hpp"
#include "../../tests/support/fuzz_support.hpp"

namespace drun::rdzv::fuzz {

inline void requireKeys(bool ok, const char* what) { drun::fuzz::require(ok, "keys", what); }

// Runs parse(value); true when it returned, false when it threw ProtocolError; anything else
// escapes and aborts the fuzzer (std::terminate through the noexcept fuzz entry).
template <typename F>
bool parsesOrRejects(F&& parse) {
  try {
    parse();
    return true;
  } catch (const ProtocolError& e) {
    requireKeys(*e.what() != '\0', "a rejection says why");
    return false;
  }
}

// encode(parsed) parses back and re-encodes to the same bytes. An encoder may refuse
// (InvalidArgument) what a lenient parser let through; that is not a disagreement worth a crash.
template <typename Parse, typename Encode>
void roundTrips(Parse&& parse, Encode&& encode, const char* what) {
  std::string once;
  try {
    once = encode();
  } catch (const InvalidArgument&) {
    return;
  }
  std::string twice;
  bool ok = parsesOrRejects([&] { twice = parse(once); });
  if (!ok) std::fprintf(stderr, "keys fuzz: %s\n", what);
  requireKeys(ok, "an encoded value parses");
  requireKeys(twice == once, "encode(parse(encode(x))) == encode(x)");
}

inline void checkKeysInput(std::string_view data) {
  // The first byte picks the parser, so one corpus covers all of them.
  if (data.empty()) return;
  const unsigned char selector = static_cast<unsigned char>(data[0]);
  const std::string_view value = data.substr(1);
  switch (selector % 8) {
    case 0: {
      size_t skipped = 0;
      auto nodes = keys::parseJoined(value, &skipped);
      for (const auto& node : nodes) {
        roundTrips(
            [](const std::string& v) {
              auto back = keys::parseJoined(v);
              requireKeys(back.size() == 1, "one encoded descriptor is one node");
              return keys::encodeDescriptor(back[0]);
            },
            [&] { return keys::encodeDescriptor(node); }, "descriptor");
      }
      break;
    }
    case 1: {
      std::optional<keys::RoundState> state;
      if (parsesOrRejects([&] { state = keys::parseState(value); }) && state) {
        roundTrips(
            [](const std::string& v) {
              auto back = keys::parseState(v);
              requireKeys(back.has_value(), "an encoded state is a state");
              return keys::encodeState(*back);
            },
                   [&] { return keys::encodeState(*state); }, "state");
      }
      break;
    }
    case 2: {
      keys::Assignment a;
      if (parsesOrRejects([&] { a = keys::parseAssignment(value); })) {
        roundTrips(
            [](const std::string& v) { return keys::encodeAssignment(keys::parseAssignment(v)); },
            [&] { return keys::encodeAssignment(a); }, "assignment");
      }
      break;
    }
    case 3: {
      // The expected count is the second byte, so both a match and a mismatch are reached.
      if (value.empty()) break;
      const size_t expected = static_cast<unsigned char>(value[0]);
      std::vector<std::string> names;
      if (parsesOrRejects([&] { names = keys::parseHostList(value.substr(1), expected); })) {
        requireKeys(names.size() == expected, "an accepted host list has the expected size");
        roundTrips(
            [&](const std::string& v) {
              return keys::encodeHostList(keys::parseHostList(v, expected));
            },
            [&] { return keys::encodeHostList(names); }, "host list");
      }
      break;
    }
    case 4: {
      FailureRecord f;
      if (parsesOrRejects([&] { f = keys::parseFailure(value); })) {
        roundTrips([](const std::string& v) { return keys::encodeFailure(keys::parseFailure(v)); },
                   [&] { return keys::encodeFailure(f); }, "failure");
      }
      break;
    }
    case 5: {
      std::optional<FailureRecord> f;
      if (parsesOrRejects([&] { f = keys::parseOutcome(value); })) {
        roundTrips([](const std::string& v) { return keys::encodeOutcome(keys::parseOutcome(v)); },
                   [&] { return keys::encodeOutcome(f); }, "outcome");
      }
      break;
    }
    case 6: {
      keys::JobConfig c;
      if (parsesOrRejects([&] { c = keys::parseJobConfig(value); })) {
        roundTrips(
            [](const std::string& v) { return keys::encodeJobConfig(keys::parseJobConfig(v)); },
            [&] { return keys::encodeJobConfig(c); }, "job config");
      }
      break;
    }
    case 7: {
      std::optional<int64_t> n;
      if (parsesOrRejects([&] { n = keys::parseCounter(std::string(value)); })) {
        requireKeys(n.has_value(), "a present counter value parses to a number");
      }
      requireKeys(!keys::parseCounter(std::nullopt).has_value(), "an absent counter is nullopt");
      break;
    }
  }
}

}  // namespace drun::rdzv::fuzz
