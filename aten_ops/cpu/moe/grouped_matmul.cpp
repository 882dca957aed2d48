// CPU entry points of grouped_matmul and grouped_matmul_grad (native_functions.yaml).
//
// Every call is lowered to a list of independent products  pre_i = a_i · b_i + bias_i,  out_i = act(pre_i)
// over 2-D views of the inputs and outputs:
//   group_type -1  the (x_i, weight_i) pairs of the lists;
//   group_type  0  rows [start_e, end_e) of x times weight[e], written to the same rows of out;
//   group_type  2  columns K_e of x times rows K_e of weight, written to out[e] (the weight-gradient form).
// The backward is lowered the same way (transposed views, no epilogue). run_products() runs big products whole
// (the GEMM is threaded) and cuts the others into (row chunk, column tile) tasks, balances them over the threads by FLOPs and runs each task on one thread with
// at::cpu::mm_out (MKL / oneDNN, fp32 accumulation; called directly, not through the dispatcher, because worker
// threads do not inherit the caller's dispatcher state). A few large groups thus keep every core busy, and many
// small groups cost one parallel region instead of one threaded GEMM each.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/ops/mm_cpu_dispatch.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "common/checked_math.h"
#include "cpu/moe/grouped_matmul_kernels.h"
#include "generated/kernels.h"

