#!/usr/bin/env bash
# Installs the Debian/Ubuntu packages dptrain builds with, if any is missing. Idempotent; needs root
# (or sudo) only when something must be installed. The CUDA toolkit, cuDNN and NCCL are optional and
# are never installed here: with them in /usr/local/cuda (or the system paths) the GPU backend builds.
# With DPT_SETUP_FUZZ=1, also what scripts/fuzz.sh needs (clang and libFuzzer).
set -euo pipefail
packages=(build-essential cmake ninja-build pkg-config libeigen3-dev libspdlog-dev libfmt-dev libyaml-cpp-dev
          libgtest-dev libgloo-dev iproute2 procps)
# scripts/fuzz.sh (DPT_SETUP_FUZZ=1): clang with libFuzzer and the sanitizer runtimes.
if [[ "${DPT_SETUP_FUZZ:-0}" == 1 ]]; then
  packages+=(clang-14 libclang-rt-14-dev)
fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  exit 0
fi
echo "dptrain setup: installing ${missing[*]}"
sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then sudo_cmd=(sudo); fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -q
"${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
