#!/usr/bin/env bash
# Installs everything iotune needs on a fresh Debian machine, as root. Idempotent:
# a second run only checks. Nothing here is meant to be done by hand instead.
#   - apt: bcc (python3-bpfcc, bpfcc-tools), kernel headers, fio, libaio-dev,
#     filesystem tools (xfsprogs, btrfs-progs, e2fsprogs, fdisk), and the FUSE
#     toolchain for the emulated drive (gcc, fuse3, libfuse3-dev, pkg-config), and chromium
#     (headless, for the HTML report's browser test; playwright drives it, downloads nothing)
#     plus openssh-server and pdsh (the multi-node bed of the tests: sshd "nodes" on 127.0.0.x)
#     and Slurm (slurmctld, slurmd, slurm-client, munge: the tests' one-machine Slurm cluster,
#     whose daemons the tests start themselves; the packages' own services are kept from starting)
#   - /lib/modules/$(uname -r)/{build,source} -> Debian's headers, only when the
#     running kernel has no headers of its own (bcc needs them to compile probes)
#   - a venv in .venv with iotune and its Python dependencies (extras test, train
#     and docs: pytest, torch, MkDocs for tests/project/test_docs.py), DeepSpeed built
#     from source with the ops iotune loads compiled into the package (nothing
#     JIT-compiles at run time; scripts/build_ops.py verifies it), and Debian's
#     bcc bindings made importable from it
set -euo pipefail
cd "$(dirname "$0")/.."
log() { printf 'setup: %s\n' "$*" >&2; }

APT_PKGS=(python3-bpfcc bpfcc-tools libbpf-tools bpftool linux-headers-amd64 fio libaio-dev xfsprogs btrfs-progs e2fsprogs util-linux fdisk procps gcc fuse3 libfuse3-dev pkg-config chromium openssh-server pdsh)
# Slurm's packages start their services on install, and slurmctld's and slurmd's
# fail without /etc/slurm/slurm.conf (failing the install): the tests' Slurm bed
# (iotune/tests/beds/slurm.py) runs its own munged, slurmctld and slurmds instead.
APT_PKGS+=(munge slurmctld slurmd slurm-client)
missing=()
for p in "${APT_PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    log "need root to install: ${missing[*]} (run: sudo $0)"; exit 1
  fi
  log "installing apt packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >&2
  policy=/usr/sbin/policy-rc.d
  if [[ ! -e $policy ]]; then   # no service starts during the install (see above)
    printf '#!/bin/sh\nexit 101\n' > "$policy"
    chmod 755 "$policy"
    trap 'rm -f "$policy"' EXIT
    apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
    rm -f "$policy"
    trap - EXIT
  else
    apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
  fi
fi

# Kernel headers for bcc: only when the running kernel has none.
kdir=/lib/modules/$(uname -r)
if [[ ! -e $kdir/build/include/linux/kconfig.h && ! -e $kdir/source/include/linux/kconfig.h ]]; then
  hdr=$(ls -d /usr/src/linux-headers-*-amd64 2>/dev/null | sort -V | tail -n 1 || true)
  if [[ -z $hdr ]]; then
    log "no kernel headers found under /usr/src; install linux-headers-amd64"; exit 1
  fi
  common=${hdr%-amd64}-common
  log "linking $kdir/{build,source} -> $hdr, $common (no headers for $(uname -r))"
  mkdir -p "$kdir"
  ln -sfn "$hdr" "$kdir/build"
  ln -sfn "$common" "$kdir/source"
fi

# tracefs: bcc reads tracepoint formats there (iotune also mounts it on demand).
if [[ ! -d /sys/kernel/tracing/events ]] && ! mountpoint -q /sys/kernel/tracing; then
  mount -t tracefs nodev /sys/kernel/tracing || log "could not mount tracefs"
fi

PY=${IOTUNE_PYTHON:-python3}
if [[ ! -x .venv/bin/python ]]; then
  log "creating .venv with $($PY --version 2>&1)"
  "$PY" -m venv .venv
fi

# DeepSpeed with its C++ ops compiled into the package (DS_BUILD_<OP>=1, as
# DeepSpeed documents for production): loading them then imports a library
# from site-packages, whatever PATH a job has. JIT-built ops (the default
# install) compile on first load with whichever ninja PATH finds; a job
# started without .venv/bin first on PATH rebuilds async_io for minutes,
# Debian's and pip's ninja rewrite each other's build log, and a killed
# rebuild leaves a lock every later job waits on.
#   async_io (+ pin_memory, which it loads first): NVMe swapping;
#   cpu_adam: the CPU optimizer; shm_comm: the CPU accelerator's comm op.
# --no-build-isolation: build against the torch installed here (the ops must
# match it); --no-cache-dir: pip's wheel cache keys a wheel by the sdist, not
# by DS_BUILD_*, so it would hand back a wheel built earlier without ops;
# LDFLAGS: DeepSpeed's CPU op builder gives async_io its -laio for JIT builds
# only, and a prebuilt async_io without it fails to load (undefined symbol
# io_submit); DS_ENABLE_NINJA: compile each op's sources in parallel.
DS_VERSION=$(sed -n 's/.*"deepspeed==\([0-9.]*\)".*/\1/p' pyproject.toml)
DS_BUILD_ENV=(DS_BUILD_OPS=0 DS_BUILD_AIO=1 DS_BUILD_PIN_MEMORY=1 DS_BUILD_CPU_ADAM=1 DS_BUILD_SHM_COMM=1
              DS_ENABLE_NINJA=1 "LDFLAGS=-Wl,--no-as-needed -laio")
