#!/usr/bin/env bash
# Installs the Debian packages Sluice builds, tests and benchmarks with.
# Does nothing (and needs no network) when every package is already present.
# podman and buildah build and test the image (make image, tests/integration/
# test_deploy.py), and podman runs the multi-host tests' daemons from it
# (docs/multi-host-tests.md), with runc for hosts where crun cannot set
# rlimits (docs/operations.md); valgrind counts instructions for
# bench/dynamic_instructions.py; pip, setuptools, wheel and venv build the
# Python wheel and install it in a test (make wheel). Any argument is ignored.
set -euo pipefail

packages=(
  build-essential cmake pkg-config clang libclang-rt-14-dev
  libevent-dev libssl-dev openssl nanopb libnanopb-dev protobuf-compiler python3-protobuf
  liblmdb-dev libjansson-dev liburing-dev libcriterion-dev zlib1g-dev libturbojpeg0-dev libjpeg62-turbo-dev
  python3 iperf3 chromium fio iproute2 nftables valgrind
  python3-numpy python3-torch python3-pil python3-yaml lmdb-utils
  python3-pip python3-setuptools python3-wheel python3-venv
  podman buildah runc
)

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$p")
done

if ((${#missing[@]} == 0)); then
  exit 0
fi

if [[ $(id -u) -ne 0 ]]; then
  echo "install-deps: missing packages: ${missing[*]}; run as root to install them" >&2
  exit 1
fi

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"
