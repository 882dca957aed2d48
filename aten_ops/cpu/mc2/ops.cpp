// MC2 entry points declared in native_functions.yaml: matmul fused with all-gather, reduce-scatter or all-reduce.
//
// The fusion is a software pipeline over row chunks: the collective of chunk c is in flight (asynchronous
// functional collective) while chunk c+1 is multiplied, so communication hides behind compute. Kernels are
// backend-neutral (at::mm + c10d functional collectives through the dispatcher) and are registered for CPU and
// PrivateUse1 alike. With chunks == 1 each op is exactly the unfused computation.
#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>

#include "cpu/mc2/collectives.h"
#include "generated/kernels.h"
#include "generated/op_calls.h"

namespace npu_fa {
namespace {

using mc2::Group;

// Op ids in the cross-rank signature: ranks calling different ops are reported instead of deadlocking.
enum OpId : int64_t { kAllGatherMatmul = 1, kMatmulReduceScatter, kMatmulAllReduce, kGatherForGrad };

// Chunks below this many rows, or collectives below this many bytes, cost more in per-call latency than they hide.
constexpr int64_t kMinChunkRows = 64;
constexpr int64_t kMinChunkBytes = 128 * 1024;
constexpr int64_t kMaxAutoChunks = 4;

int64_t choose_chunks(const char* op, int64_t requested, int64_t rows, int64_t bytes_per_row, int64_t world) {
  TORCH_CHECK_VALUE(requested >= 0, op, ": argument 'chunks' must be >= 0 (0 = automatic); got ", requested);
  if (requested > 0) return std::max<int64_t>(1, std::min(requested, rows));
  if (world == 1) return 1;
  const int64_t by_rows = rows / kMinChunkRows;
  const int64_t by_bytes = rows * bytes_per_row / kMinChunkBytes;
  return std::max<int64_t>(1, std::min({kMaxAutoChunks, by_rows, by_bytes}));
}

// Row range [begin, end) of chunk c out of n over `rows` rows (sizes differ by at most one).
int64_t chunk_begin(int64_t c, int64_t n, int64_t rows) { return c * rows / n; }

void check_matmul_args(const char* op, const at::Tensor& x1, const at::Tensor& x2,
                       const std::optional<at::Tensor>& bias, bool x1_any_rank) {
  if (x1_any_rank) {
    TORCH_CHECK_VALUE(x1.dim() >= 2, op, ": x1 must be [m, k] or [b, s, k]; got shape ", x1.sizes());
  } else {
    TORCH_CHECK_VALUE(x1.dim() == 2, op, ": x1 must be 2-D [m, k]; got shape ", x1.sizes());
  }
  TORCH_CHECK_VALUE(x2.dim() == 2, op, ": x2 must be 2-D [k, n]; got shape ", x2.sizes());
  TORCH_CHECK_VALUE(x1.size(-1) == x2.size(0), op, ": x1's last dim (k = ", x1.size(-1),
                    ") must equal x2's first dim; got x1 of shape ", x1.sizes(), " and x2 of shape ", x2.sizes());
  TORCH_CHECK_VALUE(at::isFloatingType(x1.scalar_type()), op, ": x1 must be a floating-point tensor; got ",
                    x1.scalar_type());
  TORCH_CHECK_VALUE(x2.scalar_type() == x1.scalar_type(), op, ": x2's dtype (", x2.scalar_type(),
                    ") must equal x1's (", x1.scalar_type(), ")");
  if (bias.has_value()) {
    TORCH_CHECK_VALUE(bias->dim() == 1 && bias->size(0) == x2.size(1), op, ": bias must be 1-D of size n = ",
                      x2.size(1), " (x2's last dim); got shape ", bias->sizes());
    TORCH_CHECK_VALUE(bias->scalar_type() == x1.scalar_type(), op, ": bias's dtype (", bias->scalar_type(),
                      ") must equal x1's (", x1.scalar_type(), ")");
  }
}

// What every rank must agree on; fixed length so the signature all-gather itself never mismatches.
mc2::Signature signature(OpId id, at::ScalarType dtype, const char* rows_name, int64_t rows, const char* cols_name,
                         int64_t cols, int64_t chunks, bool has_bias) {
  return {{"the op called", "the dtype of x1", rows_name, cols_name, "argument 'chunks'", "whether bias is given"},
          {id, static_cast<int64_t>(dtype), rows, cols, chunks, has_bias ? 1 : 0}};
}

void write_matmul(at::Tensor out, const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& bias) {
  if (bias.has_value()) at::addmm_out(out, *bias, a, b);
  else at::mm_out(out, a, b);
}

std::tuple<at::Tensor, at::Tensor> all_gather_matmul_impl(const char* op, const at::Tensor& x1, const at::Tensor& x2,
                                                          const Group& g, const std::optional<at::Tensor>& bias,
                                                          bool gather_output, int64_t chunks) {
  const int64_t m = x1.size(0), k = x1.size(1), n = x2.size(1), W = g.size;
  const int64_t C = choose_chunks(op, chunks, m, k * x1.element_size() * W, W);
  mc2::validate_across_ranks(op, g, signature(kAllGatherMatmul, x1.scalar_type(), "x1.shape[0]", m, "x1.shape[1]",
                                              k, C, bias.has_value()));
  at::Tensor out = at::empty({W * m, n}, x1.options());
  at::Tensor gathered = at::empty({gather_output ? W * m : 0, k}, x1.options());
  // All gathers are queued first: the gather of chunk c+1 proceeds while chunk c is multiplied.
  std::vector<at::Tensor> pending;
  for (int64_t c = 0; c < C; ++c)
    pending.push_back(mc2::all_gather_async(x1.slice(0, chunk_begin(c, C, m), chunk_begin(c + 1, C, m)), g));
  for (int64_t c = 0; c < C; ++c) {
    const int64_t b = chunk_begin(c, C, m), rows = chunk_begin(c + 1, C, m) - b;
    const at::Tensor part = mc2::wait(pending[c], g);  // [W * rows, k], rank-major
    for (int64_t r = 0; r < W; ++r) {
      const at::Tensor src = part.slice(0, r * rows, (r + 1) * rows);
      write_matmul(out.slice(0, r * m + b, r * m + b + rows), src, x2, bias);
      if (gather_output) gathered.slice(0, r * m + b, r * m + b + rows).copy_(src);
    }
  }
  return {out, gathered};
}

at::Tensor matmul_reduce_scatter_impl(const char* op, const at::Tensor& x1, const at::Tensor& x2, const Group& g,
                                      const std::optional<at::Tensor>& bias, int64_t chunks) {
  const int64_t m = x1.size(0), n = x2.size(1), W = g.size;
  TORCH_CHECK_VALUE(m % W == 0, op, ": x1's first dim (m = ", m, ") must be divisible by world_size (", W,
                    "): reduce-scatter gives each rank m / world_size rows");
  const int64_t local = m / W;
  const int64_t C = choose_chunks(op, chunks, local, n * x1.element_size() * W, W);
  mc2::validate_across_ranks(op, g, signature(kMatmulReduceScatter, x1.scalar_type(), "x1.shape[0]", m,
                                              "x2.shape[1]", n, C, bias.has_value()));
  // Chunk c holds rows [b, e) of every rank's output block: it reduce-scatters into rows [b, e) of ours.
  std::vector<at::Tensor> pending;
  for (int64_t c = 0; c < C; ++c) {
    const int64_t b = chunk_begin(c, C, local), rows = chunk_begin(c + 1, C, local) - b;
    at::Tensor partial = at::empty({W * rows, n}, x1.options());
    for (int64_t r = 0; r < W; ++r) {
      at::Tensor dst = partial.slice(0, r * rows, (r + 1) * rows);
      at::mm_out(dst, x1.slice(0, r * local + b, r * local + b + rows), x2);
    }
    pending.push_back(mc2::reduce_scatter_async(partial, g));
  }
  at::Tensor out = at::empty({local, n}, x1.options());
  for (int64_t c = 0; c < C; ++c) {
    at::Tensor dst = out.slice(0, chunk_begin(c, C, local), chunk_begin(c + 1, C, local));
    const at::Tensor summed = mc2::wait(pending[c], g);
    // The bias is added once, after the reduction (the bias of a row-parallel Linear).
    if (bias.has_value()) at::add_out(dst, summed, *bias);
    else dst.copy_(summed);
  }
  return out;
}

// Multiplies row chunks of x1 [m, k], adds this rank's x3 [m, n] (if given) to each and all-reduces it while the
// next one is multiplied; `finish(b, e, summed)` consumes the chunk of rows [b, e) as soon as its reduction is
// complete. Ranks may differ on whether they pass x3 (each adds its own share), so it is not part of the signature.
template <typename Finish>
void matmul_all_reduce_chunks(const char* op, const at::Tensor& x1, const at::Tensor& x2,
                              const std::optional<at::Tensor>& x3, const Group& g, bool has_bias, int64_t chunks,
                              Finish finish) {
  const int64_t m = x1.size(0), n = x2.size(1);
  const int64_t C = choose_chunks(op, chunks, m, n * x1.element_size(), g.size);
  mc2::validate_across_ranks(op, g, signature(kMatmulAllReduce, x1.scalar_type(), "the rows of x1", m,
                                              "x2.shape[1]", n, C, has_bias));
  std::vector<at::Tensor> pending;
  for (int64_t c = 0; c < C; ++c) {
    const int64_t b = chunk_begin(c, C, m), e = chunk_begin(c + 1, C, m);
    at::Tensor part = at::mm(x1.slice(0, b, e), x2);
    if (x3.has_value()) part.add_(x3->slice(0, b, e));
    pending.push_back(mc2::all_reduce_async(part, g));
  }
  for (int64_t c = 0; c < C; ++c)
    finish(chunk_begin(c, C, m), chunk_begin(c + 1, C, m), mc2::wait(pending[c], g));
}

// x3 of matmul_all_reduce(_add_rms_norm): the output's shape and x1's dtype; returned as [rows, n].
std::optional<at::Tensor> check_x3(const char* op, const std::optional<at::Tensor>& x3, const at::Tensor& x1,
                                   const std::vector<int64_t>& shape) {
  if (!x3.has_value()) return std::nullopt;
  TORCH_CHECK_VALUE(x3->sizes() == at::IntArrayRef(shape), op, ": x3 must have the output's shape ",
                    at::IntArrayRef(shape), " (x1's leading dims, x2's last dim); got ", x3->sizes());
  TORCH_CHECK_VALUE(x3->scalar_type() == x1.scalar_type(), op, ": x3's dtype (", x3->scalar_type(),
                    ") must equal x1's (", x1.scalar_type(), ")");
  return x3->reshape({-1, shape.back()});
}

std::vector<int64_t> output_shape(const at::Tensor& x1, int64_t n) {
  std::vector<int64_t> shape(x1.sizes().begin(), x1.sizes().end());
  shape.back() = n;
  return shape;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> all_gather_matmul_mc2(const AllGatherMatmulArgs& args) {
  const char* op = "all_gather_matmul";
  check_matmul_args(op, args.x1, args.x2, args.bias, false);
  TORCH_CHECK_VALUE(args.gather_index == 0, op,
                    ": argument 'gather_index' must be 0 (gather x1, as torch_npu supports); got ",
                    args.gather_index);
  const Group g = mc2::resolve_group(op, args.group_name, args.world_size, args.x1.device());
  return all_gather_matmul_impl(op, args.x1, args.x2, g, args.bias, args.gather_output, args.chunks);
}

at::Tensor matmul_reduce_scatter_mc2(const MatmulReduceScatterArgs& args) {
  const char* op = "matmul_reduce_scatter";
  check_matmul_args(op, args.x1, args.x2, args.bias, false);
  const Group g = mc2::resolve_group(op, args.group_name, args.world_size, args.x1.device());
  return matmul_reduce_scatter_impl(op, args.x1, args.x2, g, args.bias, args.chunks);
}

at::Tensor matmul_all_reduce_mc2(const MatmulAllReduceArgs& args) {
  const char* op = "matmul_all_reduce";
  check_matmul_args(op, args.x1, args.x2, args.bias, true);
  const std::vector<int64_t> shape = output_shape(args.x1, args.x2.size(1));
  const std::optional<at::Tensor> x3 = check_x3(op, args.x3, args.x1, shape);
  const Group g = mc2::resolve_group(op, args.group_name, -1, args.x1.device());
  const at::Tensor a = args.x1.reshape({-1, args.x1.size(-1)});
  at::Tensor out = at::empty({a.size(0), args.x2.size(1)}, args.x1.options());
  matmul_all_reduce_chunks(op, a, args.x2, x3, g, args.bias.has_value(), args.chunks,
                           [&](int64_t b, int64_t e, const at::Tensor& s) {
    at::Tensor dst = out.slice(0, b, e);
    if (args.bias.has_value()) at::add_out(dst, s, *args.bias);
    else dst.copy_(s);
  });
  return out.view(shape);
}

std::tuple<at::Tensor, at::Tensor> matmul_all_reduce_add_rms_norm_mc2(const MatmulAllReduceAddRmsNormArgs& args) {
  const char* op = "matmul_all_reduce_add_rms_norm";
  check_matmul_args(op, args.x1, args.x2, args.bias, true);
  const std::vector<int64_t> shape = output_shape(args.x1, args.x2.size(1));
  TORCH_CHECK_VALUE(args.residual.sizes() == at::IntArrayRef(shape), op, ": residual must have the output's shape ",
                    at::IntArrayRef(shape), " (x1's leading dims, x2's last dim); got ", args.residual.sizes());
  TORCH_CHECK_VALUE(args.gamma.dim() == 1 && args.gamma.size(0) == args.x2.size(1), op,
                    ": gamma must be 1-D of size n = ",
                    args.x2.size(1), "; got shape ", args.gamma.sizes());
  TORCH_CHECK_VALUE(args.residual.scalar_type() == args.x1.scalar_type() && args.gamma.scalar_type() == args.x1.scalar_type(), op,
                    ": residual (", args.residual.scalar_type(), ") and gamma (", args.gamma.scalar_type(),
                    ") must have x1's dtype (", args.x1.scalar_type(), ")");
  TORCH_CHECK_VALUE(args.epsilon > 0 && std::isfinite(args.epsilon), op, ": argument 'epsilon' must be finite and > 0; got ",
                    args.epsilon);
  const std::optional<at::Tensor> x3 = check_x3(op, args.x3, args.x1, shape);
  const Group g = mc2::resolve_group(op, args.group_name, -1, args.x1.device());
  const at::Tensor a = args.x1.reshape({-1, args.x1.size(-1)});
  const at::Tensor res = args.residual.reshape({-1, args.x2.size(1)});
  at::Tensor y = at::empty({a.size(0), args.x2.size(1)}, args.x1.options());
  at::Tensor normed = at::empty_like(y);
  const at::ScalarType acc = args.x1.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const at::Tensor gamma_acc = args.gamma.to(acc);
  // Residual add and RMSNorm of chunk c run while the all-reduces of later chunks are still in flight.
  matmul_all_reduce_chunks(op, a, args.x2, x3, g, args.bias.has_value(), args.chunks,
                           [&](int64_t b, int64_t e, const at::Tensor& s) {
    at::Tensor h = s.to(acc) + res.slice(0, b, e).to(acc);
    if (args.bias.has_value()) h.add_(args.bias->to(acc));
    y.slice(0, b, e).copy_(h);
    // The norm family's rms_norm (one RMSNorm row routine for every CPU kernel), through the dispatcher so that
    // each device runs its own kernel.
    RmsNormValues norm;
    norm.x = h;
    norm.gamma = gamma_acc;
    norm.epsilon = args.epsilon;
    normed.slice(0, b, e).copy_(std::get<0>(call_rms_norm(norm.args())));
  });
  return {y.view(shape), normed.view(shape)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> all_gather_matmul_grad_mc2(const AllGatherMatmulGradArgs& args) {
  const char* op = "all_gather_matmul_grad";
  check_matmul_args(op, args.x1, args.x2, args.bias, false);
  const Group g = mc2::resolve_group(op, args.group_name, args.world_size, args.x1.device());
  TORCH_CHECK_VALUE(args.grad_out.dim() == 2 && args.grad_out.size(0) == g.size * args.x1.size(0) && args.grad_out.size(1) == args.x2.size(1),
                    op, ": grad_out must be [world_size * m, n] = [", g.size * args.x1.size(0), ", ", args.x2.size(1),
                    "]; got shape ", args.grad_out.sizes());
  const bool regather = args.gather_out.numel() == 0 && args.x1.numel() != 0;
  if (regather) {
    mc2::validate_across_ranks(op, g, signature(kGatherForGrad, args.x1.scalar_type(), "x1.shape[0]", args.x1.size(0),
                                                "x1.shape[1]", args.x1.size(1), 1, false));
  }
  // The forward did not keep the gathered x1: gather it again, overlapped with the reduce-scatter below.
  const at::Tensor pending = regather ? mc2::all_gather_async(args.x1, g) : at::Tensor();
  const at::Tensor dx1 = matmul_reduce_scatter_impl(op, args.grad_out, args.x2.t(), g, std::nullopt, args.chunks);
  const at::Tensor gathered = regather ? mc2::wait(pending, g) : args.gather_out;
  const at::Tensor dx2 = at::mm(gathered.t(), args.grad_out);
  const at::Tensor dbias = args.bias.has_value() ? args.grad_out.sum(0) : at::empty({0}, args.x1.options());
  return {dx1, dx2, dbias};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> matmul_reduce_scatter_grad_mc2(const MatmulReduceScatterGradArgs& args) {
  const char* op = "matmul_reduce_scatter_grad";
  check_matmul_args(op, args.x1, args.x2, args.bias, false);
  const Group g = mc2::resolve_group(op, args.group_name, args.world_size, args.x1.device());
  TORCH_CHECK_VALUE(args.grad_out.dim() == 2 && args.grad_out.size(0) * g.size == args.x1.size(0) && args.grad_out.size(1) == args.x2.size(1),
                    op, ": grad_out must be [m / world_size, n] = [", args.x1.size(0) / g.size, ", ", args.x2.size(1),
                    "]; got shape ", args.grad_out.sizes());
  // The dual op: all-gather the output gradient while multiplying it by x2ᵀ chunk by chunk.
  auto [dx1, full_grad] = all_gather_matmul_impl(op, args.grad_out, args.x2.t(), g, std::nullopt, true, args.chunks);
  const at::Tensor dx2 = at::mm(args.x1.t(), full_grad);
  // The bias is one parameter shared by the group: its gradient is the group total, identical on every rank.
  const at::Tensor dbias = args.bias.has_value() ? full_grad.sum(0) : at::empty({0}, args.x1.options());
  return {dx1, dx2, dbias};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> matmul_all_reduce_grad_mc2(
    const MatmulAllReduceGradArgs& args) {
  const char* op = "matmul_all_reduce_grad";
  check_matmul_args(op, args.x1, args.x2, args.bias, true);
  const std::vector<int64_t> shape = output_shape(args.x1, args.x2.size(1));
  TORCH_CHECK_VALUE(args.grad_out.sizes() == at::IntArrayRef(shape), op, ": grad_out must have the output's shape ",
                    at::IntArrayRef(shape), "; got ", args.grad_out.sizes());
  check_x3(op, args.x3, args.x1, shape);
  // Local: the all-reduce's backward is the identity on a loss every rank computes alike.
  const at::Tensor g = args.grad_out.reshape({-1, args.x2.size(1)});
  const at::Tensor dx1 = at::mm(g, args.x2.t()).view(args.x1.sizes());
  const at::Tensor dx2 = at::mm(args.x1.reshape({-1, args.x1.size(-1)}).t(), g);
  const at::Tensor dbias = args.bias.has_value() ? g.sum(0) : at::empty({0}, args.x1.options());
  // x3 is added before the reduction: under the same convention its gradient is grad_out itself.
  const at::Tensor dx3 = args.x3.has_value() ? args.grad_out.clone() : at::empty({0}, args.x1.options());
  return {dx1, dx2, dbias, dx3};
}

bool mc2_validation(int64_t enable) {
  TORCH_CHECK_VALUE(enable >= -1 && enable <= 1, "mc2_validation: argument 'enable' must be -1 (query), 0 or 1; got ",
                    enable);
  if (enable >= 0) mc2::set_validation(enable == 1);
  return mc2::validation_enabled();
}

}  // namespace npu_fa
