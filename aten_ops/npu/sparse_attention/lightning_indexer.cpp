// lightning_indexer on the npu device (PrivateUse1): the Ascend C kernel
// (ascendc/kernels/sparse_attention/lightning_indexer_kernel.cpp), validated exactly like the CPU op (shared
// common/sparse_attention/lightning_indexer_params: parse_lightning_indexer). The host resolves what is per query
// row — its sequence (-1 for rows past the query lengths), the number of leading keys it may see (the key length,
// or the right-down causal limit of sparse_mode 3) and where its sequence starts in unpaged keys — into a small
// int32 row table; the kernel scores, selects and writes every slot itself (for few rows, splitting their keys over
// the cores and merging the partial selections through the workspace). What the kernel does not cover (float64,
// head dims beyond one vector repeat stride, a group and top-k that do not fit UB, more than 2^31 key rows, no query
// heads or a head dim of 0) goes to npu_host::fallback_to_cpu (the CPU kernel on the simulated device; an error on
// CANN builds and under TOT_NPU_SIM_NO_FALLBACK=1); see docs/ascendc_sparse_attention.md.
#include <ATen/ATen.h>

#include <algorithm>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "common/sparse_attention/lightning_indexer_params.h"
#include "generated/kernels.h"
#include "npu/ascendc_launch.h"
#include "npu/host_alias.h"
#include "npu/sparse_attention/kernel_dtype.h"
#include "sparse_attention/lightning_indexer_tiling.h"

#ifndef TOT_WITH_CANN  // with CANN, ascendc_launch.h includes the generated aclrtlaunch_<kernel>.h launchers
#include "sparse_attention/lightning_indexer_kernel.h"
#endif

namespace npu_fa {
namespace {

using sparse_attention::IndexerGeometry;
using sparse_attention::KeyLayout;
using sparse_attention::kernel_dtype;

constexpr const char* kOp = "lightning_indexer";
constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

// [B, S1, N2, K] (BSND) or [T1, N2, K] (TND), as the CPU op.
std::vector<int64_t> indices_shape(const at::Tensor& query, const IndexerGeometry& g, int64_t K) {
  std::vector<int64_t> s(query.sizes().begin(), query.sizes().end() - 2);
  s.push_back(g.N2);
  s.push_back(K);
  return s;
}

// Why the kernel cannot run this call ("" when it can), filling its tiling otherwise.
std::string plan_kernel(const LightningIndexerArgs& a, const IndexerGeometry& g,
                        tot_ascendc::LightningIndexerTiling& tiling) {
  if (a.query.scalar_type() == at::kDouble) return "float64 inputs";
  if (g.N1 == 0 || g.D == 0) return "a query without heads or a head dim of 0";
  for (int64_t len : g.k_len)
    if (len > kInt32Max) return "a key sequence longer than 2^31 - 1 tokens";
  if (g.q_rows > kInt32Max) return "more than 2^31 - 1 query rows";
  tot_ascendc::IndexerShape s;
  s.rows = uint32_t(g.q_rows);
  s.q_heads = uint32_t(g.N1);
  s.kv_heads = uint32_t(g.N2);
  s.d = uint32_t(g.D);
  s.sparse_count = uint32_t(a.sparse_count);
  s.dtype = kernel_dtype(a.query.scalar_type());
  s.return_value = a.return_value;
  s.paged = g.key_layout == KeyLayout::PA_BSND;
  s.batch = uint32_t(g.B);
  s.block_size = uint32_t(g.block_size);
  s.max_blocks = s.paged ? uint32_t(g.block_table.size(1)) : 0;
  s.kv_rows = uint64_t(g.k_rows);
  for (int64_t b = 0; b < g.B; ++b)  // the last query of a sequence sees the most keys
    if (g.q_len[b] > 0) s.max_keys = std::max(s.max_keys, uint32_t(g.visible_keys(b, g.q_len[b] - 1)));
  return tot_ascendc::LightningIndexerTilingFn(s, tot_ascendc::Ascend910B(), tiling);
}

// Per query row: (sequence or -1, visible keys, first key row of the sequence when unpaged, 0). Rows past a
// sequence's query length (BSND) or past the last cumulative length (TND) keep -1: their slots are all -1.
at::Tensor row_table(const IndexerGeometry& g) {
  at::Tensor host = at::zeros({g.q_rows, 4}, at::TensorOptions().dtype(at::kInt));
  int32_t* r = host.data_ptr<int32_t>();
  for (int64_t row = 0; row < g.q_rows; ++row) r[row * 4] = -1;
  for (int64_t b = 0; b < g.B; ++b)
    for (int64_t i = 0; i < g.q_len[b]; ++i) {
      int32_t* e = r + (g.q_start[b] + i) * 4;
      e[0] = int32_t(b);
      e[1] = int32_t(g.visible_keys(b, i));
      e[2] = g.key_layout == KeyLayout::PA_BSND ? 0 : int32_t(g.k_start[b]);
    }
  return host;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> lightning_indexer_npu(const LightningIndexerArgs& a) {
  const IndexerGeometry g = sparse_attention::parse_lightning_indexer(
      kOp,
      sparse_attention::IndexerInputs{a.query, a.key, a.weights, a.actual_seq_lengths_query,
                                      a.actual_seq_lengths_key, a.block_table, std::string(a.layout_query),
                                      std::string(a.layout_key), a.sparse_mode, a.pre_tokens, a.next_tokens},
      a.sparse_count, a.return_value);
  const auto shape = indices_shape(a.query, g, a.sparse_count);
  at::Tensor indices = at::empty(shape, a.query.options().dtype(at::kInt));
  at::Tensor values = a.return_value ? at::empty(shape, a.query.options()) : at::empty({0}, a.query.options());
  if (indices.numel() == 0) return {indices, values};
  if (a.key.numel() == 0) {  // no key rows: every slot is empty (-1, value -inf), as on the CPU; nothing to launch
    indices.fill_(-1);
    if (a.return_value) values.fill_(-std::numeric_limits<double>::infinity());
    return {indices, values};
  }

  tot_ascendc::LightningIndexerTiling tiling;
  const std::string unsupported = plan_kernel(a, g, tiling);
  if (!unsupported.empty())
    return npu_host::fallback_to_cpu(kOp, unsupported, a, lightning_indexer_cpu, a.query.device());

  const c10::Device device = a.query.device();
  const at::Tensor q = a.query.contiguous(), k = a.key.contiguous();
  const at::Tensor w = a.weights.to(at::kFloat).contiguous();  // fp32, as the CPU op accumulates
  std::optional<at::Tensor> table, vals;
  if (tiling.paged) table = g.block_table.to(at::kInt).to(device);
  if (a.return_value) vals = values;
  const at::Tensor rows = row_table(g).to(device);

  npu_fa::ascendc::Launch launch(kOp);
  TOT_ASCENDC_RUN(launch, lightning_indexer, tiling.block_dim, AscendC::KernelMode::AIV_MODE, launch.Gm(q),
                  launch.Gm(k), launch.Gm(w), launch.Gm(table), launch.Gm(rows), launch.Gm(indices),
                  launch.Gm(vals), launch.Workspace(int64_t(tiling.workspace_bytes), a.query.options()),
                  launch.Tiling(tiling, a.query.options()));
  return {indices, values};
}

}  // namespace npu_fa
