// The causal conv1d loops for one instruction set (see causal_conv1d_kernels.h): work items are (sequence, block of
// channels) for the forward ops and the input gradient, blocks of channels for the weight gradient, so every value
// is computed by one task in a fixed order and the results do not depend on the thread count. Rows are converted to
// the accumulation type (fp32, fp64 for fp64) once and kept in a ring of the K rows a token's window needs.
#include "cpu/linear_attention/causal_conv1d_kernels.h"
#include "cpu/vec_convert.h"

#ifndef CPU_CAPABILITY
#error "this *_isa.cpp must be compiled with -DCPU_CAPABILITY=DEFAULT|AVX2|AVX512 (setup.py does this)"
#endif

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

namespace npu_fa::cpu::CPU_CAPABILITY {

namespace {

template <typename T>
using acc_of = std::conditional_t<std::is_same_v<T, double>, double, float>;

// Channels per task: a few cache lines of every row, and enough tasks for the threads when dim is large.
constexpr int64_t kChannelBlock = 128;
// The weight gradient has one task per block only (no (sequence, block) split), so its blocks are narrower.
constexpr int64_t kGradWeightBlock = 32;

// out[j] = sum_k w[k][j] * rows[k][j], j < n (rows[k] the k-th row of the window, oldest first).
template <typename A>
inline void window_dot(const A* const* rows, const A* w, int64_t K, int64_t ldw, int64_t n, A* out) {
  using Vec = at::vec::Vectorized<A>;
  constexpr int64_t V = Vec::size();
  int64_t j = 0;
  for (; j + V <= n; j += V) {
    Vec acc = Vec::loadu(w + j) * Vec::loadu(rows[0] + j);
    for (int64_t k = 1; k < K; ++k) acc = at::vec::fmadd(Vec::loadu(w + k * ldw + j), Vec::loadu(rows[k] + j), acc);
    acc.store(out + j);
  }
  for (; j < n; ++j) {
    A acc = w[j] * rows[0][j];
    for (int64_t k = 1; k < K; ++k) acc += w[k * ldw + j] * rows[k][j];
    out[j] = acc;
  }
}

// The epilogue of fused_causal_conv1d on one output row: + bias, SiLU, the pangu reset, + the residual.
template <typename A>
inline void epilogue(A* y, int64_t n, const A* bias, bool silu, bool zero, const A* residual) {
  using Vec = at::vec::Vectorized<A>;
  constexpr int64_t V = Vec::size();
  if (zero) {
    std::fill(y, y + n, A(0));
  } else {
    if (bias != nullptr) at::vec::map2<A>([](Vec a, Vec b) { return a + b; }, y, y, bias, n);
    if (silu) at::vec::map<A>([](Vec a) { return a / (Vec(A(1)) + a.neg().exp()); }, y, y, n);
  }
  if (residual != nullptr) {
    int64_t j = 0;
    for (; j + V <= n; j += V) (Vec::loadu(y + j) + Vec::loadu(residual + j)).store(y + j);
    for (; j < n; ++j) y[j] += residual[j];
  }
}

// A thread's scratch for fused_causal_conv1d, kept across its tasks: the weights (and bias) are converted once per
// block of channels, since the tasks are ordered block by block (a decode step is one token per sequence, so the
// conversion would otherwise cost as much as the conv).
template <typename T>
struct FusedWorkspace {
  using A = acc_of<T>;
  int64_t c0 = -1;            // the block whose weights w / bias hold
  std::vector<A> w, bias;     // [K, n], [n]
  std::vector<A> ring, out;   // [K, n], [n]
  std::vector<T> stash;       // the prefix rows of the line, [prefix, n]
  std::vector<const A*> rows; // the window, oldest row first

