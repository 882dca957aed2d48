// CPU entry points of grouped_matmul_quant and grouped_matmul_swiglu_quant (native_functions.yaml).
//
// Both lower the call to a list of products (rows of x, one expert's weight, rows of the output) like
// grouped_matmul does, then:
//   W8A8         acc = exact_int_mm(x_e, w_e) (cpu/quant/int_mm.h: oneDNN's s8s8 -> s32 GEMM with VNNI / AMX-INT8
//                on AVX-512 CPUs, an exact vpmaddwd kernel on AVX2 ones),
//                then ATen element-wise passes apply int32 bias, weight scale, per-token scale, float bias,
//                activation and the cast (round half to even + saturate for int8 outputs);
//   weight-only  each task dequantises its [K, tile] block of the expert's int8 / int4 weight into x's dtype, then
//                ATen's bf16/fp16 GEMM (addmm: fp32 accumulation, bias) runs on it.
// Both run as (group, column tile) tasks spread over the intra-op threads, each single-threaded.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>

#include <algorithm>
#include <array>
#include <tuple>
#include <atomic>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/checked_math.h"
#include "cpu/moe/grouped_matmul_kernels.h"
#include "cpu/quant/int_mm.h"
#include "generated/kernels.h"

namespace npu_fa {
namespace {

constexpr const char* kOp = "grouped_matmul_quant";

// One product: rows [r0, r0 + m) of x[xi] (as [rows, K]) times expert e, written to rows [o0, o0 + m) of out[oi].
struct QProduct {
  int64_t xi, r0, m, e, oi, o0;
};

bool is_float(c10::ScalarType t) { return t == at::kFloat || t == at::kBFloat16 || t == at::kHalf; }

// The experts: one [E, K, N'] tensor or E [K, N'] tensors; N' = N, or N / 8 for int4 packed into int32.
struct Experts {
  at::TensorList list;
  bool stacked;
  bool int4;
  int64_t count() const { return stacked ? list[0].size(0) : int64_t(list.size()); }
  at::Tensor operator[](int64_t e) const { return stacked ? list[0][e] : list[e]; }
  int64_t k(int64_t e) const { return (*this)[e].size(0); }
  int64_t n(int64_t e) const { return (*this)[e].size(1) * (int4 ? 8 : 1); }
};

// Row boundaries of the groups of a split-M call: (expert, row start, rows) per group. group_list_type 0 (cumulative
// ends) and 1 (counts) have one entry per expert; 2 is an [G, 2] tensor of (expert index, count) pairs. The groups
// may end before M (serving engines pass buffers sized for the worst case); the rows after them are not computed.
std::vector<QProduct> split_m_groups(const char* op, const at::Tensor& gl, int64_t list_type, int64_t experts,
                                     int64_t rows) {
  TORCH_CHECK_TYPE(gl.scalar_type() == at::kLong || gl.scalar_type() == at::kInt, op,
                   ": argument 'group_list' must be an int64 or int32 tensor; got ", gl.scalar_type());
  const at::Tensor v = gl.to(at::kLong).contiguous();
  const int64_t* p = v.data_ptr<int64_t>();
  std::vector<QProduct> ps;
  int64_t end = 0;
  if (list_type == 2) {
    TORCH_CHECK_VALUE(gl.dim() == 2 && gl.size(1) == 2, op, ": argument 'group_list' with group_list_type 2 must "
                      "be [G, 2] (expert index, row count) pairs; got shape ", gl.sizes());
    for (int64_t g = 0; g < gl.size(0); ++g) {
      const int64_t e = p[2 * g], c = p[2 * g + 1];
      TORCH_CHECK_VALUE(e >= 0 && e < experts, op, ": argument 'group_list' (group_list_type 2) row ", g,
                        " names expert ", e, "; expected 0 <= index < ", experts);
      TORCH_CHECK_VALUE(c >= 0, op, ": argument 'group_list' (group_list_type 2) row ", g, " has count ", c,
                        "; expected >= 0");
      ps.push_back({0, end, c, e, 0, end});
      end = checked_add(op, "the sum of group_list's counts", end, c);
    }
  } else {
    TORCH_CHECK_VALUE(gl.dim() == 1 && gl.numel() == experts, op, ": argument 'group_list' must be 1-D with one "
                      "entry per expert (", experts, "); got shape ", gl.sizes());
    for (int64_t e = 0; e < experts; ++e) {
      int64_t c;
      if (list_type == 0) {
        TORCH_CHECK_VALUE(p[e] >= end, op, ": argument 'group_list' (group_list_type 0, cumulative ends) must be "
                          "non-decreasing from >= 0; group_list[", e, "] = ", p[e], " after ", end);
        c = p[e] - end;
      } else {
        TORCH_CHECK_VALUE(p[e] >= 0, op, ": argument 'group_list' (group_list_type 1, counts) must be >= 0; "
                          "group_list[", e, "] = ", p[e]);
        c = p[e];
      }
      ps.push_back({0, end, c, e, 0, end});
      end = checked_add(op, "the sum of group_list's counts", end, c);
    }
  }
  TORCH_CHECK_VALUE(end <= rows, op, ": argument 'group_list' covers ", end, " rows but x has only ", rows);
  return ps;
}

// Per-expert entry of a quantisation parameter list: list[0][e] of one tensor with a leading expert axis next to
// stacked weights, else list[e]. `what` names the argument in errors.
at::Tensor expert_param(const char* op, const char* what, at::TensorList list, const Experts& w, int64_t e) {
  if (w.stacked) {
    TORCH_CHECK_VALUE(list.size() == 1 && list[0].dim() >= 1 && list[0].size(0) == w.count(), op, ": argument '",
                      what, "' must be one tensor with a leading expert axis of ", w.count(), " next to a stacked "
                      "[E, K, N] weight; got ", list.size(), " tensors", list.empty() ? "" : ", the first of shape ",
                      list.empty() ? at::IntArrayRef{} : list[0].sizes());
    return list[0][e];
  }
  TORCH_CHECK_VALUE(int64_t(list.size()) == w.count(), op, ": argument '", what, "' must hold one tensor per weight (",
                    w.count(), "); got ", list.size());
  return list[e];
}

// Weight scale of expert e as a contiguous fp32 vector of 1 (per tensor) or N (per channel) values. int64 holds
// npu_trans_quant_param's packing: the fp32 bits in bits 0-31, bit 46 set, an int9 offset in bits 37-45.
at::Tensor weight_scale(const at::Tensor& s_in, int64_t n, int64_t e) {
  at::Tensor s = s_in.reshape({-1});
  TORCH_CHECK_VALUE(s.numel() == 1 || s.numel() == n, kOp, ": argument 'scale' of expert ", e, " must hold 1 (per "
                    "tensor) or N=", n, " (per channel) values; got shape ", s_in.sizes());
  if (s.scalar_type() == at::kLong) {
    const at::Tensor offset_bits = s.bitwise_right_shift(37).bitwise_and(0x1FF);
    TORCH_CHECK_NOT_IMPLEMENTED(!offset_bits.any().item<bool>(), kOp, ": argument 'scale' (int64) of expert ", e,
                                " carries a quantisation offset (bits 37-45, npu_trans_quant_param's offset), which "
                                "is not implemented; pack the scale without offset");
    return s.bitwise_and(0xFFFFFFFFLL).to(at::kInt).view(at::kFloat).contiguous();
  }
  TORCH_CHECK_TYPE(s.scalar_type() == at::kFloat || s.scalar_type() == at::kBFloat16, kOp,
                   ": argument 'scale' must be float32, bfloat16 or int64 (packed); got ", s.scalar_type());
  return s.to(at::kFloat).contiguous();
}

// Weight-only parameters of expert e, validated: scale / offset as fp32 [G, N] (G = 1 per channel, else groups of
// K/G rows); offset undefined when absent.
std::pair<at::Tensor, at::Tensor> antiquant_params(int64_t K, int64_t N, const at::Tensor& scale,
                                                   const at::Tensor& offset, c10::ScalarType dtype, int64_t e) {
  auto grouped = [&](const at::Tensor& p, const char* what) {
    TORCH_CHECK_VALUE(p.scalar_type() == dtype || p.scalar_type() == at::kFloat, kOp, ": argument '", what,
                      "' must have x's dtype (", dtype, ") or float32; got ", p.scalar_type());
    TORCH_CHECK_VALUE((p.dim() == 1 && p.size(0) == N) || (p.dim() == 2 && p.size(1) == N && p.size(0) >= 1), kOp,
                      ": argument '", what, "' of expert ", e, " must be [N=", N, "] (per channel) or [G, N] (per "
                      "group); got shape ", p.sizes());
    const int64_t G = p.dim() == 1 ? 1 : p.size(0);
    TORCH_CHECK_VALUE(K % G == 0, kOp, ": argument '", what, "' of expert ", e, " has G=", G,
                      " groups, which must divide K=", K);
    return p.to(at::kFloat).reshape({G, N});
  };
  const at::Tensor s = grouped(scale, "antiquant_scale");
  at::Tensor o;
  if (offset.defined()) {
    o = grouped(offset, "antiquant_offset");
    TORCH_CHECK_VALUE(o.sizes() == s.sizes(), kOp, ": argument 'antiquant_offset' of expert ", e,
                      " must have antiquant_scale's shape ", scale.sizes(), "; got ", offset.sizes());
  }
  return {s, o};
}

// Columns [n0, n1) of an expert weight (int8 [K, N] or int32 [K, N/8] holding eight int4 along N, element j in bits
// 4j..4j+3; n0, n1 multiples of 8 for int4) dequantised to `dtype`: (w + offset) * scale in fp32, one rounding.
at::Tensor dequant_tile(const at::Tensor& w, bool int4, const at::Tensor& s, const at::Tensor& o, int64_t n0,
                        int64_t n1, c10::ScalarType dtype) {
  const int64_t K = w.size(0), T = n1 - n0, G = s.size(0);
  at::Tensor q;
  if (int4) {
    const at::Tensor packed = w.narrow(1, n0 / 8, T / 8);
    const at::Tensor shifts = at::arange(0, 32, 4, w.options());
    at::Tensor nib = packed.unsqueeze(-1).bitwise_right_shift(shifts).bitwise_and(15);
    q = (nib.bitwise_xor(8) - 8).reshape({K, T}).to(at::kFloat);  // sign-extended from 4 bits
  } else {
    q = w.narrow(1, n0, T).to(at::kFloat);
  }
  at::Tensor qg = q.view({G, K / G, T});
  if (o.defined()) qg = qg + o.narrow(1, n0, T).unsqueeze(1);
  return (qg * s.narrow(1, n0, T).unsqueeze(1)).reshape({K, T}).to(dtype);
}

// W8A8 epilogue y = (acc + bias_i) * scale * pts[row] + bias_f -> act -> out's dtype, with ATen's vectorised,
// threaded element-wise kernels: a few passes over one group's [m, n] block (L2-sized for serving shapes), cheaper
// than a scalar fused loop here (this file is compiled for the baseline ISA; the bf16 conversion does not vectorise).
void w8a8_epilogue(at::Tensor acc, at::Tensor out, const at::Tensor& scale, const at::Tensor& pts,
                   const at::Tensor& bias_i, const at::Tensor& bias_f, int64_t act) {
  if (bias_i.defined()) acc.add_(bias_i);
  if (!scale.defined()) {  // int32 output: the accumulation
    out.copy_(acc);
    return;
  }
  at::Tensor f = at::mul(acc, scale);  // int32 * fp32 -> fp32
  if (pts.defined()) f.mul_(pts.unsqueeze(1));
  if (bias_f.defined()) f.add_(bias_f);
  if (act != cpu::kActNone) {
    at::Tensor g = at::empty_like(f);
    const int64_t n = f.size(1);
    at::parallel_for(0, f.size(0), 8, [&](int64_t r0, int64_t r1) {
      cpu::gmm_epilogue_stub(at::kFloat, cpu::Block{f.data_ptr<float>() + r0 * n, n},
                             cpu::Block{g.data_ptr<float>() + r0 * n, n}, nullptr, r1 - r0, n, act);
    });
    f = g;
  }
  if (out.scalar_type() == at::kChar) f.round_().clamp_(-128, 127);  // round half to even, saturate
  out.copy_(f);
}

// Runs products (rows m, columns n, depth k) as (product, column tile) tasks of about equal cost on the intra-op
// threads, dynamically handed out through an atomic counter; each task is single-threaded (ATen and oneDNN run
// serially inside a parallel region). One parallel region per call instead of one threaded GEMM per group: small
// groups do not leave threads idle at every GEMM's barrier, which on a loaded machine cost more than the GEMMs.
// Tile widths are multiples of 64 columns. run(product, n0, n1) computes one tile.
template <typename F>
void run_column_tasks(const std::vector<std::array<int64_t, 3>>& shapes, const F& run) {
  struct Task { size_t product; int64_t n0, n1; };
  const int64_t threads = at::get_num_threads();
  double total = 0;
  for (const auto& sh : shapes) total += double(sh[0]) * sh[1] * std::max<int64_t>(sh[2], 1);
  const double target = total / double(std::max<int64_t>(threads, 1) * 4);
  std::vector<Task> tasks;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const int64_t m = shapes[i][0], n = shapes[i][1], k = std::max<int64_t>(shapes[i][2], 1);
    const int64_t tiles = threads == 1 ? 1
        : std::clamp<int64_t>(int64_t(double(m) * n * k / target + 0.5), 1, std::max<int64_t>(1, n / 64));
    const int64_t width = std::min(n, ((n + tiles - 1) / tiles + 63) / 64 * 64);
    for (int64_t n0 = 0; n0 < n; n0 += width) tasks.push_back({i, n0, std::min(n, n0 + width)});
  }
  const at::ThreadLocalState tls;  // the caller's dispatcher state (inference mode...) for the worker threads
  std::atomic<size_t> next{0};
  at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
    at::ThreadLocalStateGuard guard(tls);
    for (size_t t; (t = next.fetch_add(1)) < tasks.size();) run(tasks[t].product, tasks[t].n0, tasks[t].n1);
  });
}

