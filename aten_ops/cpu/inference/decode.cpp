// CPU entry point of incre_flash_attention (decode attention, CANN IncreFlashAttention): validate every argument,
// build DecodeParams, and run the kernel compiled for the best instruction set this CPU has (cpu/isa_dispatch.h).
#include <ATen/ATen.h>

#include "common/inference/decode_params.h"
#include "cpu/inference/decode_kernels.h"
#include "generated/kernels.h"

namespace npu_fa {

using cpu::DecodeParams;

at::Tensor incre_flash_attention_cpu(const IncreFlashAttentionArgs& args) {
  attention::DecodeInputs in = attention::validate_decode(args);
  const DecodeParams& p = in.params;
  const int64_t B = p.batch, N1 = p.q_heads;
  const at::Tensor q32 = args.query.to(at::kFloat).contiguous();  // [B, N1, D] in every layout (Sq = 1), exact
  at::Tensor out = at::empty(args.query.sizes(), args.query.options().memory_format(at::MemoryFormat::Contiguous));
  if (B > 0 && N1 > 0) cpu::decode_attention_stub(p, q32, in.key, in.value, out);
  return out;
}

}  // namespace npu_fa
