#include "core/cuda/cudnn_graph.h"

#include <string>

#include "core/cuda/check.h"

namespace dpt::cuda::cudnn_graph {

namespace {

// cuDNN's own words for the last failure (its plan and graph finalizers say why a graph is refused).
std::string last_error() {
  char message[1024] = {0};
  cudnnGetLastErrorString(message, sizeof message);
  return message;
}

// Every tensor the engines see is 16-byte aligned: our allocations are 256-byte aligned, and the callers
// check that each operand's offset keeps rows on 16-byte boundaries.
constexpr int64_t kAlignment = 16;

}  // namespace

Descriptor::Descriptor(cudnnBackendDescriptorType_t type) {
  DPT_CUDNN_CHECK(cudnnBackendCreateDescriptor(type, &desc_));
}

Descriptor::~Descriptor() {
  if (desc_) (void)cudnnBackendDestroyDescriptor(desc_);
}

Descriptor& Descriptor::set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count,
                            const void* values) {
  DPT_CUDNN_CHECK(cudnnBackendSetAttribute(desc_, name, type, count, values));
  return *this;
}

Descriptor& Descriptor::set(cudnnBackendAttributeName_t name, const Descriptor& value) {
  cudnnBackendDescriptor_t raw = value.get();
  return set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &raw);
}

void Descriptor::finalize() { DPT_CUDNN_CHECK(cudnnBackendFinalize(desc_)); }

cudnnStatus_t Descriptor::try_finalize() { return cudnnBackendFinalize(desc_); }

DescriptorPtr GraphBuilder::make_tensor(cudnnDataType_t type, const Dims& dims, const Dims& strides, bool is_virtual,
                                        bool by_value, int64_t* uid_out) {
  auto t = std::make_shared<Descriptor>(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  const int64_t uid = next_uid_++;
  t->set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type)
      .set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data())
      .set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data())
      .set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid)
      .set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &kAlignment)
      .set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual);
  if (by_value) t->set(CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value);
  t->finalize();
  if (uid_out) *uid_out = uid;
  keep_.push_back(t);
  return t;
}

DescriptorPtr GraphBuilder::tensor(cudnnDataType_t type, const Dims& dims, const Dims& strides, int64_t* uid_out) {
  return make_tensor(type, dims, strides, false, false, uid_out);
}

DescriptorPtr GraphBuilder::virtual_tensor(cudnnDataType_t type, const Dims& dims, const Dims& strides) {
  return make_tensor(type, dims, strides, true, false, nullptr);
}

DescriptorPtr GraphBuilder::scalar(int64_t* uid_out) {
  return make_tensor(CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true, uid_out);
}

DescriptorPtr GraphBuilder::device_int64(int64_t* uid_out) {
  return make_tensor(CUDNN_DATA_INT64, {1, 1, 1, 1}, {1, 1, 1, 1}, false, false, uid_out);
}

