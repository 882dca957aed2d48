// CPU kernels of moe_finalize_routing (the MoE combine) and its backward.

#include <limits>

#include "cpu/moe/routing_helpers.h"
#include "generated/kernels.h"

namespace npu_fa {

using moe::acc_t;
using moe::row_grain;
using moe::weighted_row_sum;

// ---------------------------------------------------------------------------------------------------------------
// moe_finalize_routing
// ---------------------------------------------------------------------------------------------------------------
namespace {

struct Finalize {
  int64_t N, k, H, R;
  std::vector<int64_t> src;     // per (i, j) at i*k + j: row of expanded or -1
  std::vector<int64_t> expert;  // per (i, j), when bias is given
  at::Tensor rows;              // expanded as contiguous [R, H]
};

Finalize plan_finalize(const char* op, const at::Tensor& expanded, const std::optional<at::Tensor>& skip1,
                       const std::optional<at::Tensor>& skip2, const std::optional<at::Tensor>& bias,
                       const std::optional<at::Tensor>& scales, const at::Tensor& dst_row,
                       const std::optional<at::Tensor>& experts, int64_t drop_pad_mode) {
  moe::check_float(op, "expanded_permuted_rows", expanded);
  TORCH_CHECK_VALUE(expanded.dim() >= 2, op, ": argument 'expanded_permuted_rows' must be [rows, H] (or [E, C, H]); ",
                    "got shape ", expanded.sizes());
  TORCH_CHECK_VALUE(drop_pad_mode >= 0 && drop_pad_mode <= 3, op, ": argument 'drop_pad_mode' must be 0-3 (0/1: ",
                    "column-major pairs j*N+i, 2/3: token-major i*k+j; 1/3 capacity layout); got ", drop_pad_mode);
  moe::check_index(op, "expanded_src_to_dst_row", dst_row);
  Finalize fz;
  fz.H = expanded.size(-1);
  fz.R = expanded.numel() / std::max<int64_t>(fz.H, 1);
  if (skip1.has_value()) fz.N = skip1->size(0);
  else if (scales.has_value()) fz.N = scales->size(0);
  else if (experts.has_value()) fz.N = experts->size(0);
  else TORCH_CHECK_VALUE(false, op, ": one of 'skip1', 'scales' or 'export_for_source_row' is needed to know the ",
                         "token count N");
  const int64_t n = dst_row.numel();
  TORCH_CHECK_VALUE(dst_row.dim() == 1 && (fz.N == 0 ? n == 0 : n % fz.N == 0), op, ": argument ",
                    "'expanded_src_to_dst_row' of shape ", dst_row.sizes(), " must be 1-D [N*k] with N = ", fz.N);
  fz.k = fz.N ? n / fz.N : 0;
  // With no tokens, k is read from the [N, k] arguments so an empty batch gives an empty result.
  if (fz.N == 0 && scales.has_value() && scales->dim() == 2) fz.k = scales->size(1);
  else if (fz.N == 0 && experts.has_value() && experts->dim() == 2) fz.k = experts->size(1);
  for (const auto& [name, t] : {std::pair<const char*, const std::optional<at::Tensor>*>{"skip1", &skip1},
                                {"skip2", &skip2}}) {
    if (!t->has_value()) continue;
    moe::check_same_dtype(op, name, **t, "expanded_permuted_rows", expanded);
    TORCH_CHECK_VALUE((*t)->dim() == 2 && (*t)->size(0) == fz.N && (*t)->size(1) == fz.H, op, ": argument '", name,
                      "' of shape ", (*t)->sizes(), " must be [N, H] = [", fz.N, ", ", fz.H, "]");
  }
  if (scales.has_value()) {
    moe::check_float(op, "scales", *scales);
    TORCH_CHECK_VALUE(scales->dim() == 2 && scales->size(0) == fz.N && scales->size(1) == fz.k, op,
                      ": argument 'scales' of shape ", scales->sizes(), " must be [N, k] = [", fz.N, ", ", fz.k,
                      "] (k = the length ", n, " of 'expanded_src_to_dst_row' / N)");
  }
  const std::vector<int64_t> raw = moe::read_index(dst_row);
  moe::check_destinations(op, "expanded_src_to_dst_row", raw, fz.R, true);
  const bool column_major = drop_pad_mode <= 1;
  fz.src.resize(n);
  for (int64_t i = 0; i < fz.N; ++i)
    for (int64_t j = 0; j < fz.k; ++j) fz.src[i * fz.k + j] = raw[column_major ? j * fz.N + i : i * fz.k + j];
  if (bias.has_value()) {
    moe::check_same_dtype(op, "bias", *bias, "expanded_permuted_rows", expanded);
    TORCH_CHECK_VALUE(bias->dim() == 2 && bias->size(1) == fz.H, op, ": argument 'bias' of shape ", bias->sizes(),
                      " must be [E, H] with H = ", fz.H);
    TORCH_CHECK_VALUE(experts.has_value(), op, ": argument 'export_for_source_row' (the expert of each pair) is ",
                      "required with bias");
    moe::check_index(op, "export_for_source_row", *experts);
    TORCH_CHECK_VALUE(experts->dim() == 2 && experts->size(0) == fz.N && experts->size(1) == fz.k, op,
                      ": argument 'export_for_source_row' of shape ", experts->sizes(), " must be [N, k] = [", fz.N,
                      ", ", fz.k, "]");
    fz.expert = moe::read_index(*experts);
    for (size_t f = 0; f < fz.expert.size(); ++f)
      TORCH_CHECK_VALUE(fz.expert[f] >= 0 && fz.expert[f] < bias->size(0), op, ": argument 'export_for_source_row'[",
                        f, "] = ", fz.expert[f], " is out of range [0, E = bias.size(0) = ", bias->size(0), ")");
  }
  fz.rows = expanded.contiguous();
  return fz;
}

}  // namespace

at::Tensor moe_finalize_routing_cpu(const MoeFinalizeRoutingArgs& args) {
  const char* op = "moe_finalize_routing";
  const Finalize fz = plan_finalize(op, args.expanded_permuted_rows, args.skip1, args.skip2, args.bias, args.scales,
                                    args.expanded_src_to_dst_row,
                                    args.export_for_source_row, args.drop_pad_mode);
  at::Tensor out = at::empty({fz.N, fz.H}, args.expanded_permuted_rows.options());
  if (out.numel() == 0) return out;
  const at::Tensor s1 = args.skip1.has_value() ? args.skip1->contiguous() : at::Tensor();
  const at::Tensor s2 = args.skip2.has_value() ? args.skip2->contiguous() : at::Tensor();
  const at::Tensor bc = args.bias.has_value() ? args.bias->contiguous() : at::Tensor();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, out.scalar_type(), "moe_finalize_routing", [&] {
    using A = acc_t<scalar_t>;
    const at::Tensor w = args.scales.has_value() ? args.scales->to(c10::CppTypeToScalarType<A>::value).contiguous() : at::Tensor();
    auto ptr = [](const at::Tensor& t) { return t.defined() ? t.data_ptr<scalar_t>() : nullptr; };
    weighted_row_sum<scalar_t, A>(fz.rows.data_ptr<scalar_t>(), fz.H, fz.src, w.defined() ? w.data_ptr<A>() : nullptr,
                                  fz.N, fz.k, out.data_ptr<scalar_t>(), ptr(s1), ptr(s2), ptr(bc), &fz.expert);
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> moe_finalize_routing_grad_cpu(
    const MoeFinalizeRoutingGradArgs& args) {
  const char* op = "moe_finalize_routing_grad";
  const Finalize fz = plan_finalize(op, args.expanded_permuted_rows, args.skip1, std::nullopt, args.bias, args.scales,
                                    args.expanded_src_to_dst_row, args.export_for_source_row, args.drop_pad_mode);
  moe::check_float(op, "grad_out", args.grad_out);
  TORCH_CHECK_VALUE(args.grad_out.dim() == 2 && args.grad_out.size(0) == fz.N && args.grad_out.size(1) == fz.H, op,
                    ": argument 'grad_out' of shape ", args.grad_out.sizes(), " must be [N, H] = [", fz.N, ", ", fz.H, "]");
  const auto dt = args.expanded_permuted_rows.scalar_type();
  const at::Tensor g = args.grad_out.to(dt).contiguous();
  at::Tensor d_rows = at::zeros(args.expanded_permuted_rows.sizes(),
                                args.expanded_permuted_rows.options().memory_format(
                                                                    at::MemoryFormat::Contiguous));
  at::Tensor d_skip = g.clone();
  at::Tensor d_scales = args.scales.has_value() ? at::empty({fz.N, fz.k}, args.scales->options()) : at::empty({0}, g.options());
  at::Tensor d_bias = args.bias.has_value() ? at::empty(args.bias->sizes(), args.bias->options()) : at::empty({0}, g.options());
  if (fz.N == 0 || fz.H == 0) {
    if (d_scales.numel()) d_scales.zero_();
    if (d_bias.numel()) d_bias.zero_();
    return {d_rows, d_skip, d_scales, d_bias};
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dt, "moe_finalize_routing_grad", [&] {
    using A = acc_t<scalar_t>;
    const A* wp = nullptr;
    at::Tensor w;
    if (args.scales.has_value()) {
      w = args.scales->to(c10::CppTypeToScalarType<A>::value).contiguous();
      wp = w.data_ptr<A>();
    }
    const at::Tensor bc = args.bias.has_value() ? args.bias->contiguous() : at::Tensor();
    const scalar_t* bp = bc.defined() ? bc.data_ptr<scalar_t>() : nullptr;
    const scalar_t* gp = g.data_ptr<scalar_t>();
    const scalar_t* rp = fz.rows.data_ptr<scalar_t>();
    scalar_t* drp = d_rows.data_ptr<scalar_t>();
    const int64_t N = fz.N, k = fz.k, H = fz.H;
    at::Tensor dsc = at::zeros({N, k}, g.options().dtype(c10::CppTypeToScalarType<A>::value));
    A* dsp = dsc.data_ptr<A>();
    // Rows and scales: pair (i, j) writes only its own row of d_rows (destinations are distinct) and d_scales[i, j].
    at::parallel_for(0, N, row_grain(H * k), [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        for (int64_t j = 0; j < k; ++j) {
          const int64_t r = fz.src[i * k + j];
          if (r < 0) continue;
          const A s = wp ? wp[i * k + j] : A(1);
          const scalar_t* gi = gp + i * H;
          const scalar_t* row = rp + r * H;
          const scalar_t* b = bp ? bp + fz.expert[i * k + j] * H : nullptr;
          A dot = 0;
          for (int64_t h = 0; h < H; ++h) {
            const A gv = static_cast<A>(gi[h]);
            drp[r * H + h] = static_cast<scalar_t>(s * gv);
            dot += gv * (static_cast<A>(row[h]) + (b ? static_cast<A>(b[h]) : A(0)));
          }
          dsp[i * k + j] = dot;
        }
      }
    });
    if (args.scales.has_value()) d_scales.copy_(dsc);
    if (args.bias.has_value()) {  // parallel over column blocks: every thread owns whole columns of d_bias
      const int64_t E = args.bias->size(0);
      at::Tensor db = at::zeros({E, H}, g.options().dtype(c10::CppTypeToScalarType<A>::value));
      A* dbp = db.data_ptr<A>();
      at::parallel_for(0, H, 64, [&](int64_t h0, int64_t h1) {
        for (int64_t i = 0; i < N; ++i)
          for (int64_t j = 0; j < k; ++j) {
            if (fz.src[i * k + j] < 0) continue;
            const A s = wp ? wp[i * k + j] : A(1);
            A* dst = dbp + fz.expert[i * k + j] * H;
            for (int64_t h = h0; h < h1; ++h) dst[h] += s * static_cast<A>(gp[i * H + h]);
          }
      });
      d_bias.copy_(db);
    }
  });
  return {d_rows, d_skip, d_scales, d_bias};
}

}  // namespace npu_fa
