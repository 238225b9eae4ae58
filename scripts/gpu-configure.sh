# shellcheck shell=bash
# Sourced by gpu-test.sh and gpu-compare.sh: how a dptrain source tree is configured for CUDA on a GPU
# machine, against the Debian packages unpacked into the checkout's .deps/ (gpu-test.sh's header lists
# them). Expects $root (the checkout). Sets dep_libs (on LD_LIBRARY_PATH), generator and keep_going (for
# `cmake --build ... -- "${keep_going[@]}"`), and defines
#   gpu_configure SOURCE BUILD LOG   configure SOURCE into BUILD, CMake's output in LOG; CMake's exit status.
deps="${root:?gpu-configure.sh expects root, the checkout}/.deps"
# Never let NCCL or anything else set up NVLink multicast on these machines.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
dep_libs="$deps/usr/lib/x86_64-linux-gnu:$deps/usr/lib:$deps/lib/x86_64-linux-gnu"
export LD_LIBRARY_PATH="$dep_libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

if [[ ! -d "$deps/usr/include/eigen3" ]]; then
  echo "$(basename "$0"): $deps/usr is missing the unpacked dependency packages" >&2
  exit 2
fi
# Debian's Gloo export names its library by absolute path (/usr/lib/libgloo.so...); point it into .deps.
gloo_targets="$deps/usr/share/cmake/Gloo/GlooTargets-relwithdebinfo.cmake"
if [[ -f "$gloo_targets" ]] && grep -q '"/usr/lib/libgloo' "$gloo_targets"; then
  sed -i 's#"/usr/lib/libgloo#"${_IMPORT_PREFIX}/lib/libgloo#g' "$gloo_targets"
fi

# shellcheck disable=SC2034  # keep_going is for the scripts that source this
{
  generator=()
  keep_going=(-k)
  if command -v ninja >/dev/null 2>&1; then
    generator=(-G Ninja)
    keep_going=(-k 0)
  fi
}

gpu_configure() {
  local source="$1" build="$2" log="$3"
  mkdir -p "$build"
  if [[ -f "$build/CMakeCache.txt" ]] &&
    ! grep -q "CMAKE_GENERATOR:INTERNAL=${generator[1]:-Unix Makefiles}$" "$build/CMakeCache.txt"; then
    rm -rf "$build/CMakeCache.txt" "$build/CMakeFiles"  # the generator changed since the last run
  fi
  cmake -S "$source" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DDPT_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_PREFIX_PATH="$deps/usr" -DEigen3_DIR="$deps/usr/share/eigen3/cmake" \
    -DCMAKE_POLICY_VERSION_MINIMUM=3.5 \
    -DCMAKE_EXE_LINKER_FLAGS="-Wl,-rpath-link,$dep_libs" -DCMAKE_SHARED_LINKER_FLAGS="-Wl,-rpath-link,$dep_libs" \
    >"$log" 2>&1
}