// One group: its rows of x, its expert's weight, its rows of the output and the epilogue's / dequantisation's
// operands (undefined when absent).
struct Job {
  at::Tensor a, w, out;
  at::Tensor scale, pts, bias_i, bias_f;  // W8A8
  at::Tensor aq_scale, aq_offset, bias;   // weight-only: [G, N] fp32 parameters, bias in x's dtype
};

std::vector<std::array<int64_t, 3>> shapes_of(const std::vector<Job>& jobs) {
  std::vector<std::array<int64_t, 3>> shapes;
  for (const auto& j : jobs) shapes.push_back({j.a.size(0), j.out.size(1), j.a.size(1)});
  return shapes;
}

void run_w8a8(const std::vector<Job>& jobs, int64_t act) {
  run_column_tasks(shapes_of(jobs), [&](size_t p, int64_t n0, int64_t n1) {
    const auto& j = jobs[p];
    const int64_t w = n1 - n0, n = j.out.size(1);
    auto cols = [&](const at::Tensor& v) { return v.defined() && v.numel() == n && n > 1 ? v.narrow(0, n0, w) : v; };
    const bool whole = n0 == 0 && w == n;
    w8a8_epilogue(cpu::exact_int_mm(j.a, whole ? j.w : j.w.narrow(1, n0, w)), whole ? j.out : j.out.narrow(1, n0, w),
                  cols(j.scale), j.pts, cols(j.bias_i), cols(j.bias_f), act);
  });
}

