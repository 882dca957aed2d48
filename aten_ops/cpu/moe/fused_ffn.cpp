// CPU entry points of moe_ffn and moe_ffn_prepack (native_functions.yaml; docs/moe.md "Fused MoE FFN").
//
// moe_ffn routes the (token, choice) pairs by expert with the routing ops' stable counting sort, then runs the
// whole expert FFN in cpu/moe/fused_ffn_kernels_isa.cpp on weights in the packed brgemm layout (packed here on the
// fly when given plain, once when the caller keeps moe_ffn_prepack's result). dtypes without a usable brgemm here
// (fp16, fp64, or bf16 on a CPU whose oneDNN has no bf16 micro-kernel) take a per-expert at::mm path in fp32 (fp64)
// with the same math.
#include <ATen/ATen.h>
#include <ATen/native/CPUBlas.h>

#include <string>
#include <vector>

#include "cpu/brgemm.h"
#include "cpu/moe/fused_ffn_kernels.h"
#include "cpu/moe/routing_helpers.h"
#include "generated/kernels.h"

namespace npu_fa {
namespace {

using cpu::kFfnBlock;
using cpu::kFfnHalf;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
bool pairs_rows(c10::ScalarType t) { return c10::elementSize(t) == 2; }  // VNNI: K rounded up to even
int64_t packed_k(int64_t k, c10::ScalarType t) { return pairs_rows(t) ? (k + 1) / 2 * 2 : k; }

int64_t activation_code(const char* op, c10::string_view a) {
  const std::string s(a);
  if (s == "swiglu") return cpu::kFfnSwiglu;
  if (s == "none") return cpu::kFfnNone;
  if (s == "relu") return cpu::kFfnRelu;
  if (s == "gelu_tanh") return cpu::kFfnGeluTanh;
  if (s == "fast_gelu") return cpu::kFfnFastGelu;
  if (s == "silu") return cpu::kFfnSilu;
  TORCH_CHECK_VALUE(false, op, ": argument 'activation' must be one of 'swiglu', 'silu', 'gelu_tanh', 'fast_gelu', "
                    "'relu', 'none'; got '", s, "'");
}

void check_float(const char* op, const char* name, const at::Tensor& t) {
  const auto d = t.scalar_type();
  TORCH_CHECK_TYPE(d == at::kFloat || d == at::kBFloat16 || d == at::kHalf || d == at::kDouble, op, ": argument '",
                   name, "' must be float32, bfloat16, float16 or float64; got ", d);
}

// Plain [E, K, N] weight (a view) of a "nk" ([E, N, K], nn.Linear's out x in) or "kn" weight.
at::Tensor as_kn(const at::Tensor& w, const std::string& layout) { return layout == "nk" ? w.transpose(1, 2) : w; }

// [E, K, N] -> packed [E, NB, Kp, kFfnBlock] (fused_ffn_kernels.h).
at::Tensor pack_kn(const at::Tensor& w, bool gated) {
  const int64_t E = w.size(0), K = w.size(1), N = w.size(2);
  at::Tensor cols;  // [E, K, NB, kFfnBlock]
  if (gated) {
    const int64_t F = N / 2, nb = ceil_div(F, kFfnHalf);
    auto half = [&](int64_t start) {
      return at::constant_pad_nd(w.narrow(2, start, F), {0, nb * kFfnHalf - F}).reshape({E, K, nb, kFfnHalf});
    };
    cols = at::cat({half(0), half(F)}, 3);
  } else {
    const int64_t nb = ceil_div(N, kFfnBlock);
    cols = at::constant_pad_nd(w, {0, nb * kFfnBlock - N}).reshape({E, K, nb, kFfnBlock});
  }
  at::Tensor blocks = cols.permute({0, 2, 1, 3});  // [E, NB, K, B]
  const int64_t nb = blocks.size(1), kp = packed_k(K, w.scalar_type());
  if (!pairs_rows(w.scalar_type())) {
    blocks = blocks.contiguous();
  } else {
    blocks = at::constant_pad_nd(blocks, {0, 0, 0, kp - K});
    blocks = blocks.reshape({E, nb, kp / 2, 2, kFfnBlock}).permute({0, 1, 2, 4, 3}).contiguous();
  }
  // Gated blocks are labelled [.., 2, 32] so that a w13 packed for the other kind of activation is refused.
  return gated ? blocks.view({E, nb, kp, 2, kFfnHalf}) : blocks.view({E, nb, kp, kFfnBlock});
}

// Packed [E, NB, Kp, B] -> [E, Kp, n] plain (n = N, or for gated blocks the first n of both halves: [E, Kp, 2n]).
at::Tensor unpack(const at::Tensor& packed, bool gated, int64_t n) {
  const int64_t E = packed.size(0), nb = packed.size(1), kp = packed.size(2);
  const at::Tensor p = packed.reshape({E, nb, kp, kFfnBlock});
  at::Tensor b = p;
  if (pairs_rows(p.scalar_type())) b = p.view({E, nb, kp / 2, kFfnBlock, 2}).permute({0, 1, 2, 4, 3}).reshape(
      {E, nb, kp, kFfnBlock});
  b = b.permute({0, 2, 1, 3});  // [E, Kp, NB, B]
  if (!gated) return b.reshape({E, kp, nb * kFfnBlock}).narrow(2, 0, n);
  auto half = [&](int64_t i) { return b.narrow(3, i * kFfnHalf, kFfnHalf).reshape({E, kp, nb * kFfnHalf}).narrow(2, 0, n); };
  return at::cat({half(0), half(1)}, 2);
}

// The reference-speed path: per expert at::mm in fp32 (fp64 for fp64) on plain [E, K, N] weights.
void ffn_with_mm(const at::Tensor& x, const at::Tensor& w13, const at::Tensor& w2, const at::Tensor& b13,
                 const at::Tensor& b2, int64_t act, int64_t F, const moe::KeySort& s, const std::vector<int64_t>& pos,
                 const at::Tensor& pair_weight, int64_t k, at::Tensor& out) {
  const auto acc = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const int64_t T = x.size(0), H = x.size(1), R = int64_t(s.order.size());
  const at::Tensor order = at::tensor(s.order, at::kLong);
  const at::Tensor xs = x.index_select(0, at::div(order, k, "floor")).to(acc);
  at::Tensor y = at::empty({R, H}, x.options().dtype(acc));
  int64_t r0 = 0;
  for (int64_t e = 0; e < int64_t(s.counts.size()); ++e) {
    const int64_t m = s.counts[e];
    if (m == 0) continue;
    at::Tensor h = at::mm(xs.narrow(0, r0, m), w13[e].to(acc));
    if (b13.defined()) h = h + b13[e].to(acc);
    at::Tensor inner;
    switch (act) {
      case cpu::kFfnSwiglu: inner = at::silu(h.narrow(1, 0, F)) * h.narrow(1, F, F); break;
      case cpu::kFfnRelu: inner = at::relu(h); break;
      case cpu::kFfnGeluTanh: inner = at::gelu(h, "tanh"); break;
      case cpu::kFfnFastGelu: inner = h * at::sigmoid(h * 1.702); break;
      case cpu::kFfnSilu: inner = at::silu(h); break;
      default: inner = h;
    }
    at::Tensor o = at::mm(inner, w2[e].to(acc));
    if (b2.defined()) o = o + b2[e].to(acc);
    y.narrow(0, r0, m).copy_(o * pair_weight.reshape(-1).index_select(0, order.narrow(0, r0, m)).to(acc).unsqueeze(1));
    r0 += m;
  }
  const at::Tensor p = at::tensor(pos, at::kLong);
  out.copy_(y.index_select(0, p).view({T, k, H}).sum(1));
}

}  // namespace

at::Tensor moe_ffn_prepack_cpu(const MoeFfnPrepackArgs& args) {
  constexpr const char* op = "moe_ffn_prepack";
  const at::Tensor& w = args.weight;
  const std::string layout(args.weight_layout);
  TORCH_CHECK_VALUE(layout == "nk" || layout == "kn", op, ": argument 'weight_layout' must be 'nk' ([E, N, K], "
                    "out x in) or 'kn' ([E, K, N]); got '", layout, "'");
  check_float(op, "weight", w);
  TORCH_CHECK_VALUE(w.dim() == 3, op, ": argument 'weight' must be a 3-D [E, ", layout == "nk" ? "N, K" : "K, N",
                    "] tensor; got shape ", w.sizes());
  const at::Tensor kn = as_kn(w, layout);
  TORCH_CHECK_VALUE(!args.gated || kn.size(2) % 2 == 0, op, ": a gated (swiglu) weight has 2F output columns (gate "
                    "then up); got an odd N = ", kn.size(2));
  return pack_kn(kn, args.gated);
}

at::Tensor moe_ffn_cpu(const MoeFfnArgs& args) {
  constexpr const char* op = "moe_ffn";
  const at::Tensor &x = args.x, &w13 = args.w13, &w2 = args.w2, &tw = args.topk_weights, &ids = args.topk_ids;
  const int64_t act = activation_code(op, args.activation);
  const bool gated = act == cpu::kFfnSwiglu;
  const std::string layout(args.weight_layout);
  TORCH_CHECK_VALUE(layout == "nk" || layout == "kn" || layout == "packed", op, ": argument 'weight_layout' must be "
                    "'nk' (w13 [E, N, H], w2 [E, H, F]), 'kn' (w13 [E, H, N], w2 [E, F, H]) or 'packed' "
                    "(moe_ffn_prepack); got '", layout, "'");
  const bool packed = layout == "packed";
  check_float(op, "x", x);
  const auto dt = x.scalar_type();
  TORCH_CHECK_VALUE(x.dim() == 2, op, ": argument 'x' must be [T, H]; got shape ", x.sizes());
  const int64_t T = x.size(0), H = x.size(1);
  TORCH_CHECK_TYPE(w13.scalar_type() == dt && w2.scalar_type() == dt, op, ": arguments 'w13' and 'w2' must have "
                   "x's dtype ", dt, "; got ", w13.scalar_type(), " and ", w2.scalar_type());
  if (!packed) {
    TORCH_CHECK_VALUE(w13.dim() == 3 && w2.dim() == 3, op, ": with weight_layout '", layout, "' arguments 'w13' and "
                      "'w2' must be 3-D", w13.dim() > 3 ? " (4-D and 5-D weights come from moe_ffn_prepack: pass "
                      "weight_layout='packed')" : "", "; got shapes ", w13.sizes(), " and ", w2.sizes());
  } else {
    TORCH_CHECK_VALUE((w13.dim() == 4 || w13.dim() == 5) && w2.dim() == 4, op, ": with weight_layout 'packed' "
                      "arguments 'w13' and 'w2' must come from moe_ffn_prepack ([E, NB, Kp, 2, 32] gated or [E, NB, "
                      "Kp, 64]); got shapes ", w13.sizes(), " and ", w2.sizes());
  }
  TORCH_CHECK_VALUE(!packed || w13.dim() == (gated ? 5 : 4), op, ": packed 'w13' ", w13.sizes(), " was packed with "
                    "gated=", gated ? "False" : "True", " but activation '", std::string(args.activation), "' needs ",
                    "gated=", gated ? "True" : "False");
  TORCH_CHECK_VALUE(!packed || !(w2.dim() == 4 && w2.size(3) != kFfnBlock), op, ": packed 'w2' must be packed with "
                    "gated=False; got shape ", w2.sizes());
  const int64_t E = w13.size(0);
  TORCH_CHECK_VALUE(E > 0 && w2.size(0) == E, op, ": arguments 'w13' and 'w2' must hold the same E > 0 experts; got ",
                    E, " and ", w2.size(0));
  const int64_t Hp = packed_k(H, dt);
  int64_t F = 0;
  if (packed) {
    TORCH_CHECK_VALUE(w13.size(2) == Hp &&
                          w2.size(1) == ceil_div(H, kFfnBlock),
                      op, ": packed 'w13' must be [E, NB, ", Hp, ", ...] and packed 'w2' [E, ", ceil_div(H, kFfnBlock),
                      ", Fp, 64] for x's H = ", H, " (moe_ffn_prepack of the [E, 2F, H] / [E, H, F] weights); got ",
                      w13.sizes(), " and ", w2.sizes());
    F = w2.size(2);
    TORCH_CHECK_VALUE(w13.size(1) == ceil_div(F, gated ? kFfnHalf : kFfnBlock), op, ": packed 'w13' has ",
                      w13.size(1), " column blocks, but packed 'w2' (F = ", F, ") needs ",
                      ceil_div(F, gated ? kFfnHalf : kFfnBlock), ": w13 and w2 are not of the same FFN");
    // bf16 rounds an odd F up to even (a zero feature); a bias tells the true F.
    if (args.bias13.has_value() && args.bias13->defined() && pairs_rows(dt)) {
      const int64_t f = gated ? args.bias13->size(-1) / 2 : args.bias13->size(-1);
      if (f == F - 1 && f % 2 == 1) F = f;
    }
  } else {
    const at::Tensor a = as_kn(w13, layout), b = as_kn(w2, layout);
    F = b.size(1);
    TORCH_CHECK_VALUE(a.size(1) == H && b.size(2) == H && a.size(2) == (gated ? 2 * F : F), op,
                      ": with weight_layout '", layout, "' 'w13' must be ",
                      layout == "nk" ? "[E, N, H] and 'w2' [E, H, F]" : "[E, H, N] and 'w2' [E, F, H]", " with H = ",
                      H, " (x) and N = ", gated ? "2F (gate then up halves)" : "F", "; got ", w13.sizes(), " and ",
                      w2.sizes());
  }
  const int64_t N1 = gated ? 2 * F : F;
  auto check_bias = [&](const char* name, const std::optional<at::Tensor>& b, int64_t n) -> at::Tensor {
    if (!b.has_value() || !b->defined()) return {};
    check_float(op, name, *b);
    TORCH_CHECK_VALUE(b->dim() == 2 && b->size(0) == E && b->size(1) == n, op, ": argument '", name, "' must be [E=",
                      E, ", ", n, "]; got shape ", b->sizes());
    return *b;
  };
  const at::Tensor b13 = check_bias("bias13", args.bias13, N1), b2 = check_bias("bias2", args.bias2, H);
  TORCH_CHECK_VALUE(ids.dim() == 2 && ids.size(0) == T && ids.size(1) >= 1, op, ": argument 'topk_ids' must be [T=",
                    T, ", k >= 1]; got shape ", ids.sizes());
  TORCH_CHECK_TYPE(ids.scalar_type() == at::kInt || ids.scalar_type() == at::kLong, op, ": argument 'topk_ids' must "
                   "be int32 or int64; got ", ids.scalar_type());
  const int64_t k = ids.size(1);
  TORCH_CHECK_VALUE(tw.dim() == 2 && tw.size(0) == T && tw.size(1) == k, op, ": argument 'topk_weights' must be [T=",
                    T, ", k=", k, "] like topk_ids; got shape ", tw.sizes());
  check_float(op, "topk_weights", tw);
  const std::vector<int64_t> keys = moe::read_index(ids);
  for (size_t i = 0; i < keys.size(); ++i)
    TORCH_CHECK_VALUE(keys[i] >= 0 && keys[i] < E, op, ": argument 'topk_ids' holds expert ", keys[i], " at [",
                      int64_t(i) / k, ", ", int64_t(i) % k, "]; expert indices must be in [0, E=", E, ")");

  at::Tensor out = at::empty({T, H}, x.options());
  if (T == 0 || H == 0) return out;
  const moe::KeySort s = moe::counting_sort(keys, E);
  std::vector<int64_t> pos(keys.size());
  for (int64_t r = 0; r < int64_t(s.order.size()); ++r) pos[s.order[r]] = r;

  // bf16 without a bf16 micro-kernel runs the fused kernel with fp32 products (widened operands); other dtypes
  // without brgemm, and F == 0 (no product to run, only the biases), take the per-expert matmul path.
  const bool fused = F > 0 && (cpu::brgemm_usable(dt) || (dt == at::kBFloat16 && cpu::brgemm_usable(at::kFloat)));
  if (!fused) {
    at::Tensor a, b;
    if (packed) {
      a = unpack(w13, gated, F).narrow(1, 0, H);
      b = unpack(w2, false, H).narrow(1, 0, F);
    } else {
      a = as_kn(w13, layout);
      b = as_kn(w2, layout);
    }
    ffn_with_mm(x, a, b, b13, b2, act, F, s, pos, tw, k, out);
    return out;
  }
  const at::Tensor p13 = packed ? w13.contiguous() : pack_kn(as_kn(w13, layout), gated);
  const at::Tensor p2 = packed ? w2.contiguous() : pack_kn(as_kn(w2, layout), false);
  const at::Tensor xc = x.contiguous();
  const at::Tensor w32 = tw.to(at::kFloat).contiguous();
  const at::Tensor b13f = b13.defined() ? b13.to(at::kFloat).contiguous() : b13;
  const at::Tensor b2f = b2.defined() ? b2.to(at::kFloat).contiguous() : b2;
  std::vector<int64_t> offsets(E + 1, 0);
  for (int64_t e = 0; e < E; ++e) offsets[e + 1] = offsets[e] + s.counts[e];
  cpu::FusedFfnParams p{};
  p.dtype = dt;
  p.experts = E;
  p.tokens = T;
  p.k = k;
  p.H = H;
  p.Hp = Hp;
  p.F = F;
  p.Fp = p2.size(2);
  p.act = act;
  p.offsets = offsets.data();
  p.order = s.order.data();
  p.pos = pos.data();
  p.pair_weight = w32.data_ptr<float>();
  p.x = xc.data_ptr();
  p.w13 = p13.data_ptr();
  p.nb1 = p13.size(1);
  p.w2 = p2.data_ptr();
  p.nb2 = p2.size(1);
  p.b13 = b13f.defined() ? b13f.data_ptr<float>() : nullptr;
  p.b2 = b2f.defined() ? b2f.data_ptr<float>() : nullptr;
  p.out = out.data_ptr();
  cpu::fused_ffn_stub(p);
  return out;
}

}  // namespace npu_fa
