// CPU entry points of the attention ops declared in native_functions.yaml: validate (shared parser), allocate the
// outputs, and run the kernel compiled for the best instruction set this CPU has (cpu/isa_dispatch.h).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>

#include "common/attention/params.h"
#include "common/checked_math.h"
#include "cpu/attention/kernels.h"
#include "cpu/attention/tuning.h"
#include "generated/kernels.h"

namespace npu_fa {
namespace {

using namespace npu_fa::cpu;
using attention::AttentionInputs;
using attention::AttentionParams;

at::Tensor scalar_long(uint64_t v) { return at::scalar_tensor(static_cast<int64_t>(v), at::kLong); }

bool has_work(const AttentionParams& p) { return p.batch > 0 && p.q_heads > 0 && p.max_q_len > 0; }

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> flash_attention_score_cpu(
    const FlashAttentionScoreArgs& args) {
  AttentionInputs in;
  const AttentionParams p = attention::parse_attention_params("flash_attention_score", args, in);
  ForwardOutputs o;
  o.out = at::empty(attention::output_shape(p, args.query), args.query.options());
  o.softmax_max = at::empty(attention::stats_shape(p, args.query), args.query.options().dtype(at::kFloat));
  o.softmax_sum = at::empty_like(o.softmax_max);
  if (has_work(p))
    attention::tuning::run_with_tiles(attention::tuning::Family::Forward, p, in.query.scalar_type(),
                                      in.key.scalar_type(), [&] { attention_forward_stub(p, in, o); });
  return {o.out, o.softmax_max, o.softmax_sum, at::empty({0}, args.query.options()), scalar_long(p.seed),
          scalar_long(p.offset)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> flash_attention_score_grad_cpu(
    const FlashAttentionScoreGradArgs& args) {
  static constexpr const char* op = "flash_attention_score_grad";
  AttentionInputs in;
  const AttentionParams p = attention::parse_backward_params(op, args, in);
  BackwardTensors t;
  t.dy = args.dy.contiguous();
  t.attention_in = args.attention_in.contiguous();
  t.softmax_max = args.softmax_max.contiguous();
  t.softmax_sum = args.softmax_sum.contiguous();
  t.dq = at::empty(args.query.sizes(), args.query.options());
  t.dk = at::empty(args.key.sizes(), args.key.options());
  t.dv = at::empty(args.value.sizes(), args.value.options());
  t.dq_rows = attention::row_map(p, t.dq, true, p.head_dim);
  t.dk_rows = attention::row_map(p, t.dk, false, p.head_dim);
  t.dv_rows = attention::row_map(p, t.dv, false, p.v_head_dim);
  // pse_type 2/3: pse holds ALiBi slopes, which get no gradient (as FlashAttention-2's alibi_slopes): zeros.
  const bool slopes = args.pse.has_value() && args.pse_type >= 2;
  if (args.pse.has_value() && !slopes) t.dpse = at::empty(args.pse->sizes(), args.pse->options());
  // dsink as torch_npu returns it: float32 [head_num], or an empty float32 tensor without sink.
  t.dsink = at::zeros({args.sink.has_value() ? p.q_heads : 0}, args.key.options().dtype(at::kFloat));
  if (has_work(p)) {
    // dsink is accumulated into: zeroed again before each run when tuning measures several.
    attention::tuning::run_with_tiles(attention::tuning::Family::Backward, p, in.query.scalar_type(),
                                      in.key.scalar_type(), [&] { attention_backward_stub(p, in, t); },
                                      [&] { t.dsink.zero_(); });
  } else {
    t.dq.zero_();
    t.dk.zero_();
    t.dv.zero_();
    if (t.dpse.defined()) t.dpse.zero_();
  }
  if (slopes) t.dpse = at::zeros(args.pse->sizes(), args.pse->options());
  return {t.dq, t.dk, t.dv, t.dpse.defined() ? t.dpse : at::empty({0}, args.query.options()), t.dsink};
}

at::Tensor dropout_gen_mask_cpu(const DropoutGenMaskArgs& args) {
  static constexpr const char* op = "dropout_gen_mask";
  TORCH_CHECK_VALUE(args.rows >= 0 && args.cols >= 0, op, ": arguments 'rows' and 'cols' must be >= 0; got ",
                    args.rows, " and ", args.cols);
  TORCH_CHECK_VALUE(args.keep_prob > 0.0 && args.keep_prob <= 1.0, op,
                    ": argument 'keep_prob' must be in (0, 1]; got ", args.keep_prob);
  TORCH_CHECK_VALUE(args.seed.numel() == 1 && args.offset.numel() == 1 && !at::isFloatingType(args.seed.scalar_type()) &&
                        !at::isFloatingType(args.offset.scalar_type()),
                    op, ": arguments 'seed' and 'offset' must be one-element integer tensors");
  check_alloc(op, "the mask of rows * cols", checked_mul(op, "rows * cols", args.rows, args.cols), 1);
  const uint64_t s = static_cast<uint64_t>(args.seed.item<int64_t>());
  const uint64_t off = static_cast<uint64_t>(args.offset.item<int64_t>());
  at::Tensor keep = at::empty({args.rows, args.cols}, args.seed.options().dtype(at::kBool));
  uint8_t* data = reinterpret_cast<uint8_t*>(keep.data_ptr<bool>());
  // Chunks of the flattened mask (a multiple of 4 elements: one Philox block is never split between threads).
  constexpr int64_t kChunk = 1 << 14;
  const int64_t total = args.rows * args.cols;
  at::parallel_for(0, (total + kChunk - 1) / kChunk, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t e0 = c * kChunk;
      attention::dropout_keep_run(s, off, static_cast<float>(args.keep_prob), e0, std::min(kChunk, total - e0),
                                  data + e0);
    }
  });
  return keep;
}

}  // namespace npu_fa