// Weight-only: each task dequantises its [K, tile] block of the expert's weight into x's dtype, then one GEMM.
void run_weight_only(const std::vector<Job>& jobs, bool int4, c10::ScalarType dtype) {
  run_column_tasks(shapes_of(jobs), [&](size_t p, int64_t n0, int64_t n1) {
    const auto& j = jobs[p];
    const at::Tensor wq = dequant_tile(j.w, int4, j.aq_scale, j.aq_offset, n0, n1, dtype);
    // The bias enters the GEMM (beta = 1): the fp32 accumulation is rounded to x's dtype once, as upstream's fp32
    // matmul + bias does; only the bias itself is rounded to x's dtype first.
    j.out.narrow(1, n0, n1 - n0).copy_(j.bias.defined() ? at::addmm(j.bias.narrow(0, n0, n1 - n0), j.a, wq)
                                                        : at::mm(j.a, wq));
  });
}

// Bias of expert e (stacked [E, N] next to stacked weights, else one [N] per weight), or undefined.
at::Tensor bias_of(at::TensorList bias, const Experts& w, int64_t e, int64_t n) {
  if (bias.empty()) return {};
  const at::Tensor b = expert_param(kOp, "bias", bias, w, e);
  // [N], or [1, N] as serving code reshapes a single linear layer's bias.
  TORCH_CHECK_VALUE(b.dim() >= 1 && b.size(-1) == n && b.numel() == n, kOp, ": argument 'bias' of expert ", e,
                    " must be [N=", n, "]; got shape ", b.sizes());
  return b.reshape({n});
}

}  // namespace

