#!/usr/bin/env bash
# Builds the libFuzzer targets (rendezvous/fuzz, rendezvous/store/fuzz, launcher/fuzz) with clang++ in a build directory
# of their own, building nothing else, then runs each for DRUN_FUZZ_SECONDS (default 15) over a
# scratch copy of its corpus; fails when a target finds a crash (its input is in the target's
# scratch directory: add it to the corpus, fix, and the corpus replay test keeps it fixed).
# Exits 77 (CTest: SKIPPED) when clang++ or its libFuzzer runtime is missing.
#   scripts/fuzz.sh [build dir, default build-fuzz]
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build-fuzz}
seconds=${DRUN_FUZZ_SECONDS:-15}

# clang++-16 first: Debian 12's clang 14 builds fuzz_server only without UBSan's function check.
cxx=$(command -v clang++-16 || command -v clang++ || command -v clang++-14 || true)
if [[ -z $cxx ]]; then
  echo "SKIP: clang++ is not installed (scripts/setup.sh --tests installs clang-16)"
  exit 77
fi
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' \
  >"$probe/probe.cpp"
if ! "$cxx" -fsanitize=fuzzer,address,undefined "$probe/probe.cpp" -o "$probe/probe" \
     2>"$probe/err"; then
  echo "SKIP: $cxx cannot link libFuzzer (libclang-rt-16-dev missing?): $(head -3 "$probe/err")"
  exit 77
fi

# Crash reports name functions and lines only with a symbolizer: Debian's clang-16 runtime looks
# for its own (package llvm-16) and finds none; any llvm-symbolizer there is will do.
if [[ -z ${ASAN_SYMBOLIZER_PATH:-} ]]; then
  symbolizer=$(command -v llvm-symbolizer-16 || command -v llvm-symbolizer || true)
  [[ -z $symbolizer ]] || export ASAN_SYMBOLIZER_PATH=$symbolizer
fi

cmake -S . -B "$dir" -G Ninja -DDRUN_FUZZ=ON -DDRUN_FUZZ_CXX="$cxx" \
  -DDRUN_FUZZ_SECONDS="$seconds" >/dev/null
nice cmake --build "$dir" --target fuzz_all -j2
# Every target's test is named "fuzz: <target>"; two at a time on a 2-core machine.
ctest --test-dir "$dir" -R '^fuzz: ' --output-on-failure -j2 --timeout $((seconds * 4 + 120))
