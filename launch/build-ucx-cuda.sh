#!/usr/bin/env bash
# Build UCX with its CUDA transports (cuda_copy, cuda_ipc) where the
# distribution's UCX has none (Debian 12's libucx0 1.13.1 is built without
# CUDA, so refit.transport: ucx cannot move GPU memory with it). The source
# is the distribution's own UCX, so the result is the same version as the
# headers refit is usually built against.
#
#   launch/build-ucx-cuda.sh [PREFIX]        (default /opt/ucx-cuda)
#   PKG_CONFIG_PATH=PREFIX/lib/pkgconfig cmake -S . -B build -DREFIT_CUDA=ON
#
# refit then links this UCX (CMake records its directory as the run path).
# Needs the CUDA toolkit (CUDA_HOME, default /usr/local/cuda) and Debian's
# source index; it installs autoconf, automake and libtool when missing and
# reads deb-src through a private apt directory (the system's apt sources
# are not changed). The toolkit here ships no NVML header: UCX uses NVML only
# to count a GPU's NVLinks for its bandwidth estimate, so a small file of
# declarations and a link-time stub library stand in for it, and the
# driver's libnvidia-ml.so.1 is the one loaded at run time.
set -euo pipefail
prefix=${1:-/opt/ucx-cuda}
cuda=${CUDA_HOME:-/usr/local/cuda}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
say() { echo "build-ucx-cuda: $*"; }

[ -f "$cuda/include/cuda.h" ] || { say "no CUDA toolkit at $cuda (set CUDA_HOME)"; exit 2; }
missing=()
for tool in autoconf automake libtoolize make gcc; do
  command -v "$tool" >/dev/null || missing+=("$tool")
done
if [ ${#missing[@]} -gt 0 ]; then
  say "installing autoconf automake libtool make gcc (missing: ${missing[*]})"
  apt-get update -qq && apt-get install -y -qq autoconf automake libtool make gcc >/dev/null
fi

# The distribution's UCX source, through a private apt state directory.
version=$(dpkg-query -W -f '${Version}' libucx0 2>/dev/null || true)
cat >"$work/src.sources" <<EOF
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
mkdir -p "$work/lists/partial" "$work/src"
apt_src=(-o Dir::Etc::SourceList="$work/src.sources" -o Dir::Etc::SourceParts=/dev/null
         -o Dir::State::Lists="$work/lists")
say "fetching the source of ucx ${version:-(any version)}"
apt-get "${apt_src[@]}" update -qq
(cd "$work/src" && apt-get "${apt_src[@]}" source --download-only "ucx${version:+=$version}" 2>&1 |
  grep -v -i unsandboxed || true)
tarball=$(ls "$work"/src/ucx_*.orig.tar.* | head -1)
tar -xf "$tarball" -C "$work/src"
srcdir=$(ls -d "$work"/src/ucx-*/ | head -1)

# NVML stand-in: declarations of the calls UCX makes, and a stub library
# that only satisfies the linker (soname libnvidia-ml.so.1, the driver's).
mkdir -p "$work/nvml/include" "$work/nvml/lib"
cat >"$work/nvml/include/nvml.h" <<'EOF'
/* Build-time declarations for UCX's NVLink count; the driver's NVML is used
 * at run time. */
#ifndef REFIT_NVML_DECLS_H
#define REFIT_NVML_DECLS_H
typedef enum { NVML_SUCCESS = 0 } nvmlReturn_t;
typedef struct nvmlDevice_st *nvmlDevice_t;
typedef enum { NVML_VALUE_TYPE_DOUBLE = 0, NVML_VALUE_TYPE_UNSIGNED_INT = 1 } nvmlValueType_t;
typedef union { double dVal; unsigned int uiVal; unsigned long ulVal;
                unsigned long long ullVal; signed long long sllVal; int siVal; } nvmlValue_t;
typedef struct { unsigned int fieldId; unsigned int scopeId; long long timestamp;
                 long long latencyUsec; nvmlValueType_t valueType; nvmlReturn_t nvmlReturn;
                 nvmlValue_t value; } nvmlFieldValue_t;
typedef struct { char bytes[256]; } nvmlPciInfo_t; /* larger than the library writes */
#define NVML_FI_DEV_NVLINK_LINK_COUNT 91
#define nvmlInit nvmlInit_v2
#define nvmlDeviceGetHandleByIndex nvmlDeviceGetHandleByIndex_v2
#define nvmlDeviceGetNvLinkRemotePciInfo nvmlDeviceGetNvLinkRemotePciInfo_v2
nvmlReturn_t nvmlInit_v2(void);
nvmlReturn_t nvmlShutdown(void);
const char *nvmlErrorString(nvmlReturn_t r);
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device);
nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int count, nvmlFieldValue_t *values);
nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned int link,
                                                 nvmlPciInfo_t *pci);
#endif
EOF
cat >"$work/nvml/stub.c" <<'EOF'
/* Link-time stand-ins only: never loaded (the soname is the driver's). */
int nvmlInit(void) { return 1; }
int nvmlInit_v2(void) { return 1; }
int nvmlShutdown(void) { return 1; }
const char *nvmlErrorString(int r) { (void)r; return "stub"; }
int nvmlDeviceGetHandleByIndex_v2(void) { return 1; }
int nvmlDeviceGetFieldValues(void) { return 1; }
int nvmlDeviceGetNvLinkRemotePciInfo_v2(void) { return 1; }
EOF
gcc -shared -fPIC -o "$work/nvml/lib/libnvidia-ml.so" -Wl,-soname,libnvidia-ml.so.1 \
  "$work/nvml/stub.c"

cd "$srcdir"
[ -d debian ] || cp -r debian.upstream debian # autogen wants debian/ files
say "configuring in $srcdir"
./autogen.sh >"$work/autogen.log" 2>&1 || { tail -20 "$work/autogen.log"; exit 1; }
CPPFLAGS="-I$work/nvml/include" LDFLAGS="-L$work/nvml/lib -L$cuda/lib64/stubs" \
  ./configure --prefix="$prefix" --with-cuda="$cuda" --without-rocm --without-verbs \
  --without-rdmacm --without-knem --without-xpmem --without-java --without-go \
  --disable-doxygen-doc --enable-optimizations --disable-logging --disable-debug \
  --disable-assertions --disable-params-check >"$work/configure.log" 2>&1 ||
  { tail -20 "$work/configure.log"; exit 1; }
grep -q "UCT modules:.*cuda" "$work/configure.log" ||
  { say "configure found no CUDA support:"; grep -i cuda "$work/configure.log" | tail; exit 1; }
# The libraries, their modules and ucx_info only: UCX 1.13's test programs do
# not build against CUDA 13's driver API.
say "building (make -j$(nproc))"
for dir in src/ucm src/ucs src/uct src/ucp src/tools/info; do
  make -C "$dir" -j"$(nproc)" install >"$work/make.log" 2>&1 ||
    { tail -30 "$work/make.log"; exit 1; }
done
make install-pkgconfigDATA >"$work/install.log" 2>&1 || { tail -30 "$work/install.log"; exit 1; }
cp src/ucs/ucx-ucs.pc src/uct/ucx-uct.pc src/uct/cuda/ucx-cuda.pc "$prefix/lib/pkgconfig/"
say "installed in $prefix: $(ls "$prefix"/lib/ucx | grep -c cuda) CUDA modules"
say "build refit with: PKG_CONFIG_PATH=$prefix/lib/pkgconfig cmake -S . -B build -DREFIT_CUDA=ON"
