#pragma once
// Where the operands of one fused causal attention call live in memory. The kernels see every operand as
// [B H, T, D] (head bh = b H + h, query or key row, column) with unit column stride; an AttentionLayout
// says where element (bh, row, col) sits in its buffer:
//   offset + (bh / heads) batch_stride + (bh % heads) head_stride + row row_stride + col
// so one kernel reads a contiguous [B, H, T, D] tensor and, with no copy, the heads of a packed QKV
// projection [B, T, 3C] (C = H D; q of head h at columns h D.., k at C + h D.., v at 2 C + h D..) and
// writes its output straight into [B, T, C] (head h at columns h D..), the layout the next projection reads.
#include <cstdint>

#include "core/bfloat16.h"  // DPT_HOST_DEVICE
#include "core/kernel_types.h"

namespace dpt {

struct AttentionLayout {
  int64_t offset = 0;  // elements from the buffer's start to element (0, 0, 0)
  int64_t heads = 1;   // H: bh / heads is the batch, bh % heads the head
  int64_t batch_stride = 0, head_stride = 0, row_stride = 0;

  // Element (bh, 0, 0).
  DPT_HOST_DEVICE int64_t head_start(int64_t bh) const {
    return offset + (bh / heads) * batch_stride + (bh % heads) * head_stride;
  }
  // Element (bh, row, col).
  DPT_HOST_DEVICE int64_t at(int64_t bh, int64_t row, int64_t col) const {
    return head_start(bh) + row * row_stride + col;
  }
  // True when every row start is a multiple of `elements` from the buffer's start: with `elements`
  // elements to 16 bytes and a 16-byte aligned buffer, every row can be read in 16-byte vectors.
  bool rows_aligned_to(int64_t elements) const {
    return offset % elements == 0 && batch_stride % elements == 0 && head_stride % elements == 0 &&
           row_stride % elements == 0;
  }

  // Contiguous [BH, T, D] (heads = 1: every bh is its own batch).
  static AttentionLayout contiguous(int64_t t, int64_t d) { return {0, 1, t * d, t * d, d}; }
  // Part `part` (0 = q, 1 = k, 2 = v) of a packed [B, T, 3 C] projection, C = heads d.
  static AttentionLayout packed_qkv(int64_t part, int64_t heads, int64_t t, int64_t d) {
    const int64_t c = heads * d;
    return {part * c, heads, t * 3 * c, d, 3 * c};
  }
  // Heads merged into rows: [B, T, C], head h at columns h d.
  static AttentionLayout merged_heads(int64_t heads, int64_t t, int64_t d) {
    const int64_t c = heads * d;
    return {0, heads, t * c, d, c};
  }
};

// The layouts of one call's operands. Each gradient has its operand's layout (grad_q q's, grad_out
// out's, ...): the packed op's gradient is packed like its input, and grad_out arrives shaped as out.
struct AttentionLayouts {
  AttentionLayout q, k, v, out;

  static AttentionLayouts contiguous(int64_t t, int64_t d) {
    const AttentionLayout c = AttentionLayout::contiguous(t, d);
    return {c, c, c, c};
  }
  static AttentionLayouts packed_qkv(int64_t heads, int64_t t, int64_t d) {
    return {AttentionLayout::packed_qkv(0, heads, t, d), AttentionLayout::packed_qkv(1, heads, t, d),
            AttentionLayout::packed_qkv(2, heads, t, d), AttentionLayout::merged_heads(heads, t, d)};
  }
};

// Dropout on the attention weights inside the fused kernels: the weight of query i and key j in head h is
// kept when philox::dropout_uniform_at(rng, (h t + i) t + j) > p, and then scaled by 1 / (1 - p) — the very mask
// dpt::dropout draws for the [bh, t, t] weights from the same generator state, so the composed path is the
// reference. The softmax statistics (lse) are those before dropout; the backward draws the mask again.
// p == 0: no dropout.
struct AttentionDropout {
  float p = 0;
  PhiloxArgs rng;
};

}  // namespace dpt