namespace npu_fa {
namespace {

using cpu::Block;

// ---- Products and their parallel execution. ----

struct Product {
  at::Tensor a, b;               // [m, k] and [k, n] views (any strides ATen's GEMM accepts)
  at::Tensor pre, out;           // [m, n] views with unit column stride; the same tensor without activation
  const char* bias = nullptr;    // [n] in the accumulation type (fp32, fp64 for float64) or null
};

struct Task {
  int64_t product, m0, m1, n0, n1;
  double cost;
};

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Cuts each product into about `pieces` = cost / target tasks: column tiles first (the GEMM keeps long row runs),
// then row chunks when the columns alone cannot make enough pieces. k == 0 products are one task (a fill).
std::vector<Task> make_tasks(const std::vector<Product>& ps, int64_t threads) {
  double total = 0;
  for (const auto& p : ps) total += double(p.pre.size(0)) * p.pre.size(1) * std::max<int64_t>(p.a.size(1), 1);
  const double target = total / double(threads * 4);
  std::vector<Task> tasks;
  for (int64_t i = 0; i < int64_t(ps.size()); ++i) {
    const int64_t m = ps[i].pre.size(0), n = ps[i].pre.size(1), k = ps[i].a.size(1);
    if (m == 0 || n == 0) continue;
    const double cost = double(m) * n * std::max<int64_t>(k, 1);
    int64_t pieces = threads == 1 || k == 0 ? 1 : std::max<int64_t>(1, int64_t(cost / target + 0.5));
    const int64_t n_tiles = std::min(pieces, ceil_div(n, 64));
    const int64_t tile_n = std::min(n, (ceil_div(n, n_tiles) + 15) / 16 * 16);
    const int64_t m_chunks = std::max<int64_t>(1, std::min(ceil_div(pieces, ceil_div(n, tile_n)), ceil_div(m, 32)));
    const int64_t chunk_m = ceil_div(m, m_chunks);
    for (int64_t m0 = 0; m0 < m; m0 += chunk_m) {
      for (int64_t n0 = 0; n0 < n; n0 += tile_n) {
        const int64_t m1 = std::min(m, m0 + chunk_m), n1 = std::min(n, n0 + tile_n);
        tasks.push_back({i, m0, m1, n0, n1, double(m1 - m0) * (n1 - n0) * std::max<int64_t>(k, 1)});
      }
    }
  }
  return tasks;
}

void zero_rows(const at::Tensor& t) {
  const int64_t row_bytes = t.size(1) * t.element_size();
  char* base = static_cast<char*>(t.data_ptr());
  for (int64_t r = 0; r < t.size(0); ++r) std::memset(base + r * t.stride(0) * t.element_size(), 0, row_bytes);
}

void run_task(const Product& p, const Task& t, int64_t act) {
  const int64_t mt = t.m1 - t.m0, nt = t.n1 - t.n0;
  at::Tensor pre = p.pre.narrow(0, t.m0, mt).narrow(1, t.n0, nt);
  if (p.a.size(1) == 0) {
    zero_rows(pre);
  } else {
    at::cpu::mm_out(pre, p.a.narrow(0, t.m0, mt), p.b.narrow(1, t.n0, nt));
  }
  if (p.bias == nullptr && act == cpu::kActNone) return;
  at::Tensor out = p.out.narrow(0, t.m0, mt).narrow(1, t.n0, nt);
  cpu::gmm_epilogue_stub(pre.scalar_type(), {pre.data_ptr(), pre.stride(0)}, {out.data_ptr(), out.stride(0)},
                         p.bias ? p.bias + t.n0 * (pre.scalar_type() == at::kDouble ? 8 : 4) : nullptr, mt, nt, act);
}

// Runs every product. One big enough to keep every core busy inside ATen's threaded GEMM runs whole, like a loop of
// torch.mm would (cutting it into single-threaded tiles measured 10-20% slower); the rest are split into tasks, one
// contiguous run per thread with about equal FLOPs.
void run_products(const std::vector<Product>& all, int64_t act) {
  const int64_t threads = at::get_num_threads();
  const double threaded_gemm_macs = double(threads) * double(1 << 24);
  std::vector<Product> ps;
  for (const auto& p : all) {
    const int64_t m = p.pre.size(0), n = p.pre.size(1), k = p.a.size(1);
    if (threads > 1 && double(m) * n * k >= threaded_gemm_macs)
      run_task(p, Task{0, 0, m, 0, n, 0.0}, act);
    else
      ps.push_back(p);
  }
  const std::vector<Task> tasks = make_tasks(ps, threads);
  if (threads == 1 || tasks.size() <= 1) {
    for (const auto& t : tasks) run_task(ps[t.product], t, act);  // one task: the GEMM itself is threaded
    return;
  }
  double total = 0;
  for (const auto& t : tasks) total += t.cost;
  std::vector<int64_t> first(threads + 1, int64_t(tasks.size()));
  first[0] = 0;
  double before = 0;
  int64_t owner = 0;
  for (int64_t i = 0; i < int64_t(tasks.size()); ++i) {
    const int64_t o = std::min(threads - 1, int64_t((before + 0.5 * tasks[i].cost) / total * threads));
    while (owner < o) first[++owner] = i;
    before += tasks[i].cost;
  }
  at::parallel_for(0, threads, 1, [&](int64_t b, int64_t e) {
    for (int64_t th = b; th < e; ++th) {
      for (int64_t i = first[th]; i < first[th + 1]; ++i) run_task(ps[tasks[i].product], tasks[i], act);
    }
  });
}

const char* bias_ptr(const at::Tensor& b) { return b.defined() ? static_cast<const char*>(b.data_ptr()) : nullptr; }

// ---- Argument checks. ----

constexpr const char* kOp = "grouped_matmul";

void check_modes(const char* op, int64_t group_type, int64_t group_list_type, int64_t act) {
  TORCH_CHECK(group_type == -1 || group_type == 0 || group_type == 2, op,
              ": group_type must be -1 (lists), 0 (split x along M) or 2 (split along K); got ", group_type);
  TORCH_CHECK(group_list_type == 0 || group_list_type == 1, op,
              ": group_list_type must be 0 (cumulative ends) or 1 (per-group counts); got ", group_list_type);
  TORCH_CHECK(act == cpu::kActNone || act == cpu::kActRelu || act == cpu::kActGeluTanh ||
                  act == cpu::kActFastGelu || act == cpu::kActSilu,
              op, ": act_type must be 0 (none), 1 (relu), 2 (gelu_tanh), 4 (fast_gelu) or 5 (silu); got ", act);
  TORCH_CHECK(group_type != 2 || act == cpu::kActNone, op,
              ": group_type 2 (split along K) takes no activation; got act_type ", act);
}

c10::ScalarType check_dtypes(const char* op, at::TensorList x, at::TensorList weight) {
  TORCH_CHECK(!x.empty() && !weight.empty(), op, ": x and weight must be non-empty lists; got ", x.size(),
              " and ", weight.size(), " tensors");
  const auto dtype = x[0].scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kHalf || dtype == at::kBFloat16 || dtype == at::kDouble, op,
              ": x must be float32, float16, bfloat16 or float64; got ", dtype);
  for (size_t i = 0; i < x.size(); ++i) {
    TORCH_CHECK(x[i].scalar_type() == dtype, op, ": every x has the dtype of x[0] (", dtype, "); x[", i,
                "] is ", x[i].scalar_type());
    TORCH_CHECK(x[i].device().is_cpu(), op, ": x[", i, "] must be a CPU tensor; got ", x[i].device());
  }
  for (size_t i = 0; i < weight.size(); ++i) {
    TORCH_CHECK(weight[i].scalar_type() == dtype, op, ": weight[", i, "] must have x's dtype ", dtype, "; got ",
                weight[i].scalar_type());
    TORCH_CHECK(weight[i].device().is_cpu(), op, ": weight[", i, "] must be a CPU tensor");
  }
  return dtype;
}

// Group boundaries [0, end_0, ..., end_{E-1}] from group_list (cumulative ends or counts); they must cover `total`.
std::vector<int64_t> group_offsets(const char* op, const std::optional<at::Tensor>& group_list, int64_t list_type,
                                   int64_t groups, int64_t total, const char* axis) {
  TORCH_CHECK(group_list.has_value() && group_list->defined(), op,
              ": group_list is required for group_type 0 and 2 (a 1-D int64/int32 tensor of ", groups, " groups)");
  const at::Tensor& gl = *group_list;
  TORCH_CHECK(gl.dim() == 1 && (gl.scalar_type() == at::kLong || gl.scalar_type() == at::kInt), op,
              ": group_list must be a 1-D int64 or int32 tensor; got ", gl.dim(), "-D ", gl.scalar_type());
  TORCH_CHECK(gl.numel() == groups, op, ": group_list must have one entry per group (", groups, "); got ",
              gl.numel());
  const at::Tensor v = gl.to(at::kLong).contiguous();
  const int64_t* p = v.data_ptr<int64_t>();
  std::vector<int64_t> off(groups + 1, 0);
  for (int64_t e = 0; e < groups; ++e) {
    if (list_type == 0) {
      TORCH_CHECK(p[e] >= off[e], op, ": group_list (group_list_type 0, cumulative ends) must be non-decreasing "
                  "and start at >= 0; group_list[", e, "] = ", p[e], " after ", off[e]);
      off[e + 1] = p[e];
    } else {
      TORCH_CHECK(p[e] >= 0, op, ": group_list (group_list_type 1, counts) must be >= 0; group_list[", e, "] = ",
                  p[e]);
      // A sum that wraps int64 could come back to `total` and pass the coverage check below.
      off[e + 1] = checked_add(op, "the sum of group_list (group_list_type 1, counts)", off[e], p[e]);
    }
  }
  TORCH_CHECK(off[groups] == total, op, ": group_list must cover the ", axis, " axis of x exactly: the groups sum to ",
              off[groups], " but x has ", total);
  return off;
}

// Weight of group e: weight[0][e] of a single [E, K, N] tensor, or weight[e] of a list of E [K, N] tensors.
struct ExpertWeights {
  at::TensorList list;
  bool stacked;
  int64_t groups() const { return stacked ? list[0].size(0) : int64_t(list.size()); }
  at::Tensor operator[](int64_t e) const { return stacked ? list[0][e] : list[e]; }
};

ExpertWeights expert_weights(const char* op, at::TensorList weight) {
  const bool stacked = weight.size() == 1 && weight[0].dim() == 3;
  if (!stacked) {
    for (size_t i = 0; i < weight.size(); ++i) {
      TORCH_CHECK(weight[i].dim() == 2, op, ": group_type 0 takes weight as one [E, K, N] tensor or a list of E "
                  "[K, N] tensors; weight[", i, "] has shape ", weight[i].sizes());
    }
  }
  return {weight, stacked};
}

// Contiguous bias row of product i in the accumulation type (bias[0][i] of a stacked [E, N] bias, else
// bias[i]); undefined tensors without bias.
std::vector<at::Tensor> bias_rows(const char* op, at::TensorList bias, int64_t count, const std::vector<int64_t>& n,
                                  c10::ScalarType dtype) {
  std::vector<at::Tensor> rows(count);
  if (bias.empty()) return rows;
  const bool stacked = bias.size() == 1 && bias[0].dim() == 2;
  TORCH_CHECK(stacked || int64_t(bias.size()) == count, op, ": bias must be empty, one [E, N] tensor or a list of ",
              count, " [N] tensors; got ", bias.size(), " tensors");
  for (int64_t i = 0; i < count; ++i) {
    at::Tensor b = stacked ? bias[0] : bias[i];
    TORCH_CHECK(b.scalar_type() == dtype || b.scalar_type() == at::kFloat, op, ": bias must have x's dtype (",
                dtype, ") or float32; got ", b.scalar_type());
    if (stacked) {
      TORCH_CHECK(b.size(0) == count && b.size(1) == n[i], op, ": bias must have shape [", count, ", ", n[i],
                  "]; got ", b.sizes());
      b = b[i];
    } else {
      TORCH_CHECK(b.dim() == 1 && b.size(0) == n[i], op, ": bias[", i, "] must have shape [", n[i], "]; got ",
                  b.sizes());
    }
    rows[i] = b.to(dtype == at::kDouble ? at::kDouble : at::kFloat).contiguous();
  }
  return rows;
}

}  // namespace

