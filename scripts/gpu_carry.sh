#!/usr/bin/env bash
# gpu_carry.sh [DIR]: puts the NCCL checks built here (comm_gpu_check, drun, drun-comm-bench) and
# the Debian libraries they link into DIR (default .devcarry, ignored by git: the device tool
# takes it when a run names it in `carry`), stripped of debug info, for a machine with a GPU but
# without this project's dependencies. libnccl and the C library come from that machine.
# There, from DIR:
#   export LD_LIBRARY_PATH=$PWD/lib:$(dirname "$(find / -name libnccl.so.2 -not -path '/proc/*' 2>/dev/null | head -1)")
#   ./comm_gpu_check            # exit 0: passed, 77: no device or no NCCL built in
#   ./drun --standalone --nproc-per-node 1 ./drun-comm-bench --backend nccl --check
# Needs a build with NCCL (the CUDA toolkit under /usr/local/cuda: cmake reports "NCCL found").
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-.devcarry}
build=${BUILD_DIR:-build}
grep -q "DRUN_HAVE_NCCL=1\|NCCL_LIBRARY:FILEPATH=/" "$build/CMakeCache.txt" 2>/dev/null ||
  { echo "gpu_carry.sh: $build was configured without NCCL" >&2; exit 1; }
cmake --build "$build" --target comm_gpu_check drun drun-comm-bench >/dev/null
rm -rf "$out"
mkdir -p "$out/lib"
bins=("$build/tests/comm_gpu_check" "$build/bin/drun" "$build/bin/drun-comm-bench")
cp "${bins[@]}" "$out/"
for b in "${bins[@]}"; do
  ldd "$b" | awk '/=> \// {print $3}' | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|ld-linux*|libnccl.so*) ;;  # the machine's own
      *) [[ -e "$out/lib/$(basename "$lib")" ]] || cp -L "$lib" "$out/lib/" ;;
    esac
  done
done
strip --strip-debug "$out"/comm_gpu_check "$out"/drun "$out"/drun-comm-bench "$out"/lib/*.so* 2>/dev/null || true
du -sh "$out"
