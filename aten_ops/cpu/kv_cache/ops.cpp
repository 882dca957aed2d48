// CPU entry points of the paged KV cache helpers declared in native_functions.yaml.
//
// A paged cache holds num_blocks blocks of block_size token rows; a token row is N2*D values, stored as
// (num_blocks, block_size, N2, D) or (num_blocks, block_size, N2*D) (cache_layout "BSND"), or head-major as
// (num_blocks, N2, block_size, D) (cache_layout "BNSD"). Slot s = block * block_size + offset.
// Rows are copied byte-wise, so any dtype works as long as new rows and cache agree.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>
#include <tuple>
#include <vector>

#include "generated/kernels.h"

namespace npu_fa {
namespace {

struct CacheGeom {
  int64_t num_blocks, block_size, row;  // row = values per token (N2*D)
  bool head_major = false;              // (num_blocks, N2, block_size, D)
  int64_t heads = 1, dim = 0;           // N2 and D when head_major
};

bool parse_cache_layout(const char* op, c10::string_view layout) {
  TORCH_CHECK_VALUE(layout == "BSND" || layout == "BNSD", op, ": argument 'cache_layout' must be 'BSND' ((num_blocks, "
                    "block_size, N2, D) or (num_blocks, block_size, N2*D)) or 'BNSD' ((num_blocks, N2, block_size, D)); "
                    "got '", std::string(layout.data(), layout.size()), "'");
  return layout == "BNSD";
}

CacheGeom cache_geometry(const char* op, const char* name, const at::Tensor& cache, bool head_major) {
  if (head_major) {
    TORCH_CHECK(cache.dim() == 4, op, ": ", name, " must be (num_blocks, N2, block_size, D) for cache_layout 'BNSD'; "
                "got shape ", cache.sizes());
  } else {
    TORCH_CHECK(cache.dim() == 3 || cache.dim() == 4, op, ": ", name,
                " must be (num_blocks, block_size, N2, D) or (num_blocks, block_size, N2*D); got shape ",
                cache.sizes());
  }
  TORCH_CHECK(cache.is_contiguous(), op, ": ", name, " must be contiguous");
  if (head_major)
    return {cache.size(0), cache.size(2), cache.size(1) * cache.size(3), true, cache.size(1), cache.size(3)};
  CacheGeom g{cache.size(0), cache.size(1), 1};
  for (int64_t d = 2; d < cache.dim(); ++d) g.row *= cache.size(d);
  return g;
}

// Copies one token row (N2*D values of `es` bytes) between a packed [.., N2, D] row and slot `slot` of the cache.
void copy_token(const CacheGeom& g, size_t es, char* cache, int64_t slot, char* row, bool to_cache) {
  if (!g.head_major) {
    char* c = cache + slot * g.row * es;
    to_cache ? std::memcpy(c, row, g.row * es) : std::memcpy(row, c, g.row * es);
    return;
  }
  const int64_t blk = slot / g.block_size, off = slot % g.block_size;
  const size_t head_bytes = g.dim * es;
  for (int64_t n = 0; n < g.heads; ++n) {
    char* c = cache + ((blk * g.heads + n) * g.block_size + off) * head_bytes;
    char* r = row + n * head_bytes;
    to_cache ? std::memcpy(c, r, head_bytes) : std::memcpy(r, c, head_bytes);
  }
}

at::Tensor as_long(const at::Tensor& t) { return t.to(at::kLong).contiguous(); }

void check_index_dtype(const char* op, const char* name, const at::Tensor& t) {
  TORCH_CHECK(t.scalar_type() == at::kLong || t.scalar_type() == at::kInt, op, ": ", name,
              " must be int64 or int32; got ", t.scalar_type());
}

void check_rows(const char* op, const char* name, const at::Tensor& x, const at::Tensor& cache, int64_t T,
                int64_t row, bool head_major) {
  TORCH_CHECK(x.scalar_type() == cache.scalar_type(), op, ": ", name, " (", x.scalar_type(),
              ") and its cache (", cache.scalar_type(), ") must have the same dtype");
  TORCH_CHECK(x.dim() >= 2 && x.size(0) == T, op, ": ", name, " of shape ", x.sizes(),
              " must be [T, N2, D] (or [T, N2*D]) with T = slot_mapping.numel() = ", T);
  int64_t per = 1;
  for (int64_t d = 1; d < x.dim(); ++d) per *= x.size(d);
  TORCH_CHECK(per == row, op, ": ", name, " of shape ", x.sizes(), " has ", per,
              " values per token but its cache of shape ", cache.sizes(), " holds ", row);
  const int64_t head_dim = head_major ? 1 : 2;  // where N2 sits in the cache
  if (x.dim() == 3 && cache.dim() == 4)
    TORCH_CHECK(x.size(1) == cache.size(head_dim) && x.size(2) == cache.size(3), op, ": ", name, " of shape ", x.sizes(),
                " does not match the (N2, D) of its cache ", cache.sizes());
}

// Geometries of a key/value cache pair, which must agree on (num_blocks, block_size).
std::pair<CacheGeom, CacheGeom> cache_pair(const char* op, const at::Tensor& key_cache, const at::Tensor& value_cache,
                                           c10::string_view cache_layout) {
  const bool head_major = parse_cache_layout(op, cache_layout);
  const CacheGeom kg = cache_geometry(op, "key_cache", key_cache, head_major);
  const CacheGeom vg = cache_geometry(op, "value_cache", value_cache, head_major);
  TORCH_CHECK(kg.num_blocks == vg.num_blocks && kg.block_size == vg.block_size, op,
              ": key_cache ", key_cache.sizes(), " and value_cache ", value_cache.sizes(),
              " must share (num_blocks, block_size)");
  // Slots and sequence positions are divided by block_size.
  TORCH_CHECK_VALUE(kg.block_size > 0, op, ": key_cache ", key_cache.sizes(), " has block_size 0; expected >= 1 ",
                    "token rows per block");
  return {kg, vg};
}

}  // namespace

void scatter_pa_kv_cache_cpu(const ScatterPaKvCacheArgs& args) {
  const char* op = "scatter_pa_kv_cache";
  const auto [kg, vg] = cache_pair(op, args.key_cache, args.value_cache, args.cache_layout);
  check_index_dtype(op, "slot_mapping", args.slot_mapping);
  TORCH_CHECK(args.slot_mapping.dim() == 1, op, ": slot_mapping must be 1-D [T]; got shape ",
              args.slot_mapping.sizes());
  const int64_t T = args.slot_mapping.numel();
  check_rows(op, "key", args.key, args.key_cache, T, kg.row, kg.head_major);
  check_rows(op, "value", args.value, args.value_cache, T, vg.row, vg.head_major);
  const at::Tensor slots = as_long(args.slot_mapping);
  const int64_t* sp = slots.data_ptr<int64_t>();
  const int64_t n_slots = kg.num_blocks * kg.block_size;
  for (int64_t t = 0; t < T; ++t)
    TORCH_CHECK(sp[t] == -1 || (sp[t] >= 0 && sp[t] < n_slots), op, ": slot_mapping[", t, "] = ", sp[t],
                " is out of range; slots are -1 (skip) or in [0, num_blocks*block_size = ", n_slots, ")");
  {  // Two tokens writing one slot would race; reject it.
    std::vector<int64_t> used;
    used.reserve(T);
    for (int64_t t = 0; t < T; ++t)
      if (sp[t] >= 0) used.push_back(sp[t]);
    std::sort(used.begin(), used.end());
    const auto dup = std::adjacent_find(used.begin(), used.end());
    TORCH_CHECK(dup == used.end(), op, ": slot ", dup == used.end() ? 0 : *dup,
                " appears more than once in slot_mapping; every token needs its own slot");
  }
  if (T == 0) return;
  const at::Tensor kc = args.key.contiguous(), vc = args.value.contiguous();
  const size_t kbytes = kg.row * args.key.element_size(), vbytes = vg.row * args.value.element_size();
  char* ks = static_cast<char*>(kc.data_ptr());
  char* vs = static_cast<char*>(vc.data_ptr());
  char* kd = static_cast<char*>(args.key_cache.data_ptr());
  char* vd = static_cast<char*>(args.value_cache.data_ptr());
  at::parallel_for(0, T, 16, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      if (sp[t] < 0) continue;
      copy_token(kg, args.key.element_size(), kd, sp[t], ks + t * kbytes, true);
      copy_token(vg, args.value.element_size(), vd, sp[t], vs + t * vbytes, true);
    }
  });
}

