// Argument validation of incre_flash_attention shared by every backend (CPU kernel, Ascend C kernel on the npu
// device), so both reject the same bad inputs with the same messages.
#include "common/inference/decode_params.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <string>
#include <vector>

#include "common/attention/params.h"
#include "common/checked_math.h"
#include "common/inference/nz_cache.h"

namespace npu_fa::attention {
namespace {

constexpr const char* kOp = "incre_flash_attention";

std::vector<int64_t> int_values(const char* arg, const at::Tensor& t) {
  TORCH_CHECK_TYPE(t.scalar_type() == at::kLong || t.scalar_type() == at::kInt, kOp, ": argument '", arg,
                   "' must be an int64 or int32 tensor; got ", t.scalar_type());
  const at::Tensor c = t.to(at::kCPU, at::kLong).contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

}  // namespace

// ---- int8 caches (KV antiquant) ----
namespace {

// The int8 cache's dequantisation factors of one of key / value (`which`), for antiquant mode `mode`: `scale` (and
// `offset`, optional) already sliced from the stacked [2, ...] form when that was used; `name` is the argument to
// blame. `need` = the last cache position read + 1 (per-token factors must cover it).
void parse_antiquant(const char* kOp, const std::string& name, const std::string& offset_name, const char* mode_name,
                     const at::Tensor& scale, const std::optional<at::Tensor>& offset, int64_t mode, int64_t B,
                     int64_t N2, int64_t D, int64_t need, at::Tensor& s32, at::Tensor& o32, Antiquant& q) {
  TORCH_CHECK_NOT_IMPLEMENTED(mode != 4 && mode != 5, kOp, ": argument '", mode_name, "' = ", mode,
                              " (scales managed by page attention) is not implemented");
  TORCH_CHECK_TYPE(at::isFloatingType(scale.scalar_type()), kOp, ": argument '", name,
                   "' must be float32, float16 or bfloat16; got ", scale.scalar_type());
  const auto sz = scale.sizes();
  const int64_t dim = scale.dim();
  bool ok = false;
  if (mode == 0) {
    if (scale.numel() == 1) {
      ok = dim <= 1;  // per-tensor
    } else {
      ok = dim >= 1 && dim <= 4 && scale.numel() == N2 * D && (sz.back() == D || sz.back() == N2 * D);
      q.s_h = D;
      q.s_d = 1;
    }
    TORCH_CHECK_VALUE(ok, kOp, ": argument '", name, "' (", mode_name, "=0, per-channel) must hold N2*D = ", N2 * D,
                      " values as [1, N2, 1, D], [1, N2, D], [1, H], [N2, D] or [H] (stacked [2, ...] for "
                      "antiquant_scale), or one value (per-tensor); got shape ", sz, " with N2=", N2, ", D=", D);
  } else if (mode == 1) {
    ok = (dim == 2 || (dim == 3 && sz[0] == 1)) && sz[dim - 2] == B && sz[dim - 1] >= need;
    TORCH_CHECK_VALUE(ok, kOp, ": argument '", name, "' (", mode_name, "=1, per-token) must have shape [1, B, S] or "
                      "[B, S] with B=", B, " and S >= ", need, " (the last cache position read + 1); got ", sz);
    q.s_b = sz[dim - 1];
    q.s_pos = 1;
    q.per_token = true;
  } else if (mode == 2) {
    ok = dim == 1 && sz[0] == N2;
    TORCH_CHECK_VALUE(ok, kOp, ": argument '", name, "' (", mode_name, "=2, per-tensor per-head) must have shape "
                      "[N2=", N2, "]; got ", sz);
    q.s_h = 1;
  } else if (mode == 3) {
    ok = dim == 3 && sz[0] == B && sz[1] == N2 && sz[2] >= need;
    TORCH_CHECK_VALUE(ok, kOp, ": argument '", name, "' (", mode_name, "=3, per-token per-head) must have shape "
                      "[B=", B, ", N2=", N2, ", S >= ", need, "]; got ", sz);
    q.s_b = N2 * sz[2];
    q.s_h = sz[2];
    q.s_pos = 1;
    q.per_token = true;
  } else {
    TORCH_CHECK_VALUE(false, kOp, ": argument '", mode_name, "' must be in [0, 5] (0 per-channel, 1 per-token, 2 "
                      "per-tensor per-head, 3 per-token per-head; 4/5 not implemented); got ", mode);
  }
  s32 = scale.to(at::kFloat).contiguous();
  q.scale = s32.data_ptr<float>();
  if (offset.has_value()) {
    TORCH_CHECK_TYPE(at::isFloatingType(offset->scalar_type()), kOp, ": argument '", offset_name,
                     "' must be float32, float16 or bfloat16; got ", offset->scalar_type());
    TORCH_CHECK_VALUE(offset->sizes() == sz, kOp, ": argument '", offset_name, "' must have the shape of '", name,
                      "' ", sz, "; got ", offset->sizes());
    o32 = offset->to(at::kFloat).contiguous();
    q.offset = o32.data_ptr<float>();
  }
}

}  // namespace

KvAntiquant parse_kv_antiquant(const char* kOp, const AntiquantArgs& a, bool int8, int64_t B, int64_t N2, int64_t D,
                               int64_t need) {
  KvAntiquant in;
  TORCH_CHECK_VALUE(a.antiquant_mode == 0 || a.antiquant_mode == 1, kOp,
                    ": argument 'antiquant_mode' must be 0 (per-channel) or 1 (per-token); got ", a.antiquant_mode);
  for (const auto& [m, nm] : {std::pair{a.key_antiquant_mode, "key_antiquant_mode"},
                              std::pair{a.value_antiquant_mode, "value_antiquant_mode"}})
    TORCH_CHECK_VALUE(m >= 0 && m <= 5, kOp, ": argument '", nm, "' must be in [0, 5]; got ", m);
  const bool separate = a.key_antiquant_scale.has_value() || a.value_antiquant_scale.has_value();
  const bool any = separate || a.antiquant_scale.has_value() || a.antiquant_offset.has_value() ||
                   a.key_antiquant_offset.has_value() || a.value_antiquant_offset.has_value();
  if (!int8) {
    TORCH_CHECK_VALUE(!any, kOp, ": the antiquant arguments dequantise an int8 key/value cache; key and value "
                      "are not int8");
    return in;
  }
  TORCH_CHECK_VALUE(a.antiquant_scale.has_value() || separate, kOp, ": int8 key/value need their dequantisation "
                    "scales: argument 'antiquant_scale' ([2, ...], key and value stacked) or 'key_antiquant_scale' "
                    "and 'value_antiquant_scale'");
  TORCH_CHECK_VALUE(!a.antiquant_offset.has_value() || a.antiquant_scale.has_value(), kOp,
                    ": argument 'antiquant_offset' needs 'antiquant_scale'");
  Antiquant& kq = in.k;
  Antiquant& vq = in.v;
  if (separate) {  // the separate form wins over the stacked one (as torch_npu)
    TORCH_CHECK_VALUE(a.key_antiquant_scale.has_value() && a.value_antiquant_scale.has_value(), kOp,
                      ": arguments 'key_antiquant_scale' and 'value_antiquant_scale' must be given together");
    TORCH_CHECK_VALUE(a.key_antiquant_offset.has_value() == a.value_antiquant_offset.has_value(), kOp,
                      ": arguments 'key_antiquant_offset' and 'value_antiquant_offset' must be given together (or "
                      "neither)");
    const int64_t km = a.key_antiquant_mode, vm = a.value_antiquant_mode;
    TORCH_CHECK_VALUE(km == vm || (km == 0 && vm == 1), kOp, ": arguments 'key_antiquant_mode' (", km,
                      ") and 'value_antiquant_mode' (", vm, ") must be equal, or 0 and 1 (as torch_npu)");
    parse_antiquant(kOp, "key_antiquant_scale", "key_antiquant_offset", "key_antiquant_mode", *a.key_antiquant_scale,
                    a.key_antiquant_offset, km, B, N2, D, need, in.k_scale, in.k_offset, kq);
    parse_antiquant(kOp, "value_antiquant_scale", "value_antiquant_offset", "value_antiquant_mode",
                    *a.value_antiquant_scale, a.value_antiquant_offset, vm, B, N2, D, need, in.v_scale, in.v_offset,
                    vq);
    return in;
  }
  TORCH_CHECK_VALUE(!a.key_antiquant_offset.has_value() && !a.value_antiquant_offset.has_value(), kOp,
                    ": arguments 'key_antiquant_offset' / 'value_antiquant_offset' need 'key_antiquant_scale' and "
                    "'value_antiquant_scale'");
  const at::Tensor& s = *a.antiquant_scale;
  TORCH_CHECK_VALUE(s.dim() >= 1 && s.size(0) == 2, kOp, ": argument 'antiquant_scale' must stack key's and value's "
                    "factors in a leading dim of 2 ([2, N2, 1, D], [2, N2, D], [2, H], [2] or, per-token, [2, B, S]); "
                    "got shape ", s.sizes());
  if (a.antiquant_offset.has_value())
    TORCH_CHECK_VALUE(a.antiquant_offset->sizes() == s.sizes(), kOp, ": argument 'antiquant_offset' must have the "
                      "shape of 'antiquant_scale' ", s.sizes(), "; got ", a.antiquant_offset->sizes());
  std::optional<at::Tensor> ko, vo;
  if (a.antiquant_offset.has_value()) ko = (*a.antiquant_offset)[0], vo = (*a.antiquant_offset)[1];
  parse_antiquant(kOp, "antiquant_scale", "antiquant_offset", "antiquant_mode", s[0], ko, a.antiquant_mode, B, N2, D,
                  need, in.k_scale, in.k_offset, kq);
  parse_antiquant(kOp, "antiquant_scale", "antiquant_offset", "antiquant_mode", s[1], vo, a.antiquant_mode, B, N2, D,
                  need, in.v_scale, in.v_offset, vq);
  return in;
}

at::Tensor dequantize_kv(const at::Tensor& x, const Antiquant& a, const at::Tensor& scale, const at::Tensor& offset) {
  // Broadcast views of the factors over [B, N2, S, D] (zero strides where they do not vary).
  const auto sizes = x.sizes();
  const std::vector<int64_t> strides{a.s_b, a.s_h, a.s_pos, a.s_d};
  at::Tensor y = x.to(at::kFloat);
  if (a.offset) y.add_(offset.as_strided(sizes, strides));
  return y.mul_(scale.as_strided(sizes, strides));
}


DecodeInputs validate_decode(const IncreFlashAttentionArgs& args) {
  const std::string layout(args.input_layout);
  TORCH_CHECK_VALUE(layout == "BSH" || layout == "BSND" || layout == "BNSD", kOp,
                    ": argument 'input_layout' must be one of BSH, BSND, BNSD; got '", layout, "'");
  TORCH_CHECK_VALUE(args.num_heads > 0, kOp, ": argument 'num_heads' must be positive; got ", args.num_heads);
  TORCH_CHECK_VALUE(args.num_key_value_heads >= 0, kOp, ": argument 'num_key_value_heads' must be >= 0; got ",
                    args.num_key_value_heads);
  TORCH_CHECK_VALUE(args.inner_precise == 0 || args.inner_precise == 1, kOp,
                    ": argument 'inner_precise' must be 0 or 1; got ",
                    args.inner_precise);
  const bool int8 = args.key.scalar_type() == at::kChar || args.value.scalar_type() == at::kChar;
  if (int8) {  // an int8 cache (KV antiquant): fp16/bf16 queries only, as torch_npu
    const auto qt = args.query.scalar_type();
    TORCH_CHECK_TYPE(args.key.scalar_type() == at::kChar && args.value.scalar_type() == at::kChar, kOp,
                     ": arguments 'key' and 'value' must both be int8 for an int8 cache; got ", args.key.scalar_type(),
                     " and ", args.value.scalar_type());
    TORCH_CHECK_TYPE(qt == at::kHalf || qt == at::kBFloat16, kOp, ": int8 key/value need a float16 or bfloat16 "
                     "'query' (as torch_npu); got ", qt);
  } else {
    attention::check_qkv_dtypes(kOp, args.query, args.key, args.value);
  }
  attention::check_scale(kOp, "scale_value", args.scale_value);
  const bool bsh = layout == "BSH";
  const int64_t q_rank = bsh ? 3 : 4;
  TORCH_CHECK_VALUE(args.query.dim() == q_rank, kOp, ": argument 'query' must be a ", q_rank,
                    "-D tensor for input_layout ",
                    layout, "; got shape ", args.query.sizes());
  const int64_t N1 = args.num_heads;
  const int64_t N2 = args.num_key_value_heads == 0 ? N1 : args.num_key_value_heads;
  TORCH_CHECK_VALUE(N1 % N2 == 0, kOp, ": argument 'num_heads' (", N1, ") must be a multiple of 'num_key_value_heads' (",
                    N2, ")");
  const int64_t B = args.query.size(0);
  int64_t sq, D;
  if (bsh) {
    sq = args.query.size(1);
    TORCH_CHECK_VALUE(args.query.size(2) % N1 == 0, kOp, ": argument 'query' hidden size ", args.query.size(2),
                      " is not a multiple of num_heads ", N1);
    D = args.query.size(2) / N1;
  } else if (layout == "BSND") {
    sq = args.query.size(1);
    TORCH_CHECK_VALUE(args.query.size(2) == N1, kOp, ": argument 'query' has ", args.query.size(2),
                      " heads; num_heads is ", N1);
    D = args.query.size(3);
  } else {
    sq = args.query.size(2);
    TORCH_CHECK_VALUE(args.query.size(1) == N1, kOp, ": argument 'query' has ", args.query.size(1),
                      " heads; num_heads is ", N1);
    D = args.query.size(3);
  }
  TORCH_CHECK_VALUE(sq == 1, kOp, ": argument 'query' must have query length 1 (one decode token per sequence); got ",
                    sq, " (shape ", args.query.sizes(), ", input_layout ", layout, ")");
  TORCH_CHECK_VALUE(D > 0, kOp, ": argument 'query' has head dim 0");
  TORCH_CHECK_VALUE(args.key.sizes() == args.value.sizes(), kOp,
                    ": arguments 'key' and 'value' must have the same shape; got ",
                    args.key.sizes(), " and ", args.value.sizes());

  DecodeInputs in;
  DecodeParams& p = in.params;
  p.batch = B;
  p.q_heads = N1;
  p.kv_heads = N2;
  p.group = N1 / N2;
  p.head_dim = D;
  // KV cache: keep the caller's memory when the head dim is contiguous (a copy would cost more than the attention).
  in.key = args.key.stride(-1) == 1 ? args.key : args.key.contiguous();
  in.value = args.value.stride(-1) == 1 ? args.value : args.value.contiguous();
  const at::Tensor& k = in.key;
  const at::Tensor& v = in.value;
  p.paged = args.block_table.has_value();
  int64_t capacity = 0;  // valid positions on the cache's seq axis per sequence
  if (p.paged) {
    const at::Tensor& bt = *args.block_table;
    TORCH_CHECK_TYPE(bt.scalar_type() == at::kInt || bt.scalar_type() == at::kLong, kOp,
                     ": argument 'block_table' must be an int32 tensor; got ", bt.scalar_type());
    TORCH_CHECK_VALUE(bt.dim() == 2 && bt.size(0) == B, kOp, ": argument 'block_table' must have shape [B=", B,
                      ", max_blocks_per_seq]; got ", bt.sizes());
    TORCH_CHECK_VALUE(args.block_size > 0 && args.block_size % 16 == 0 && args.block_size <= 512, kOp,
                      ": argument 'block_size' must be a positive multiple of 16 and <= 512 with a paged cache; got ",
                      args.block_size);
    TORCH_CHECK_VALUE(!args.kv_padding_size.has_value(), kOp,
                      ": argument 'kv_padding_size' is only supported with a contiguous cache (block_table is set)");
    TORCH_CHECK_VALUE(args.actual_seq_lengths.has_value(), kOp,
                      ": argument 'actual_seq_lengths' is required with a paged cache (block_table is set)");
    if (k.dim() == 3) {  // (num_blocks, block_size, N2*D)
      TORCH_CHECK_VALUE(k.size(1) == args.block_size && k.size(2) == N2 * D, kOp,
                        ": argument 'key' of a paged cache must have shape (num_blocks, block_size=", args.block_size,
                        ", N2*D=", N2 * D, "); got ", k.sizes());
      p.k_blk = k.stride(0); p.k_seq = k.stride(1); p.k_head = D;
      p.v_blk = v.stride(0); p.v_seq = v.stride(1); p.v_head = D;
      TORCH_CHECK_VALUE(k.stride(2) == 1 && v.stride(2) == 1, kOp, ": paged 'key'/'value' need a contiguous last dim");
    } else if (is_nz_cache(k)) {  // (num_blocks, N2, D / c0, block_size, c0): read in place, piece by piece
      TORCH_CHECK_VALUE(layout == "BNSD", kOp, ": an NZ (5-D) paged cache needs input_layout BNSD; got ", layout);
      const NzStrides ks = nz_strides(kOp, "key", k, N2, D, args.block_size);
      const NzStrides vs = nz_strides(kOp, "value", v, N2, D, args.block_size);
      p.k_blk = ks.blk; p.k_head = ks.head; p.k_seq = ks.seq; p.k_piece = ks.piece;
      p.v_blk = vs.blk; p.v_head = vs.head; p.v_seq = vs.seq; p.v_piece = vs.piece;
      p.nz_c0 = ks.c0;
    } else {
      TORCH_CHECK_VALUE(k.dim() == 4 && layout == "BNSD", kOp,
                        ": argument 'key' of a paged cache must be (num_blocks, block_size, N2*D), or "
                        "(num_blocks, N2, block_size, D) or the NZ (num_blocks, N2, D/c0, block_size, c0) with "
                        "input_layout BNSD; got shape ", k.sizes(),
                        " with input_layout ", layout);
      TORCH_CHECK_VALUE(k.size(1) == N2 && k.size(2) == args.block_size && k.size(3) == D, kOp,
                        ": argument 'key' of a paged cache must have shape (num_blocks, N2=", N2, ", block_size=",
                        args.block_size, ", D=", D, "); got ", k.sizes());
      p.k_blk = k.stride(0); p.k_head = k.stride(1); p.k_seq = k.stride(2);
      p.v_blk = v.stride(0); p.v_head = v.stride(1); p.v_seq = v.stride(2);
    }
    TORCH_CHECK_VALUE(!int8 || args.block_size % 32 == 0, kOp, ": argument 'block_size' must be a multiple of 32 "
                      "with an int8 paged cache (as torch_npu); got ", args.block_size);
    p.block_size = args.block_size;
    p.max_blocks = bt.size(1);
    p.block_table = int_values("block_table", bt);
    capacity = p.max_blocks * args.block_size;
  } else {
    const int64_t k_rank = bsh ? 3 : 4;
    TORCH_CHECK_VALUE(k.dim() == k_rank && k.size(0) == B, kOp, ": argument 'key' must be a ", k_rank,
                      "-D tensor with batch ", B, " for input_layout ", layout, " (or pass block_table for a paged "
                      "cache); got shape ", k.sizes());
    if (bsh) {
      TORCH_CHECK_VALUE(k.size(2) == N2 * D, kOp, ": argument 'key' hidden size must be num_key_value_heads*D = ",
                        N2 * D, "; got shape ", k.sizes());
      p.k_blk = k.stride(0); p.k_seq = k.stride(1); p.k_head = D;
      p.v_blk = v.stride(0); p.v_seq = v.stride(1); p.v_head = D;
      TORCH_CHECK_VALUE(k.stride(2) == 1 && v.stride(2) == 1, kOp, ": 'key'/'value' need a contiguous hidden dim");
      capacity = k.size(1);
    } else if (layout == "BSND") {
      TORCH_CHECK_VALUE(k.size(2) == N2 && k.size(3) == D, kOp, ": argument 'key' must have shape [B, S, N2=", N2,
                        ", D=", D, "]; got ", k.sizes());
      p.k_blk = k.stride(0); p.k_seq = k.stride(1); p.k_head = k.stride(2);
      p.v_blk = v.stride(0); p.v_seq = v.stride(1); p.v_head = v.stride(2);
      capacity = k.size(1);
    } else {
      TORCH_CHECK_VALUE(k.size(1) == N2 && k.size(3) == D, kOp, ": argument 'key' must have shape [B, N2=", N2,
                        ", S, D=", D, "]; got ", k.sizes());
      p.k_blk = k.stride(0); p.k_head = k.stride(1); p.k_seq = k.stride(2);
      p.v_blk = v.stride(0); p.v_head = v.stride(1); p.v_seq = v.stride(2);
      capacity = k.size(2);
    }
    TORCH_CHECK_VALUE(args.block_size == 0 || args.block_size % 16 == 0, kOp,
                      ": argument 'block_size' must be a multiple of 16 and <= 512; got ", args.block_size);
  }

  // Per-sequence lengths and where they start on the cache's seq axis.
  p.kv_len.assign(B, capacity);
  if (args.actual_seq_lengths.has_value()) {
    const auto lens = int_values("actual_seq_lengths", *args.actual_seq_lengths);
    TORCH_CHECK_VALUE(args.actual_seq_lengths->dim() <= 1 && (static_cast<int64_t>(lens.size()) == B || lens.size() == 1),
                      kOp, ": argument 'actual_seq_lengths' must have B=", B, " (or 1) entries; got shape ",
                      args.actual_seq_lengths->sizes());
    for (int64_t b = 0; b < B; ++b) {
      const int64_t len = lens[lens.size() == 1 ? 0 : b];
      TORCH_CHECK_VALUE(len >= 0 && len <= capacity, kOp, ": argument 'actual_seq_lengths'[", b, "] = ", len,
                        " is outside [0, ", capacity, "] (the cache holds ", capacity, " positions per sequence",
                        p.paged ? ": max_blocks_per_seq * block_size" : "", ")");
      p.kv_len[b] = len;
    }
  }
  p.kv_start.assign(B, 0);
  if (args.kv_padding_size.has_value()) {
    const auto pad = int_values("kv_padding_size", *args.kv_padding_size);
    TORCH_CHECK_VALUE(pad.size() == 1, kOp, ": argument 'kv_padding_size' must be a one-element tensor; got shape ",
                      args.kv_padding_size->sizes());
    for (int64_t b = 0; b < B; ++b) {
      // pad + length is checked for overflow first: a wrapped sum would pass the capacity test and start the
      // keys outside the cache.
      TORCH_CHECK_VALUE(pad[0] >= 0, kOp, ": argument 'kv_padding_size' must be >= 0; got ", pad[0]);
      const int64_t end = checked_add(kOp, "argument 'kv_padding_size' + actual_seq_lengths", pad[0], p.kv_len[b]);
      TORCH_CHECK_VALUE(end <= capacity, kOp, ": argument 'kv_padding_size' = ", pad[0],
                        " with actual_seq_lengths[", b, "] = ", p.kv_len[b], " does not fit the cache of ", capacity,
                        " positions");
      p.kv_start[b] = capacity - pad[0] - p.kv_len[b];
    }
  }
  if (p.paged) {
    // Only the range is checked: attention only reads the cache, so one physical block may back several logical
    // blocks, of different sequences (a shared prompt prefix) or even of one sequence (docs/inference.md).
    const int64_t num_blocks = k.size(0);
    for (int64_t b = 0; b < B; ++b) {
      const int64_t used = (p.kv_len[b] + args.block_size - 1) / args.block_size;
      for (int64_t i = 0; i < used; ++i) {
        const int64_t blk = p.block_table[b * p.max_blocks + i];
        TORCH_CHECK_VALUE(blk >= 0 && blk < num_blocks, kOp, ": argument 'block_table'[", b, "][", i, "] = ", blk,
                          " is out of range [0, ", num_blocks, ") (num_blocks of the cache)");
      }
    }
  }
  // Highest cache position any sequence reads + 1: the minimum width of atten_mask / pse_shift.
  int64_t need = 0;
  for (int64_t b = 0; b < B; ++b) if (p.kv_len[b] > 0) need = std::max(need, p.kv_start[b] + p.kv_len[b]);

  at::Tensor& mask_u8 = in.mask_u8;
  at::Tensor& pse32 = in.pse32;
  if (args.atten_mask.has_value()) {
    const at::Tensor& m = *args.atten_mask;
    TORCH_CHECK_TYPE(m.scalar_type() == at::kBool || m.scalar_type() == at::kByte, kOp,
                     ": argument 'atten_mask' must be bool or uint8 (True/1 = masked out); got ", m.scalar_type());
    bool ok = m.dim() >= 2 && m.dim() <= 4 && (m.size(0) == B || m.size(0) == 1) && m.size(-1) >= need;
    for (int64_t d = 1; ok && d + 1 < m.dim(); ++d) ok = m.size(d) == 1;
    TORCH_CHECK_VALUE(ok, kOp, ": argument 'atten_mask' must have shape (B, S), (B, 1, S) or (B, 1, 1, S) with B=", B,
                      " (or 1) and S >= ", need, " (the last cache position read + 1); got ", m.sizes());
    mask_u8 = m.to(at::kByte).reshape({m.size(0), m.size(-1)}).contiguous();
    p.mask = mask_u8.data_ptr<uint8_t>();
    p.mask_sb = m.size(0) == 1 ? 0 : mask_u8.size(1);
  }
  if (args.pse_shift.has_value()) {
    const at::Tensor& ps = *args.pse_shift;
    TORCH_CHECK_TYPE(at::isFloatingType(ps.scalar_type()), kOp, ": argument 'pse_shift' must be floating point; got ",
                     ps.scalar_type());
    TORCH_CHECK_VALUE(ps.dim() == 4 && (ps.size(0) == B || ps.size(0) == 1) && ps.size(1) == N1 && ps.size(2) == 1 &&
                          ps.size(3) >= need,
                      kOp, ": argument 'pse_shift' must have shape [B=", B, " or 1, N1=", N1, ", 1, S >= ", need,
                      "]; got ", ps.sizes());
    pse32 = ps.to(at::kFloat).contiguous();
    p.pse = pse32.data_ptr<float>();
    p.pse_sn = ps.size(3);
    p.pse_sb = ps.size(0) == 1 ? 0 : N1 * ps.size(3);
  }
  if (args.learnable_sink.has_value()) {
    const at::Tensor& sk = *args.learnable_sink;
    TORCH_CHECK_TYPE(at::isFloatingType(sk.scalar_type()), kOp, ": argument 'learnable_sink' must be floating point; "
                     "got ", sk.scalar_type());
    TORCH_CHECK_VALUE(sk.dim() == 1 && sk.size(0) == N1, kOp, ": argument 'learnable_sink' must have shape [N1=", N1,
                      "] (one logit per query head); got ", sk.sizes());
    TORCH_CHECK_VALUE(sk.device() == args.query.device(), kOp, ": argument 'learnable_sink' must be on ",
                      args.query.device(), "; got ", sk.device());
    in.sink32 = sk.to(at::kFloat).contiguous();
    p.sink = in.sink32.data_ptr<float>();
  }

  parse_kv_antiquant(kOp, AntiquantArgs::of(args), int8, B, N2, D, need).install(p, in);
  p.scale = static_cast<float>(args.scale_value);
  return in;
}

}  // namespace npu_fa::attention