  void load_block(const FusedConvParams& p, int64_t block_c0, int64_t n) {
    if (block_c0 == c0) return;
    c0 = block_c0;
    w.resize(static_cast<size_t>(p.K * n));
    const T* weight = static_cast<const T*>(p.weight);
    for (int64_t k = 0; k < p.K; ++k) to_acc(weight + k * p.dim + c0, n, w.data() + k * n);
    if (p.bias != nullptr) {
      bias.resize(static_cast<size_t>(n));
      to_acc(static_cast<const T*>(p.bias) + c0, n, bias.data());
    }
    ring.resize(static_cast<size_t>(p.K * n));
    out.resize(static_cast<size_t>(n));
    rows.resize(static_cast<size_t>(p.K));
  }
};

// One sequence, channels [c0, c0+n). Order matters for the in-place op (y == x) and for a cache line that is both
// read and written: the prefix rows are stashed first, the cache is written from the stash and x, and the outputs
// are computed from the last token down, so y[t] overwrites x[t] only after every window that reads x[t] is loaded.
template <typename T>
void fused_sequence(const FusedConvParams& p, const SeqPlan& s, int64_t c0, int64_t n, FusedWorkspace<T>& ws) {
  using A = acc_of<T>;
  const int64_t K = p.K, C = p.C, dim = p.dim;
  const T* x = static_cast<const T*>(p.x);
  T* states = static_cast<T*>(p.states);
  T* y = static_cast<T*>(p.y);
  const int64_t prefix = s.read_line < 0 ? K - 1 : s.offset + K - 1;
  ws.stash.resize(static_cast<size_t>(prefix * n));
  T* stash = ws.stash.data();
  if (s.read_line >= 0) {
    for (int64_t r = 0; r < prefix; ++r)
      std::memcpy(stash + r * n, states + (s.read_line * C + r) * dim + c0, n * sizeof(T));
  } else {
    std::fill(stash, stash + prefix * n, T(0));
  }
  auto padded = [&](int64_t r) -> const T* {
    return r < prefix ? stash + r * n : x + (s.start + r - prefix) * dim + c0;
  };
  const int64_t total = prefix + s.len, kept = std::min(C, total);
  for (int64_t i = 0; i < kept; ++i)
    std::memcpy(states + (s.write_line * C + C - kept + i) * dim + c0, padded(total - kept + i), n * sizeof(T));
  for (size_t f = 0; f < s.fill_lines.size(); ++f)
    for (int64_t j = 0; j < K - 1; ++j)
      std::memcpy(states + (s.fill_lines[f] * C + C - (K - 1) + j) * dim + c0, padded(s.offset + s.fill_at[f] + j),
                  n * sizeof(T));
  if (s.len == 0) return;

  A* ring = ws.ring.data();
  A* out = ws.out.data();
  auto slot = [&](int64_t r) { return ring + (r % K) * n; };
  const int64_t last = s.offset + s.len - 1;  // the first padded row of the last token's window
  for (int64_t k = 0; k < K; ++k) to_acc(padded(last + k), n, slot(last + k));
  for (int64_t t = s.len - 1; t >= 0; --t) {
    const int64_t r0 = s.offset + t;
    if (t != s.len - 1) to_acc(padded(r0), n, slot(r0));  // replaces row r0 + K, which no window below reads
    for (int64_t k = 0; k < K; ++k) ws.rows[k] = slot(r0 + k);
    window_dot(ws.rows.data(), ws.w.data(), K, n, n, out);
    epilogue(out, n, p.bias ? ws.bias.data() : nullptr, p.silu, t < s.reset, p.residual ? ws.rows[K - 1] : nullptr);
    from_acc(out, n, y + (s.start + t) * dim + c0);
  }
}

// Tasks block-major (all sequences of one block of channels, then the next), so a thread's consecutive tasks share
// the block's converted weights.
template <typename T>
void fused(const FusedConvParams& p) {
  const auto& seqs = *p.seqs;
  const int64_t nseq = static_cast<int64_t>(seqs.size());
  const int64_t blocks = (p.dim + kChannelBlock - 1) / kChannelBlock;
  at::parallel_for(0, nseq * blocks, 1, [&](int64_t i0, int64_t i1) {
    FusedWorkspace<T> ws;
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t c0 = (i / nseq) * kChannelBlock, n = std::min(kChannelBlock, p.dim - c0);
      ws.load_block(p, c0, n);
      fused_sequence<T>(p, seqs[i % nseq], c0, n, ws);
    }
  });
}

void fused_causal_conv1d(const FusedConvParams& p) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, p.dtype, "fused_causal_conv1d",
                                  [&] { fused<scalar_t>(p); });
}

