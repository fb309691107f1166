#!/bin/sh
# An aarch64 (arm64) Debian sysroot with CPython, numpy and msgpack, for running the runtime
# and prebuilt aarch64 kernels under qemu-aarch64 on an x86-64 machine (tests/devices/cpu).
#
#   tools/cross/aarch64-sysroot.sh DIR
#
# Uses apt-get with a configuration of its own under DIR (arm64 package lists of the host's
# Debian release; the system's apt configuration and dpkg are left alone), downloads the few
# packages below and extracts them with `dpkg -x` into DIR/root. Nothing is installed on
# the system. Idempotent: a complete DIR/root (DIR/root/.complete) is kept as it is.
set -eu
dir=${1:?usage: aarch64-sysroot.sh DIR}
root="$dir/root"
[ -f "$root/.complete" ] && exit 0
command -v apt-get >/dev/null 2>&1 && command -v dpkg >/dev/null 2>&1 || { echo "needs apt-get and dpkg (Debian/Ubuntu)" >&2; exit 1; }
. /etc/os-release
suite=${VERSION_CODENAME:?no VERSION_CODENAME in /etc/os-release}
case "$ID" in
  debian) mirror=http://deb.debian.org/debian; components=main ;;
  ubuntu) mirror=http://ports.ubuntu.com/ubuntu-ports; components="main universe" ;;
  *) echo "unsupported distribution $ID" >&2; exit 1 ;;
esac
keyring=/usr/share/keyrings/$ID-archive-keyring.gpg
apt="$dir/apt"
mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial" "$apt/etc/preferences.d" "$apt/etc/sources.list.d" "$dir/debs"
: > "$apt/status"
echo "deb [arch=arm64 signed-by=$keyring] $mirror $suite $components" > "$apt/etc/sources.list"
set -- -o APT::Architecture=arm64 -o APT::Architectures::=arm64 -o Dir::Etc="$apt/etc" \
  -o Dir::Etc::SourceList="$apt/etc/sources.list" -o Dir::Etc::SourceParts="$apt/etc/sources.list.d" \
  -o Dir::Etc::PreferencesParts="$apt/etc/preferences.d" -o Dir::State="$apt" -o Dir::State::Lists="$apt/lists" \
  -o Dir::State::status="$apt/status" -o Dir::Cache="$apt/cache" -o Debug::NoLocking=1 \
  -o APT::Sandbox::User=root -o Acquire::Languages=none
apt-get "$@" -qq update
py=$(apt-cache "$@" depends python3-minimal 2>/dev/null | sed -n 's/.*Depends: \(python3\.[0-9]*-minimal\).*/\1/p' | head -n1)
py=${py%-minimal}
# CPython and the standard library's native parts the runtime uses (ctypes: libffi; hashlib:
# libssl), numpy with its BLAS/LAPACK, msgpack (C++), and libgomp for the kernels.
packages="libc6 libgcc-s1 libstdc++6 libgomp1 zlib1g libexpat1 libffi8 libssl3 libbz2-1.0 liblzma5
  $py-minimal lib$py-minimal lib$py-stdlib python3-numpy python3-msgpack libblas3 liblapack3 libgfortran5"
(cd "$dir/debs" && apt-get "$@" -qq download $packages)
rm -rf "$root"
mkdir -p "$root"
for deb in "$dir"/debs/*.deb; do dpkg -x "$deb" "$root"; done
ln -sf "$py" "$root/usr/bin/python3"
# Debian's BLAS/LAPACK are found through update-alternatives links, which dpkg -x does not make.
arch_lib="$root/usr/lib/aarch64-linux-gnu"
for lib in blas/libblas.so.3 lapack/liblapack.so.3; do
  [ -e "$arch_lib/$(basename $lib)" ] || ln -s "$lib" "$arch_lib/$(basename $lib)"
done
touch "$root/.complete"
