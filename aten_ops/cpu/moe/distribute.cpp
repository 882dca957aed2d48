// Expert-parallel MoE dispatch / combine (CANN MoeDistributeDispatchV2 / MoeDistributeCombineV2 semantics) on any
// c10d process group, through PyTorch's functional collectives (cpu/mc2/collectives.h for the group lookup, the
// all_gather and validation switch; all_to_all_single called the same way here).
//
// Collectives per call:
//   dispatch: one all_gather of [call signature, batch size, pairs per expert] (cross-rank validation and the
//             receive counts in one small message), then one all_to_all_single of packed rows (the row's bytes,
//             its dynamic scale, its expert weight, its token and slot).
//   combine:  an optional validation all_gather (mc2_validation, on by default), then one all_to_all_single of the
//             rows back to their sources.
// Every rank sends its active (token, slot) pairs stably sorted by expert id, i.e. by destination rank, then by
// local expert, then in token order. A receiving rank thus gets, from each source rank, rows grouped by local
// expert; it reorders them to (local expert, source rank) blocks, the layout of expand_x and ep_recv_counts, so
// combine can send every row back from the counts alone and the source finds its pairs in its own sending order.
// Rows travel as bytes (uint8) so that any dtype and the per-row metadata go in the same message.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "cpu/mc2/collectives.h"
#include "generated/kernels.h"

