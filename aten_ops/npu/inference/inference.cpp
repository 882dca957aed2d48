// The inference attention ops on the npu device (PrivateUse1), validated exactly like the CPU ops (shared
// common/inference/*_params):
//   - incre_flash_attention: the Ascend C decode kernel (ascendc/kernels/inference/incre_flash_attention_kernel.cpp)
//     on a contiguous or paged KV cache;
//   - prompt_flash_attention: the FlashAttention forward kernel (npu/attention/flash_forward.h), which computes the
//     same softmax(scale·QKᵀ + mask)·V;
//   - fused_infer_attention_score: the route the CPU op takes too (common/inference/fia_route.h) — decode through
//     incre_flash_attention, dense prefill and paged prefill (over the gathered blocks) on the FlashAttention kernel.
// Argument combinations the kernels do not implement go to npu_host::fallback_to_cpu (the CPU kernel on the
// simulated device; an error on CANN builds and under TOT_NPU_SIM_NO_FALLBACK=1); see docs/ascendc_inference.md.
#include <ATen/ATen.h>

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "common/inference/decode_params.h"
#include "common/inference/fia_route.h"
#include "common/inference/paged_params.h"
#include "common/inference/prefill_params.h"
#include "inference/incre_flash_attention_tiling.h"
#include "generated/kernels.h"
#include "npu/ascendc_launch.h"
#include "npu/attention/bnsd_layout.h"
#include "npu/attention/flash_forward.h"
#include "npu/host_alias.h"
#include "npu/injected_fault.h"

#ifndef TOT_WITH_CANN  // with CANN, ascendc_launch.h includes the generated aclrtlaunch_<kernel>.h launchers
#include "inference/incre_flash_attention_kernel.h"
#endif

