// incre_flash_attention on the npu device (PrivateUse1): validate exactly like the CPU op (shared
// common/inference/decode_params), then launch the Ascend C decode kernel
// (ascendc/kernels/inference/incre_flash_attention_kernel.cpp) on a contiguous or paged KV cache.
// Argument combinations the kernel does not implement (atten_mask, pse_shift, an int8 cache, shapes whose tiles
// cannot fit UB, an empty cache) go to npu_host::fallback_to_cpu (the CPU kernel on the simulated device; an error
// on CANN builds and under TOT_NPU_SIM_NO_FALLBACK=1); see docs/ascendc_inference.md.
#include <ATen/ATen.h>

#include <string>

#include "common/inference/decode_params.h"
#include "inference/incre_flash_attention_tiling.h"
#include "generated/kernels.h"
#include "npu/ascendc_launch.h"
#include "npu/host_alias.h"

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

// Why the Ascend C kernel cannot run this call ("" when it can), filling its tiling otherwise.
std::string plan_kernel(const attention::DecodeInputs& in, const at::Tensor& k, const std::string& layout,
                        bool has_mask, bool has_pse, at::ScalarType dtype,
                        tot_ascendc::IncreFlashAttentionTiling& tiling) {
  const auto& p = in.params;
  if (k.scalar_type() == at::kChar) return "an int8 KV cache (antiquant)";
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
  s.scale = p.scale;
  cache_strides(k, p.paged, layout, p.head_dim, s);
  return tot_ascendc::IncreFlashAttentionTilingFn(s, tot_ascendc::Ascend910B(), tiling);
}

}  // namespace

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
  for (int64_t b = 0; b < p.batch; ++b) {
    seq[2 * b] = int32_t(p.kv_start[b]);
    seq[2 * b + 1] = int32_t(p.kv_len[b]);
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