namespace npu_fa {
namespace {

using mc2::Group;

enum OpId : int64_t { kDispatch = 21, kCombine = 22 };

// all_to_all_single through the dispatcher (boxed: its group_name is typed `Any`), as mc2's collectives are: rows
// of `input` split by `in_splits` go to the ranks in order; the result holds out_splits[r] rows from rank r.
at::Tensor all_to_all_async(const at::Tensor& input, const std::vector<int64_t>& out_splits,
                            const std::vector<int64_t>& in_splits, const Group& g) {
  std::vector<c10::IValue> stack = {g.via_host ? input.cpu().contiguous() : input.contiguous(), out_splits, in_splits,
                                    g.name};
  c10::Dispatcher::singleton().findSchemaOrThrow("_c10d_functional::all_to_all_single", "").callBoxed(&stack);
  return stack.at(0).toTensor();
}

at::ScalarType acc_type(at::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }

at::Tensor long_tensor(const std::vector<int64_t>& v) {
  return at::tensor(v, at::TensorOptions().dtype(at::kLong));
}

// A 2-D tensor's rows as bytes ([rows, cols * itemsize] uint8) and back ([rows, bytes / itemsize]).
at::Tensor as_bytes(const at::Tensor& t) { return t.contiguous().view(at::kByte); }
at::Tensor from_bytes(const at::Tensor& bytes, at::ScalarType dtype) { return bytes.contiguous().view(dtype); }

// Symmetric per-row int8: q = round(row * 127 / max|row|), scale = max|row| / 127 (0 for a zero row).
std::pair<at::Tensor, at::Tensor> quantize_rows(const at::Tensor& rows) {
  const at::Tensor f = rows.to(at::kFloat);
  const at::Tensor amax = f.abs().amax(1);
  const at::Tensor inv = at::where(amax > 0, 127.0f / amax, at::zeros_like(amax));
  const at::Tensor q = (f * inv.unsqueeze(1)).round().clamp(-127, 127).to(at::kChar);
  return {q, amax / 127.0f};
}

// This rank's active (token, slot) pairs in sending order.
struct Route {
  int64_t bs = 0, k = 0;
  std::vector<int64_t> pair;          // t * k + slot, sorted by expert (stable)
  std::vector<int64_t> expert;        // expert of each pair
  std::vector<int64_t> per_rank;      // pairs sent to each rank
  std::vector<int64_t> per_expert;    // pairs sent to each expert
  std::vector<uint8_t> token_active;  // tokens with at least one active pair
};

Route make_route(const char* op, const at::Tensor& expert_ids, const std::optional<at::Tensor>& mask,
                 int64_t experts, int64_t world) {
  TORCH_CHECK_VALUE(expert_ids.dim() == 2, op, ": expert_ids must be 2-D [BS, K]; got shape ", expert_ids.sizes());
  TORCH_CHECK_TYPE(expert_ids.scalar_type() == at::kInt || expert_ids.scalar_type() == at::kLong, op,
                   ": expert_ids must be int32 (or int64); got ", expert_ids.scalar_type());
  Route rt;
  rt.bs = expert_ids.size(0);
  rt.k = expert_ids.size(1);
  TORCH_CHECK_VALUE(rt.k >= 1, op, ": expert_ids must have K >= 1 columns (top-k experts); got shape ",
                    expert_ids.sizes());
  std::vector<uint8_t> active(rt.bs * rt.k, 1);
  if (mask.has_value()) {
    const at::Tensor& m = *mask;
    TORCH_CHECK_TYPE(m.scalar_type() == at::kBool, op, ": x_active_mask must be bool; got ", m.scalar_type());
    const bool per_token = m.dim() == 1 && m.size(0) == rt.bs;
    const bool per_pair = m.dim() == 2 && m.size(0) == rt.bs && m.size(1) == rt.k;
    TORCH_CHECK_VALUE(per_token || per_pair, op, ": x_active_mask must be [BS] = [", rt.bs, "] or [BS, K] = [", rt.bs,
                      ", ", rt.k, "]; got shape ", m.sizes());
    const at::Tensor mc = m.to(at::kByte).contiguous();
    const uint8_t* mp = mc.data_ptr<uint8_t>();
    for (int64_t t = 0; t < rt.bs; ++t) {
      if (per_token) {
        TORCH_CHECK_VALUE(!(t > 0 && mp[t] && !mp[t - 1]), op, ": a 1-D x_active_mask must hold its trues before its ",
                          "falses (active tokens first); token ", t, " is active after an inactive one");
        for (int64_t s = 0; s < rt.k; ++s) active[t * rt.k + s] = mp[t];
      } else {
        for (int64_t s = 0; s < rt.k; ++s) active[t * rt.k + s] = mp[t * rt.k + s];
      }
    }
  }
  const at::Tensor ids = expert_ids.to(at::kLong).contiguous();
  const int64_t* ip = ids.data_ptr<int64_t>();
  rt.per_expert.assign(experts, 0);
  rt.token_active.assign(rt.bs, 0);
  for (int64_t t = 0; t < rt.bs; ++t) {
    for (int64_t s = 0; s < rt.k; ++s) {
      const int64_t e = ip[t * rt.k + s];
      TORCH_CHECK_VALUE(e >= 0 && e < experts, op, ": expert_ids must lie in [0, moe_expert_num) = [0, ", experts,
                        "); got ", e, " at [", t, ", ", s, "]");
      for (int64_t p = 0; p < s; ++p) {
        TORCH_CHECK_VALUE(ip[t * rt.k + p] != e, op, ": the K experts of a token must be distinct; token ", t,
                          " names expert ", e, " twice");
      }
      if (active[t * rt.k + s]) {
        ++rt.per_expert[e];
        rt.token_active[t] = 1;
      }
    }
  }
  std::vector<int64_t> next(experts + 1, 0);
  for (int64_t e = 0; e < experts; ++e) next[e + 1] = next[e] + rt.per_expert[e];
  rt.pair.assign(next[experts], 0);
  rt.expert.assign(next[experts], 0);
  for (int64_t f = 0; f < rt.bs * rt.k; ++f) {
    if (!active[f]) continue;
    const int64_t at = next[ip[f]]++;
    rt.pair[at] = f;
    rt.expert[at] = ip[f];
  }
  const int64_t local = experts / world;
  rt.per_rank.assign(world, 0);
  for (int64_t e = 0; e < experts; ++e) rt.per_rank[e / local] += rt.per_expert[e];
  return rt;
}

void check_group_args(const char* op, int64_t world, int64_t rank, int64_t experts, int64_t global_bs, int64_t bs) {
  TORCH_CHECK_VALUE(world >= 1, op, ": argument 'ep_world_size' must be >= 1; got ", world);
  TORCH_CHECK_VALUE(rank >= 0 && rank < world, op, ": argument 'ep_rank_id' must lie in [0, ep_world_size) = [0, ",
                    world, "); got ", rank);
  TORCH_CHECK_VALUE(experts >= 1 && experts % world == 0, op, ": argument 'moe_expert_num' must be a positive ",
                    "multiple of ep_world_size (", world, "): every rank holds moe_expert_num / ep_world_size experts; ",
                    "got ", experts);
  TORCH_CHECK_VALUE(global_bs >= 0, op, ": argument 'global_bs' must be >= 0; got ", global_bs);
  if (global_bs > 0) {
    TORCH_CHECK_VALUE(global_bs % world == 0 && bs <= global_bs / world, op, ": argument 'global_bs' (", global_bs,
                      ") must be max_bs * ep_world_size with every rank's batch <= max_bs; this rank has BS = ", bs,
                      " and ep_world_size = ", world);
  }
}

Group resolve(const char* op, c10::string_view name, int64_t world, int64_t rank, const at::Tensor& like) {
  const Group g = mc2::resolve_group(op, name, -1, like.device());
  TORCH_CHECK_VALUE(world == g.size, op, ": argument 'ep_world_size' (", world, ") must equal the size of group '",
                    g.name, "' (", g.size, ")");
  TORCH_CHECK_VALUE(rank == g.rank, op, ": argument 'ep_rank_id' (", rank, ") must be this process's rank in group '",
                    g.name, "' (", g.rank, ")");
  return g;
}

// All ranks' `values` ([world][n]); every rank passes the same n.
std::vector<std::vector<int64_t>> gather_ints(const Group& g, const std::vector<int64_t>& values) {
  const int64_t n = static_cast<int64_t>(values.size());
  const at::Tensor mine = long_tensor(values).to(g.device);
  const at::Tensor all = mc2::wait(mc2::all_gather_async(mine, g), g).view({g.size, n}).cpu().contiguous();
  const int64_t* p = all.data_ptr<int64_t>();
  std::vector<std::vector<int64_t>> out(g.size);
  for (int64_t r = 0; r < g.size; ++r) out[r].assign(p + r * n, p + (r + 1) * n);
  return out;
}

// Raises the same error on every rank when ranks disagree on one of the first fields.size() values.
void check_same(const char* op, const Group& g, const std::vector<std::vector<int64_t>>& all,
                const std::vector<std::string>& fields) {
  for (size_t f = 0; f < fields.size(); ++f) {
    bool same = true;
    for (int64_t r = 1; r < g.size; ++r) same = same && all[r][f] == all[0][f];
    if (same) continue;
    std::ostringstream per_rank;
    for (int64_t r = 0; r < g.size; ++r) {
      per_rank << (r ? ", " : "") << "rank " << r << ": ";
      if (fields[f].find("dtype") != std::string::npos) per_rank << c10::toString(static_cast<at::ScalarType>(all[r][f]));
      else per_rank << all[r][f];
    }
    TORCH_CHECK_VALUE(false, op, ": ranks of group '", g.name, "' disagree on ", fields[f], " (", per_rank.str(),
                      "); every rank must pass the same ", fields[f]);
  }
}

// Where the rows of expand_x (blocks of (local expert, source rank), sizes from the cumulative counts) go back:
// `rows` lists them grouped by destination rank (then local expert), `send_to` how many go to each rank.
struct Return {
  std::vector<int64_t> rows;
  std::vector<int64_t> send_to;
  int64_t total = 0;
};

Return plan_return(const char* op, const char* name, const at::Tensor& counts, int64_t world, int64_t local,
                   int64_t available_rows) {
  TORCH_CHECK_VALUE(counts.dim() == 1 && counts.numel() == world * local, op, ": ", name, " must be 1-D of ",
                    "ep_world_size * local_expert_num = ", world * local, " cumulative counts (dispatch's ",
                    "ep_recv_counts); got shape ", counts.sizes());
  TORCH_CHECK_TYPE(counts.scalar_type() == at::kInt || counts.scalar_type() == at::kLong, op, ": ", name,
                   " must be int32 (or int64); got ", counts.scalar_type());
  const at::Tensor c = counts.to(at::kLong).contiguous();
  const int64_t* cp = c.data_ptr<int64_t>();
  std::vector<int64_t> start(world * local), n(world * local);
  int64_t prev = 0;
  for (int64_t i = 0; i < world * local; ++i) {
    TORCH_CHECK_VALUE(cp[i] >= prev, op, ": ", name, " must be non-decreasing cumulative counts; entry ", i, " (",
                      cp[i], ") < entry ", i - 1, " (", prev, ")");
    start[i] = prev;
    n[i] = cp[i] - prev;
    prev = cp[i];
  }
  TORCH_CHECK_VALUE(prev <= available_rows, op, ": ", name, " counts ", prev, " rows but the expanded tensor has ",
                    available_rows);
  Return ret;
  ret.total = prev;
  ret.send_to.assign(world, 0);
  ret.rows.reserve(prev);
  for (int64_t r = 0; r < world; ++r) {
    for (int64_t le = 0; le < local; ++le) {
      const int64_t i = le * world + r;
      for (int64_t j = 0; j < n[i]; ++j) ret.rows.push_back(start[i] + j);
      ret.send_to[r] += n[i];
    }
  }
  return ret;
}

// Cross-rank check of a combine-direction exchange: what rank q sends rank r must be what r expects from q.
void validate_return(const char* op, const Group& g, std::vector<int64_t> header, const std::vector<std::string>& fields,
                     const std::vector<int64_t>& send_to, const std::vector<int64_t>& expect_from) {
  if (!mc2::validation_enabled() || g.size == 1) return;
  const size_t h = header.size();
  header.insert(header.end(), send_to.begin(), send_to.end());
  header.insert(header.end(), expect_from.begin(), expect_from.end());
  const auto all = gather_ints(g, header);
  check_same(op, g, all, fields);
  for (int64_t q = 0; q < g.size; ++q) {
    for (int64_t r = 0; r < g.size; ++r) {
      const int64_t sends = all[q][h + r], expects = all[r][h + g.size + q];
      TORCH_CHECK_VALUE(sends == expects, op, ": rank ", q, " of group '", g.name, "' returns ", sends,
                        " rows to rank ", r, ", which expects ", expects, " from it: every rank must pass the ",
                        "ep_recv_counts its dispatch returned and the expert_ids / x_active_mask it dispatched");
    }
  }
}

// out[t] = sum over t's active slots s of w[t, s] * row(t, s) (w = 1 without weights), in one pass over the
// received rows: row j of pair (t, s) starts at base + j * stride, holds H values of scalar_t (int8 followed by its
// float32 scale with `scaled`). Slots are summed in order: deterministic.
template <typename scalar_t, typename acc_t>
void accumulate_pairs(acc_t* out, const uint8_t* base, int64_t stride, bool scaled, const Route& rt,
                      const std::vector<int64_t>& pos, const acc_t* w, int64_t H) {
  at::parallel_for(0, rt.bs, std::max<int64_t>(1, 16384 / std::max<int64_t>(H * rt.k, 1)), [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      acc_t* o = out + t * H;
      std::fill(o, o + H, acc_t(0));
      for (int64_t s = 0; s < rt.k; ++s) {
        const int64_t j = pos[t * rt.k + s];
        if (j < 0) continue;
        const uint8_t* row = base + j * stride;
        acc_t f = w ? w[t * rt.k + s] : acc_t(1);
        if (scaled) {
          float sc;
          std::memcpy(&sc, row + H * sizeof(scalar_t), sizeof(float));
          f *= static_cast<acc_t>(sc);
        }
        const scalar_t* r = reinterpret_cast<const scalar_t*>(row);
        for (int64_t h = 0; h < H; ++h) o[h] += f * static_cast<acc_t>(r[h]);
      }
    }
  });
}

// Position of each (token, slot) pair in rt's sending order (-1: inactive).
std::vector<int64_t> pair_positions(const Route& rt) {
  std::vector<int64_t> pos(rt.bs * rt.k, -1);
  for (size_t j = 0; j < rt.pair.size(); ++j) pos[rt.pair[j]] = static_cast<int64_t>(j);
  return pos;
}

// Sends the rows `ret.rows` of `rows_src` back to their source ranks and returns, on the source side,
// out[t] = sum over t's active slots of weight * row ([BS, H], accumulation dtype; `weights` [BS, K] or undefined).
// quant: rows travel as int8 with a per-row float32 scale.
at::Tensor rows_back_summed(const Group& g, const at::Tensor& rows_src, const Return& ret, const Route& rt, bool quant,
                            const at::Tensor& weights) {
  const at::ScalarType dtype = rows_src.scalar_type(), acc = acc_type(dtype);
  const int64_t H = rows_src.size(1);
  const at::Tensor rows = rows_src.index_select(0, long_tensor(ret.rows));
  at::Tensor payload;
  if (quant) {
    auto [q, s] = quantize_rows(rows);
    payload = at::cat({as_bytes(q), as_bytes(s.unsqueeze(1))}, 1);
  } else {
    payload = as_bytes(rows);
  }
  const at::Tensor got = mc2::wait(all_to_all_async(payload, rt.per_rank, ret.send_to, g), g).cpu().contiguous();
  at::Tensor out = at::empty({rt.bs, H}, rows_src.options().dtype(acc));
  const std::vector<int64_t> pos = pair_positions(rt);
  const at::Tensor w = weights.defined() ? weights.to(acc).contiguous() : weights;
  const uint8_t* base = got.data_ptr<uint8_t>();
  const int64_t stride = got.size(1);
  AT_DISPATCH_FLOATING_TYPES(acc, "moe_distribute_rows_back", [&] {
    using acc_t = scalar_t;
    const acc_t* wp = w.defined() ? w.data_ptr<acc_t>() : nullptr;
    if (quant) {
      accumulate_pairs<int8_t, acc_t>(out.data_ptr<acc_t>(), base, stride, true, rt, pos, wp, H);
      return;
    }
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "moe_distribute_rows_back_rows", [&] {
      accumulate_pairs<scalar_t, acc_t>(out.data_ptr<acc_t>(), base, stride, false, rt, pos, wp, H);
    });
  });
  return out;
}

