#!/usr/bin/env bash
# install_check.sh BUILD_DIR: what `cmake --install` and `cpack -G DEB` give a user.
#  1. cmake --install BUILD --prefix P: P/bin/drun and P/bin/drun-rendezvous exist and run a job,
#     the Python modules drun ships are under P/lib/drun/python, the man pages (drun.1,
#     drun-rendezvous.1) under P/share/man/man1.
#  2. cpack -G DEB: the .deb names its library dependencies; `dpkg --root` installs it into a fresh
#     root (a dpkg database of its own; --force-depends: that root holds no libraries, the host's
#     Debian 12 ones are used to run it), and the installed drun runs a job.
# A chroot from debootstrap (a clean Debian 12) would need the network: not done here.
# Exit 0: all good; 1: a check failed (says which); 77: a tool is missing (skip).
set -euo pipefail
build=$(cd "$1" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/drun_install_check.XXXXXX")
trap 'rm -rf "$work"' EXIT
fail() { echo "install_check: FAILED: $*" >&2; exit 1; }

run_job() {  # run_job DRUN: two workers say hello
  local out
  out=$("$1" --nproc-per-node 2 /bin/echo hello 2>&1) || fail "$1 exited $?: $out"
  [[ $(grep -c 'hello' <<<"$out") == 2 ]] || fail "$1: expected 2 hello lines, got: $out"
}

# 1. cmake --install
cmake --install "$build" --prefix "$work/prefix" >/dev/null || fail "cmake --install"
for f in bin/drun bin/drun-rendezvous; do
  [[ -x $work/prefix/$f ]] || fail "cmake --install did not install $f"
done
for page in drun.1 drun-rendezvous.1; do
  [[ -s $work/prefix/share/man/man1/$page ]] || fail "cmake --install did not install share/man/man1/$page"
done
"$work/prefix/bin/drun-rendezvous" --help >/dev/null || fail "drun-rendezvous --help"
run_job "$work/prefix/bin/drun"
if [[ -d $build/lib/drun/python/drun ]]; then
  [[ -f $work/prefix/lib/drun/python/drun/__init__.py ]] || fail "the Python modules were not installed"
fi
echo "install_check: cmake --install: ok ($(cd "$work/prefix" && find . -type f | wc -l) files)"

# 2. the Debian package
for tool in cpack dpkg dpkg-deb dpkg-shlibdeps; do
  command -v "$tool" >/dev/null || { echo "install_check: SKIP: no $tool" >&2; exit 77; }
done
(cd "$work" && cpack -G DEB --config "$build/CPackConfig.cmake" -B "$work/pkg" >/dev/null) || fail "cpack -G DEB"
deb=$(ls "$work"/pkg/drun_*.deb 2>/dev/null | head -1)
[[ -n $deb ]] || fail "cpack made no .deb"
depends=$(dpkg-deb -f "$deb" Depends)
[[ $depends == *libspdlog* ]] || fail "the .deb's Depends lack spdlog: '$depends'"
root=$work/root
mkdir -p "$root/var/lib/dpkg/info" "$root/var/lib/dpkg/updates"
touch "$root/var/lib/dpkg/status" "$root/var/lib/dpkg/available"
dpkg --root="$root" --force-depends --force-not-root --force-script-chrootless -i "$deb" >/dev/null 2>&1 ||
  dpkg --root="$root" --force-depends --force-not-root -i "$deb" >/dev/null || fail "dpkg --root -i $deb"
[[ -x $root/usr/bin/drun && -x $root/usr/bin/drun-rendezvous ]] || fail "the .deb did not install /usr/bin/drun{,-rendezvous}"
[[ -s $root/usr/share/man/man1/drun.1 ]] || fail "the .deb did not install /usr/share/man/man1/drun.1"
run_job "$root/usr/bin/drun"
if [[ -d $build/lib/drun/python/drun ]]; then
  [[ -f $root/usr/lib/drun/python/drun/__init__.py ]] || fail "the .deb lacks the Python modules (usr/lib/drun/python)"
fi
echo "install_check: $(basename "$deb"): installs with dpkg --root and runs (Depends: $depends)"
