#!/usr/bin/env bash
# Installs the Debian/Ubuntu packages dptrain builds with, if any is missing. Idempotent; needs root
# (or sudo) only when something must be installed. The CUDA toolkit, cuDNN and NCCL are optional and
# are never installed here: with them in /usr/local/cuda (or the system paths) the GPU backend builds.
# With DPT_SETUP_FUZZ=1, also what scripts/sanitize.sh and scripts/fuzz.sh need (clang, its sanitizer
# and libFuzzer runtimes, llvm-symbolizer); scripts/test.sh runs both.
set -euo pipefail
# gnuplot-nox draws the PNG plots of dpt-bench scaling and scripts/plot-metrics.sh. nlohmann-json3-dev
# (its vocabulary file) and libicu-dev (Unicode letter and number classes) are for GPT-2's tokenizer,
# libcli11-dev for the options of dpt-generate and dpt-tokenize.
packages=(build-essential cmake ninja-build pkg-config libeigen3-dev libspdlog-dev libfmt-dev libyaml-cpp-dev
          libgtest-dev libgloo-dev iproute2 procps gnuplot-nox nlohmann-json3-dev libicu-dev libcli11-dev)
# DPT_SETUP_FUZZ=1: the distribution's default clang (14 on Debian 12, 18 on Ubuntu 24.04; Ubuntu has
# these in universe), libclang-rt-dev for libFuzzer and the ASan/UBSan runtimes (clang only recommends
# it), and llvm for llvm-symbolizer, which turns sanitizer stack traces into file:line.
if [[ "${DPT_SETUP_FUZZ:-0}" == 1 ]]; then
  packages+=(clang libclang-rt-dev llvm)
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
