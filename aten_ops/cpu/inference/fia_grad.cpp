// The backward of fused_infer_attention_score: the gradient of learnable_sink, the op's only differentiable input.
// With L a row's log-sum-exp over its keys and s its head's sink, the op returns out' = out·sigmoid(L - s) and
// lse' = logaddexp(L, s); with w = exp(s - lse') (the sink's probability), d out'/ds = -w·out' and d lse'/ds = w, so
//   grad_learnable_sink[n] = Σ over the rows of head n of w·(grad_softmax_lse - rowsum(grad_attention_out ∘ out')).
// Written with ATen ops on the forward's results, so it holds for every route (the kernels need no backward).
#include <ATen/ATen.h>

#include <limits>
#include <tuple>

#include "generated/kernels.h"
#include "generated/op_calls.h"

namespace npu_fa {
namespace {

// lse' of every row, fp32 [B, N, S] or [T, N] (TND): the forward's softmax_lse, or the forward run again (through the
// dispatcher, with every argument as given) with the lse when the call did not ask for it.
at::Tensor rows_lse(const FusedInferAttentionScoreGradArgs& a) {
  at::Tensor lse = a.softmax_lse;
  if (!a.softmax_lse_flag) {
    FusedInferAttentionScoreValues f(forward_args(a));
    f.softmax_lse_flag = true;
    lse = std::get<1>(call_fused_infer_attention_score(f.args()));
  }
  return lse.squeeze(-1);
}

// rowsum(grad ∘ out) of every row, in the lse's [B, N, S] / [T, N] order; out in the op's output layout.
at::Tensor rows_dot(const FusedInferAttentionScoreGradArgs& a, const at::Tensor& grad) {
  const c10::string_view layout = a.input_layout;
  at::Tensor out = a.attention_out.to(at::kFloat), g = grad.to(at::kFloat);
  if (layout == "BSH") {  // [B, S, N*Dv] -> [B, S, N, Dv]
    out = out.unflatten(-1, {a.num_heads, -1});
    g = g.unflatten(-1, {a.num_heads, -1});
  }
  const at::Tensor dot = (out * g).sum(-1);
  // TND [T, N] and BNSD [B, N, S] are the lse's order; BSH, BSND and BNSD_BSND's BSND output are [B, S, N].
  return layout == "TND" || layout == "BNSD" ? dot : dot.transpose(1, 2);
}

}  // namespace

at::Tensor fused_infer_attention_score_grad_cpu(const FusedInferAttentionScoreGradArgs& args) {
  const auto f32 = args.query.options().dtype(at::kFloat);
  if (!args.learnable_sink.has_value()) return at::empty({0}, f32);
  const at::Tensor& sink = *args.learnable_sink;
  if (args.attention_out.numel() == 0) return at::zeros_like(sink, f32);
  const at::Tensor lse = rows_lse(args);
  const bool tnd = args.input_layout == "TND";
  const at::Tensor s = tnd ? sink.view({1, -1}) : sink.view({1, -1, 1});
  // Rows beyond their sequence have no softmax (lse -inf): they add nothing, also for a sink of -inf.
  const at::Tensor w = at::where(lse == -std::numeric_limits<float>::infinity(), at::zeros({}, f32), at::exp(s - lse));
  at::Tensor g = at::zeros_like(lse);
  if (args.grad_softmax_lse.has_value() && args.grad_softmax_lse->numel() == lse.numel())
    g = g + args.grad_softmax_lse->to(at::kFloat).reshape(lse.sizes());
  if (args.grad_attention_out.has_value()) g = g - rows_dot(args, *args.grad_attention_out);
  return tnd ? (w * g).sum(0) : (w * g).sum(at::IntArrayRef{0, 2});
}

}  // namespace npu_fa
