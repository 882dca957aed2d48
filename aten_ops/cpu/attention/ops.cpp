// CPU entry points of the attention ops declared in native_functions.yaml: validate (shared parser), allocate the
// outputs, and run the kernel compiled for the best instruction set this CPU has (cpu/isa_dispatch.h).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "common/attention/params.h"
#include "cpu/attention/kernels.h"
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
    const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, int64_t head_num, c10::string_view input_layout,
    const std::optional<at::Tensor>& pse, const std::optional<at::Tensor>& atten_mask,
    const std::optional<at::Tensor>& actual_seq_qlen, const std::optional<at::Tensor>& actual_seq_kvlen, double scale,
    double keep_prob, int64_t pre_tokens, int64_t next_tokens, int64_t inner_precise, int64_t sparse_mode,
    int64_t pse_type, const std::optional<at::Tensor>& seed, const std::optional<at::Tensor>& offset) {
  AttentionInputs in;
  const AttentionParams p = attention::parse_attention_params(
      "flash_attention_score", query, key, value, head_num, input_layout, pse, atten_mask, actual_seq_qlen,
      actual_seq_kvlen, scale, keep_prob, pre_tokens, next_tokens, inner_precise, sparse_mode, pse_type, seed, offset,
      in);
  ForwardOutputs o;
  o.out = at::empty(attention::output_shape(p, query), query.options());
  o.softmax_max = at::empty(attention::stats_shape(p, query), query.options().dtype(at::kFloat));
  o.softmax_sum = at::empty_like(o.softmax_max);
  if (has_work(p)) attention_forward_stub(p, in, o);
  return {o.out, o.softmax_max, o.softmax_sum, at::empty({0}, query.options()), scalar_long(p.seed),
          scalar_long(p.offset)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> flash_attention_score_grad_cpu(
    const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, const at::Tensor& dy, int64_t head_num,
    c10::string_view input_layout, const std::optional<at::Tensor>& pse, const std::optional<at::Tensor>& atten_mask,
    const at::Tensor& softmax_max, const at::Tensor& softmax_sum, const at::Tensor& attention_in,
    const std::optional<at::Tensor>& actual_seq_qlen, const std::optional<at::Tensor>& actual_seq_kvlen, double scale,
    double keep_prob, int64_t pre_tokens, int64_t next_tokens, int64_t inner_precise, int64_t sparse_mode,
    int64_t pse_type, const std::optional<at::Tensor>& seed, const std::optional<at::Tensor>& offset) {
  static constexpr const char* op = "flash_attention_score_grad";
  TORCH_CHECK_VALUE(keep_prob >= 1.0 || seed.has_value(), op, ": argument 'seed' is required when keep_prob < 1 (pass "
                    "the seed_out/offset_out of the forward so the same dropout mask is regenerated)");
  AttentionInputs in;
  const AttentionParams p = attention::parse_attention_params(
      op, query, key, value, head_num, input_layout, pse, atten_mask, actual_seq_qlen, actual_seq_kvlen, scale,
      keep_prob, pre_tokens, next_tokens, inner_precise, sparse_mode, pse_type, seed, offset, in);
  attention::check_backward_inputs(op, p, query, dy, softmax_max, softmax_sum, attention_in);
  BackwardTensors t;
  t.dy = dy.contiguous();
  t.attention_in = attention_in.contiguous();
  t.softmax_max = softmax_max.contiguous();
  t.softmax_sum = softmax_sum.contiguous();
  t.dq = at::empty(query.sizes(), query.options());
  t.dk = at::empty(key.sizes(), key.options());
  t.dv = at::empty(value.sizes(), value.options());
  t.dq_rows = attention::row_map(p, t.dq, true, p.head_dim);
  t.dk_rows = attention::row_map(p, t.dk, false, p.head_dim);
  t.dv_rows = attention::row_map(p, t.dv, false, p.v_head_dim);
  if (pse.has_value()) t.dpse = at::empty(pse->sizes(), pse->options());
  if (has_work(p)) {
    attention_backward_stub(p, in, t);
  } else {
    t.dq.zero_();
    t.dk.zero_();
    t.dv.zero_();
    if (t.dpse.defined()) t.dpse.zero_();
  }
  return {t.dq, t.dk, t.dv, t.dpse.defined() ? t.dpse : at::empty({0}, query.options())};
}

at::Tensor dropout_gen_mask_cpu(const at::Tensor& seed, const at::Tensor& offset, int64_t rows, int64_t cols,
                                double keep_prob) {
  static constexpr const char* op = "dropout_gen_mask";
  TORCH_CHECK_VALUE(rows >= 0 && cols >= 0, op, ": arguments 'rows' and 'cols' must be >= 0; got ", rows, " and ", cols);
  TORCH_CHECK_VALUE(keep_prob > 0.0 && keep_prob <= 1.0, op, ": argument 'keep_prob' must be in (0, 1]; got ", keep_prob);
  TORCH_CHECK_VALUE(seed.numel() == 1 && offset.numel() == 1 && !at::isFloatingType(seed.scalar_type()) &&
                        !at::isFloatingType(offset.scalar_type()),
                    op, ": arguments 'seed' and 'offset' must be one-element integer tensors");
  const uint64_t s = static_cast<uint64_t>(seed.item<int64_t>());
  const uint64_t off = static_cast<uint64_t>(offset.item<int64_t>());
  at::Tensor keep = at::empty({rows, cols}, seed.options().dtype(at::kBool));
  uint8_t* data = reinterpret_cast<uint8_t*>(keep.data_ptr<bool>());
  at::parallel_for(0, rows, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      attention::dropout_keep_row(s, off + static_cast<uint64_t>(r), static_cast<float>(keep_prob), 0, cols, data + r * cols);
  });
  return keep;
}

}  // namespace npu_fa
