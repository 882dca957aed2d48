// Host tiling of the FlashAttention backward kernel (see the header for the work split).
#include "attention/flash_attention_score_grad_tiling.h"

#include <algorithm>

namespace tot_ascendc {
namespace {

constexpr int64_t kDefaultBlock = 128;  // query / key rows per tile: a 128 x 128 score block per cube step
constexpr uint64_t kWsAlign = 512;      // workspace regions start on 512 bytes (GM burst alignment)
constexpr uint32_t kMaxHeadDim = 512;

uint32_t ElemBytes(FagDtype t) { return t == FagDtype::FP32 ? 4 : 2; }

std::string Positive(const char* what, int64_t v) {
  return v > 0 ? "" : std::string("flash_attention_score_grad tiling: ") + what + " must be > 0; got " +
                          std::to_string(v);
}

// UB bytes of the vector buffers for `chunk` elements per work buffer (see the kernel's InitBuffers).
uint32_t UbBytes(uint32_t chunk, uint32_t elem, uint32_t vec_rows, uint32_t bkv_pitch, uint32_t mask_pitch) {
  const uint32_t work = chunk * (4 + 4 + 2 * elem);
  const uint32_t stats = 3 * AlignUp(uint64_t(vec_rows) * 8 * 4, 32);   // max, sum, Di: [rows, 8] fp32
  // Compare works on whole 256-byte repeats: its operands span the key row rounded up to 128 elements.
  const uint32_t cmp = FaGradComparePitch(bkv_pitch);
  const uint32_t mask = AlignUp(uint64_t(vec_rows) * mask_pitch, 32)    // uint8 rows
                        + AlignUp(uint64_t(cmp) * 2, 32)                // one row as half
                        + AlignUp(cmp / 8, 32)                          // compare bits
                        + AlignUp(uint64_t(cmp) * 4, 32);               // key indices as fp32
  const uint32_t reduce_tmp = 256;
  return work + stats + mask + reduce_tmp;
}

}  // namespace

std::string FlashAttentionScoreGradTilingFunc(const FlashAttentionScoreGradShape& s, const PlatformInfo& pf,
                                              FlashAttentionScoreGradTiling& t) {
  t = FlashAttentionScoreGradTiling{};
  for (auto [what, v] : {std::pair<const char*, int64_t>{"batch", s.batch}, {"q_heads", s.q_heads},
                         {"kv_heads", s.kv_heads}, {"s1", s.s1}, {"s2", s.s2}, {"d", s.d}, {"dv", s.dv}}) {
    const std::string e = Positive(what, v);
    if (!e.empty()) return e;
  }
  if (s.q_heads % s.kv_heads != 0)
    return "flash_attention_score_grad tiling: q_heads (" + std::to_string(s.q_heads) +
           ") must be a multiple of kv_heads (" + std::to_string(s.kv_heads) + ")";
  if (s.d > kMaxHeadDim || s.dv > kMaxHeadDim)
    return "flash_attention_score_grad tiling: head dims must be <= " + std::to_string(kMaxHeadDim) + "; got d=" +
           std::to_string(s.d) + ", dv=" + std::to_string(s.dv);
  if (s.s1 > (int64_t(1) << 24) || s.s2 > (int64_t(1) << 24))
    return "flash_attention_score_grad tiling: sequence lengths must be <= 2^24 (key indices are exact in fp32)";
  if (s.has_mask && !((s.mask_batches == 1 || s.mask_batches == s.batch) &&
                      (s.mask_heads == 1 || s.mask_heads == s.q_heads)))
    return "flash_attention_score_grad tiling: mask leading dims must be [1 or B, 1 or N1]; got [" +
           std::to_string(s.mask_batches) + ", " + std::to_string(s.mask_heads) + "]";

  const uint32_t elem = ElemBytes(s.dtype);
  t.dtype = uint32_t(s.dtype);
  t.batch = uint32_t(s.batch);
  t.q_heads = uint32_t(s.q_heads);
  t.kv_heads = uint32_t(s.kv_heads);
  t.group = uint32_t(s.q_heads / s.kv_heads);
  t.s1 = uint32_t(s.s1);
  t.s2 = uint32_t(s.s2);
  t.d = uint32_t(s.d);
  t.dv = uint32_t(s.dv);
  t.scale = s.scale;
  t.band_lo = s.band_lo;
  t.band_hi = s.band_hi;
  t.has_mask = s.has_mask ? 1 : 0;
  t.mask_head_stride = s.has_mask && s.mask_heads > 1 ? uint64_t(s.s1) * s.s2 : 0;
  t.mask_batch_stride = s.has_mask && s.mask_batches > 1 ? uint64_t(s.mask_heads) * s.s1 * s.s2 : 0;
  t.d_pitch = AlignUp(s.d, 16);
  t.dv_pitch = AlignUp(s.dv, 16);
  const uint32_t max_pitch = std::max(t.d_pitch, t.dv_pitch);

  // Tiles: start from 128 x 128 (or the caller's) and halve the key block until the UB holds at least one row of
  // every buffer and the L1 holds both operands of the largest matmul step twice (double buffering).
  int64_t bq = std::min<int64_t>(s.block_q > 0 ? s.block_q : kDefaultBlock, s.s1);
  int64_t bkv = std::min<int64_t>(s.block_kv > 0 ? s.block_kv : kDefaultBlock, s.s2);
  const uint32_t budget = pf.UsableUb();
  for (;;) {
    const uint32_t bkv_pitch = AlignUp(bkv, 16), mask_pitch = AlignUp(bkv, 32);
    const uint64_t dmax = std::max(s.d, s.dv);
    const uint64_t l1 = 2 * elem * (uint64_t(bq) * dmax + uint64_t(bkv) * dmax + uint64_t(bq) * bkv_pitch);
    // One chunk must hold a full score row and a full accumulator row; aim for bq score rows.
    const uint32_t min_chunk = std::max(bkv_pitch, max_pitch);
    uint32_t chunk = std::max<uint32_t>(uint32_t(bq) * bkv_pitch, min_chunk);
    uint32_t vec_rows = std::min<uint32_t>(uint32_t(bq), chunk / bkv_pitch);
    while (chunk > min_chunk && UbBytes(chunk, elem, vec_rows, bkv_pitch, mask_pitch) > budget) {
      chunk = std::max(min_chunk, AlignUp(chunk / 2, 16));
      vec_rows = std::max<uint32_t>(1, std::min<uint32_t>(uint32_t(bq), chunk / bkv_pitch));
    }
    const uint32_t ub = UbBytes(chunk, elem, vec_rows, bkv_pitch, mask_pitch);
    if (ub <= budget && l1 <= pf.l1_bytes) {
      t.bq = uint32_t(bq);
      t.bkv = uint32_t(bkv);
      t.bkv_pitch = bkv_pitch;
      t.mask_pitch = mask_pitch;
      t.ub_chunk_elems = chunk;
      t.vec_rows = vec_rows;
      t.ub_bytes = ub;
      t.l1_bytes = uint32_t(l1);
      break;
    }
    if (bkv <= 16 && bq <= 16)
      return "flash_attention_score_grad tiling: no tile fits UB (" + std::to_string(budget) + " B) and L1 (" +
             std::to_string(pf.l1_bytes) + " B) for d=" + std::to_string(s.d) + ", dv=" + std::to_string(s.dv);
    if (bkv > 16) bkv = std::max<int64_t>(16, bkv / 2);
    else bq = std::max<int64_t>(16, bq / 2);
  }
  t.s1_blocks = CeilDiv(s.s1, t.bq);
  t.s2_blocks = CeilDiv(s.s2, t.bkv);
  t.s1_tail = uint32_t(s.s1 - int64_t(t.s1_blocks - 1) * t.bq);
  t.s2_tail = uint32_t(s.s2 - int64_t(t.s2_blocks - 1) * t.bkv);
  t.task_num = uint32_t(s.batch * s.kv_heads * t.s2_blocks);
  t.rows = uint64_t(s.batch) * s.q_heads * s.s1;

  // Cores: one AIV per task at most, in whole groups of 2 AIVs.
  const int64_t max_groups = s.max_block_dim > 0 ? std::min<int64_t>(s.max_block_dim, pf.aic_cores) : pf.aic_cores;
  t.block_dim = uint32_t(std::clamp<int64_t>(CeilDiv(t.task_num, 2), 1, max_groups));
  t.aiv_num = 2 * t.block_dim;

  // Workspace.
  uint64_t off = 0;
  auto take = [&](uint64_t bytes) { const uint64_t at = off; off = AlignUp(off + bytes, kWsAlign); return at; };
  t.ws_dq_offset = take(t.rows * t.d_pitch * 4);
  t.ws_di_offset = take(t.rows * 8 * 4);
  t.ws_aiv_offset = off;
  uint64_t slice = 0;
  auto take_slice = [&](uint64_t bytes) { const uint64_t at = slice; slice = AlignUp(slice + bytes, kWsAlign); return at; };
  const uint64_t block = uint64_t(t.bq) * t.bkv_pitch;
  t.ws_s_offset = take_slice(block * 4);
  t.ws_dp_offset = take_slice(block * 4);
  t.ws_p_offset = take_slice(block * elem);
  t.ws_ds_offset = take_slice(block * elem);
  t.ws_dqp_offset = take_slice(uint64_t(t.bq) * t.d_pitch * 4);
  t.ws_dk_offset = take_slice(uint64_t(t.bkv) * t.d_pitch * 4);
  t.ws_dv_offset = take_slice(uint64_t(t.bkv) * t.dv_pitch * 4);
  t.ws_aiv_bytes = slice;
  t.workspace_bytes = t.ws_aiv_offset + uint64_t(t.aiv_num) * slice;
  return "";
}

}  // namespace tot_ascendc