at::Tensor active_tokens(const Route& rt, at::ScalarType dtype) {
  return at::tensor(std::vector<int64_t>(rt.token_active.begin(), rt.token_active.end()),
                    at::TensorOptions().dtype(at::kLong)).to(dtype).view({rt.bs, 1});
}

void check_floating(const char* op, const char* name, const at::Tensor& t) {
  TORCH_CHECK_TYPE(at::isFloatingType(t.scalar_type()), op, ": ", name, " must be float16, bfloat16, float32 or ",
                   "float64; got ", t.scalar_type());
}

// Checks shared by combine and its backward; returns the route.
Route combine_route(const char* op, const at::Tensor& expand_x, const at::Tensor& expert_ids,
                    const at::Tensor& expert_scales, const std::optional<at::Tensor>& mask,
                    const std::optional<at::Tensor>& shared, int64_t world, int64_t rank, int64_t experts,
                    int64_t global_bs) {
  TORCH_CHECK_VALUE(expand_x.dim() == 2, op, ": expand_x must be 2-D [A, H]; got shape ", expand_x.sizes());
  check_floating(op, "expand_x", expand_x);
  check_group_args(op, world, rank, experts, global_bs, expert_ids.dim() == 2 ? expert_ids.size(0) : 0);
  Route rt = make_route(op, expert_ids, mask, experts, world);
  TORCH_CHECK_VALUE(expert_scales.sizes() == expert_ids.sizes(), op, ": expert_scales must have expert_ids' shape [BS, K] = ",
                    expert_ids.sizes(), "; got ", expert_scales.sizes());
  check_floating(op, "expert_scales", expert_scales);
  if (shared.has_value()) {
    const at::Tensor& s = *shared;
    const bool ok = s.dim() >= 2 && s.dim() <= 3 && s.size(-1) == expand_x.size(1) && s.numel() == rt.bs * expand_x.size(1);
    TORCH_CHECK_VALUE(ok, op, ": shared_expert_x must be [BS, H] = [", rt.bs, ", ", expand_x.size(1),
                      "] (or 3-D with leading dims multiplying to BS); got shape ", s.sizes());
    TORCH_CHECK_TYPE(s.scalar_type() == expand_x.scalar_type(), op, ": shared_expert_x's dtype (", s.scalar_type(),
                     ") must equal expand_x's (", expand_x.scalar_type(), ")");
  }
  return rt;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
moe_distribute_dispatch_v2_cpu(const MoeDistributeDispatchV2Args& a) {
  const char* op = "moe_distribute_dispatch_v2";
  const at::Tensor& x = a.x;
  TORCH_CHECK_VALUE(x.dim() == 2, op, ": x must be 2-D [BS, H]; got shape ", x.sizes());
  check_floating(op, "x", x);
  const int64_t bs = x.size(0), H = x.size(1), W = a.ep_world_size, E = a.moe_expert_num;
  check_group_args(op, W, a.ep_rank_id, E, a.global_bs, bs);
  TORCH_CHECK_VALUE(a.quant_mode == 0 || a.quant_mode == 2, op, ": argument 'quant_mode' must be 0 (none) or 2 ",
                    "(dynamic per-token int8); got ", a.quant_mode);
  TORCH_CHECK_VALUE(a.expert_token_nums_type == 0 || a.expert_token_nums_type == 1, op,
                    ": argument 'expert_token_nums_type' must be 0 (cumulative) or 1 (counts); got ",
                    a.expert_token_nums_type);
  TORCH_CHECK_VALUE(a.tp_world_size == 0 || a.tp_world_size == 1, op, ": argument 'tp_world_size' must be 0 or 1 ",
                    "(no tensor-parallel split); got ", a.tp_world_size);
  const bool quant = a.quant_mode == 2;
  Route rt = make_route(op, a.expert_ids, a.x_active_mask, E, W);
  TORCH_CHECK_VALUE(rt.bs == bs, op, ": expert_ids must have x's BS = ", bs, " rows; got shape ", a.expert_ids.sizes());
  if (a.scales.has_value()) {
    TORCH_CHECK_VALUE(quant, op, ": argument 'scales' (smooth-quant scales) needs quant_mode 2; got quant_mode ",
                      a.quant_mode);
    TORCH_CHECK_VALUE(a.scales->dim() == 2 && a.scales->size(0) == E && a.scales->size(1) == H, op,
                      ": scales must be [moe_expert_num, H] = [", E, ", ", H, "]; got shape ", a.scales->sizes());
    check_floating(op, "scales", *a.scales);
  }
  if (a.expert_scales.has_value()) {
    TORCH_CHECK_VALUE(a.expert_scales->sizes() == a.expert_ids.sizes(), op, ": expert_scales must have expert_ids' ",
                      "shape [BS, K] = ", a.expert_ids.sizes(), "; got ", a.expert_scales->sizes());
    check_floating(op, "expert_scales", *a.expert_scales);
  }
  const Group g = resolve(op, a.group_ep, W, a.ep_rank_id, x);
  const int64_t L = E / W, me = g.rank;

  // Signature, batch size and pairs per expert of every rank, in one all_gather.
  const std::vector<std::string> fields = {"the op called", "the dtype of x", "x.shape[1] (H)",
                                           "expert_ids.shape[1] (K)", "argument 'moe_expert_num'",
                                           "argument 'quant_mode'", "argument 'global_bs'", "whether scales is given",
                                           "whether expert_scales is given"};
  std::vector<int64_t> mine = {kDispatch, static_cast<int64_t>(x.scalar_type()), H, rt.k, E, a.quant_mode,
                               a.global_bs, a.scales.has_value(), a.expert_scales.has_value(), bs};
  mine.insert(mine.end(), rt.per_expert.begin(), rt.per_expert.end());
  const auto all = gather_ints(g, mine);
  check_same(op, g, all, fields);
  const size_t bs_at = fields.size(), counts_at = bs_at + 1;
  for (int64_t r = 0; r < W; ++r) {
    TORCH_CHECK_VALUE(a.global_bs != 0 || all[r][bs_at] == bs, op, ": with global_bs = 0 every rank must have the ",
                      "same batch size; rank ", r, " has ", all[r][bs_at], " tokens and rank ", me, " has ", bs,
                      " (pass global_bs = max_bs * ep_world_size for uneven batches)");
  }
  const int64_t G = a.global_bs == 0 ? bs * W : a.global_bs;
  const int64_t A = G * std::min(L, rt.k);

  // The packed rows: data bytes, then 4-byte columns [dynamic scale][expert weight] token slot.
  const int64_t P = static_cast<int64_t>(rt.pair.size());
  const at::ScalarType out_dtype = quant ? at::kChar : x.scalar_type();
  const int64_t data_bytes = H * c10::elementSize(out_dtype);
  at::Tensor src_rows, src_scales;  // the rows to send ([BS, H], or [P, H] with smooth scales) and their scales
  bool per_pair = false;
  if (quant && a.scales.has_value()) {
    // Smooth scales are per expert: each (token, expert) row is quantised on its own.
    const at::Tensor pair = long_tensor(rt.pair);
    const at::Tensor rows = x.index_select(0, at::floor_divide(pair, rt.k)).to(at::kFloat) *
                            a.scales->to(at::kFloat).index_select(0, long_tensor(rt.expert));
    std::tie(src_rows, src_scales) = quantize_rows(rows);
    per_pair = true;
  } else if (quant) {
    std::tie(src_rows, src_scales) = quantize_rows(x);  // once per token, shared by its K rows
  } else {
    src_rows = x.contiguous();
  }
  const at::Tensor weights = a.expert_scales.has_value() ? a.expert_scales->to(at::kFloat).contiguous() : at::Tensor();
  const int64_t ncols = 2 + (quant ? 1 : 0) + (weights.defined() ? 1 : 0);
  const int64_t row_bytes = data_bytes + 4 * ncols;
  at::Tensor payload = at::empty({P, row_bytes}, at::TensorOptions().dtype(at::kByte));
  {
    uint8_t* out = payload.data_ptr<uint8_t>();
    const uint8_t* rows_p = static_cast<const uint8_t*>(src_rows.data_ptr());
    const float* scale_p = quant ? src_scales.contiguous().data_ptr<float>() : nullptr;
    const float* w_p = weights.defined() ? weights.data_ptr<float>() : nullptr;
    at::parallel_for(0, P, std::max<int64_t>(1, 65536 / std::max<int64_t>(row_bytes, 1)), [&](int64_t b, int64_t e) {
      for (int64_t j = b; j < e; ++j) {
        const int64_t f = rt.pair[j], t = f / rt.k;
        const int64_t from = per_pair ? j : t;
        uint8_t* dst = out + j * row_bytes;
        std::memcpy(dst, rows_p + from * data_bytes, data_bytes);
        dst += data_bytes;
        if (quant) { std::memcpy(dst, scale_p + from, 4); dst += 4; }
        if (w_p) { std::memcpy(dst, w_p + f, 4); dst += 4; }
        const int32_t ts[2] = {static_cast<int32_t>(t), static_cast<int32_t>(f % rt.k)};
        std::memcpy(dst, ts, 8);
      }
    });
  }

  std::vector<int64_t> recv_from(W, 0);
  for (int64_t r = 0; r < W; ++r)
    for (int64_t le = 0; le < L; ++le) recv_from[r] += all[r][counts_at + me * L + le];
  const at::Tensor got = mc2::wait(all_to_all_async(payload, recv_from, rt.per_rank, g), g).cpu().contiguous();

  // Reorder from (source rank, local expert) blocks to (local expert, source rank) blocks.
  std::vector<int64_t> perm, src, ep_recv(W * L), tokens_per_expert(L, 0);
  std::vector<int64_t> rank_start(W + 1, 0);
  for (int64_t r = 0; r < W; ++r) rank_start[r + 1] = rank_start[r] + recv_from[r];
  int64_t cum = 0;
  for (int64_t le = 0; le < L; ++le) {
    for (int64_t r = 0; r < W; ++r) {
      int64_t off = rank_start[r];
      for (int64_t p = 0; p < le; ++p) off += all[r][counts_at + me * L + p];
      const int64_t n = all[r][counts_at + me * L + le];
      for (int64_t j = 0; j < n; ++j) {
        perm.push_back(off + j);
        src.push_back(r);
      }
      cum += n;
      ep_recv[le * W + r] = cum;
      tokens_per_expert[le] += n;
    }
  }
  const int64_t R = cum;
  TORCH_CHECK(R <= A, op, ": received ", R, " rows, more than A = ", A, " (internal error: the batch-size checks ",
              "bound it)");
  const at::TensorOptions opts = x.options();
  at::Tensor expand_x = at::empty({A, H}, opts.dtype(out_dtype));
  expand_x.narrow(0, R, A - R).zero_();
  at::Tensor meta = at::empty({R, ncols}, at::TensorOptions().dtype(at::kInt));
  {
    const uint8_t* in = got.data_ptr<uint8_t>();
    uint8_t* dst = static_cast<uint8_t*>(expand_x.data_ptr());
    int32_t* meta_p = meta.data_ptr<int32_t>();
    at::parallel_for(0, R, std::max<int64_t>(1, 65536 / std::max<int64_t>(row_bytes, 1)), [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const uint8_t* row = in + perm[i] * row_bytes;
        std::memcpy(dst + i * data_bytes, row, data_bytes);
        std::memcpy(meta_p + i * ncols, row + data_bytes, 4 * ncols);
      }
    });
  }
  int64_t col = 0;
  at::Tensor dynamic_scales = at::zeros({A}, opts.dtype(at::kFloat));
  if (quant) dynamic_scales.narrow(0, 0, R).copy_(meta.select(1, col++).contiguous().view(at::kFloat));
  at::Tensor expand_scales = at::zeros({A}, opts.dtype(at::kFloat));
  if (a.expert_scales.has_value()) expand_scales.narrow(0, 0, R).copy_(meta.select(1, col++).contiguous().view(at::kFloat));
  at::Tensor assist = at::zeros({std::max(bs * rt.k, 128 * A)}, opts.dtype(at::kInt));
  const at::Tensor triples = at::stack({long_tensor(src).to(at::kInt), meta.select(1, col), meta.select(1, col + 1)}, 1);
  assist.narrow(0, 0, 3 * R).copy_(triples.reshape(-1));

  at::Tensor expert_token_nums = long_tensor(tokens_per_expert);
  if (a.expert_token_nums_type == 0) expert_token_nums = expert_token_nums.cumsum(0);
  at::Tensor ep_recv_counts = long_tensor(ep_recv).to(at::kInt);
  at::Tensor tp_recv_counts = at::full({a.tp_world_size}, R, opts.dtype(at::kInt));
  return {expand_x, dynamic_scales, assist, expert_token_nums, ep_recv_counts, tp_recv_counts, expand_scales};
}

