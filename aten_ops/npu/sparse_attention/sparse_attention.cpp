// sparse_flash_attention on the npu device (PrivateUse1): the Ascend C kernel
// (ascendc/kernels/sparse_attention/sparse_flash_attention_kernel.cpp), validated exactly like the CPU op (shared
// common/sparse_attention/sparse_flash_attention_params). The host resolves what is per query row — its sequence,
// the number of leading tokens it may see (the KV length, or the right-down causal limit of sparse_mode 3) and
// where its sequence starts in an unpaged cache — into a small int32 row table; the kernel gathers the selected
// rows itself. What the kernel does not cover (float64, head dims beyond one vector repeat stride, more than 2^31
// cache rows) goes to npu_host::fallback_to_cpu (the CPU kernel on the simulated device; an error on CANN builds
// and under TOT_NPU_SIM_NO_FALLBACK=1); see docs/ascendc_sparse_attention.md.
#include <ATen/ATen.h>

#include <algorithm>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "common/sparse_attention/sparse_flash_attention_params.h"
#include "generated/kernels.h"
#include "npu/ascendc_launch.h"
#include "npu/host_alias.h"
#include "npu/sparse_attention/kernel_dtype.h"
#include "npu/injected_fault.h"
#include "sparse_attention/sparse_flash_attention_tiling.h"

#ifndef TOT_WITH_CANN  // with CANN, ascendc_launch.h includes the generated aclrtlaunch_<kernel>.h launchers
#include "sparse_attention/sparse_flash_attention_kernel.h"
#endif

