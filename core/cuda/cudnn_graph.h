#pragma once
// A thin layer over cuDNN's backend graph API (cudnnBackend*): owned descriptors, and builders for the
// tensors and operations a fused graph is made of. cuDNN matches such a graph against its fused engines
// (attention, for one: core/cuda/sdpa_cudnn.h); a graph no engine runs yields no plan, which the caller
// treats as "take our own kernels", never as an error.
#include <cudnn.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace dpt::cuda::cudnn_graph {

// One backend descriptor, destroyed with its owner. Setters throw (DPT_CUDNN_CHECK) on a rejected
// attribute: a rejected attribute is a bug here, not a property of the graph.
class Descriptor {
 public:
  explicit Descriptor(cudnnBackendDescriptorType_t type);
  ~Descriptor();
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;

  cudnnBackendDescriptor_t get() const { return desc_; }
  Descriptor& set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count,
                  const void* values);
  Descriptor& set(cudnnBackendAttributeName_t name, const Descriptor& value);
  void finalize();
  // cudnnBackendFinalize's status, for descriptors whose finalize may legitimately fail (a plan).
  cudnnStatus_t try_finalize();

 private:
  cudnnBackendDescriptor_t desc_ = nullptr;
};
using DescriptorPtr = std::shared_ptr<Descriptor>;

using Dims = std::array<int64_t, 4>;

// Builds one operation graph: tensors get consecutive unique ids from 1; the descriptors stay alive
// as long as the builder (and the plan made from it).
class GraphBuilder {
 public:
  // A tensor in device memory, read or written by the graph (its uid goes in the variant pack).
  DescriptorPtr tensor(cudnnDataType_t type, const Dims& dims, const Dims& strides, int64_t* uid_out = nullptr);
  // An intermediate the engine keeps on chip: dims and strides only give it its shape.
  DescriptorPtr virtual_tensor(cudnnDataType_t type, const Dims& dims, const Dims& strides);
  // A float32 scalar passed by value at execution (a host pointer in the variant pack).
  DescriptorPtr scalar(int64_t* uid_out);
  // An int64 scalar in device memory (a random draw's seed or offset, which a CUDA graph's replays move on).
  DescriptorPtr device_int64(int64_t* uid_out);

  void matmul(const DescriptorPtr& a, const DescriptorPtr& b, const DescriptorPtr& c);
  // y = op(x) or y = op(x, b); binary select is y = t ? x : b. axis only for CUDNN_POINTWISE_GEN_INDEX.
  void pointwise(cudnnPointwiseMode_t mode, cudnnDataType_t math, const DescriptorPtr& x, const DescriptorPtr& y,
                 const DescriptorPtr& b = nullptr, const DescriptorPtr& t = nullptr, int64_t axis = -1);
  void reduction(cudnnReduceTensorOp_t op, const DescriptorPtr& x, const DescriptorPtr& y);
  // y = 1 with probability `keep`, else 0, from cuDNN's Philox generator at the device scalars seed and offset.
  void bernoulli(double keep, const DescriptorPtr& seed, const DescriptorPtr& offset, const DescriptorPtr& y);
  // y views x's elements with other dims and strides (a transpose, for the engines that read it so).
  void reshape(const DescriptorPtr& x, const DescriptorPtr& y);

  // The operation graph, its engine configurations from heuristics (mode A), and the first that builds
  // an execution plan. Null when none does; failure() then says why in cuDNN's words.
  DescriptorPtr build_plan(cudnnHandle_t handle);
  const std::string& failure() const { return failure_; }

 private:
  DescriptorPtr make_tensor(cudnnDataType_t type, const Dims& dims, const Dims& strides, bool is_virtual, bool by_value,
                            int64_t* uid_out);

  int64_t next_uid_ = 1;
  std::vector<DescriptorPtr> keep_;  // every descriptor an operation refers to
  std::vector<DescriptorPtr> ops_;
  std::string failure_;
};

// The workspace a plan needs, in bytes.
int64_t plan_workspace_bytes(const Descriptor& plan);

// Runs `plan` on the handle's stream with the given (uid, pointer) bindings.
void execute(cudnnHandle_t handle, const Descriptor& plan, const std::vector<int64_t>& uids,
             const std::vector<void*>& pointers, void* workspace);

}  // namespace dpt::cuda::cudnn_graph
