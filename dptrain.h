#pragma once
// dptrain's public API in one include: tensors and autograd, layers, optimizers, data, and data-parallel
// training. A program that trains with dptrain includes this header and links dptrain::dptrain
// (find_package(dptrain), or add_subdirectory of the source tree).

// Tensors, autograd and ops (CPU, and CUDA when built with it).
#include "core/autograd.h"
#include "core/cuda_runtime.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/factory.h"
#include "core/ops.h"
#include "core/safetensors.h"
#include "core/tensor.h"

// Layers (nn::Module and what is built from it).
#include "layers/activation.h"
#include "layers/attention.h"
#include "layers/dropout.h"
#include "layers/embedding.h"
#include "layers/gpt.h"
#include "layers/layer_norm.h"
#include "layers/linear.h"
#include "layers/losses.h"
#include "layers/mlp.h"
#include "layers/module.h"
#include "layers/sequential.h"

// Optimizers, schedules, clipping, mixed precision, checkpoints.
#include "optim/adam.h"
#include "optim/checkpoint.h"
#include "optim/grad_clip.h"
#include "optim/lr_schedule.h"
#include "optim/mixed_precision.h"
#include "optim/optimizer.h"
#include "optim/sgd.h"

// Data: datasets, samplers, the background loader.
#include "data/dataset.h"
#include "data/loader.h"
#include "data/sampler.h"
#include "data/synthetic.h"
#include "data/tensor_dataset.h"
#include "data/token_file.h"

// Data parallelism: the launcher's environment, process groups, DDP, the sharding sampler.
#include "collectives/process_group.h"
#include "distributed/ddp.h"
#include "distributed/sampler.h"
#include "rendezvous/env.h"