std::tuple<at::Tensor, at::Tensor> gather_pa_kv_cache_cpu(const GatherPaKvCacheArgs& args) {
  const char* op = "gather_pa_kv_cache";
  const auto [kg, vg] = cache_pair(op, args.key_cache, args.value_cache, args.cache_layout);
  check_index_dtype(op, "block_table", args.block_table);
  check_index_dtype(op, "seq_lens", args.seq_lens);
  TORCH_CHECK(args.block_table.dim() == 2, op, ": block_table must be 2-D [B, max_blocks]; got shape ",
              args.block_table.sizes());
  TORCH_CHECK(args.seq_lens.dim() == 1 && args.seq_lens.size(0) == args.block_table.size(0), op, ": seq_lens of shape ",
              args.seq_lens.sizes(), " must be [B] with B = block_table.size(0) = ", args.block_table.size(0));
  const int64_t B = args.block_table.size(0), M = args.block_table.size(1), bs = kg.block_size;
  const at::Tensor bt = as_long(args.block_table), lens = as_long(args.seq_lens);
  const int64_t* btp = bt.data_ptr<int64_t>();
  const int64_t* lp = lens.data_ptr<int64_t>();
  std::vector<int64_t> start(B + 1, 0);
  for (int64_t b = 0; b < B; ++b) {
    TORCH_CHECK(lp[b] >= 0 && lp[b] <= M * bs, op, ": seq_lens[", b, "] = ", lp[b], " must lie in [0, max_blocks*",
                "block_size = ", M * bs, "]");
    for (int64_t j = 0; j < (lp[b] + bs - 1) / bs; ++j) {
      const int64_t blk = btp[b * M + j];
      TORCH_CHECK(blk >= 0 && blk < kg.num_blocks, op, ": block_table[", b, ", ", j, "] = ", blk,
                  " is out of range [0, num_blocks = ", kg.num_blocks, ")");
    }
    start[b + 1] = start[b] + lp[b];
  }
  const int64_t total = start[B];
  std::vector<int64_t> ks{total}, vs{total};
  if (kg.head_major) {
    ks.insert(ks.end(), {kg.heads, kg.dim});
    vs.insert(vs.end(), {vg.heads, vg.dim});
  } else {
    for (int64_t d = 2; d < args.key_cache.dim(); ++d) ks.push_back(args.key_cache.size(d));
    for (int64_t d = 2; d < args.value_cache.dim(); ++d) vs.push_back(args.value_cache.size(d));
  }
  at::Tensor k = at::empty(ks, args.key_cache.options());
  at::Tensor v = at::empty(vs, args.value_cache.options());
  if (total == 0) return {k, v};
  const size_t kbytes = kg.row * args.key_cache.element_size(), vbytes = vg.row * args.value_cache.element_size();
  char* ksrc = static_cast<char*>(args.key_cache.data_ptr());
  char* vsrc = static_cast<char*>(args.value_cache.data_ptr());
  char* kd = static_cast<char*>(k.data_ptr());
  char* vd = static_cast<char*>(v.data_ptr());
  // One work item per (sequence, logical block).
  at::parallel_for(0, B * M, 1, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t b = i / M, j = i % M;
      const int64_t first = j * bs;
      if (first >= lp[b]) continue;
      const int64_t n = std::min(bs, lp[b] - first);
      const int64_t blk = btp[b * M + j];
      for (int64_t p = 0; p < n; ++p) {
        const int64_t row = start[b] + first + p;
        copy_token(kg, args.key_cache.element_size(), ksrc, blk * bs + p, kd + row * kbytes, false);
        copy_token(vg, args.value_cache.element_size(), vsrc, blk * bs + p, vd + row * vbytes, false);
      }
    }
  });
  return {k, v};
}