# The wheel built with those ops is kept in iotune's cache, keyed by everything the build depends on
# (DeepSpeed's version, torch's, Python's, the machine, the flags, libaio's headers), so that a fresh
# clone on the same machine (CI's) installs it in seconds instead of compiling for minutes. pip's own
# cache cannot serve here (above); a cached wheel whose ops fail the check is deleted and rebuilt.
ds_wheel_dir() {
  local versions key
  versions=$(.venv/bin/python -c 'import sys, torch; print(torch.__version__, "%d.%d" % sys.version_info[:2])')
  key=$(printf '%s|' "$DS_VERSION" "$versions" "$(uname -m)" "${DS_BUILD_ENV[@]}" \
        "$(sha1sum /usr/include/libaio.h 2>/dev/null)" | sha1sum | cut -c1-16)
  echo "${XDG_CACHE_HOME:-$HOME/.cache}/iotune/deepspeed-wheels/$key"
}
install_deepspeed_with_ops() {
  local again=() dir wheel tmp
  if .venv/bin/python -m pip show -q deepspeed >/dev/null 2>&1; then
    again=(--force-reinstall --no-deps)       # replace an install without (working) prebuilt ops
  fi
  dir=$(ds_wheel_dir)
  if [[ ${1:-} == rebuild ]]; then rm -rf "$dir"; fi
  wheel=$(ls "$dir"/deepspeed-*.whl 2>/dev/null | head -n 1 || true)
  if [[ -z $wheel ]]; then
    log "building DeepSpeed $DS_VERSION with its ops prebuilt (async_io, pin_memory, cpu_adam, shm_comm; minutes, once per machine)"
    .venv/bin/python -m pip install -q ninja py-cpuinfo setuptools wheel >&2     # what its setup.py needs
    tmp=$(mktemp -d)
    if ! env "${DS_BUILD_ENV[@]}" .venv/bin/python -m pip wheel -q --no-build-isolation --no-cache-dir --no-deps \
         -w "$tmp" "deepspeed==$DS_VERSION" >&2; then
      rm -rf "$tmp"
      log "building DeepSpeed $DS_VERSION failed (above)"; exit 1
    fi
    mkdir -p "$dir"
    mv "$tmp"/deepspeed-*.whl "$dir"/
    rm -rf "$tmp"
    wheel=$(ls "$dir"/deepspeed-*.whl | head -n 1)
  else
    log "installing DeepSpeed $DS_VERSION with its ops prebuilt from $wheel"
  fi
  .venv/bin/python -m pip install -q "${again[@]}" "$wheel" >&2
}

if ! .venv/bin/python -c 'import iotune, click, rich, pandas, pytest, deepspeed, transformers, mkdocs, material, mkdocs_click' 2>/dev/null \
   || [[ pyproject.toml -nt .venv/.iotune-installed ]]; then
  log "installing iotune and its Python dependencies into .venv (torch; DeepSpeed with its ops compiled in: minutes)"
  .venv/bin/python -m pip install -q --upgrade pip >&2
  # torch first and pinned, so nothing pulls a multi-GB CUDA build
  .venv/bin/python -m pip install -q 'torch==2.13.0' >&2
  if ! .venv/bin/python scripts/build_ops.py --check 2>/dev/null; then
    install_deepspeed_with_ops
  fi
  .venv/bin/python -m pip install -q -e '.[test,train,docs]' >&2     # keeps the DeepSpeed just built
  touch .venv/.iotune-installed
fi

# Debian's bcc bindings live in the system Python's dist-packages; the PyPI
# package called "bcc" is unrelated. Link just that package into the venv.
site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
if [[ ! -e $site/bcc ]]; then
  ln -sfn /usr/lib/python3/dist-packages/bcc "$site/bcc"
fi
.venv/bin/python -c 'import bcc' || { log "bcc is not importable from .venv"; exit 1; }

# A venv made before ops were prebuilt (or whose DeepSpeed pip replaced) has
# JIT ops: reinstall DeepSpeed with them. The check reads files only.
if ! .venv/bin/python scripts/build_ops.py --check; then
  log "reinstalling DeepSpeed $DS_VERSION with its ops prebuilt (a few minutes, once)"
  install_deepspeed_with_ops rebuild
  rm -f .venv/.iotune-ops-verified
fi
# Load each op through DeepSpeed's own loader once per install: fails if any would compile.
if [[ ! -e .venv/.iotune-ops-verified || .venv/.iotune-installed -nt .venv/.iotune-ops-verified ]]; then
  log "verifying that loading DeepSpeed's ops compiles nothing"
  if ! .venv/bin/python scripts/build_ops.py >&2; then
    log "DeepSpeed's prebuilt ops did not load here (above): building them again"
    install_deepspeed_with_ops rebuild
    .venv/bin/python scripts/build_ops.py >&2
  fi
  touch .venv/.iotune-ops-verified
fi
log "ready: .venv/bin/iotune"
