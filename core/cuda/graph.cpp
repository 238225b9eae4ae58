// CudaGraph (core/cuda_runtime.h): stream capture into a graph whose memory is a GraphMemory.
#include <utility>

#include "core/cuda/check.h"
#include "core/cuda/graph_memory.h"
#include "core/cuda/stream.h"
#include "core/cuda_runtime.h"
#include "core/error.h"

namespace dpt::cuda {

struct CudaGraph::State {
  int device = 0;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  std::shared_ptr<GraphMemory> memory;
};

CudaGraph::CudaGraph() : state_(std::make_unique<State>()) {
  state_->device = current_device();
  state_->memory = std::make_shared<GraphMemory>(state_->device);
}

CudaGraph::~CudaGraph() {
  if (state_->exec) (void)cudaGraphExecDestroy(state_->exec);
  if (state_->graph) (void)cudaGraphDestroy(state_->graph);
  retire_graph_memory(state_->memory);
}

void CudaGraph::capture(const std::function<void()>& work) {
  DPT_CHECK(!state_->graph, "CudaGraph: capture() twice; make a new graph");
  DeviceGuard guard(state_->device);
  cudaStream_t stream = current_stream(state_->device);
  // Relaxed: GraphMemory allocates and waits on its own stream, which is not captured, meanwhile.
  DPT_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
  begin_graph_memory_capture(state_->memory);
  std::exception_ptr failed;
  try {
    work();
  } catch (...) {
    failed = std::current_exception();
  }
  end_graph_memory_capture();
  state_->memory->wait_for_blocks();
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
  if (failed) {
    if (graph) (void)cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    std::rethrow_exception(failed);
  }
  DPT_CHECK(ended == cudaSuccess,
            "CudaGraph: the captured work did something a graph cannot hold ({}): a host "
            "synchronisation, or work on another stream that was not joined back",
            cudaGetErrorString(ended));
  state_->graph = graph;
  DPT_CUDA_CHECK(cudaGraphInstantiate(&state_->exec, graph, 0));
}

void CudaGraph::replay() {
  DPT_CHECK(state_->exec, "CudaGraph: replay() before capture()");
  DPT_CUDA_CHECK(cudaGraphLaunch(state_->exec, current_stream(state_->device)));
}

size_t CudaGraph::memory_reserved() const { return state_->memory->reserved_bytes(); }
size_t CudaGraph::memory_outstanding() const { return state_->memory->outstanding_bytes(); }

}  // namespace dpt::cuda
