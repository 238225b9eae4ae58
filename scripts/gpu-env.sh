# Sourced by the GPU comparison scripts (gpu-bench.sh, gpu-scaling.sh, gpu-collectives.sh): the environment
# both dptrain and the PyTorch reference run in.
#  - NVLink multicast stays off everywhere (NCCL, PyTorch, NVSHMEM).
#  - The unpacked C++ dependencies (.deps) are on the library path.
#  - dptrain loads the same NCCL library as the PyTorch it is compared with (PyTorch's wheel brings its own,
#    often newer than the system's), so a ratio compares the frameworks, not two NCCL releases.
#    DPT_NCCL=system keeps the system NCCL.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export LD_LIBRARY_PATH="$root/.deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if [[ "${DPT_NCCL:-pytorch}" == pytorch ]]; then
  torch_nccl="$(python3 -c 'import os, nvidia.nccl as n; print(os.path.join(list(n.__path__)[0], "lib"))' 2>/dev/null)"
  if [[ -n "$torch_nccl" && -f "$torch_nccl/libnccl.so.2" ]]; then
    export LD_LIBRARY_PATH="$torch_nccl:$LD_LIBRARY_PATH"
    echo "NCCL: dptrain and PyTorch both load $torch_nccl/libnccl.so.2 (DPT_NCCL=system for the system's)"
  fi
fi
