// CPU kernels of the Megatron-style moe_token_permute / moe_token_unpermute and their backwards.

#include <limits>

#include "cpu/moe/routing_helpers.h"
#include "generated/kernels.h"

namespace npu_fa {

using moe::acc_t;
using moe::row_grain;
using moe::expert_buckets;
using moe::weighted_row_sum;
using moe::check_rows2d;

// ---------------------------------------------------------------------------------------------------------------
// moe_token_permute / moe_token_unpermute
// ---------------------------------------------------------------------------------------------------------------
namespace {

int64_t topk_of(const at::Tensor& indices) { return indices.dim() == 2 ? indices.size(1) : 1; }

int64_t kept_rows(int64_t n, std::optional<int64_t> num_out_tokens) {
  const int64_t v = num_out_tokens.value_or(0);
  if (v == 0) return n;
  return v > 0 ? std::min(v, n) : std::max<int64_t>(n + v, 0);
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> moe_token_permute_cpu(const MoeTokenPermuteArgs& args) {
  const char* op = "moe_token_permute";
  TORCH_CHECK_VALUE(!args.padded_mode, op,
                    ": argument 'padded_mode' must be False (padded mode is not implemented, as in ",
                    "CANN)");
  check_rows2d(op, "tokens", args.tokens);
  moe::check_index(op, "indices", args.indices);
  TORCH_CHECK_VALUE((args.indices.dim() == 1 || args.indices.dim() == 2) && args.indices.size(0) == args.tokens.size(0), op,
                    ": argument 'indices' of shape ", args.indices.sizes(), " must be [N, topk] or [N] with N = ",
                    "tokens.size(0) = ", args.tokens.size(0));
  const int64_t n = args.indices.numel(), R = kept_rows(n, args.num_out_tokens), topk = topk_of(args.indices);
  TORCH_CHECK_VALUE(topk <= 1024, op, ": argument 'indices' has topk = ", topk, "; at most 1024 is supported");
  const std::vector<int64_t> experts = moe::read_index(args.indices);
  const moe::KeySort s = moe::counting_sort(experts, expert_buckets(op, "indices", experts));
  at::Tensor sorted = at::empty({n}, args.indices.options().dtype(at::kInt));
  int32_t* sp = sorted.data_ptr<int32_t>();
  std::vector<int64_t> src(R);
  for (int64_t p = 0; p < n; ++p) {
    sp[s.order[p]] = static_cast<int32_t>(p);
    if (p < R) src[p] = s.order[p] / topk;
  }
  at::Tensor permuted = at::empty({R, args.tokens.size(1)}, args.tokens.options());
  moe::gather_rows(args.tokens.contiguous(), permuted, src);
  return {permuted, sorted};
}

at::Tensor moe_token_permute_grad_cpu(const MoeTokenPermuteGradArgs& args) {
  const char* op = "moe_token_permute_grad";
  moe::check_float(op, "grad_permuted_tokens", args.grad_permuted_tokens);
  check_rows2d(op, "grad_permuted_tokens", args.grad_permuted_tokens);
  moe::check_index(op, "sorted_indices", args.sorted_indices);
  const int64_t N = args.indices.size(0), topk = topk_of(args.indices), n = N * topk, R = args.grad_permuted_tokens.size(0);
  const int64_t H = args.grad_permuted_tokens.size(1);
  TORCH_CHECK_VALUE(args.sorted_indices.numel() == n, op, ": argument 'sorted_indices' must have N*topk = ", n,
                    " entries; got ", args.sorted_indices.numel());
  std::vector<int64_t> src = moe::read_index(args.sorted_indices);
  moe::check_destinations(op, "sorted_indices", src, n, false);
  for (auto& r : src)
    if (r >= R) r = -1;  // dropped by num_out_tokens
  const at::Tensor g = args.grad_permuted_tokens.contiguous();
  at::Tensor dt = at::empty({N, H}, g.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, g.scalar_type(), "moe_token_permute_grad", [&] {
    weighted_row_sum<scalar_t, float>(g.data_ptr<scalar_t>(), H, src, nullptr, N, topk, dt.data_ptr<scalar_t>(),
                                      nullptr, nullptr, nullptr, nullptr);
  });
  return dt;
}

namespace {

struct Unpermute {
  int64_t N, topk, R, H;
  std::vector<int64_t> src;  // per pair: row of permuted_tokens or -1 (dropped)
};

Unpermute plan_unpermute(const char* op, const at::Tensor& permuted, const at::Tensor& sorted_indices,
                         const std::optional<at::Tensor>& probs, bool padded_mode) {
  TORCH_CHECK_VALUE(!padded_mode, op, ": argument 'padded_mode' must be False (padded mode is not implemented, as in ",
                    "CANN)");
  moe::check_float(op, "permuted_tokens", permuted);
  check_rows2d(op, "permuted_tokens", permuted);
  moe::check_index(op, "sorted_indices", sorted_indices);
  TORCH_CHECK_VALUE(sorted_indices.dim() == 1, op, ": argument 'sorted_indices' must be 1-D [N*topk]; got shape ",
                    sorted_indices.sizes());
  Unpermute u;
  const int64_t n = sorted_indices.numel();
  u.topk = probs.has_value() ? probs->size(-1) : 1;
  if (probs.has_value()) {
    moe::check_float(op, "probs", *probs);
    TORCH_CHECK_VALUE(probs->dim() == 2 && probs->numel() == n, op, ": argument 'probs' of shape ", probs->sizes(),
                      " must be [N, topk] with N*topk = sorted_indices.numel() = ", n);
  }
  u.N = u.topk ? n / u.topk : 0;
  u.R = permuted.size(0);
  u.H = permuted.size(1);
  TORCH_CHECK_VALUE(u.R <= n, op, ": argument 'permuted_tokens' has ", u.R, " rows, more than the ", n,
                    " (token, expert) pairs of sorted_indices");
  u.src = moe::read_index(sorted_indices);
  // -1 marks a pair routed nowhere (moe_init_routing_v2's index of a pair outside active_expert_range): it
  // contributes nothing, as a pair dropped by num_out_tokens does.
  moe::check_destinations(op, "sorted_indices", u.src, n, true);
  for (auto& r : u.src)
    if (r >= u.R) r = -1;
  return u;
}

}  // namespace

at::Tensor moe_token_unpermute_cpu(const MoeTokenUnpermuteArgs& args) {
  const char* op = "moe_token_unpermute";
  const Unpermute u = plan_unpermute(op, args.permuted_tokens, args.sorted_indices, args.probs, args.padded_mode);
  at::Tensor out = at::empty({u.N, u.H}, args.permuted_tokens.options());
  if (out.numel() == 0) return out;
  const at::Tensor pc = args.permuted_tokens.contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, pc.scalar_type(), "moe_token_unpermute", [&] {
    using A = acc_t<scalar_t>;
    const at::Tensor w = args.probs.has_value() ? args.probs->to(c10::CppTypeToScalarType<A>::value).contiguous() : at::Tensor();
    weighted_row_sum<scalar_t, A>(pc.data_ptr<scalar_t>(), u.H, u.src, w.defined() ? w.data_ptr<A>() : nullptr, u.N,
                                  u.topk, out.data_ptr<scalar_t>(), nullptr, nullptr, nullptr, nullptr);
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor> moe_token_unpermute_grad_cpu(const MoeTokenUnpermuteGradArgs& args) {
  const char* op = "moe_token_unpermute_grad";
  const Unpermute u = plan_unpermute(op, args.permuted_tokens, args.sorted_indices, args.probs, args.padded_mode);
  moe::check_float(op, "grad_unpermuted_tokens", args.grad_unpermuted_tokens);
  TORCH_CHECK_VALUE(args.grad_unpermuted_tokens.dim() == 2 && args.grad_unpermuted_tokens.size(0) == u.N &&
                        args.grad_unpermuted_tokens.size(1) == u.H,
                    op, ": argument 'grad_unpermuted_tokens' of shape ", args.grad_unpermuted_tokens.sizes(),
                    " must be [N, H] = [", u.N, ", ", u.H, "]");
  const auto dt = args.permuted_tokens.scalar_type();
  const at::Tensor g = args.grad_unpermuted_tokens.to(dt).contiguous();
  // The rows are read only for grad_probs: without probs, permuted_tokens may be a storage-free stand-in of the
  // right shape (autograd does not keep the rows alive then).
  const bool with_probs = args.probs.has_value();
  const at::Tensor pc = with_probs ? args.permuted_tokens.contiguous() : at::Tensor();
  at::Tensor d_perm = at::zeros({u.R, u.H}, args.permuted_tokens.options());
  at::Tensor d_probs = args.probs.has_value() ? at::empty(args.probs->sizes(), args.probs->options()) : at::empty({0}, g.options());
  if (u.N == 0 || u.H == 0) {
    if (d_probs.numel()) d_probs.zero_();
    return {d_perm, d_probs};
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dt, "moe_token_unpermute_grad", [&] {
    using A = acc_t<scalar_t>;
    const at::Tensor w = args.probs.has_value() ? args.probs->to(c10::CppTypeToScalarType<A>::value).contiguous() : at::Tensor();
    const A* wp = w.defined() ? w.data_ptr<A>() : nullptr;
    at::Tensor dpr = at::zeros({u.N, u.topk}, g.options().dtype(c10::CppTypeToScalarType<A>::value));
    A* dpp = dpr.data_ptr<A>();
    const scalar_t* gp = g.data_ptr<scalar_t>();
    const scalar_t* rp = with_probs ? pc.data_ptr<scalar_t>() : nullptr;
    scalar_t* dp = d_perm.data_ptr<scalar_t>();
    const int64_t H = u.H, k = u.topk;
    at::parallel_for(0, u.N, row_grain(H * k), [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t)
        for (int64_t j = 0; j < k; ++j) {
          const int64_t r = u.src[t * k + j];
          if (r < 0) continue;
          const A s = wp ? wp[t * k + j] : A(1);
          A dot = 0;
          for (int64_t h = 0; h < H; ++h) {
            const A gv = static_cast<A>(gp[t * H + h]);
            dp[r * H + h] = static_cast<scalar_t>(s * gv);
            if (rp) dot += gv * static_cast<A>(rp[r * H + h]);
          }
          dpp[t * k + j] = dot;
        }
    });
    if (args.probs.has_value()) d_probs.copy_(dpr);
  });
  return {d_perm, d_probs};
}

}  // namespace npu_fa