at::Tensor moe_distribute_dispatch_v2_grad_cpu(const MoeDistributeDispatchV2GradArgs& a) {
  const char* op = "moe_distribute_dispatch_v2_grad";
  TORCH_CHECK_VALUE(a.grad_expand_x.dim() == 2 && a.x.dim() == 2 && a.grad_expand_x.size(1) == a.x.size(1), op,
                    ": grad_expand_x must be [A, H] with x's H; got ", a.grad_expand_x.sizes(), " for x of shape ",
                    a.x.sizes());
  check_floating(op, "grad_expand_x", a.grad_expand_x);
  const int64_t W = a.ep_world_size, E = a.moe_expert_num;
  check_group_args(op, W, a.ep_rank_id, E, a.global_bs, a.x.size(0));
  const Route rt = make_route(op, a.expert_ids, a.x_active_mask, E, W);
  const Return ret = plan_return(op, "ep_recv_counts", a.ep_recv_counts, W, E / W, a.grad_expand_x.size(0));
  const Group g = resolve(op, a.group_ep, W, a.ep_rank_id, a.x);
  return rows_back_summed(g, a.grad_expand_x, ret, rt, false, at::Tensor()).to(a.x.scalar_type());
}

at::Tensor moe_distribute_combine_v2_cpu(const MoeDistributeCombineV2Args& a) {
  const char* op = "moe_distribute_combine_v2";
  const int64_t W = a.ep_world_size, E = a.moe_expert_num;
  const Route rt = combine_route(op, a.expand_x, a.expert_ids, a.expert_scales, a.x_active_mask, a.shared_expert_x,
                                 W, a.ep_rank_id, E, a.global_bs);
  TORCH_CHECK_VALUE(a.comm_quant_mode == 0 || a.comm_quant_mode == 2, op, ": argument 'comm_quant_mode' must be 0 ",
                    "(none) or 2 (int8 communication); got ", a.comm_quant_mode);
  TORCH_CHECK_VALUE(a.assist_info_for_combine.dim() == 1, op, ": assist_info_for_combine must be 1-D (dispatch's ",
                    "output); got shape ", a.assist_info_for_combine.sizes());
  const Return ret = plan_return(op, "ep_send_counts", a.ep_send_counts, W, E / W, a.expand_x.size(0));
  const Group g = resolve(op, a.group_ep, W, a.ep_rank_id, a.expand_x);
  const int64_t H = a.expand_x.size(1);
  validate_return(op, g, {kCombine, static_cast<int64_t>(a.expand_x.scalar_type()), H, rt.k, E, a.global_bs,
                          a.comm_quant_mode},
                  {"the op called", "the dtype of expand_x", "expand_x.shape[1] (H)", "expert_ids.shape[1] (K)",
                   "argument 'moe_expert_num'", "argument 'global_bs'", "argument 'comm_quant_mode'"},
                  ret.send_to, rt.per_rank);
  const at::ScalarType acc = acc_type(a.expand_x.scalar_type());
  at::Tensor out = rows_back_summed(g, a.expand_x, ret, rt, a.comm_quant_mode == 2, a.expert_scales);
  if (a.shared_expert_x.has_value())
    out.add_(a.shared_expert_x->reshape({rt.bs, H}).to(acc) * active_tokens(rt, acc));
  return out.to(a.expand_x.scalar_type());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> moe_distribute_combine_v2_grad_cpu(
    const MoeDistributeCombineV2GradArgs& a) {
  const char* op = "moe_distribute_combine_v2_grad";
  const int64_t W = a.ep_world_size, E = a.moe_expert_num;
  const Route rt = combine_route(op, a.expand_x, a.expert_ids, a.expert_scales, a.x_active_mask, a.shared_expert_x,
                                 W, a.ep_rank_id, E, a.global_bs);
  const int64_t H = a.expand_x.size(1);
  TORCH_CHECK_VALUE(a.grad_out.dim() == 2 && a.grad_out.size(0) == rt.bs && a.grad_out.size(1) == H, op,
                    ": grad_out must be [BS, H] = [", rt.bs, ", ", H, "]; got ", a.grad_out.sizes());
  const Return ret = plan_return(op, "ep_send_counts", a.ep_send_counts, W, E / W, a.expand_x.size(0));
  const Group g = resolve(op, a.group_ep, W, a.ep_rank_id, a.expand_x);
  const at::ScalarType acc = acc_type(a.expand_x.scalar_type());
  const at::Tensor pair = long_tensor(rt.pair);
  const int64_t P = static_cast<int64_t>(rt.pair.size());

  // The gradient travels like a dispatch, with each pair's weight beside it.
  const at::Tensor grad = a.grad_out.to(a.expand_x.scalar_type());
  const at::Tensor w = a.expert_scales.to(acc).reshape(-1).index_select(0, pair);
  const at::Tensor payload = at::cat({as_bytes(grad.index_select(0, at::floor_divide(pair, rt.k))),
                                      as_bytes(w.unsqueeze(1))}, 1);
  const int64_t data_bytes = H * a.expand_x.element_size();
  const at::Tensor got = mc2::wait(all_to_all_async(payload, ret.send_to, rt.per_rank, g), g).cpu();
  const at::Tensor gr = from_bytes(got.narrow(1, 0, data_bytes), a.expand_x.scalar_type()).to(acc);
  const at::Tensor wr = from_bytes(got.narrow(1, data_bytes, c10::elementSize(acc)), acc);
  const at::Tensor rows = long_tensor(ret.rows);
  at::Tensor grad_expand_x = at::zeros_like(a.expand_x, at::MemoryFormat::Contiguous);
  grad_expand_x.index_copy_(0, rows, (gr * wr).to(a.expand_x.scalar_type()));

  // d out[t] / d expert_scales[t, k] = row(t, k): the dot product is taken where the row lives and sent back.
  const at::Tensor dots = (gr * a.expand_x.index_select(0, rows).to(acc)).sum(1, true);
  const at::Tensor back = mc2::wait(all_to_all_async(as_bytes(dots), rt.per_rank, ret.send_to, g), g).cpu();
  at::Tensor grad_scales = at::zeros({rt.bs * rt.k}, a.expert_scales.options().dtype(acc));
  grad_scales.index_copy_(0, pair, from_bytes(back, acc).view({P}));
  grad_scales = grad_scales.view({rt.bs, rt.k}).to(a.expert_scales.scalar_type());

  at::Tensor grad_shared = at::empty({0}, a.expand_x.options());
  if (a.shared_expert_x.has_value()) {
    grad_shared = (a.grad_out.to(acc) * active_tokens(rt, acc))
                      .to(a.shared_expert_x->scalar_type())
                      .reshape(a.shared_expert_x->sizes());
  }
  return {grad_expand_x, grad_scales, grad_shared};
}

}  // namespace npu_fa