// masked_causal_conv1d forward, one batch column b and channels [c0, c0+n): a ring of the W input rows of the window.
template <typename T>
void masked_column(const MaskedConvParams& p, int64_t b, int64_t c0, int64_t n, std::vector<acc_of<T>>& scratch) {
  using A = acc_of<T>;
  const int64_t S = p.S, B = p.B, H = p.H, W = p.W;
  scratch.assign(static_cast<size_t>((2 * W + 1) * n), A(0));  // weights [W, n], ring [W, n] (zeros), out [n]
  A* w = scratch.data();
  A* ring = w + W * n;
  A* out = ring + W * n;
  for (int64_t k = 0; k < W; ++k) to_acc(static_cast<const T*>(p.weight) + k * H + c0, n, w + k * n);
  const T* in = static_cast<const T*>(p.input);
  T* y = static_cast<T*>(p.out);
  std::vector<const A*> rows(W);
  // padded row r holds input row r - (W-1); rows 0..W-2 are the zeros the ring starts with
  auto slot = [&](int64_t r) { return ring + (r % W) * n; };
  for (int64_t s = 0; s < S; ++s) {
    to_acc(in + (s * B + b) * H + c0, n, slot(s + W - 1));
    T* dst = y + (s * B + b) * H + c0;
    if (p.mask != nullptr && !p.mask[b * S + s]) {
      std::fill(dst, dst + n, T(0));
      continue;
    }
    for (int64_t k = 0; k < W; ++k) rows[k] = slot(s + k);
    window_dot(rows.data(), w, W, n, n, out);
    from_acc(out, n, dst);
  }
}

// grad_input of one batch column: g' = masked grad_output, grad_input[s] = sum_k w[k] g'[s+W-1-k]; a ring of the
// W rows of g' from s to s+W-1 (zeros past the end), walked from the last s down.
template <typename T>
void grad_input_column(const MaskedConvParams& p, int64_t b, int64_t c0, int64_t n, std::vector<acc_of<T>>& scratch) {
  using A = acc_of<T>;
  const int64_t S = p.S, B = p.B, H = p.H, W = p.W;
  // reversed weights [W, n], ring [W, n], a zero row [n] (the rows past the end), out [n]
  scratch.assign(static_cast<size_t>((2 * W + 2) * n), A(0));
  A* wr = scratch.data();
  A* ring = wr + W * n;
  const A* zero = ring + W * n;
  A* out = ring + (W + 1) * n;
  // window rows oldest first are g'[s .. s+W-1]; g'[s+j] meets w[W-1-j]
  for (int64_t j = 0; j < W; ++j) to_acc(static_cast<const T*>(p.weight) + (W - 1 - j) * H + c0, n, wr + j * n);
  const T* g = static_cast<const T*>(p.grad_output);
  T* gi = static_cast<T*>(p.grad_input);
  std::vector<const A*> rows(W);
  auto slot = [&](int64_t s) { return ring + (s % W) * n; };
  for (int64_t s = S - 1; s >= 0; --s) {
    A* dst = slot(s);  // held row s+W, which no window below reads
    if (p.mask != nullptr && !p.mask[b * S + s]) {
      std::fill(dst, dst + n, A(0));
    } else {
      to_acc(g + (s * B + b) * H + c0, n, dst);
    }
    for (int64_t j = 0; j < W; ++j) rows[j] = s + j < S ? slot(s + j) : zero;
    window_dot(rows.data(), wr, W, n, n, out);
    from_acc(out, n, gi + (s * B + b) * H + c0);
  }
}