// torch_npu's npu_gather_pa_kv_cache: token rows of each sequence copied, sequence after sequence, into the caller's
// key/value. Token j of sequence b reads block_tables[b, seq_offset[b] / block_size + j / block_size], row
// j % block_size; a block id outside [0, num_blocks) or a table index past the row gives a row of zeros (upstream's
// definition). Rows past key.size(0) are not written; rows past the sequences' total are left as they are.
void gather_pa_kv_cache_into_cpu(const GatherPaKvCacheIntoArgs& args) {
  const char* op = "gather_pa_kv_cache_into";
  const auto [kg, vg] = cache_pair(op, args.key_cache, args.value_cache, "BSND");
  check_index_dtype(op, "block_tables", args.block_tables);
  check_index_dtype(op, "seq_lens", args.seq_lens);
  TORCH_CHECK_VALUE(args.block_tables.dim() == 2, op, ": argument 'block_tables' must be 2-D [batch, max_blocks]; got "
                    "shape ", args.block_tables.sizes());
  TORCH_CHECK_VALUE(args.seq_lens.dim() == 1, op, ": argument 'seq_lens' must be 1-D; got shape ", args.seq_lens.sizes());
  const int64_t T = args.key.dim() > 0 ? args.key.size(0) : 0;
  for (const auto& [name, x, cache, row] : {std::tuple<const char*, const at::Tensor&, const at::Tensor&, int64_t>{
                                                "key", args.key, args.key_cache, kg.row},
                                            {"value", args.value, args.value_cache, vg.row}}) {
    TORCH_CHECK_TYPE(x.scalar_type() == cache.scalar_type(), op, ": argument '", name, "' (", x.scalar_type(),
                     ") must have the dtype of its cache (", cache.scalar_type(), ")");
    TORCH_CHECK_VALUE(x.dim() >= 2 && x.size(0) == T, op, ": argument '", name, "' of shape ", x.sizes(),
                      " must be [num_tokens, N, D] (or [num_tokens, N*D]) with num_tokens = key.size(0) = ", T);
    int64_t per = 1;
    for (int64_t d = 1; d < x.dim(); ++d) per *= x.size(d);
    TORCH_CHECK_VALUE(per == row, op, ": argument '", name, "' of shape ", x.sizes(), " has ", per,
                      " values per token but its cache of shape ", cache.sizes(), " holds ", row);
  }
  const at::Tensor lens_in = as_long(args.seq_lens);
  const int64_t* lin = lens_in.data_ptr<int64_t>();
  const int64_t n_in = lens_in.numel();
  TORCH_CHECK_VALUE(!args.is_seq_lens_cumsum || n_in >= 1, op, ": with is_seq_lens_cumsum, argument 'seq_lens' ",
                    "holds batch+1 cumulative counts; got an empty tensor");
  const int64_t B = args.is_seq_lens_cumsum ? n_in - 1 : n_in;
  std::vector<int64_t> len(B);
  for (int64_t b = 0; b < B; ++b) {
    len[b] = args.is_seq_lens_cumsum ? lin[b + 1] - lin[b] : lin[b];
    TORCH_CHECK_VALUE(len[b] >= 0, op, ": argument 'seq_lens' must give non-negative lengths",
                      args.is_seq_lens_cumsum ? " (a non-decreasing cumulative sum)" : "", "; sequence ", b,
                      " has ", len[b]);
  }
  TORCH_CHECK_VALUE(args.block_tables.size(0) >= B, op, ": argument 'block_tables' of shape ",
                    args.block_tables.sizes(), " needs a row per sequence (", B, ")");
  std::vector<int64_t> first_block(B, 0);
  if (args.seq_offset.has_value()) {
    check_index_dtype(op, "seq_offset", *args.seq_offset);
    TORCH_CHECK_VALUE(args.seq_offset->dim() == 1 && args.seq_offset->size(0) == B, op,
                      ": argument 'seq_offset' must be 1-D [batch] = [", B, "]; got shape ", args.seq_offset->sizes());
    const at::Tensor off = as_long(*args.seq_offset);
    for (int64_t b = 0; b < B; ++b) {
      const int64_t o = off.data_ptr<int64_t>()[b];
      TORCH_CHECK_VALUE(o >= 0, op, ": argument 'seq_offset' must be non-negative; got ", o, " for sequence ", b);
      first_block[b] = o / kg.block_size;
    }
  }
  std::vector<int64_t> start(B + 1, 0);
  for (int64_t b = 0; b < B; ++b) start[b + 1] = start[b] + len[b];
  const int64_t rows = std::min(start[B], T);
  if (rows == 0) return;
  const at::Tensor bt = as_long(args.block_tables);
  const int64_t* btp = bt.data_ptr<int64_t>();
  const int64_t M = bt.size(1), bs = kg.block_size;
  at::Tensor k = args.key.is_contiguous() ? args.key : args.key.contiguous();
  at::Tensor v = args.value.is_contiguous() ? args.value : args.value.contiguous();
  const size_t kes = args.key_cache.element_size(), ves = args.value_cache.element_size();
  const size_t kbytes = kg.row * kes, vbytes = vg.row * ves;
  const char* ksrc = static_cast<const char*>(args.key_cache.data_ptr());
  const char* vsrc = static_cast<const char*>(args.value_cache.data_ptr());
  char* kd = static_cast<char*>(k.data_ptr());
  char* vd = static_cast<char*>(v.data_ptr());
  at::parallel_for(0, rows, std::max<int64_t>(1, 4096 / std::max<int64_t>(kg.row + vg.row, 1)), [&](int64_t r0, int64_t r1) {
    int64_t b = std::upper_bound(start.begin(), start.end(), r0) - start.begin() - 1;
    for (int64_t r = r0; r < r1; ++r) {
      while (r >= start[b + 1]) ++b;  // skips empty sequences
      const int64_t j = r - start[b], idx = first_block[b] + j / bs;
      const int64_t blk = idx < M ? btp[b * M + idx] : -1;
      if (blk >= 0 && blk < kg.num_blocks) {
        const int64_t slot = blk * bs + j % bs;
        std::memcpy(kd + r * kbytes, ksrc + slot * kbytes, kbytes);
        std::memcpy(vd + r * vbytes, vsrc + slot * vbytes, vbytes);
      } else {
        std::memset(kd + r * kbytes, 0, kbytes);
        std::memset(vd + r * vbytes, 0, vbytes);
      }
    }
  });
  if (!k.is_same(args.key)) args.key.copy_(k);
  if (!v.is_same(args.value)) args.value.copy_(v);
}