namespace npu_fa {
namespace {

using sparse_attention::KvLayout;
using sparse_attention::kernel_dtype;
using sparse_attention::SfaGeometry;

constexpr const char* kOp = "sparse_flash_attention";
constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

std::vector<int64_t> with_last(const at::Tensor& t, int64_t last) {
  std::vector<int64_t> s(t.sizes().begin(), t.sizes().end());
  s.back() = last;
  return s;
}

// softmax_max / softmax_sum: BSND [B, N2, S1, G], TND [N2, T1, G] (the CPU op's shapes).
std::vector<int64_t> stat_shape(const SfaGeometry& g) {
  if (g.q_tnd) return {g.N2, g.T1, g.G};
  return {g.B, g.N2, g.S1, g.G};
}

// The kernel addresses value through key's pointer when they are one tensor (the MLA cache), as the CPU op does.
bool value_is_key(const at::Tensor& k, const at::Tensor& v) {
  return v.data_ptr() == k.data_ptr() && v.sizes() == k.sizes() && v.strides() == k.strides();
}

// Why the kernel cannot run this call ("" when it can), filling its tiling otherwise.
std::string plan_kernel(const SparseFlashAttentionArgs& a, const SfaGeometry& g,
                        const sparse_attention::SfaTensors& d, tot_ascendc::SparseFlashAttentionTiling& tiling) {
  if (a.query.scalar_type() == at::kDouble) return "float64 inputs";
  for (int64_t len : g.kv_len)
    if (len > kInt32Max) return "a KV sequence longer than 2^31 - 1 tokens";
  if (g.T1 > kInt32Max || g.K > kInt32Max) return "more than 2^31 - 1 query rows or slots";
  tot_ascendc::SparseShape s;
  s.rows = uint32_t(g.T1);
  s.q_heads = uint32_t(g.N1);
  s.kv_heads = uint32_t(g.N2);
  s.slots = uint32_t(g.K);
  s.sparse_block_size = uint32_t(g.sparse_block_size);
  s.dn = uint32_t(d.Dn);
  s.dr = uint32_t(d.Dr);
  s.dv = uint32_t(d.Dv);
  s.dtype = kernel_dtype(a.query.scalar_type());
  s.value_is_key = value_is_key(a.key, a.value);
  s.paged = g.kv_layout == KvLayout::PA_BSND;
  s.batch = uint32_t(g.B);
  s.block_size = uint32_t(g.block_size);
  s.max_blocks = uint32_t(g.max_blocks);
  s.kv_rows = uint64_t(g.kv_rows);
  s.q_tnd = g.q_tnd;
  s.s1 = uint32_t(g.S1);
  s.has_sinks = a.sinks.has_value();
  s.return_stats = a.return_softmax_lse;
  s.scale = npu_host::injected_fault() == "sfa_scale" ? float(g.scale) * 1.05f : float(g.scale);
  return tot_ascendc::SparseFlashAttentionTilingFn(s, tot_ascendc::Ascend910B(), tiling);
}

// Per query row: (sequence or -1 for padding, visible tokens, first cache row of the sequence when unpaged, 0).
// Visible tokens: the KV length, under sparse_mode 3 at most kv_len - q_len + i + 1 (the right-down causal limit).
at::Tensor row_table(const SfaGeometry& g) {
  const int64_t causal_fault = npu_host::injected_fault() == "sfa_causal" ? 1 : 0;  // one token past the limit
  at::Tensor host = at::zeros({g.T1, 4}, at::TensorOptions().dtype(at::kInt));
  int32_t* r = host.data_ptr<int32_t>();
  for (int64_t t = 0; t < g.T1; ++t, r += 4) {
    const int64_t b = g.row_batch[t];
    r[0] = int32_t(b);
    if (b < 0) continue;
    int64_t limit = g.kv_len[b];
    if (g.sparse_mode == 3) limit = std::min(limit, g.kv_len[b] - g.q_len[b] + g.row_pos[t] + 1 + causal_fault);
    r[1] = int32_t(std::max<int64_t>(limit, 0));
    if (g.kv_layout == KvLayout::BSND) r[2] = int32_t(b * g.S2);
    else if (g.kv_layout == KvLayout::TND) r[2] = int32_t(g.kv_begin[b]);
  }
  return host;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> sparse_flash_attention_npu(const SparseFlashAttentionArgs& a) {
  const SfaGeometry g = sparse_attention::parse_sfa(sparse_attention::SfaCall{
      kOp, a.query, a.key, a.sparse_indices, a.block_table, a.actual_seq_lengths_query, a.actual_seq_lengths_kv,
      "actual_seq_lengths_query", "actual_seq_lengths_kv", a.scale_value, a.sparse_block_size, a.layout_query,
      a.layout_kv, a.sparse_mode, a.pre_tokens, a.next_tokens});
  const sparse_attention::SfaTensors d = sparse_attention::check_sfa_tensors(
      kOp, a.query, a.key, a.value, a.query_rope, a.key_rope, a.attention_mode, a.sinks, g);
  const auto stat_opt = a.query.options().dtype(a.query.scalar_type() == at::kDouble ? at::kDouble : at::kFloat);
  at::Tensor out = at::empty(with_last(a.query, d.Dv), a.query.options());
  at::Tensor smax = a.return_softmax_lse ? at::empty(stat_shape(g), stat_opt) : at::empty({0}, stat_opt);
  at::Tensor ssum = a.return_softmax_lse ? at::empty(stat_shape(g), stat_opt) : at::empty({0}, stat_opt);
  if (out.numel() == 0 && smax.numel() == 0) return {out, smax, ssum};

  tot_ascendc::SparseFlashAttentionTiling tiling;
  const std::string unsupported = plan_kernel(a, g, d, tiling);
  if (!unsupported.empty())
    return npu_host::fallback_to_cpu(kOp, unsupported, a, sparse_flash_attention_cpu, a.query.device());

  const c10::Device device = a.query.device();
  const at::Tensor q = a.query.contiguous(), k = a.key.contiguous();
  const at::Tensor v = tiling.value_is_key ? k : a.value.contiguous();
  std::optional<at::Tensor> qr, kr, idx, table, sinks;
  if (d.Dr > 0) {
    qr = a.query_rope->contiguous();
    kr = a.key_rope->contiguous();
  }
  if (g.K > 0) idx = a.sparse_indices.contiguous();
  if (g.kv_layout == KvLayout::PA_BSND) table = a.block_table->to(device, at::kInt).contiguous();
  if (a.sinks.has_value()) sinks = a.sinks->to(device, at::kFloat).contiguous();
  const at::Tensor rows = row_table(g).to(device);
  std::optional<at::Tensor> stat_max, stat_sum;
  if (a.return_softmax_lse) {
    stat_max = smax;
    stat_sum = ssum;
  }

  npu_fa::ascendc::Launch launch(kOp);
  TOT_ASCENDC_RUN(launch, sparse_flash_attention, tiling.block_dim, AscendC::KernelMode::AIV_MODE, launch.Gm(q),
                  launch.Gm(qr), launch.Gm(k), launch.Gm(kr), launch.Gm(v), launch.Gm(idx), launch.Gm(table),
                  launch.Gm(rows), launch.Gm(sinks), launch.Gm(out), launch.Gm(stat_max), launch.Gm(stat_sum),
                  launch.Workspace(0, a.query.options()), launch.Tiling(tiling, a.query.options()));
  return {out, smax, ssum};
}

}  // namespace npu_fa