namespace npu_fa {
namespace {

constexpr const char* kOp = "incre_flash_attention";

tot_ascendc::DecodeDtype kernel_dtype(at::ScalarType t) {
  if (t == at::kHalf) return tot_ascendc::DecodeDtype::FP16;
  if (t == at::kBFloat16) return tot_ascendc::DecodeDtype::BF16;
  return tot_ascendc::DecodeDtype::FP32;
}

// Element strides (block or batch, head, position) of a contiguous cache; key.dim() and the layout tell which
// axes are which, as in validate_decode.
void cache_strides(const at::Tensor& k, bool paged, const std::string& layout, int64_t head_dim,
                   tot_ascendc::DecodeShape& s) {
  if (k.dim() == 3) {  // [B or blocks, S or block_size, N2*D]
    s.k_blk = k.stride(0); s.k_seq = k.stride(1); s.k_head = head_dim;
  } else if (!paged && layout == "BSND") {  // [B, S, N2, D]
    s.k_blk = k.stride(0); s.k_seq = k.stride(1); s.k_head = k.stride(2);
  } else {  // [B, N2, S, D] or paged (blocks, N2, block_size, D)
    s.k_blk = k.stride(0); s.k_head = k.stride(1); s.k_seq = k.stride(2);
  }
}

// TOT_NPU_SIM_FAULT (npu/injected_fault.h, simulated device only, for testing the differential oracle): the decode
// kernel's faults — "decode_scale" (5% too large) or "decode_tail" (the last key of every sequence ignored: its
// kv length one short).
bool fault_is(const char* name) { return npu_host::injected_fault() == name; }

// Why the Ascend C kernel cannot run this call ("" when it can), filling its tiling otherwise.
std::string plan_kernel(const attention::DecodeInputs& in, const at::Tensor& k, const std::string& layout,
                        bool has_mask, bool has_pse, at::ScalarType dtype,
                        tot_ascendc::IncreFlashAttentionTiling& tiling) {
  const auto& p = in.params;
  if (k.scalar_type() == at::kChar) return "an int8 KV cache (antiquant)";
  if (p.nz_c0 > 0) return "an NZ (5-D) paged cache";
  if (has_mask) return "atten_mask";
  if (has_pse) return "pse_shift";
  if (p.sink) return "learnable_sink";
  if (k.numel() == 0) return "an empty KV cache";
  tot_ascendc::DecodeShape s;
  s.batch = uint32_t(p.batch);
  s.q_heads = uint32_t(p.q_heads);
  s.kv_heads = uint32_t(p.kv_heads);
  s.head_dim = uint32_t(p.head_dim);
  s.dtype = kernel_dtype(dtype);
  s.paged = p.paged;
  s.block_size = uint32_t(p.block_size);
  s.max_blocks = uint32_t(p.max_blocks);
  s.seq_capacity = p.paged ? 0 : uint32_t(k.dim() == 3 || layout == "BSND" ? k.size(1) : k.size(2));
  s.kv_elems = uint64_t(k.numel());
  s.scale = fault_is("decode_scale") ? p.scale * 1.05f : p.scale;
  cache_strides(k, p.paged, layout, p.head_dim, s);
  return tot_ascendc::IncreFlashAttentionTilingFn(s, tot_ascendc::Ascend910B(), tiling);
}

// ---- prefill on the FlashAttention forward kernel ---------------------------------------------------------------
// What only the CPU kernels implement, decided from the raw arguments (their validation then runs in the CPU op).
const char* prefill_refusal_before_parsing(const PromptFlashAttentionArgs& a) {
  if (a.input_layout == "TND") return "TND (variable-length) layout";
  if (a.pse_shift.has_value()) return "pse_shift";
  return nullptr;
}

const char* prefill_refusal_before_parsing(const FusedInferAttentionScoreArgs& a) {
  if (a.learnable_sink.has_value()) return "learnable_sink";  // first: named even where another reason applies too
  if (a.input_layout == "TND") return "TND (variable-length) layout";
  if (a.pse_shift.has_value()) return "pse_shift";
  if (a.query_rope.has_value() || a.key_rope.has_value()) return "query_rope / key_rope (MLA)";
  return nullptr;
}

// An int8 key or value (KV antiquant) dequantised on the device, (x + offset) * scale in fp32 rounded to the
// query's dtype — what the hardware's antiquant does before its fp16/bf16 matmul — in the op's layout again.
at::Tensor dequantized(const at::Tensor& x, const attention::AttentionParams& p, const attention::Antiquant& q,
                       const at::Tensor& scale, const at::Tensor& offset, at::ScalarType dtype) {
  const at::Tensor y = attention::dequantize_kv(npu_host::bnsd_view(x, p.layout, p.kv_heads), q, scale, offset);
  return npu_host::layout_view(y.to(dtype), p.layout);
}

// Per-batch lengths shorter than the padded ones: the kernel computes whole sequences, so each sequence gets its
// own launch (run_per_sequence).
bool has_short_sequences(const attention::AttentionParams& p) {
  for (int64_t b = 0; b < p.batch; ++b)
    if (p.q_len[b] < p.max_q_len || p.kv_len[b] < p.max_kv_len) return true;
  return false;
}

// Positions [0, len) of sequence b of a dense-layout tensor.
at::Tensor sequence_slice(const at::Tensor& t, attention::Layout layout, int64_t b, int64_t len) {
  using attention::Layout;
  const int64_t batch_dim = layout == Layout::SBH ? 1 : 0;
  const int64_t seq_dim = layout == Layout::BNSD ? 2 : layout == Layout::SBH ? 0 : 1;
  return t.narrow(batch_dim, b, 1).narrow(seq_dim, 0, len);
}

// The explicit mask of sequence b: rows [0, q_len), keys [0, kv_len), its batch entry when the mask has one.
at::Tensor sequence_mask(const at::Tensor& m, int64_t batch, int64_t b, int64_t q_len, int64_t kv_len) {
  at::Tensor s = m.narrow(-2, 0, q_len).narrow(-1, 0, kv_len);
  return m.dim() >= 3 && batch > 1 && m.size(0) == batch ? s.narrow(0, b, 1) : s;
}

// Sequences of different lengths: one launch of the FlashAttention kernel per sequence on its own rows and keys
// (its band from its own lengths). Rows past a sequence's length, and the rows of a sequence without keys, are
// zeros with max -inf and sum 0, as the CPU op gives them. Returns the BNSD output; fills smax / ssum.
template <class Args>
at::Tensor run_per_sequence(const char* op, const attention::AttentionParams& p, const Args& a, const at::Tensor& key,
                            const at::Tensor& value, at::Tensor& smax, at::Tensor& ssum) {
  at::Tensor out = at::zeros({p.batch, p.q_heads, p.max_q_len, p.v_head_dim}, a.query.options());
  smax.fill_(-std::numeric_limits<float>::infinity());
  ssum.zero_();
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t q = p.q_len[b], kv = p.kv_len[b];
    if (q == 0 || kv == 0) continue;
    attention::AttentionParams one = p;
    one.batch = 1;
    one.max_q_len = q;
    one.max_kv_len = kv;
    one.q_len = {q};
    one.kv_len = {kv};
    one.q_start = {0};
    one.kv_start = {0};
    at::Tensor sm = at::empty({1, p.q_heads, q, 8}, smax.options()), ss = at::empty_like(sm);
    const std::optional<at::Tensor> mask =
        p.mask ? std::optional<at::Tensor>(sequence_mask(*a.atten_mask, p.batch, b, q, kv)) : std::nullopt;
    const at::Tensor o = npu_host::run_flash_forward(op, one, sequence_slice(a.query, p.layout, b, q),
                                                     sequence_slice(key, p.layout, b, kv),
                                                     sequence_slice(value, p.layout, b, kv), mask, sm, ss);
    out.narrow(0, b, 1).narrow(2, 0, q).copy_(o);
    smax.narrow(0, b, 1).narrow(2, 0, q).copy_(sm);
    ssum.narrow(0, b, 1).narrow(2, 0, q).copy_(ss);
  }
  return out;
}

struct PrefillResult {
  at::Tensor out, smax, ssum;  // out in the op's output layout; statistics [B, N1, S1, 8] fp32
  std::string refusal;         // non-empty: the CPU kernel must run instead
};

// Validates like the CPU op, then runs the kernel unless the parsed call needs the CPU kernel.
template <class Args>
PrefillResult run_prefill_kernel(const char* op, const Args& a) {
  PrefillResult res;
  if (const char* why = prefill_refusal_before_parsing(a)) {
    res.refusal = why;
    return res;
  }
  attention::AttentionInputs in;
  const attention::PromptParams r = attention::parse_prompt_params(op, a.query, a.key, a.value, a, in);
  const attention::AttentionParams& p = r.p;
  res.smax = at::empty({p.batch, p.q_heads, p.max_q_len, 8}, a.query.options().dtype(at::kFloat));
  res.ssum = at::empty_like(res.smax);
  if (p.batch == 0 || p.max_q_len == 0) {  // nothing to compute
    res.out = at::empty(r.out_shape, a.query.options());
    return res;
  }
  const bool per_sequence = has_short_sequences(p);
  if (const char* why = npu_host::flash_forward_refusal(p)) {
    if (!per_sequence || p.max_kv_len > 0) res.refusal = why;  // (per sequence, keyless sequences launch nothing)
  }
  if (!res.refusal.empty()) return res;
  at::Tensor key = a.key, value = a.value;
  if (p.int8_kv()) {
    const at::ScalarType dt = a.query.scalar_type();
    key = dequantized(a.key, p, p.k_quant, in.k_scale, in.k_offset, dt);
    value = dequantized(a.value, p, p.v_quant, in.v_scale, in.v_offset, dt);
  }
  const at::Tensor out = per_sequence ? run_per_sequence(op, p, a, key, value, res.smax, res.ssum)
                                      : npu_host::run_flash_forward(op, p, a.query, key, value, a.atten_mask,
                                                                    res.smax, res.ssum);
  res.out = r.bsnd_out ? out.transpose(1, 2).contiguous() : npu_host::from_bnsd(out, p.layout);
  return res;
}

}  // namespace