// torch_npu's npu_scatter_nd_update_: var[indices[r]] = updates[r] for every index row r (a slice of
// var.shape[K:]). Rows are resolved to flat slice offsets first (range-checked), a repeated slice keeps its last
// update, and the distinct slices are copied in parallel (byte-wise: any dtype).
void scatter_nd_update_cpu(const ScatterNdUpdateArgs& args) {
  const char* op = "scatter_nd_update";
  const at::Tensor& var = args.var;
  check_index_dtype(op, "indices", args.indices);
  TORCH_CHECK_VALUE(args.indices.dim() >= 1, op, ": argument 'indices' must have at least 1 dimension [..., K]; got a ",
                    "scalar");
  const int64_t K = args.indices.size(-1);
  TORCH_CHECK_VALUE(K >= 1 && K <= var.dim(), op, ": argument 'indices' of shape ", args.indices.sizes(),
                    " addresses K = ", K, " leading dimensions; expected 1 <= K <= var.dim() = ", var.dim());
  TORCH_CHECK_TYPE(args.updates.scalar_type() == var.scalar_type(), op, ": argument 'updates' (",
                   args.updates.scalar_type(), ") must have the dtype of 'var' (", var.scalar_type(), ")");
  std::vector<int64_t> want(args.indices.sizes().begin(), args.indices.sizes().end() - 1);
  for (int64_t d = K; d < var.dim(); ++d) want.push_back(var.size(d));
  TORCH_CHECK_VALUE(args.updates.sizes().vec() == want, op, ": argument 'updates' must have shape indices.shape[:-1] + ",
                    "var.shape[K:] = ", at::IntArrayRef(want), "; got ", args.updates.sizes());
  const int64_t R = K ? args.indices.numel() / K : 0;
  int64_t slice = 1;
  for (int64_t d = K; d < var.dim(); ++d) slice *= var.size(d);
  if (R == 0 || slice == 0) return;
  const at::Tensor idx = as_long(args.indices);
  const int64_t* ip = idx.data_ptr<int64_t>();
  std::vector<std::pair<int64_t, int64_t>> target(R);  // (flat slice index, row)
  for (int64_t r = 0; r < R; ++r) {
    int64_t flat = 0;
    for (int64_t d = 0; d < K; ++d) {
      const int64_t i = ip[r * K + d];
      TORCH_CHECK_VALUE(i >= 0 && i < var.size(d), op, ": argument 'indices' row ", r, " has ", i, " for dimension ",
                        d, " of var (size ", var.size(d), "); expected [0, ", var.size(d), ")");
      flat = flat * var.size(d) + i;
    }
    target[r] = {flat, r};
  }
  std::stable_sort(target.begin(), target.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::pair<int64_t, int64_t>> last;  // one row per slice: the last in index order
  last.reserve(R);
  for (int64_t i = 0; i < R; ++i)
    if (i + 1 == R || target[i + 1].first != target[i].first) last.push_back(target[i]);
  const bool direct = var.is_contiguous();
  at::Tensor dst = direct ? var : var.contiguous();
  const at::Tensor src = args.updates.contiguous();
  const size_t bytes = slice * var.element_size();
  char* dp = static_cast<char*>(dst.data_ptr());
  const char* sp = static_cast<const char*>(src.data_ptr());
  at::parallel_for(0, static_cast<int64_t>(last.size()), std::max<int64_t>(1, 65536 / static_cast<int64_t>(bytes)),
                   [&](int64_t i0, int64_t i1) {
                     for (int64_t i = i0; i < i1; ++i)
                       std::memcpy(dp + last[i].first * bytes, sp + last[i].second * bytes, bytes);
                   });
  if (!direct) var.copy_(dst);
}

}  // namespace npu_fa
