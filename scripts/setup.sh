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
#   - a venv in .venv with iotune and its Python dependencies, and Debian's bcc
#     bindings made importable from it
set -euo pipefail
cd "$(dirname "$0")/.."
log() { printf 'setup: %s\n' "$*" >&2; }

APT_PKGS=(python3-bpfcc bpfcc-tools libbpf-tools bpftool linux-headers-amd64 fio libaio-dev xfsprogs btrfs-progs e2fsprogs util-linux fdisk procps gcc fuse3 libfuse3-dev pkg-config chromium openssh-server pdsh)
# Slurm's packages start their services on install, and slurmctld's and slurmd's
# fail without /etc/slurm/slurm.conf (failing the install): the tests' Slurm bed
# (iotune/volumes/slurmbed.py) runs its own munged, slurmctld and slurmds instead.
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
if ! .venv/bin/python -c 'import iotune, click, rich, pandas, pytest, deepspeed, transformers' 2>/dev/null \
   || [[ pyproject.toml -nt .venv/.iotune-installed ]]; then
  log "installing iotune and its Python dependencies into .venv (torch, DeepSpeed: a few minutes)"
  .venv/bin/python -m pip install -q --upgrade pip >&2
  # torch first and pinned, so nothing pulls a multi-GB CUDA build
  .venv/bin/python -m pip install -q 'torch==2.13.0' >&2
  .venv/bin/python -m pip install -q -e '.[test,train]' >&2
  touch .venv/.iotune-installed
fi

# Debian's bcc bindings live in the system Python's dist-packages; the PyPI
# package called "bcc" is unrelated. Link just that package into the venv.
site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
if [[ ! -e $site/bcc ]]; then
  ln -sfn /usr/lib/python3/dist-packages/bcc "$site/bcc"
fi
.venv/bin/python -c 'import bcc' || { log "bcc is not importable from .venv"; exit 1; }
# DeepSpeed's C++ ops compile on first use (async_io alone takes minutes on 2
# cores); build them once here, cached in ~/.cache/torch_extensions.
log "building DeepSpeed ops (cached after the first time)"
.venv/bin/python scripts/build_ops.py >&2
log "ready: .venv/bin/iotune"