// grad_weight of channels [c0, c0+n): sum over b then s of g'[s] * input[s-(W-1-k)], in fp64.
template <typename T>
void grad_weight_block(const MaskedConvParams& p, int64_t c0, int64_t n, std::vector<double>& scratch) {
  using Vec = at::vec::Vectorized<double>;
  constexpr int64_t V = Vec::size();
  const int64_t S = p.S, B = p.B, H = p.H, W = p.W;
  scratch.assign(static_cast<size_t>((2 + W) * n), 0.0);  // acc [W, n], g row [n], input row [n]
  double* acc = scratch.data();
  double* gd = acc + W * n;
  double* xd = gd + n;
  const T* g = static_cast<const T*>(p.grad_output);
  const T* in = static_cast<const T*>(p.input);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t s = 0; s < S; ++s) {
      if (p.mask != nullptr && !p.mask[b * S + s]) continue;
      to_acc(g + (s * B + b) * H + c0, n, gd);
      for (int64_t k = 0; k < W; ++k) {
        const int64_t src = s - (W - 1 - k);
        if (src < 0) continue;
        to_acc(in + (src * B + b) * H + c0, n, xd);
        double* a = acc + k * n;
        int64_t j = 0;
        for (; j + V <= n; j += V)
          at::vec::fmadd(Vec::loadu(gd + j), Vec::loadu(xd + j), Vec::loadu(a + j)).store(a + j);
        for (; j < n; ++j) a[j] += gd[j] * xd[j];
      }
    }
  }
  T* gw = static_cast<T*>(p.grad_weight);
  for (int64_t k = 0; k < W; ++k)
    for (int64_t j = 0; j < n; ++j) gw[k * H + c0 + j] = static_cast<T>(acc[k * n + j]);
}

template <typename T>
void masked_forward(const MaskedConvParams& p) {
  const int64_t blocks = (p.H + kChannelBlock - 1) / kChannelBlock;
  at::parallel_for(0, p.B * blocks, 1, [&](int64_t i0, int64_t i1) {
    std::vector<acc_of<T>> scratch;
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t c0 = (i % blocks) * kChannelBlock;
      masked_column<T>(p, i / blocks, c0, std::min(kChannelBlock, p.H - c0), scratch);
    }
  });
}

template <typename T>
void masked_backward(const MaskedConvParams& p) {
  const int64_t blocks = (p.H + kChannelBlock - 1) / kChannelBlock;
  at::parallel_for(0, p.B * blocks, 1, [&](int64_t i0, int64_t i1) {
    std::vector<acc_of<T>> scratch;
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t c0 = (i % blocks) * kChannelBlock;
      grad_input_column<T>(p, i / blocks, c0, std::min(kChannelBlock, p.H - c0), scratch);
    }
  });
  const int64_t wblocks = (p.H + kGradWeightBlock - 1) / kGradWeightBlock;
  at::parallel_for(0, wblocks, 1, [&](int64_t i0, int64_t i1) {
    std::vector<double> scratch;
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t c0 = i * kGradWeightBlock;
      grad_weight_block<T>(p, c0, std::min(kGradWeightBlock, p.H - c0), scratch);
    }
  });
}

void masked_causal_conv1d(const MaskedConvParams& p) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, p.dtype, "masked_causal_conv1d",
                                  [&] { masked_forward<scalar_t>(p); });
}

void masked_causal_conv1d_backward(const MaskedConvParams& p) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, p.dtype, "masked_causal_conv1d_backward",
                                  [&] { masked_backward<scalar_t>(p); });
}

}  // namespace

NPU_FA_REGISTER_ISA_KERNEL(fused_causal_conv1d_stub, fused_causal_conv1d);
NPU_FA_REGISTER_ISA_KERNEL(masked_causal_conv1d_stub, masked_causal_conv1d);
NPU_FA_REGISTER_ISA_KERNEL(masked_causal_conv1d_backward_stub, masked_causal_conv1d_backward);

}  // namespace npu_fa::cpu::CPU_CAPABILITY