std::tuple<std::vector<at::Tensor>, std::vector<at::Tensor>> grouped_matmul_cpu(const GroupedMatmulArgs& args) {
  check_modes(kOp, args.group_type, args.group_list_type, args.act_type);
  const auto dtype = check_dtypes(kOp, args.x, args.weight);
  const bool has_act = args.act_type != cpu::kActNone;
  std::vector<at::Tensor> outs, pres;
  std::vector<at::Tensor> bs;  // fp32 bias rows the products point into: alive until run_products returns
  std::vector<Product> ps;
  auto make = [&](at::IntArrayRef shape) {
    outs.push_back(at::empty(shape, args.x[0].options()));
    pres.push_back(has_act ? at::empty(shape, args.x[0].options()) : at::empty({0}, args.x[0].options()));
  };

  if (args.group_type == -1) {
    TORCH_CHECK(args.x.size() == args.weight.size(), kOp, ": group_type -1 multiplies x[i] by weight[i]; got ",
                args.x.size(),
                " x and ", args.weight.size(), " weight tensors");
    TORCH_CHECK(!args.group_list.has_value(), kOp, ": group_type -1 takes no group_list");
    std::vector<int64_t> n;
    for (size_t i = 0; i < args.x.size(); ++i) {
      TORCH_CHECK(args.x[i].dim() >= 2 && args.weight[i].dim() == 2, kOp,
                  ": group_type -1 needs x[i] [..., K] (>= 2-D) and "
                  "weight[i] [K, N]; got x[", i, "] ", args.x[i].sizes(), " and weight[", i, "] ", args.weight[i].sizes());
      TORCH_CHECK(args.x[i].size(-1) == args.weight[i].size(0), kOp, ": x[", i, "] has K=", args.x[i].size(-1),
                  " but weight[", i,
                  "] has K=", args.weight[i].size(0));
      n.push_back(args.weight[i].size(1));
    }
    bs = bias_rows(kOp, args.bias, int64_t(args.x.size()), n, dtype);
    for (size_t i = 0; i < args.x.size(); ++i) {
      std::vector<int64_t> shape(args.x[i].sizes().begin(), args.x[i].sizes().end());
      shape.back() = n[i];
      make(shape);
      const at::Tensor a = args.x[i].reshape({-1, args.x[i].size(-1)});
      ps.push_back({a, args.weight[i], (has_act ? pres : outs).back().view({-1, n[i]}), outs.back().view({-1, n[i]}),
                    bias_ptr(bs[i])});
    }
    run_products(ps, args.act_type);
    return {outs, pres};
  }

  TORCH_CHECK(args.x.size() == 1 && args.x[0].dim() == 2, kOp, ": group_type ", args.group_type,
              " takes x as a list of one 2-D "
              "tensor; got ", args.x.size(), " tensors, the first of shape ", args.x[0].sizes());
  const at::Tensor& x0 = args.x[0];
  if (args.group_type == 0) {
    const auto w = expert_weights(kOp, args.weight);
    const int64_t E = w.groups(), K = x0.size(1), N = w[0].size(1);
    for (int64_t e = 0; e < E; ++e) {
      TORCH_CHECK(w[e].size(0) == K && w[e].size(1) == N, kOp, ": expert ", e, "'s weight must be [K=", K,
                  ", N=", N, "]; got ", w[e].sizes());
    }
    const auto off = group_offsets(kOp, args.group_list, args.group_list_type, E, x0.size(0), "M (rows)");
    bs = bias_rows(kOp, args.bias, E, std::vector<int64_t>(E, N), dtype);
    make({x0.size(0), N});
    for (int64_t e = 0; e < E; ++e) {
      const int64_t r0 = off[e], m = off[e + 1] - off[e];
      ps.push_back({x0.narrow(0, r0, m), w[e], (has_act ? pres : outs)[0].narrow(0, r0, m),
                    outs[0].narrow(0, r0, m), bias_ptr(bs[e])});
    }
  } else {  // group_type 2
    TORCH_CHECK(args.weight.size() == 1 && args.weight[0].dim() == 2 && args.weight[0].size(0) == x0.size(1), kOp,
                ": group_type 2 takes weight as a list of one [K, N] tensor with x's K=", x0.size(1), "; got ",
                args.weight.size(), " tensors, the first of shape ", args.weight[0].sizes());
    TORCH_CHECK(args.bias.empty(), kOp, ": group_type 2 (split along K) takes no bias");
    TORCH_CHECK(args.group_list.has_value() && args.group_list->dim() == 1, kOp,
                ": group_type 2 needs group_list, a 1-D tensor with one entry per group");
    const int64_t E = args.group_list->numel(), M = x0.size(0), N = args.weight[0].size(1);
    const auto off = group_offsets(kOp, args.group_list, args.group_list_type, E, x0.size(1), "K (columns)");
    make({E, M, N});
    for (int64_t e = 0; e < E; ++e) {
      const int64_t k0 = off[e], k = off[e + 1] - off[e];
      ps.push_back({x0.narrow(1, k0, k), args.weight[0].narrow(0, k0, k), outs[0][e], outs[0][e], nullptr});
    }
  }
  run_products(ps, args.act_type);
  return {outs, pres};
}

