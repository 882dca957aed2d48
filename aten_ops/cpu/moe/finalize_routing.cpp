// CPU kernels of moe_finalize_routing (the MoE combine) and its backward.

#include <limits>

#include "common/moe/finalize.h"
#include "cpu/moe/routing_helpers.h"
#include "generated/kernels.h"

namespace npu_fa {

using moe::acc_t;
using moe::row_grain;
using moe::weighted_row_sum;

// ---------------------------------------------------------------------------------------------------------------
// moe_finalize_routing
// ---------------------------------------------------------------------------------------------------------------

at::Tensor moe_finalize_routing_cpu(const MoeFinalizeRoutingArgs& args) {
  const char* op = "moe_finalize_routing";
  const moe::FinalizePlan fz =
      moe::plan_finalize(op, args.expanded_permuted_rows, args.skip1, args.skip2, args.bias, args.scales,
                         args.expanded_src_to_dst_row, args.export_for_source_row, args.drop_pad_mode);
  at::Tensor out = at::empty({fz.N, fz.H}, args.expanded_permuted_rows.options());
  if (out.numel() == 0) return out;
  const at::Tensor s1 = args.skip1.has_value() ? args.skip1->contiguous() : at::Tensor();
  const at::Tensor s2 = args.skip2.has_value() ? args.skip2->contiguous() : at::Tensor();
  const at::Tensor bc = args.bias.has_value() ? args.bias->contiguous() : at::Tensor();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, out.scalar_type(), "moe_finalize_routing", [&] {
    using A = acc_t<scalar_t>;
    const at::Tensor w = args.scales.has_value() ? args.scales->to(c10::CppTypeToScalarType<A>::value).contiguous() : at::Tensor();
    auto ptr = [](const at::Tensor& t) { return t.defined() ? t.data_ptr<scalar_t>() : nullptr; };
    const at::Tensor rows = args.expanded_permuted_rows.contiguous();
    weighted_row_sum<scalar_t, A>(rows.data_ptr<scalar_t>(), fz.H, fz.src, w.defined() ? w.data_ptr<A>() : nullptr,
                                  fz.N, fz.k, out.data_ptr<scalar_t>(), ptr(s1), ptr(s2), ptr(bc), &fz.expert);
  });
  return out;
}

namespace {

// d_rows[r] = sum of scales[i, j] * grad_out[i] over the pairs (i, j) that read row r, for an index that names some
// row more than once: summed in the accumulation type, parallel over column blocks (each thread owns whole columns,
// and adds the pairs in the same order on every run: deterministic).
template <typename scalar_t, typename A>
void accumulate_row_grads(const moe::FinalizePlan& fz, const scalar_t* gp, const A* wp, at::Tensor& d_rows) {
  const int64_t N = fz.N, k = fz.k, H = fz.H;
  at::Tensor acc = at::zeros({fz.R, H}, d_rows.options().dtype(c10::CppTypeToScalarType<A>::value));
  A* ap = acc.data_ptr<A>();
  at::parallel_for(0, H, 64, [&](int64_t h0, int64_t h1) {
    for (int64_t i = 0; i < N; ++i)
      for (int64_t j = 0; j < k; ++j) {
        const int64_t r = fz.src[i * k + j];
        if (r < 0) continue;
        const A s = wp ? wp[i * k + j] : A(1);
        for (int64_t h = h0; h < h1; ++h) ap[r * H + h] += s * static_cast<A>(gp[i * H + h]);
      }
  });
  d_rows.view({fz.R, H}).copy_(acc);
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> moe_finalize_routing_grad_cpu(
    const MoeFinalizeRoutingGradArgs& args) {
  const char* op = "moe_finalize_routing_grad";
  const moe::FinalizePlan fz =
      moe::plan_finalize(op, args.expanded_permuted_rows, args.skip1, std::nullopt, args.bias, args.scales,
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
    const at::Tensor rows = args.expanded_permuted_rows.contiguous();
    const scalar_t* rp = rows.data_ptr<scalar_t>();
    scalar_t* drp = d_rows.data_ptr<scalar_t>();
    const int64_t N = fz.N, k = fz.k, H = fz.H;
    at::Tensor dsc = at::zeros({N, k}, g.options().dtype(c10::CppTypeToScalarType<A>::value));
    A* dsp = dsc.data_ptr<A>();
    // Scales, and the rows when every row is read by one pair: pair (i, j) writes only d_scales[i, j] and its own
    // row of d_rows. Rows read by several pairs are summed afterwards (accumulate_row_grads).
    const bool own_rows = !fz.repeated_rows;
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
            if (own_rows) drp[r * H + h] = static_cast<scalar_t>(s * gv);
            dot += gv * (static_cast<A>(row[h]) + (b ? static_cast<A>(b[h]) : A(0)));
          }
          dsp[i * k + j] = dot;
        }
      }
    });
    if (!own_rows) accumulate_row_grads<scalar_t, A>(fz, gp, wp, d_rows);
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
