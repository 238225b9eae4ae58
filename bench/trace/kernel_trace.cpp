// A kernel timeline without Nsight Systems: a CUPTI activity library that the CUDA driver loads into any
// program through CUDA_INJECTION64_PATH, and that writes every kernel, memcpy and memset the program's GPU
// runs (CUDA graph replays included) as one CSV line, to DPT_TRACE_DIR/trace-<pid>.csv (one file a process,
// so dpt-run's workers each write their own). compare_replays.py beside it reads them.
//
//   g++ -O2 -shared -fPIC -I/usr/local/cuda/include bench/trace/kernel_trace.cpp \
//       -L/usr/local/cuda/lib64 -lcupti -Wl,-rpath,/usr/local/cuda/lib64 -o /tmp/libkernel_trace.so
//   CUDA_INJECTION64_PATH=/tmp/libkernel_trace.so DPT_TRACE_DIR=/tmp/trace dpt-run ... dpt-bench train ...
//
// Lines: K (kernel) | C<copy kind> (memcpy) | P (peer copy) | S (memset), then device, stream, start and end
// (ns, one clock for every process of the host), grid blocks or bytes, graph id, graph node id, name.
// Recording every activity lengthens the step a little: compare traces with traces, not with untraced step
// times.
#include <cupti.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unistd.h>

static FILE* g_out = nullptr;
static std::mutex g_mu;

static void CUPTIAPI request(uint8_t** buf, size_t* size, size_t* max_records) {
  *size = 8 << 20;
  *buf = static_cast<uint8_t*>(aligned_alloc(8, *size));
  *max_records = 0;
}

static void CUPTIAPI complete(CUcontext, uint32_t, uint8_t* buf, size_t, size_t valid) {
  std::lock_guard<std::mutex> lock(g_mu);
  CUpti_Activity* rec = nullptr;
  while (cuptiActivityGetNextRecord(buf, valid, &rec) == CUPTI_SUCCESS) {
    switch (rec->kind) {
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
      case CUPTI_ACTIVITY_KIND_KERNEL: {
        auto* k = reinterpret_cast<CUpti_ActivityKernel10*>(rec);
        fprintf(g_out, "K,%u,%u,%llu,%llu,%d,%u,%llu,%s\n", k->deviceId, k->streamId,
                (unsigned long long)k->start, (unsigned long long)k->end, k->gridX * k->gridY * k->gridZ,
                k->graphId, (unsigned long long)k->graphNodeId, k->name);
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        auto* m = reinterpret_cast<CUpti_ActivityMemcpy6*>(rec);
        fprintf(g_out, "C%u,%u,%u,%llu,%llu,%llu,%u,%llu,memcpy\n", m->copyKind, m->deviceId, m->streamId,
                (unsigned long long)m->start, (unsigned long long)m->end, (unsigned long long)m->bytes,
                m->graphId, (unsigned long long)m->graphNodeId);
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY2: {
        auto* m = reinterpret_cast<CUpti_ActivityMemcpyPtoP4*>(rec);
        fprintf(g_out, "P,%u,%u,%llu,%llu,%llu,%u,%llu,p2p %u->%u\n", m->deviceId, m->streamId,
                (unsigned long long)m->start, (unsigned long long)m->end, (unsigned long long)m->bytes,
                m->graphId, (unsigned long long)m->graphNodeId, m->srcDeviceId, m->dstDeviceId);
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        auto* m = reinterpret_cast<CUpti_ActivityMemset4*>(rec);
        fprintf(g_out, "S,%u,%u,%llu,%llu,%llu,%u,%llu,memset\n", m->deviceId, m->streamId,
                (unsigned long long)m->start, (unsigned long long)m->end, (unsigned long long)m->bytes,
                m->graphId, (unsigned long long)m->graphNodeId);
        break;
      }
      default: break;
    }
  }
  free(buf);
}

static void flush_at_exit() {
  cuptiActivityFlushAll(1);
  if (g_out) fclose(g_out);
}

extern "C" int InitializeInjection(void) {
  const char* dir = getenv("DPT_TRACE_DIR");
  char path[512];
  snprintf(path, sizeof path, "%s/trace-%d.csv", dir ? dir : ".", (int)getpid());
  g_out = fopen(path, "w");
  if (!g_out) return 0;
  cuptiActivityRegisterCallbacks(request, complete);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY2);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET);
  atexit(flush_at_exit);
  return 1;
}