std::vector<at::Tensor> grouped_matmul_quant_cpu(const GroupedMatmulQuantArgs& args) {
  TORCH_CHECK_VALUE(!args.x.empty() && !args.weight.empty(), kOp, ": arguments 'x' and 'weight' must be non-empty "
                    "lists; got ", args.x.size(), " and ", args.weight.size(), " tensors");
  const auto xdt = args.x[0].scalar_type(), wdt = args.weight[0].scalar_type();
  for (size_t i = 0; i < args.x.size(); ++i) {
    TORCH_CHECK_TYPE(args.x[i].scalar_type() == xdt, kOp, ": every x has x[0]'s dtype ", xdt, "; x[", i, "] is ",
                     args.x[i].scalar_type());
  }
  for (size_t i = 0; i < args.weight.size(); ++i) {
    TORCH_CHECK_TYPE(args.weight[i].scalar_type() == wdt, kOp, ": every weight has weight[0]'s dtype ", wdt,
                     "; weight[", i, "] is ", args.weight[i].scalar_type());
  }
  const bool w8a8 = xdt == at::kChar && wdt == at::kChar;
  const bool weight_only = (xdt == at::kBFloat16 || xdt == at::kHalf) && (wdt == at::kChar || wdt == at::kInt);
  TORCH_CHECK_TYPE(w8a8 || weight_only, kOp, ": x and weight must be int8 and int8 (W8A8) or bfloat16/float16 and "
                   "int8/int32-packed int4 (weight-only); got ", xdt, " and ", wdt);
  TORCH_CHECK_VALUE(args.group_type == -1 || args.group_type == 0, kOp, ": argument 'group_type' must be -1 (lists) "
                    "or 0 (split along M) for quantised inputs; got ", args.group_type);
  TORCH_CHECK_VALUE(args.group_list_type >= 0 && args.group_list_type <= 2, kOp, ": argument 'group_list_type' "
                    "must be 0 (cumulative ends), 1 (counts) or 2 ((expert, count) pairs); got ", args.group_list_type);
  TORCH_CHECK_VALUE(args.act_type == cpu::kActNone || args.act_type == cpu::kActRelu ||
                        args.act_type == cpu::kActGeluTanh || args.act_type == cpu::kActFastGelu ||
                        args.act_type == cpu::kActSilu,
                    kOp, ": argument 'act_type' must be 0, 1, 2, 4 or 5; got ", args.act_type);

  // Output dtype.
  c10::ScalarType odt;
  if (args.output_dtype == -1) {
    odt = weight_only ? xdt : (args.scale.empty() ? at::kInt : at::kChar);
  } else {
    TORCH_CHECK_VALUE(args.output_dtype >= 0 && args.output_dtype < int64_t(c10::ScalarType::NumOptions), kOp,
                      ": argument 'output_dtype' is not a ScalarType code: ", args.output_dtype);
    odt = static_cast<c10::ScalarType>(args.output_dtype);
  }
  if (weight_only) {
    TORCH_CHECK_VALUE(odt == xdt, kOp, ": weight-only quantisation outputs x's dtype ", xdt, "; output_dtype is ",
                      odt);
    TORCH_CHECK_VALUE(args.scale.empty() && args.per_token_scale.empty(), kOp, ": arguments 'scale' and "
                      "'per_token_scale' belong to W8A8 (int8 x); with ", xdt, " x pass antiquant_scale only");
    TORCH_CHECK_VALUE(!args.antiquant_scale.empty(), kOp, ": argument 'antiquant_scale' is required with an int8/"
                      "int4 weight and ", xdt, " x");
    TORCH_CHECK_VALUE(args.act_type == cpu::kActNone, kOp, ": argument 'act_type' must be 0 for weight-only "
                      "quantisation (an activation is fused with per-token W8A8 only); got ", args.act_type);
  } else {
    TORCH_CHECK_VALUE(args.antiquant_scale.empty() && args.antiquant_offset.empty(), kOp, ": arguments "
                      "'antiquant_scale' and 'antiquant_offset' belong to weight-only quantisation (bfloat16/"
                      "float16 x); x is int8");
    TORCH_CHECK_VALUE(odt == at::kBFloat16 || odt == at::kHalf || odt == at::kFloat || odt == at::kChar ||
                          odt == at::kInt, kOp, ": argument 'output_dtype' must be bfloat16, float16, float32, "
                      "int8 or int32 for int8 x; got ", odt);
    TORCH_CHECK_VALUE((odt == at::kInt) == args.scale.empty(), kOp, odt == at::kInt
                      ? ": output_dtype int32 returns the raw accumulation; argument 'scale' must be empty"
                      : ": argument 'scale' is required for a dequantised (non-int32) output");
    TORCH_CHECK_VALUE(args.per_token_scale.empty() || odt != at::kInt, kOp, ": argument 'per_token_scale' needs "
                      "'scale' (a dequantised output)");
    TORCH_CHECK_VALUE(args.act_type == cpu::kActNone || (is_float(odt) && !args.per_token_scale.empty()), kOp,
                      ": argument 'act_type' needs per-token quantisation (per_token_scale) and a float output; got "
                      "act_type ", args.act_type);
  }
  TORCH_CHECK_VALUE(args.antiquant_offset.empty() || !args.antiquant_scale.empty(), kOp,
                    ": argument 'antiquant_offset' needs antiquant_scale");

  const bool stacked = args.weight.size() == 1 && args.weight[0].dim() == 3;
  for (size_t i = 0; i < args.weight.size() && !stacked; ++i) {
    TORCH_CHECK_VALUE(args.weight[i].dim() == 2, kOp, ": argument 'weight' must be one [E, K, N] tensor or 2-D "
                      "[K, N] tensors; weight[", i, "] has shape ", args.weight[i].sizes());
  }
  const Experts w{args.weight, stacked, wdt == at::kInt};
  const int64_t E = w.count();

  // Products and outputs.
  std::vector<QProduct> ps;
  std::vector<at::Tensor> xs, outs;  // x as [rows, K] views; outputs as [rows, N] views of the returned tensors
  std::vector<at::Tensor> returned;
  if (args.group_type == -1) {
    TORCH_CHECK_VALUE(!args.group_list.has_value(), kOp, ": argument 'group_list' must be None with group_type -1");
    TORCH_CHECK_VALUE(int64_t(args.x.size()) == E, kOp, ": group_type -1 multiplies x[i] by weight[i]; got ",
                      args.x.size(), " x and ", E, " weights");
    for (int64_t i = 0; i < E; ++i) {
      const at::Tensor& xi = args.x[i];
      TORCH_CHECK_VALUE(xi.dim() >= 2 && xi.size(-1) == w.k(i), kOp, ": x[", i, "] must be [..., K=", w.k(i),
                        "] (>= 2-D); got shape ", xi.sizes());
      std::vector<int64_t> shape(xi.sizes().begin(), xi.sizes().end());
      shape.back() = w.n(i);
      returned.push_back(at::empty(shape, xi.options().dtype(odt)));
      xs.push_back(xi.reshape({-1, w.k(i)}));
      outs.push_back(returned.back().view({-1, w.n(i)}));
      ps.push_back({i, 0, xs.back().size(0), i, i, 0});
    }
  } else {
    TORCH_CHECK_VALUE(args.x.size() == 1 && args.x[0].dim() == 2, kOp, ": group_type 0 takes x as a list of one "
                      "2-D tensor; got ", args.x.size(), " tensors, the first of shape ", args.x[0].sizes());
    TORCH_CHECK_VALUE(args.group_list.has_value() && args.group_list->defined(), kOp,
                      ": argument 'group_list' is required with group_type 0");
    const int64_t K = args.x[0].size(1), N = w.n(0);
    for (int64_t e = 0; e < E; ++e) {
      TORCH_CHECK_VALUE(w.k(e) == K && w.n(e) == N, kOp, ": expert ", e, "'s weight must be [K=", K, ", N", w.int4
                        ? "/8" : "", "=", w.int4 ? N / 8 : N, "]; got ", w[e].sizes());
    }
    ps = split_m_groups(kOp, *args.group_list, args.group_list_type, E, args.x[0].size(0));
    returned.push_back(at::empty({args.x[0].size(0), N}, args.x[0].options().dtype(odt)));
    xs.push_back(args.x[0]);
    outs.push_back(returned[0]);
    // Rows past the groups stay defined: zeros.
    const int64_t covered = ps.empty() ? 0 : ps.back().r0 + ps.back().m;
    if (covered < args.x[0].size(0)) returned[0].narrow(0, covered, args.x[0].size(0) - covered).zero_();
  }
  for (size_t i = 0; i < args.x.size(); ++i) {
    TORCH_CHECK_VALUE(args.x[i].device().is_cpu(), kOp, ": x[", i, "] must be a CPU tensor");
  }

  // Per-token scales: one per x, [rows] (or [rows, 1]) float32.
  std::vector<at::Tensor> pts;
  if (!args.per_token_scale.empty()) {
    TORCH_CHECK_VALUE(args.per_token_scale.size() == xs.size(), kOp, ": argument 'per_token_scale' must hold one "
                      "tensor per x (", xs.size(), "); got ", args.per_token_scale.size());
    for (size_t i = 0; i < xs.size(); ++i) {
      const at::Tensor& p = args.per_token_scale[i];
      TORCH_CHECK_TYPE(p.scalar_type() == at::kFloat, kOp, ": argument 'per_token_scale' must be float32; got ",
                       p.scalar_type());
      TORCH_CHECK_VALUE(p.numel() == xs[i].size(0) && (p.dim() == 1 || (p.dim() == 2 && p.size(1) == 1)), kOp,
                        ": argument 'per_token_scale'[", i, "] must be [", xs[i].size(0), "] (one per row of x); "
                        "got shape ", p.sizes());
      pts.push_back(p.reshape({-1}).contiguous());
    }
  }

  std::vector<Job> jobs;
  for (const auto& p : ps) {
    if (p.m == 0) continue;
    const int64_t n = w.n(p.e);
    Job j{xs[p.xi].narrow(0, p.r0, p.m), w[p.e], outs[p.oi].narrow(0, p.o0, p.m)};
    const at::Tensor b = bias_of(args.bias, w, p.e, n);
    if (w8a8) {
      if (!args.scale.empty()) j.scale = weight_scale(expert_param(kOp, "scale", args.scale, w, p.e), n, p.e);
      if (!pts.empty()) j.pts = pts[p.xi].narrow(0, p.r0, p.m);
      if (b.defined()) {
        if (b.scalar_type() == at::kInt) {
          j.bias_i = b;
        } else {
          TORCH_CHECK_TYPE(is_float(b.scalar_type()) && odt != at::kInt, kOp, ": argument 'bias' must be int32 "
                           "(added to the accumulation)", odt == at::kInt ? "" : " or bfloat16/float16/float32 (added "
                           "after the scales)", " for int8 x; got ", b.scalar_type());
          j.bias_f = b.to(at::kFloat);
        }
      }
    } else {
      const at::Tensor as = expert_param(kOp, "antiquant_scale", args.antiquant_scale, w, p.e);
      const at::Tensor ao = args.antiquant_offset.empty()
          ? at::Tensor() : expert_param(kOp, "antiquant_offset", args.antiquant_offset, w, p.e);
      std::tie(j.aq_scale, j.aq_offset) = antiquant_params(w.k(p.e), n, as, ao, xdt, p.e);
      if (b.defined()) {
        TORCH_CHECK_TYPE(b.scalar_type() == xdt || b.scalar_type() == at::kFloat, kOp, ": argument 'bias' must "
                         "have x's dtype (", xdt, ") or float32; got ", b.scalar_type());
        j.bias = b.to(xdt);
      }
    }
    jobs.push_back(std::move(j));
  }
  if (w8a8) {
    run_w8a8(jobs, args.act_type);
  } else {
    run_weight_only(jobs, w.int4, xdt);
  }
  return returned;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> grouped_matmul_swiglu_quant_cpu(
    const GroupedMatmulSwigluQuantArgs& args) {
  constexpr const char* op = "grouped_matmul_swiglu_quant";
  const at::Tensor &x = args.x, &w = args.weight;
  TORCH_CHECK_TYPE(x.scalar_type() == at::kChar && w.scalar_type() == at::kChar, op, ": arguments 'x' and 'weight' "
                   "must be int8; got ", x.scalar_type(), " and ", w.scalar_type());
  TORCH_CHECK_VALUE(x.dim() == 2, op, ": argument 'x' must be [M, K]; got shape ", x.sizes());
  TORCH_CHECK_VALUE(w.dim() == 3 && w.size(1) == x.size(1) && w.size(2) % 2 == 0, op, ": argument 'weight' must be "
                    "[E, K=", x.size(1), ", N] with N even; got shape ", w.sizes());
  const int64_t M = x.size(0), E = w.size(0), N = w.size(2), H = N / 2;
  TORCH_CHECK_TYPE(args.weight_scale.scalar_type() == at::kFloat || args.weight_scale.scalar_type() == at::kBFloat16,
                   op, ": argument 'weight_scale' must be float32 or bfloat16; got ", args.weight_scale.scalar_type());
  TORCH_CHECK_VALUE(args.weight_scale.dim() == 2 && args.weight_scale.size(0) == E && args.weight_scale.size(1) == N,
                    op, ": argument 'weight_scale' must be [E=", E, ", N=", N, "]; got shape ",
                    args.weight_scale.sizes());
  TORCH_CHECK_TYPE(args.x_scale.scalar_type() == at::kFloat, op, ": argument 'x_scale' must be float32; got ",
                   args.x_scale.scalar_type());
  TORCH_CHECK_VALUE(args.x_scale.dim() == 1 && args.x_scale.size(0) == M, op, ": argument 'x_scale' must be [M=", M,
                    "]; got shape ", args.x_scale.sizes());
  TORCH_CHECK_VALUE(args.group_list_type == 0 || args.group_list_type == 1, op, ": argument 'group_list_type' must "
                    "be 0 (cumulative ends) or 1 (counts); got ", args.group_list_type);
  TORCH_CHECK_VALUE(std::isfinite(args.swiglu_limit) && args.swiglu_limit >= 0, op, ": argument 'swiglu_limit' must ",
                    "be finite and >= 0 (0: no clamping); got ", args.swiglu_limit);
  const float limit = static_cast<float>(args.swiglu_limit);
  const auto groups = split_m_groups(op, args.group_list, args.group_list_type, E, M);
  const at::Tensor ws = args.weight_scale.to(at::kFloat).contiguous();
  const at::Tensor xsc = args.x_scale.contiguous();
  at::Tensor out = at::zeros({M, H}, x.options());
  at::Tensor out_scale = at::zeros({M}, x.options().dtype(at::kFloat));
  const float* xs = xsc.data_ptr<float>();
  float* os = out_scale.data_ptr<float>();
  int8_t* o = out.data_ptr<int8_t>();
  // (group, row chunk) tasks in one parallel region, each a single-threaded GEMM + SwiGLU + quantisation (a row's
  // quantisation needs all its N columns, so tasks split rows, not columns).
  struct Task { int64_t e, r0, m; };
  std::vector<Task> tasks;
  for (const auto& g : groups) {
    for (int64_t r = 0; r < g.m; r += 128) tasks.push_back({g.e, g.r0 + r, std::min<int64_t>(128, g.m - r)});
  }
  const at::ThreadLocalState tls;
  std::atomic<size_t> next{0};
  at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t, int64_t) {
    at::ThreadLocalStateGuard guard(tls);
    std::vector<float> v(H);
    for (size_t t; (t = next.fetch_add(1)) < tasks.size();) {
      const Task& g = tasks[t];
      const at::Tensor acc = cpu::exact_int_mm(x.narrow(0, g.r0, g.m), w[g.e]);
      const int32_t* a = acc.data_ptr<int32_t>();
      const float* s = ws.data_ptr<float>() + g.e * N;
      for (int64_t r = 0; r < g.m; ++r) {
        const int32_t* ar = a + r * N;
        const float xr = xs[g.r0 + r];
        float amax = 0.f;
        for (int64_t j = 0; j < H; ++j) {
          float h = static_cast<float>(ar[j]) * s[j] * xr;
          float gate = static_cast<float>(ar[j + H]) * s[j + H] * xr;
          if (limit > 0.f) {  // clipped_swiglu's clamps: the activated half from above, the other on both sides
            h = std::min(h, limit);
            gate = std::clamp(gate, -limit, limit);
          }
          v[j] = h / (1.f + std::exp(-h)) * gate;
          amax = std::max(amax, std::fabs(v[j]));
        }
        int8_t* dst = o + (g.r0 + r) * H;
        if (!(amax > 0.f)) {  // an all-zero row: zeros, scale 0
          os[g.r0 + r] = 0.f;
          continue;
        }
        const float inv = 127.f / amax;
        for (int64_t j = 0; j < H; ++j) {
          dst[j] = static_cast<int8_t>(std::clamp(std::nearbyint(v[j] * inv), -128.f, 127.f));
        }
        os[g.r0 + r] = amax / 127.f;
      }
    }
  });
  return {out, out_scale, at::zeros({}, x.options().dtype(at::kFloat))};
}

}  // namespace npu_fa
