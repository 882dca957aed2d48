// The per-sequence plan of fused_causal_conv1d (and _v2), resolved on the host by causal_conv1d_params.h and run by
// both backends: the CPU loops (cpu/linear_attention/causal_conv1d_kernels_isa.cpp) and the npu glue, which turns it
// into the Ascend C kernel's sequence table. Plain data, no torch: the per-ISA CPU units include it.
#pragma once

#include <cstdint>
#include <vector>

namespace npu_fa::linear_attention {

// One sequence of fused_causal_conv1d: rows [start, start+len) of x. The padded sequence is the first `prefix`
// rows of cache line `read_line` (or K-1 zero rows when read_line < 0) followed by the len rows of x; the conv of
// token t reads padded rows offset+t .. offset+t+K-1.
struct SeqPlan {
  int64_t start = 0, len = 0;
  int64_t read_line = -1;   // < 0: K-1 zero rows, offset 0
  int64_t offset = 0;       // first padded row the conv reads
  int64_t write_line = 0;   // receives the last min(C, prefix+len) padded rows
  int64_t reset = 0;        // y[t] = conv 0 for t < reset (before the residual)
  // prefix caching: the K-1 padded rows starting at offset + fill_at[i] go to the last K-1 rows of fill_lines[i]
  std::vector<int64_t> fill_lines, fill_at;
};

// The validated shape of a fused call and the plans of the sequences it computes (skipped ones are not listed).
struct FusedPlan {
  int64_t K = 0, C = 0, dim = 0, slots = 0;
  bool silu = false, residual = false;
  bool prefix_caching = false;  // a 2-D cache_indices: some sequences read and write different lines, fill blocks
  std::vector<SeqPlan> seqs;
};

}  // namespace npu_fa::linear_attention
