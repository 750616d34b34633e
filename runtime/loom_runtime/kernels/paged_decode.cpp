// Decode attention over the paged KV pool, read in place: one query token per sequence, every
// sequence of the step in one call. The torch path (models/attention.py) first copies each
// layer's keys and values out of the pool and then runs one fused attention call per sequence;
// this kernel reads each block where it lies, once for the scores and once for the values.
//
// Layout (kv/cache.py): pool [num_blocks, layers, 2 (k, v), block_size, kv_heads, head_dim].
// Work item: one sequence, all its query heads (GQA: query head h reads kv head h / rep). Within
// an item the order of every sum is fixed, so a sequence's result does not depend on the other
// sequences of the step or on the number of threads.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <vector>

namespace {

struct Geometry {
  int64_t heads, kv_heads, rep, head_dim, block_size, block_stride, value_offset;
};

// Scratch of one thread: scores [heads, context], scaled queries and sums [heads, D].
struct Scratch {
  std::vector<float> scores, query, acc;
};

// Ask for one row of the next block while the same row of this block is read: blocks lie
// anywhere in the pool, so the hardware prefetcher cannot guess where the next one starts.
template <typename T>
inline void prefetch_row(const T* row, int64_t bytes) {
  const char* p = reinterpret_cast<const char*>(row);
  for (int64_t at = 0; at < bytes; at += 64) __builtin_prefetch(p + at);
}

// One sequence, all its heads: each token's key (and value) row [kv_heads, D] is read once,
// contiguously, for every query head.
template <typename T>
void attend(const T* q, const T* layer_pool, const int64_t* blocks, int64_t context,
            const Geometry& g, float scale, Scratch& s, T* out) {
  const int64_t heads = g.heads, dim = g.head_dim, row = g.kv_heads * g.head_dim;
  const int64_t num_blocks = (context + g.block_size - 1) / g.block_size;
  const int64_t row_bytes = row * static_cast<int64_t>(sizeof(T));
  s.scores.resize(heads * context);
  s.query.resize(heads * dim);
  s.acc.assign(heads * dim, 0.f);
  for (int64_t i = 0; i < heads * dim; ++i) s.query[i] = static_cast<float>(q[i]) * scale;
  for (int64_t b = 0; b < num_blocks; ++b) {
    const int64_t first = b * g.block_size, n = std::min(g.block_size, context - first);
    const T* keys = layer_pool + blocks[b] * g.block_stride;
    const T* next = b + 1 < num_blocks ? layer_pool + blocks[b + 1] * g.block_stride : nullptr;
    for (int64_t t = 0; t < n; ++t) {
      if (next != nullptr) prefetch_row(next + t * row, row_bytes);
      const T* k_row = keys + t * row;
      for (int64_t h = 0; h < heads; ++h) {
        const T* k = k_row + (h / g.rep) * dim;
        const float* qh = s.query.data() + h * dim;
        float dot = 0.f;
#pragma omp simd reduction(+ : dot)
        for (int64_t d = 0; d < dim; ++d) dot += qh[d] * static_cast<float>(k[d]);
        s.scores[h * context + first + t] = dot;
      }
    }
  }
  for (int64_t h = 0; h < heads; ++h) {
    float* p = s.scores.data() + h * context;
    float top = -FLT_MAX;
    for (int64_t t = 0; t < context; ++t) top = std::max(top, p[t]);
    float total = 0.f;
#pragma omp simd reduction(+ : total)
    for (int64_t t = 0; t < context; ++t) {
      p[t] = std::exp(p[t] - top);
      total += p[t];
    }
    const float inv = 1.f / total;
#pragma omp simd
    for (int64_t t = 0; t < context; ++t) p[t] *= inv;
  }
  for (int64_t b = 0; b < num_blocks; ++b) {
    const int64_t first = b * g.block_size, n = std::min(g.block_size, context - first);
    const T* values = layer_pool + blocks[b] * g.block_stride + g.value_offset;
    const T* next =
        b + 1 < num_blocks ? layer_pool + blocks[b + 1] * g.block_stride + g.value_offset : nullptr;
    for (int64_t t = 0; t < n; ++t) {
      if (next != nullptr) prefetch_row(next + t * row, row_bytes);
      const T* v_row = values + t * row;
      for (int64_t h = 0; h < heads; ++h) {
        const T* v = v_row + (h / g.rep) * dim;
        const float p = s.scores[h * context + first + t];
        float* a = s.acc.data() + h * dim;
#pragma omp simd
        for (int64_t d = 0; d < dim; ++d) a[d] += p * static_cast<float>(v[d]);
      }
    }
  }
  for (int64_t i = 0; i < heads * dim; ++i) out[i] = static_cast<T>(s.acc[i]);
}

// q [B, heads, D]; pool as above; blocks [N]: sequence 0's blocks, then sequence 1's, ...;
// starts [B + 1]: where each sequence's blocks begin in `blocks`; context_lens [B].
at::Tensor paged_decode(const at::Tensor& q, const at::Tensor& pool, int64_t layer,
                        const at::Tensor& blocks, const at::Tensor& starts,
                        const at::Tensor& context_lens, double scale) {
  TORCH_CHECK(q.device().is_cpu() && pool.device().is_cpu(), "paged_decode runs on the CPU");
  TORCH_CHECK(q.dim() == 3 && q.is_contiguous(), "q must be a contiguous [B, heads, D] tensor");
  TORCH_CHECK(pool.dim() == 6 && pool.is_contiguous() && pool.size(2) == 2,
              "pool must be the contiguous [blocks, layers, 2, block_size, kv_heads, D] cache");
  TORCH_CHECK(q.scalar_type() == pool.scalar_type(), "q and the pool must share a dtype");
  for (const at::Tensor* t : {&blocks, &starts, &context_lens}) {
    TORCH_CHECK(t->scalar_type() == at::kLong && t->dim() == 1 && t->is_contiguous(),
                "blocks, starts and context_lens must be contiguous 1-d int64 tensors");
  }
  const int64_t batch = q.size(0), heads = q.size(1), dim = q.size(2);
  const int64_t layers = pool.size(1), block_size = pool.size(3), kv_heads = pool.size(4);
  TORCH_CHECK(pool.size(5) == dim, "q's head_dim ", dim, " is not the pool's ", pool.size(5));
  TORCH_CHECK(kv_heads > 0 && heads % kv_heads == 0, heads, " query heads over ", kv_heads,
              " kv heads");
  TORCH_CHECK(layer >= 0 && layer < layers, "layer ", layer, " of ", layers);
  TORCH_CHECK(starts.numel() == batch + 1 && context_lens.numel() == batch,
              "starts must hold B + 1 offsets and context_lens B lengths");
  const int64_t* blk = blocks.data_ptr<int64_t>();
  const int64_t* st = starts.data_ptr<int64_t>();
  const int64_t* ctx = context_lens.data_ptr<int64_t>();
  TORCH_CHECK(st[0] == 0 && st[batch] == blocks.numel(), "starts must span blocks");
  for (int64_t b = 0; b < batch; ++b) {
    TORCH_CHECK(ctx[b] >= 1 && st[b + 1] - st[b] == (ctx[b] + block_size - 1) / block_size,
                "sequence ", b, ": ", st[b + 1] - st[b], " blocks for ", ctx[b], " keys");
  }
  for (int64_t i = 0; i < blocks.numel(); ++i) {
    TORCH_CHECK(blk[i] >= 0 && blk[i] < pool.size(0), "block ", blk[i], " is not in the pool");
  }
  const int64_t half = block_size * kv_heads * dim;
  const Geometry g{heads, kv_heads, heads / kv_heads, dim, block_size, layers * 2 * half, half};
  auto out = at::empty_like(q);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "paged_decode", [&] {
    const scalar_t* qp = q.data_ptr<scalar_t>();
    const scalar_t* layer_pool = pool.data_ptr<scalar_t>() + layer * 2 * half;
    scalar_t* op = out.data_ptr<scalar_t>();
    at::parallel_for(0, batch, 1, [&](int64_t begin, int64_t end) {
      Scratch scratch;
      for (int64_t b = begin; b < end; ++b) {
        attend<scalar_t>(qp + b * heads * dim, layer_pool, blk + st[b], ctx[b], g,
                         static_cast<float>(scale), scratch, op + b * heads * dim);
      }
    });
  });
  return out;
}

}  // namespace

TORCH_LIBRARY(loom, m) {
  m.def(
      "paged_decode(Tensor q, Tensor pool, int layer, Tensor blocks, Tensor starts, "
      "Tensor context_lens, float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(loom, CPU, m) { m.impl("paged_decode", paged_decode); }