std::tuple<std::vector<at::Tensor>, std::vector<at::Tensor>, std::vector<at::Tensor>> grouped_matmul_grad_cpu(
    const GroupedMatmulGradArgs& args) {
  constexpr const char* op = "grouped_matmul_grad";
  check_modes(op, args.group_type, args.group_list_type, args.act_type);
  const auto dtype = check_dtypes(op, args.x, args.weight);
  const size_t outputs = args.group_type == -1 ? args.x.size() : 1;
  TORCH_CHECK(args.grad_out.size() == outputs, op, ": expected ", outputs, " gradients of out; got ",
              args.grad_out.size());
  TORCH_CHECK(args.act_type == cpu::kActNone || args.act_input.size() == outputs, op, ": act_input must hold the ",
              outputs,
              " pre-activation tensors of the forward; got ", args.act_input.size());

  // g = grad_out * act'(pre-activation): the gradient of the product.
  std::vector<at::Tensor> g(outputs);
  for (size_t i = 0; i < outputs; ++i) {
    at::Tensor go = args.grad_out[i].to(dtype).contiguous();
    if (args.act_type != cpu::kActNone) {
      const at::Tensor pre = args.act_input[i].contiguous();
      TORCH_CHECK(pre.sizes() == go.sizes() && pre.scalar_type() == dtype, op, ": act_input[", i,
                  "] must match grad_out[", i, "] (", go.sizes(), ", ", dtype, "); got ", pre.sizes());
      at::Tensor d = at::empty_like(go);
      cpu::gmm_act_backward_stub(dtype, go.data_ptr(), pre.data_ptr(), d.data_ptr(), go.numel(), args.act_type);
      go = d;
    }
    g[i] = go;
  }

  std::vector<at::Tensor> dx, dw, db;
  for (const auto& t : args.x) dx.push_back(at::empty(t.sizes(), t.options()));
  for (const auto& t : args.weight) dw.push_back(at::empty(t.sizes(), t.options()));
  std::vector<Product> ps;
  auto product = [&](const at::Tensor& a, const at::Tensor& b, const at::Tensor& out) {
    ps.push_back({a, b, out, out, nullptr});
  };
  // Column sums of a group's rows of g in fp32 (fp64 for float64), stored into a bias gradient.
  auto bias_grad = [&](const at::Tensor& rows, at::Tensor dst) {
    dst.copy_(rows.sum(0, /*keepdim=*/false, dtype == at::kDouble ? at::kDouble : at::kFloat));
  };

  if (args.group_type == -1) {
    for (size_t i = 0; i < args.x.size(); ++i) {
      const int64_t K = args.x[i].size(-1), N = args.weight[i].size(1);
      const at::Tensor a = args.x[i].reshape({-1, K}), gi = g[i].view({-1, N});
      product(gi, args.weight[i].t(), dx[i].view({-1, K}));
      product(a.t(), gi, dw[i]);
    }
    run_products(ps, cpu::kActNone);
    if (!args.bias.empty()) {
      const bool stacked = args.bias.size() == 1 && args.bias[0].dim() == 2;
      db.push_back(at::empty(args.bias[0].sizes(), args.bias[0].options()));
      for (size_t i = 1; i < args.bias.size(); ++i) db.push_back(at::empty(args.bias[i].sizes(),
                                                                           args.bias[i].options()));
      for (size_t i = 0; i < args.x.size(); ++i) {
        bias_grad(g[i].view({-1, args.weight[i].size(1)}), stacked ? db[0][i] : db[i]);
      }
    }
    return {dx, dw, db};
  }

  const at::Tensor& x0 = args.x[0];
  if (args.group_type == 0) {
    const auto w = expert_weights(op, args.weight);
    const ExpertWeights dws{dw, w.stacked};
    const int64_t E = w.groups();
    const auto off = group_offsets(op, args.group_list, args.group_list_type, E, x0.size(0), "M (rows)");
    for (int64_t e = 0; e < E; ++e) {
      const int64_t r0 = off[e], m = off[e + 1] - off[e];
      const at::Tensor ge = g[0].narrow(0, r0, m);
      product(ge, w[e].t(), dx[0].narrow(0, r0, m));
      product(x0.narrow(0, r0, m).t(), ge, dws[e]);
    }
    run_products(ps, cpu::kActNone);
    if (!args.bias.empty()) {
      const bool stacked = args.bias.size() == 1 && args.bias[0].dim() == 2;
      for (const auto& b : args.bias) db.push_back(at::empty(b.sizes(), b.options()));
      for (int64_t e = 0; e < E; ++e) {
        bias_grad(g[0].narrow(0, off[e], off[e + 1] - off[e]), stacked ? db[0][e] : db[e]);
      }
    }
    return {dx, dw, db};
  }

  // group_type 2: out[e] = x[:, K_e] · weight[K_e, :].
  const int64_t E = args.group_list.has_value() ? args.group_list->numel() : 0;
  const auto off = group_offsets(op, args.group_list, args.group_list_type, E, x0.size(1), "K (columns)");
  for (int64_t e = 0; e < E; ++e) {
    const int64_t k0 = off[e], k = off[e + 1] - off[e];
    product(g[0][e], args.weight[0].narrow(0, k0, k).t(), dx[0].narrow(1, k0, k));
    product(x0.narrow(1, k0, k).t(), g[0][e], dw[0].narrow(0, k0, k));
  }
  run_products(ps, cpu::kActNone);
  return {dx, dw, db};
}

}  // namespace npu_fa