void GraphBuilder::matmul(const DescriptorPtr& a, const DescriptorPtr& b, const DescriptorPtr& c) {
  auto desc = std::make_shared<Descriptor>(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
  const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
  desc->set(CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute).finalize();
  auto op = std::make_shared<Descriptor>(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
  op->set(CUDNN_ATTR_OPERATION_MATMUL_ADESC, *a)
      .set(CUDNN_ATTR_OPERATION_MATMUL_BDESC, *b)
      .set(CUDNN_ATTR_OPERATION_MATMUL_CDESC, *c)
      .set(CUDNN_ATTR_OPERATION_MATMUL_DESC, *desc)
      .finalize();
  keep_.push_back(desc);
  ops_.push_back(op);
}

void GraphBuilder::pointwise(cudnnPointwiseMode_t mode, cudnnDataType_t math, const DescriptorPtr& x,
                             const DescriptorPtr& y, const DescriptorPtr& b, const DescriptorPtr& t, int64_t axis) {
  auto desc = std::make_shared<Descriptor>(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
  desc->set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode)
      .set(CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &math);
  if (axis >= 0) desc->set(CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
  desc->finalize();
  auto op = std::make_shared<Descriptor>(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
  op->set(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, *desc)
      .set(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, *x)
      .set(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, *y);
  if (b) op->set(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, *b);
  if (t) op->set(CUDNN_ATTR_OPERATION_POINTWISE_TDESC, *t);
  op->finalize();
  keep_.push_back(desc);
  ops_.push_back(op);
}

void GraphBuilder::reduction(cudnnReduceTensorOp_t reduce_op, const DescriptorPtr& x, const DescriptorPtr& y) {
  auto desc = std::make_shared<Descriptor>(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
  const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
  desc->set(CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &reduce_op)
      .set(CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute)
      .finalize();
  auto op = std::make_shared<Descriptor>(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
  op->set(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, *x)
      .set(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, *y)
      .set(CUDNN_ATTR_OPERATION_REDUCTION_DESC, *desc)
      .finalize();
  keep_.push_back(desc);
  ops_.push_back(op);
}

void GraphBuilder::bernoulli(double keep, const DescriptorPtr& seed, const DescriptorPtr& offset,
                             const DescriptorPtr& y) {
  auto desc = std::make_shared<Descriptor>(CUDNN_BACKEND_RNG_DESCRIPTOR);
  const cudnnRngDistribution_t distribution = CUDNN_RNG_DISTRIBUTION_BERNOULLI;
  desc->set(CUDNN_ATTR_RNG_DISTRIBUTION, CUDNN_TYPE_RNG_DISTRIBUTION, 1, &distribution)
      .set(CUDNN_ATTR_RNG_BERNOULLI_DIST_PROBABILITY, CUDNN_TYPE_DOUBLE, 1, &keep)
      .finalize();
  auto op = std::make_shared<Descriptor>(CUDNN_BACKEND_OPERATION_RNG_DESCRIPTOR);
  op->set(CUDNN_ATTR_OPERATION_RNG_YDESC, *y)
      .set(CUDNN_ATTR_OPERATION_RNG_SEED, *seed)
      .set(CUDNN_ATTR_OPERATION_RNG_OFFSET_DESC, *offset)
      .set(CUDNN_ATTR_OPERATION_RNG_DESC, *desc)
      .finalize();
  keep_.push_back(desc);
  ops_.push_back(op);
}

void GraphBuilder::reshape(const DescriptorPtr& x, const DescriptorPtr& y) {
  auto op = std::make_shared<Descriptor>(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
  op->set(CUDNN_ATTR_OPERATION_RESHAPE_XDESC, *x).set(CUDNN_ATTR_OPERATION_RESHAPE_YDESC, *y).finalize();
  ops_.push_back(op);
}

DescriptorPtr GraphBuilder::build_plan(cudnnHandle_t handle) {
  auto graph = std::make_shared<Descriptor>(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  std::vector<cudnnBackendDescriptor_t> raw_ops;
  for (const DescriptorPtr& op : ops_) raw_ops.push_back(op->get());
  graph
      ->set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, static_cast<int64_t>(raw_ops.size()),
            raw_ops.data())
      .set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
  if (graph->try_finalize() != CUDNN_STATUS_SUCCESS) {
    failure_ = "operation graph refused: " + last_error();
    return nullptr;
  }
  keep_.push_back(graph);

  Descriptor heuristics(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
  heuristics.set(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, *graph)
      .set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
  if (heuristics.try_finalize() != CUDNN_STATUS_SUCCESS) {
    failure_ = "heuristics refused the graph: " + last_error();
    return nullptr;
  }
  int64_t count = 0;
  DPT_CUDNN_CHECK(cudnnBackendGetAttribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                           CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr));
  std::vector<DescriptorPtr> configs;
  std::vector<cudnnBackendDescriptor_t> raw_configs;
  for (int64_t i = 0; i < count; ++i) {
    configs.push_back(std::make_shared<Descriptor>(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
    raw_configs.push_back(configs.back()->get());
  }
  int64_t returned = 0;
  if (count > 0) {
    DPT_CUDNN_CHECK(cudnnBackendGetAttribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                             CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &returned, raw_configs.data()));
  }
  // Heuristics order the configurations by predicted speed; the first that builds is the one we keep.
  for (int64_t i = 0; i < returned; ++i) {
    auto plan = std::make_shared<Descriptor>(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
    plan->set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle)
        .set(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, *configs[i]);
    if (plan->try_finalize() == CUDNN_STATUS_SUCCESS) {
      keep_.push_back(configs[i]);
      return plan;
    }
    failure_ = "no engine configuration built a plan (" + std::to_string(returned) + " tried), last: " + last_error();
  }
  if (returned == 0) failure_ = "heuristics returned no engine configuration";
  return nullptr;
}

int64_t plan_workspace_bytes(const Descriptor& plan) {
  int64_t bytes = 0, returned = 0;
  DPT_CUDNN_CHECK(cudnnBackendGetAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1,
                                           &returned, &bytes));
  return bytes;
}

void execute(cudnnHandle_t handle, const Descriptor& plan, const std::vector<int64_t>& uids,
             const std::vector<void*>& pointers, void* workspace) {
  Descriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, static_cast<int64_t>(uids.size()), uids.data())
      .set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, static_cast<int64_t>(pointers.size()),
           pointers.data())
      .set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace)
      .finalize();
  DPT_CUDNN_CHECK(cudnnBackendExecute(handle, plan.get(), pack.get()));
}

}  // namespace dpt::cuda::cudnn_graph