at::Tensor prompt_flash_attention_npu(const PromptFlashAttentionArgs& args) {
  static constexpr const char* op = "prompt_flash_attention";
  attention::check_prompt_flags(op, args);
  PrefillResult res = run_prefill_kernel(op, args);
  if (!res.refusal.empty())
    return npu_host::fallback_to_cpu(op, res.refusal, args, prompt_flash_attention_cpu, args.query.device());
  return res.out;
}

namespace {

std::tuple<at::Tensor, at::Tensor> fused_outputs(const FusedInferAttentionScoreArgs& a, const PrefillResult& res) {
  if (!a.softmax_lse_flag) return {res.out, at::empty({0}, a.query.options().dtype(at::kFloat))};
  return {res.out, attention::lse_from_statistics(res.smax, res.ssum)};  // [B, N, S, 1], as the CPU op
}

// The blocks holding keys [0, kv_used) of every sequence, in order, as a device index tensor (past a shorter
// sequence's own blocks the plan's table holds block 0: keys beyond its length, never read).
at::Tensor used_blocks_index(const attention::PagedPlan& pl, const c10::Device& device) {
  const int64_t used_blocks = (pl.kv_used + pl.block_size - 1) / pl.block_size;
  const int64_t table_stride = std::max<int64_t>(pl.max_blocks, 1);
  std::vector<int64_t> ids;
  ids.reserve(pl.batch * used_blocks);
  for (int64_t b = 0; b < pl.batch; ++b)
    for (int64_t i = 0; i < used_blocks; ++i) ids.push_back(pl.blocks[b * table_stride + i]);
  return at::tensor(ids, at::kLong).to(device);
}

// Keys [0, kv_used) of every sequence of a paged cache, gathered into a contiguous tensor of the query's layout
// (BSH, BSND or BNSD): one index_select over the blocks the sequences use (`index`: used_blocks_index).
at::Tensor gather_pages(const attention::CacheRows& r, const attention::PagedPlan& pl, const at::Tensor& index,
                        c10::string_view layout) {
  const int64_t B = pl.batch, bs = pl.block_size, used_blocks = (pl.kv_used + bs - 1) / bs;
  const at::Tensor rows = r.cache.as_strided({r.cache.size(0), bs, r.heads, r.dim},
                                             {r.block_stride, r.seq_stride, r.head_stride, 1},
                                             r.cache.storage_offset());
  at::Tensor keys = rows.index_select(0, index).reshape({B, used_blocks * bs, r.heads, r.dim}).narrow(1, 0, pl.kv_used);
  if (layout == "BSH") return keys.reshape({B, pl.kv_used, r.heads * r.dim});
  if (layout == "BNSD") return keys.transpose(1, 2).contiguous();
  return keys.contiguous();
}

// What the Ascend C kernels do not handle runs the CPU op (the simulated device) or raises naming it (CANN builds).
std::tuple<at::Tensor, at::Tensor> fused_fallback(const char* op, const std::string& why,
                                                  const FusedInferAttentionScoreArgs& a) {
  return npu_host::fallback_to_cpu(op, why, a, fused_infer_attention_score_cpu, a.query.device());
}

// The PagedPrefill route: the FlashAttention kernel over the gathered keys (sequences of different lengths: one
// launch each; an int8 cache is gathered as int8, its factors index the keys by their position in the sequence, as
// before the gather, and the prefill path dequantises what it gathered).
std::tuple<at::Tensor, at::Tensor> paged_prefill_npu(const char* op, const FusedInferAttentionScoreArgs& a) {
  const attention::PagedPlan pl = attention::plan_paged(op, a);
  if (const char* why = prefill_refusal_before_parsing(a)) return fused_fallback(op, why, a);
  if (pl.k.nz_c0 > 0) return fused_fallback(op, "an NZ (5-D) paged cache", a);  // the CPU op reads it in place
  const c10::string_view layout = a.input_layout;
  const at::Tensor index = used_blocks_index(pl, a.key.device());
  FusedInferAttentionScoreValues g(a);  // the call on the gathered keys: a contiguous cache, no table
  g.key = gather_pages(pl.k, pl, index, layout);
  g.value = gather_pages(pl.v, pl, index, layout);
  g.atten_mask = pl.mask;
  g.actual_seq_lengths_kv = pl.kv_lens;
  g.block_table.reset();
  g.block_size = 0;
  const PrefillResult res = run_prefill_kernel(op, g.args());
  if (!res.refusal.empty()) return fused_fallback(op, res.refusal, a);
  return fused_outputs(a, res);
}

// The DensePrefill route: the FlashAttention kernel (an int8 cache dequantised on the device first).
std::tuple<at::Tensor, at::Tensor> dense_prefill_npu(const char* op, const FusedInferAttentionScoreArgs& a) {
  const PrefillResult res = run_prefill_kernel(op, a);
  if (!res.refusal.empty()) return fused_fallback(op, res.refusal, a);
  return fused_outputs(a, res);
}

}  // namespace

