// CPU kernel of ring_attention_update (torch_npu's npu_ring_attention_update): two partial attention results of
// the same queries over different key blocks (ring context parallelism) merged by their softmax statistics.
// Per (token, head) row: m = max(pm, cm), a = psum * exp(pm - m), c = csum * exp(cm - m), s = a + c and
// out = prev * (a / s) + cur * (c / s) over the head dimension (at::vec, fp32; fp64 for fp64). Rows run in
// parallel. Statistics are [B, N, S, 8] (SBH) or [T, N, 8] (TND; in N-major order unless input_softmax_layout is
// "TND", like npu_fusion_attention's).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "generated/kernels.h"

namespace npu_fa {

std::tuple<at::Tensor, at::Tensor, at::Tensor> ring_attention_update_cpu(const RingAttentionUpdateArgs& args) {
  const char* op = "ring_attention_update";
  const std::string layout(args.input_layout), sm_layout(args.input_softmax_layout);
  TORCH_CHECK_VALUE(layout == "SBH" || layout == "TND", op, ": argument 'input_layout' must be 'SBH' or 'TND'; got '",
                    layout, "'");
  TORCH_CHECK_VALUE(sm_layout.empty() || (layout == "TND" && sm_layout == "TND"), op,
                    ": argument 'input_softmax_layout' must be ''", layout == "TND" ? " or 'TND'" : "",
                    " with input_layout '", layout, "'; got '", sm_layout, "'");
  const at::Tensor& prev = args.prev_attn_out;
  const auto s = prev.scalar_type();
  TORCH_CHECK_TYPE(s == at::kFloat || s == at::kHalf || s == at::kBFloat16 || s == at::kDouble, op,
                   ": argument 'prev_attn_out' must be float16, bfloat16, float32 or float64; got ", s);
  TORCH_CHECK_TYPE(args.cur_attn_out.scalar_type() == s, op, ": argument 'cur_attn_out' (",
                   args.cur_attn_out.scalar_type(), ") must have the dtype of 'prev_attn_out' (", s, ")");
  TORCH_CHECK_VALUE(prev.dim() == 3, op, ": argument 'prev_attn_out' must be 3-D (", layout == "SBH" ? "[S, B, H]" :
                    "[T, N, D]", "); got shape ", prev.sizes());
  TORCH_CHECK_VALUE(args.cur_attn_out.sizes() == prev.sizes(), op, ": argument 'cur_attn_out' of shape ",
                    args.cur_attn_out.sizes(), " must have the shape of 'prev_attn_out' ", prev.sizes());
  const at::Tensor* stats[4] = {&args.prev_softmax_max, &args.prev_softmax_sum, &args.cur_softmax_max,
                                &args.cur_softmax_sum};
  const char* names[4] = {"prev_softmax_max", "prev_softmax_sum", "cur_softmax_max", "cur_softmax_sum"};
  int64_t S = 0, B = 1, N = 0, D = 0;
  std::vector<int64_t> want;
  if (layout == "SBH") {
    TORCH_CHECK_VALUE(args.prev_softmax_max.dim() == 4, op, ": argument 'prev_softmax_max' must be 4-D [B, N, S, 8] ",
                      "with input_layout 'SBH'; got shape ", args.prev_softmax_max.sizes());
    S = prev.size(0);
    B = prev.size(1);
    N = args.prev_softmax_max.size(1);
    TORCH_CHECK_VALUE(N > 0 && prev.size(2) % N == 0, op, ": the hidden size H = ", prev.size(2),
                      " of 'prev_attn_out' must be a multiple of the head count N = ", N, " of 'prev_softmax_max'");
    D = prev.size(2) / N;
    want = {B, N, S, 8};
  } else {
    S = prev.size(0);
    N = prev.size(1);
    D = prev.size(2);
    want = {S, N, 8};
    TORCH_CHECK_VALUE(args.actual_seq_qlen.has_value(), op, ": argument 'actual_seq_qlen' is required with ",
                      "input_layout 'TND' (cumulative query lengths ending at T = ", S, ")");
    const at::Tensor& q = *args.actual_seq_qlen;
    TORCH_CHECK_TYPE(q.scalar_type() == at::kLong || q.scalar_type() == at::kInt, op,
                     ": argument 'actual_seq_qlen' must be int64 (or int32); got ", q.scalar_type());
    TORCH_CHECK_VALUE(q.dim() == 1 && q.numel() >= 1, op, ": argument 'actual_seq_qlen' must be 1-D and non-empty; ",
                      "got shape ", q.sizes());
    const at::Tensor ql = q.to(at::kLong).contiguous();
    const int64_t* qp = ql.data_ptr<int64_t>();
    for (int64_t i = 0; i < ql.numel(); ++i)
      TORCH_CHECK_VALUE(qp[i] >= (i ? qp[i - 1] : 0), op, ": argument 'actual_seq_qlen' must be non-decreasing ",
                        "cumulative lengths from 0; got ", ql);
    TORCH_CHECK_VALUE(qp[ql.numel() - 1] == S, op, ": argument 'actual_seq_qlen' must end at T = ", S, "; got ",
                      qp[ql.numel() - 1]);
  }
  for (int i = 0; i < 4; ++i) {
    TORCH_CHECK_TYPE(stats[i]->scalar_type() == at::kFloat, op, ": argument '", names[i], "' must be float32; got ",
                     stats[i]->scalar_type());
    TORCH_CHECK_VALUE(stats[i]->sizes() == at::IntArrayRef(want), op, ": argument '", names[i], "' must have shape ",
                      at::IntArrayRef(want), " for 'prev_attn_out' of shape ", prev.sizes(), " (", layout, "); got ",
                      stats[i]->sizes());
  }
  at::Tensor out = at::empty(prev.sizes(), prev.options());
  at::Tensor out_max = at::empty(want, args.prev_softmax_max.options());
  at::Tensor out_sum = at::empty(want, args.prev_softmax_max.options());
  const int64_t rows = S * B * N;
  if (rows == 0) return {out, out_max, out_sum};
  const at::Tensor p = prev.contiguous(), c = args.cur_attn_out.contiguous();
  at::Tensor st[4];
  for (int i = 0; i < 4; ++i) st[i] = stats[i]->contiguous();
  const float *pm = st[0].data_ptr<float>(), *ps = st[1].data_ptr<float>(), *cm = st[2].data_ptr<float>(),
              *cs = st[3].data_ptr<float>();
  float *om = out_max.data_ptr<float>(), *os = out_sum.data_ptr<float>();
  const bool sbh = layout == "SBH", tnd_rows = sm_layout == "TND";
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, s, "ring_attention_update", [&] {
    using acc_t = std::conditional_t<std::is_same_v<scalar_t, double>, double, float>;
    using Vec = at::vec::Vectorized<acc_t>;
    const scalar_t* pp = p.data_ptr<scalar_t>();
    const scalar_t* cp = c.data_ptr<scalar_t>();
    scalar_t* op_ = out.data_ptr<scalar_t>();
    at::parallel_for(0, rows, std::max<int64_t>(1, 8192 / std::max<int64_t>(D, 1)), [&](int64_t r0, int64_t r1) {
      std::vector<acc_t> a(D), b(D);
      for (int64_t r = r0; r < r1; ++r) {
        // r enumerates the attention rows in memory order: (s, b, n) for SBH, (t, n) for TND
        const int64_t n = r % N, sb = r / N;
        // statistics row: [B, N, S]; TND: [T, N] with input_softmax_layout "TND", N-major [N, T] with "" (the
        // order npu_fusion_attention writes its default TND statistics in)
        const int64_t st_row = sbh ? ((sb % B) * N + n) * S + sb / B : tnd_rows ? r : n * S + sb;
        const acc_t m1 = pm[st_row * 8], m2 = cm[st_row * 8];
        const acc_t m = std::max(m1, m2);
        // a row that saw no key in either block (max -inf, sum 0) stays empty: output 0, never NaN
        const bool empty = m == -std::numeric_limits<acc_t>::infinity();
        const acc_t f1 = empty ? 0 : ps[st_row * 8] * std::exp(m1 - m);
        const acc_t f2 = empty ? 0 : cs[st_row * 8] * std::exp(m2 - m);
        const acc_t sum = f1 + f2;
        const acc_t w1 = sum > 0 ? f1 / sum : 0, w2 = sum > 0 ? f2 / sum : 0;
        for (int e = 0; e < 8; ++e) {
          om[st_row * 8 + e] = static_cast<float>(m);
          os[st_row * 8 + e] = static_cast<float>(sum);
        }
        at::vec::convert(pp + r * D, a.data(), D);
        at::vec::convert(cp + r * D, b.data(), D);
        const Vec v1(w1), v2(w2);
        int64_t d = 0;
        for (; d + Vec::size() <= D; d += Vec::size())
          (Vec::loadu(a.data() + d) * v1 + Vec::loadu(b.data() + d) * v2).store(a.data() + d);
        for (; d < D; ++d) a[d] = a[d] * w1 + b[d] * w2;
        at::vec::convert(a.data(), op_ + r * D, D);
      }
    });
  });
  return {out, out_max, out_sum};
}

}  // namespace npu_fa
