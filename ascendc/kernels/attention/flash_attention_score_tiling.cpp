// Host tiling of the FlashAttention forward kernel (pure C++; see the header for the work split).
#include "attention/flash_attention_score_tiling.h"

#include <algorithm>
#include <vector>

namespace tot_ascendc {
namespace {

bool Fits(const FlashAttentionTilingInput& in, uint32_t s1b, uint32_t s2b, uint32_t vec_rows, uint32_t vdp,
          const PlatformInfo& pf) {
  const uint32_t es = FaElemBytes(in.dtype);
  const bool mask = in.mask_kind == FA_MASK_EXPLICIT;
  return FaPlanUb(s1b, s2b, vec_rows, vdp, es, mask).Total() <= pf.UsableUb() &&
         FaL1Bytes(s1b, s2b, in.head_dim, in.v_head_dim ? in.v_head_dim : in.head_dim, es) <= pf.l1_bytes;
}

// The largest row chunk (a multiple of 8 dividing s1b, <= 128 so level-0 repeats stay < 256) that fits UB.
uint32_t PickVecRows(const FlashAttentionTilingInput& in, uint32_t s1b, uint32_t s2b, uint32_t vdp,
                     const PlatformInfo& pf) {
  for (uint32_t r = std::min<uint32_t>(s1b, 128); r >= 8; r -= 8)
    if (s1b % r == 0 && Fits(in, s1b, s2b, r, vdp, pf)) return r;
  return 0;
}

// Does the band leave any key of block [j0, j0 + nk) visible to a row of [i0, i0 + rows)?
bool BlockVisible(const FlashAttentionTilingInput& in, int64_t i0, int64_t rows, int64_t j0, int64_t nk) {
  if (in.band_hi < in.band_lo) return false;
  return !(j0 + nk - 1 < i0 + in.band_lo || j0 > i0 + rows - 1 + in.band_hi);
}

// Contiguous task ranges of about equal cost (visible key blocks + 1 for the task's fixed work), so causal
// masks, whose late query blocks see more keys, still balance.
void SplitTasks(const FlashAttentionTilingInput& in, FlashAttentionScoreTilingData& t) {
  std::vector<uint64_t> cost(t.s1_blocks);
  uint64_t per_head = 0;
  for (uint32_t sb = 0; sb < t.s1_blocks; ++sb) {
    const int64_t i0 = int64_t(sb) * t.s1_block, rows = sb + 1 == t.s1_blocks ? t.s1_tail : t.s1_block;
    cost[sb] = 1;
    for (uint32_t kb = 0; kb < t.s2_blocks; ++kb) {
      const int64_t j0 = int64_t(kb) * t.s2_block, nk = kb + 1 == t.s2_blocks ? t.s2_tail : t.s2_block;
      cost[sb] += BlockVisible(in, i0, rows, j0, nk) ? 1 : 0;
    }
    per_head += cost[sb];
  }
  const uint64_t total = per_head * t.batch * t.q_heads;
  // AIV a's range ends at the first task where the running cost reaches (a + 1) / aiv_num of the total.
  uint64_t acc = 0;
  uint32_t a = 0;
  t.task_begin[0] = 0;
  for (uint32_t task = 0; task < t.total_tasks; ++task) {
    acc += cost[task % t.s1_blocks];
    while (a + 1 < t.aiv_num && acc * t.aiv_num >= total * (a + 1)) t.task_begin[++a] = task + 1;
  }
  for (uint32_t r = a + 1; r <= kFaMaxAiv; ++r) t.task_begin[r] = t.total_tasks;
}

std::string Check(const FlashAttentionTilingInput& in, const FlashAttentionTilingOptions& opt) {
  if (in.batch == 0 || in.q_heads == 0 || in.s1 == 0 || in.s2 == 0 || in.head_dim == 0)
    return "batch, q_heads, s1, s2 and head_dim must be positive (the caller skips empty launches)";
  if (in.group == 0 || in.q_heads % in.group != 0) return "group must divide q_heads (GQA)";
  const uint32_t vd = in.v_head_dim ? in.v_head_dim : in.head_dim;
  if (vd > in.head_dim) return "v_head_dim must not exceed head_dim";
  if (in.head_dim > 512) return "head_dim " + std::to_string(in.head_dim) + " exceeds 512";
  if (in.dtype != FA_FLOAT32 && in.dtype != FA_FLOAT16 && in.dtype != FA_BFLOAT16) return "unknown dtype";
  if (opt.s1_block % 8 != 0 || opt.s1_block > 512)
    return "forced s1_block " + std::to_string(opt.s1_block) + " must be a multiple of 8 in [8, 512] (or 0 = auto)";
  // 64 fp32 scores = one 256-byte repeat: Compare/Select on a key row must cover whole repeats.
  if (opt.s2_block % 64 != 0 || opt.s2_block > 1024)
    return "forced s2_block " + std::to_string(opt.s2_block) + " must be a multiple of 64 in [64, 1024] (or 0 = auto)";
  return "";
}

// Automatic tile: the largest s1 x s2 tile (each up to 128, not beyond the sequence) that fits UB and L1.
bool PickBlocks(const FlashAttentionTilingInput& in, const FlashAttentionTilingOptions& opt, uint32_t vdp,
                const PlatformInfo& pf, uint32_t& s1b, uint32_t& s2b, uint32_t& vec_rows) {
  const uint32_t s1_cap = std::min<uint32_t>(128, AlignUp(in.s1, 16));
  const uint32_t s2_cap = std::min<uint32_t>(128, AlignUp(in.s2, 64));
  std::vector<uint32_t> s1_list, s2_list;
  if (opt.s1_block) s1_list = {opt.s1_block};
  else for (uint32_t a : {s1_cap, 128u, 64u, 32u, 16u}) if (a <= s1_cap) s1_list.push_back(a);
  if (opt.s2_block) s2_list = {opt.s2_block};
  else for (uint32_t b : {s2_cap, 128u, 64u}) if (b <= s2_cap) s2_list.push_back(b);
  uint64_t best = 0;
  for (uint32_t a : s1_list)
    for (uint32_t b : s2_list) {
      const uint32_t r = PickVecRows(in, a, b, vdp, pf);
      if (r && uint64_t(a) * b > best) { best = uint64_t(a) * b; s1b = a; s2b = b; vec_rows = r; }
    }
  return best > 0;
}

}  // namespace

std::string FlashAttentionScoreTiling(const FlashAttentionTilingInput& in, const FlashAttentionTilingOptions& opt,
                                      const PlatformInfo& pf, FlashAttentionScoreTilingData* out) {
  const std::string bad = Check(in, opt);
  if (!bad.empty()) return "flash_attention_score tiling: " + bad;
  FlashAttentionScoreTilingData t{};
  t.batch = in.batch;
  t.q_heads = in.q_heads;
  t.group = in.group;
  t.kv_heads = in.q_heads / in.group;
  t.s1 = in.s1;
  t.s2 = in.s2;
  t.head_dim = in.head_dim;
  t.v_head_dim = in.v_head_dim ? in.v_head_dim : in.head_dim;
  t.v_dim_pad = AlignUp(t.v_head_dim, 16);
  t.dtype = in.dtype;
  t.elem_bytes = FaElemBytes(in.dtype);
  t.scale = in.scale;
  t.mask_kind = in.mask_kind;
  t.mask_head_stride = in.mask_kind == FA_MASK_EXPLICIT && in.mask_per_head ? uint64_t(in.s1) * in.s2 : 0;
  t.mask_batch_stride = in.mask_kind == FA_MASK_EXPLICIT && in.mask_per_batch
                            ? uint64_t(in.s1) * in.s2 * (in.mask_per_head ? in.q_heads : 1) : 0;
  // The band only matters inside [-(S1), S2]: clamp so it fits int32.
  const int64_t lim = int64_t(in.s1) + in.s2 + 1;
  t.band_lo = int32_t(std::clamp<int64_t>(in.band_lo, -lim, lim));
  t.band_hi = int32_t(std::clamp<int64_t>(in.band_hi, -lim, lim));

  if (!PickBlocks(in, opt, t.v_dim_pad, pf, t.s1_block, t.s2_block, t.vec_rows)) {
    const uint32_t a = opt.s1_block ? opt.s1_block : 16, b = opt.s2_block ? opt.s2_block : 64;
    return "flash_attention_score tiling: no tile fits: s1_block " + std::to_string(a) + " x s2_block " +
           std::to_string(b) + " with head_dim " + std::to_string(in.head_dim) + " needs " +
           std::to_string(FaPlanUb(a, b, 8, t.v_dim_pad, t.elem_bytes, in.mask_kind == FA_MASK_EXPLICIT).Total()) +
           " bytes of UB (usable " + std::to_string(pf.UsableUb()) + ") and " +
           std::to_string(FaL1Bytes(a, b, in.head_dim, t.v_head_dim, t.elem_bytes)) + " bytes of L1 (" +
           std::to_string(pf.l1_bytes) + ")";
  }
  t.s1_blocks = CeilDiv(in.s1, t.s1_block);
  t.s2_blocks = CeilDiv(in.s2, t.s2_block);
  t.s1_tail = in.s1 - (t.s1_blocks - 1) * t.s1_block;
  t.s2_tail = in.s2 - (t.s2_blocks - 1) * t.s2_block;
  const uint64_t tasks = uint64_t(in.batch) * in.q_heads * t.s1_blocks;
  if (tasks > 0xffffffffu) return "flash_attention_score tiling: more than 2^32 tasks";
  t.total_tasks = uint32_t(tasks);
  t.block_dim = std::min<uint32_t>(std::min(pf.aic_cores, kFaMaxAiv / 2), CeilDiv(tasks, 2));
  t.aiv_num = 2 * t.block_dim;
  SplitTasks(in, t);

  // Workspace slice of one AIV: S = Q·Kᵀ (fp32), P (input dtype), O partial (fp32), each 512-byte aligned.
  t.ws_s_offset = 0;
  // Two S slices: the cube writes the next key block's scores into one while the vector reads the other.
  t.ws_p_offset = 2 * AlignUp(uint64_t(t.s1_block) * t.s2_block * 4, 512);
  t.ws_o_offset = t.ws_p_offset + AlignUp(uint64_t(t.s1_block) * t.s2_block * t.elem_bytes, 512);
  t.ws_per_aiv = t.ws_o_offset + AlignUp(uint64_t(t.s1_block) * t.v_dim_pad * 4, 512);
  t.workspace_bytes = t.ws_per_aiv * t.aiv_num;
  t.ub_bytes = FaPlanUb(t.s1_block, t.s2_block, t.vec_rows, t.v_dim_pad, t.elem_bytes,
                        in.mask_kind == FA_MASK_EXPLICIT).Total();
  t.l1_bytes = FaL1Bytes(t.s1_block, t.s2_block, t.head_dim, t.v_head_dim, t.elem_bytes);
  *out = t;
  return "";
}

}  // namespace tot_ascendc