// The route is the CPU op's (common/inference/fia_route.h); only the kernels per route are the npu's own.
std::tuple<at::Tensor, at::Tensor> fused_infer_attention_score_npu(const FusedInferAttentionScoreArgs& args) {
  static constexpr const char* op = "fused_infer_attention_score";
  const attention::FiaPlan plan = attention::plan_fia(op, args);
  const FusedInferAttentionScoreArgs a = plan.call.args();
  switch (plan.route) {
    case attention::FiaRoute::Mla: return fused_fallback(op, "query_rope / key_rope (MLA)", a);  // no kernel has rope
    case attention::FiaRoute::Decode: return attention::run_decode_route(plan);  // the Ascend C decode kernel
    case attention::FiaRoute::PagedPrefill: return paged_prefill_npu(op, a);
    case attention::FiaRoute::DensePrefill: return dense_prefill_npu(op, a);
  }
  TORCH_CHECK(false, op, ": internal error: unknown route");
}

at::Tensor incre_flash_attention_npu(const IncreFlashAttentionArgs& args) {
  const attention::DecodeInputs in = attention::validate_decode(args);
  const auto& p = in.params;
  at::Tensor out = at::empty(args.query.sizes(), args.query.options().memory_format(at::MemoryFormat::Contiguous));
  if (p.batch == 0 || p.q_heads == 0) return out;

  const std::string layout(args.input_layout);
  // The kernel reads a contiguous cache; a strided one is copied only once the kernel is known to take the call.
  tot_ascendc::IncreFlashAttentionTiling tiling;
  const std::string unsupported = plan_kernel(in, in.key, layout, args.atten_mask.has_value(),
                                              args.pse_shift.has_value(), args.query.scalar_type(), tiling);
  if (!unsupported.empty()) {
    return npu_host::fallback_to_cpu(kOp, unsupported, args, incre_flash_attention_cpu, args.query.device());
  }
  const at::Tensor k = in.key.contiguous(), v = in.value.contiguous();
  if (!k.is_same(in.key)) {  // the tiling's cache strides are the copy's
    plan_kernel(in, k, layout, false, false, args.query.scalar_type(), tiling);
  }

  // Per sequence: first cache position and length (kv_padding_size and actual_seq_lengths resolved on the host).
  at::Tensor seq_host = at::empty({p.batch, 2}, at::TensorOptions().dtype(at::kInt));
  int32_t* seq = seq_host.data_ptr<int32_t>();
  const int64_t short_by = fault_is("decode_tail") ? 1 : 0;
  for (int64_t b = 0; b < p.batch; ++b) {
    seq[2 * b] = int32_t(p.kv_start[b]);
    seq[2 * b + 1] = int32_t(std::max<int64_t>(p.kv_len[b] - short_by, 0));
  }
  const at::Tensor seq_info = seq_host.to(args.query.device());
  const at::Tensor q = args.query.contiguous();  // [B, N1, D] in memory for every layout (Sq = 1)
  std::optional<at::Tensor> table;
  if (p.paged) table = args.block_table->to(at::kInt).contiguous();

  npu_fa::ascendc::Launch launch(kOp);
  TOT_ASCENDC_RUN(launch, incre_flash_attention, tiling.block_dim, AscendC::KernelMode::AIV_MODE, launch.Gm(q),
                  launch.Gm(k), launch.Gm(v), launch.Gm(table), launch.Gm(seq_info), launch.Gm(out),
                  launch.Workspace(int64_t(tiling.workspace_bytes), args.query.options()),
                  launch.Tiling(tiling, args.query.options()));
  return out;
}

}  // namespace npu_fa
