// Rotary position embedding on the AI Vector cores (AIV_MODE): out = x*cos + rot(x)*sin over the head dim D,
// and its input gradient dx = g*cos + rot^T(g*sin), for mode 0 (half: rot(x) = [-x2, x1]) and mode 1
// (interleave: rot(x) pairs (x0, x1) -> (-x1, x0)).
//
// Both rotations are a permutation of the row followed by a sign: rot(x) = sign * perm(x), with perm swapping the
// halves (half) or the elements of each pair (interleave) and sign = -1 on the first half / even lanes. The sign
// is folded into the sin rows once per tile (one Mul with a sign row), so the per-element work is
//   forward: out = x*cos + perm(x) * (sign*sin)
//   grad:    dx  = g*cos + perm(g * (sign*sin))      (perm is its own inverse)
// which is the CPU op's formula term for term: fp32 products and sum, then one rounding to x's dtype.
//
// The backward also reduces dcos = sum g*x and dsin = sum g*rot(x) = sign * sum g*perm(x) over the x rows that
// share a table row: per tile in UB (one Add per row into its table row), then across tiles and cores by atomic
// adds (SetAtomicAdd<float>) into fp32 GM rows the host zeroed.
//
// Each core takes a contiguous range of rows (tiling: base_rows, big_cores) and walks it in tiles of tile_rows
// rows through a double-buffered CopyIn -> Compute -> CopyOut pipeline. A tile loads the cos/sin rows its x rows
// use (x row r uses table row (r / repeat) % table_rows) once, then multiplies every x row by its table row.
#include "kernel_operator.h"
#include "rope/rotary_position_embedding_tiling.h"
#include "rope/rotary_position_embedding_kernel.h"

using namespace AscendC;
using tot_ascendc::RotaryPositionEmbeddingTiling;

namespace {

constexpr int32_t kBufferNum = 2;

template <typename T>
__aicore__ inline constexpr bool IsFloat() { return sizeof(T) == 4; }

template <typename T, typename C>
class RopeKernel {
 public:
  // Forward: x, cos, sin -> out. Backward: x = the incoming gradient g, fwdX = the forward's x, out = dx,
  // dcos/dsin = fp32 [table_rows, D] accumulators (zeroed by the host); fwdX/dcos/dsin unused in the forward.
  __aicore__ inline void Init(GM_ADDR x, GM_ADDR cos, GM_ADDR sin, GM_ADDR fwdX, GM_ADDR out, GM_ADDR dcos,
                              GM_ADDR dsin, const RotaryPositionEmbeddingTiling& t) {
    t_ = t;
    const uint64_t core = uint64_t(GetBlockIdx());
    firstRow_ = core * t.base_rows + (core < t.big_cores ? core : t.big_cores);
    rowCount_ = t.base_rows + (core < t.big_cores ? 1 : 0);
    xGm_.SetGlobalBuffer((__gm__ T*)x, t.rows * t.d);
    outGm_.SetGlobalBuffer((__gm__ T*)out, t.rows * t.d);
    cosGm_.SetGlobalBuffer((__gm__ C*)cos, t.table_rows * t.d);
    sinGm_.SetGlobalBuffer((__gm__ C*)sin, t.table_rows * t.d);

    const uint32_t xElems = t.tile_rows * t.row_pitch, tabElems = t.tile_table_rows * t.row_pitch;
    pipe_.InitBuffer(inX_, kBufferNum, xElems * sizeof(T));
    pipe_.InitBuffer(outQ_, kBufferNum, xElems * sizeof(T));
    pipe_.InitBuffer(inCos_, kBufferNum, tabElems * sizeof(C));
    pipe_.InitBuffer(inSin_, kBufferNum, tabElems * sizeof(C));
    pipe_.InitBuffer(rotBuf_, xElems * sizeof(float));
    if constexpr (!IsFloat<T>()) {
      pipe_.InitBuffer(xfBuf_, xElems * sizeof(float));
      pipe_.InitBuffer(accBuf_, xElems * sizeof(float));
    }
    if constexpr (!IsFloat<C>()) {
      pipe_.InitBuffer(cfBuf_, tabElems * sizeof(float));
      pipe_.InitBuffer(sfBuf_, tabElems * sizeof(float));
    }
    pipe_.InitBuffer(signBuf_, t.row_pitch * sizeof(float));
    if (t.mode == 1) pipe_.InitBuffer(offBuf_, xElems * sizeof(uint32_t));
    if (t.is_grad) {
      fwdXGm_.SetGlobalBuffer((__gm__ T*)fwdX, t.rows * t.d);
      dcosGm_.SetGlobalBuffer((__gm__ float*)dcos, t.table_rows * t.d);
      dsinGm_.SetGlobalBuffer((__gm__ float*)dsin, t.table_rows * t.d);
      pipe_.InitBuffer(inFwdX_, kBufferNum, xElems * sizeof(T));
      if constexpr (!IsFloat<T>()) pipe_.InitBuffer(fwdXfBuf_, xElems * sizeof(float));
      pipe_.InitBuffer(prodBuf_, xElems * sizeof(float));
      pipe_.InitBuffer(tabOut_, kBufferNum, 2 * tabElems * sizeof(float));
    }
    BuildSignRow();
    if (t.mode == 1) BuildSwapOffsets();
  }

  __aicore__ inline void Process() {
    for (uint64_t done = 0; done < rowCount_; done += t_.tile_rows) {
      const uint64_t r0 = firstRow_ + done;
      const uint32_t n = uint32_t(rowCount_ - done < t_.tile_rows ? rowCount_ - done : t_.tile_rows);
      const uint64_t q0 = r0 / t_.repeat;
      const uint32_t k = uint32_t((r0 + n - 1) / t_.repeat - q0 + 1);
      CopyIn(r0, n, q0, k);
      Compute(r0, n, q0, k);
      CopyOut(r0, n);
      if (t_.is_grad) CopyOutTables(q0, k);
    }
  }

 private:
  // sign = -1 where rot() negates: the first half (half mode) or the even lanes (interleave); +1 elsewhere.
  __aicore__ inline void BuildSignRow() {
    LocalTensor<float> sign = signBuf_.Get<float>();
    for (uint32_t j = 0; j < t_.row_pitch; ++j) {
      const bool neg = t_.mode == 0 ? j < t_.half_pitch : (j < t_.d && j % 2 == 0);
      sign.SetValue(j, neg ? -1.0f : 1.0f);
    }
  }

  // Interleave: byte offsets for Gather so that element j of a row reads element j^1 (pad lanes read themselves).
  __aicore__ inline void BuildSwapOffsets() {
    LocalTensor<uint32_t> off = offBuf_.Get<uint32_t>();
    for (uint32_t i = 0; i < t_.tile_rows; ++i)
      for (uint32_t j = 0; j < t_.row_pitch; ++j) {
        const uint32_t src = j < t_.d ? (j ^ 1u) : j;
        off.SetValue(i * t_.row_pitch + j, (i * t_.row_pitch + src) * uint32_t(sizeof(float)));
      }
  }

  // `nrows` rows of D from GM (row `row` on) into UB at the tile's row pitch; half mode pads each half.
  template <typename U>
  __aicore__ inline void LoadRows(const LocalTensor<U>& dst, const GlobalTensor<U>& src, uint64_t row,
                                  uint32_t nrows) {
    const uint32_t seg = t_.mode == 0 ? t_.d / 2 : t_.d;            // elements per contiguous GM segment
    const uint32_t segPitch = t_.mode == 0 ? t_.half_pitch : t_.row_pitch;
    const uint32_t segs = t_.mode == 0 ? 2 * nrows : nrows;
    if (seg == segPitch) {  // no padding: one contiguous copy
      DataCopy(dst, src[row * t_.d], segs * seg);
      return;
    }
    constexpr uint32_t perBlock = 32 / sizeof(U);
    const uint32_t landed = (seg + perBlock - 1) / perBlock * perBlock;  // DataCopyPad pads a segment to this
    DataCopyExtParams p(uint16_t(segs), uint32_t(seg * sizeof(U)), 0, (segPitch - landed) / perBlock, 0);
    DataCopyPad(dst, src[row * t_.d], p, DataCopyPadExtParams<U>(false, 0, 0, U(0)));
  }

  template <typename U>
  __aicore__ inline void StoreRows(const GlobalTensor<U>& dst, const LocalTensor<U>& src, uint64_t row,
                                   uint32_t nrows) {
    const uint32_t seg = t_.mode == 0 ? t_.d / 2 : t_.d;
    const uint32_t segPitch = t_.mode == 0 ? t_.half_pitch : t_.row_pitch;
    const uint32_t segs = t_.mode == 0 ? 2 * nrows : nrows;
    if (seg == segPitch) {
      DataCopy(dst[row * t_.d], src, segs * seg);
      return;
    }
    constexpr uint32_t perBlock = 32 / sizeof(U);
    const uint32_t landed = (seg + perBlock - 1) / perBlock * perBlock;
    DataCopyExtParams p(uint16_t(segs), uint32_t(seg * sizeof(U)), (segPitch - landed) / perBlock, 0, 0);
    DataCopyPad(dst[row * t_.d], src, p);
  }

  // The k table rows q0, q0+1, ... (mod table_rows) of cos or sin, in runs that do not wrap.
  __aicore__ inline void LoadTable(const LocalTensor<C>& dst, const GlobalTensor<C>& src, uint64_t q0,
                                   uint32_t k) {
    for (uint32_t j = 0; j < k;) {
      const uint64_t start = (q0 + j) % t_.table_rows;
      const uint64_t left = t_.table_rows - start;
      const uint32_t run = uint32_t(k - j < left ? k - j : left);
      LoadRows(dst[j * t_.row_pitch], src, start, run);
      j += run;
    }
  }

  __aicore__ inline void CopyIn(uint64_t r0, uint32_t n, uint64_t q0, uint32_t k) {
    LocalTensor<T> x = inX_.AllocTensor<T>();
    LocalTensor<C> c = inCos_.AllocTensor<C>();
    LocalTensor<C> s = inSin_.AllocTensor<C>();
    LoadRows(x, xGm_, r0, n);
    LoadTable(c, cosGm_, q0, k);
    LoadTable(s, sinGm_, q0, k);
    inX_.EnQue(x);
    inCos_.EnQue(c);
    inSin_.EnQue(s);
    if (t_.is_grad) {
      LocalTensor<T> fx = inFwdX_.AllocTensor<T>();
      LoadRows(fx, fwdXGm_, r0, n);
      inFwdX_.EnQue(fx);
    }
  }

  // dst = perm(src) over n rows: swap the halves (two strided UB copies) or the pair elements (Gather).
  __aicore__ inline void Permute(const LocalTensor<float>& dst, const LocalTensor<float>& src, uint32_t n) {
    if (t_.mode == 1) {
      Gather(dst, src, offBuf_.Get<uint32_t>(), 0, n * t_.row_pitch);
      return;
    }
    const uint16_t halfBlocks = uint16_t(t_.half_pitch * sizeof(float) / 32);
    const DataCopyParams p(uint16_t(n), halfBlocks, halfBlocks, halfBlocks);
    DataCopy(dst[t_.half_pitch], src, p);
    DataCopy(dst, src[t_.half_pitch], p);
  }

  // dst[i] = a[i] * table[row of x row i]; one instruction when every x row has its own table row. When runs of x
  // rows share a table row (the heads of a token), each 64-lane chunk of the row is one instruction over the whole
  // run: the x rows are its repeats (repeat stride = one row) and the table row is read with repeat stride 0.
  __aicore__ inline void MulTable(const LocalTensor<float>& dst, const LocalTensor<float>& a,
                                  const LocalTensor<float>& table, uint64_t r0, uint32_t n, uint64_t q0) {
    const uint32_t P = t_.row_pitch;
    if (t_.repeat == 1) {
      Mul(dst, a, table, int32_t(n * P));
      return;
    }
    constexpr uint32_t kLanes = 64, kMaxRepeat = 255;  // fp32 lanes per repeat; repeatTime is 8-bit
    const bool batched = P / 8 <= 255;                 // the row pitch in DataBlocks must fit the 8-bit stride
    for (uint32_t i = 0; i < n;) {
      const uint64_t row = r0 + i;
      const uint32_t j = uint32_t(row / t_.repeat - q0);
      const uint64_t left = t_.repeat - row % t_.repeat;  // rows from here on that share table row j
      const uint32_t run = uint32_t(left < n - i ? left : n - i);
      if (!batched) {
        for (uint32_t r = 0; r < run; ++r) Mul(dst[(i + r) * P], a[(i + r) * P], table[j * P], int32_t(P));
        i += run;
        continue;
      }
      const uint8_t pitch = uint8_t(P / 8);
      for (uint32_t done = 0; done < run; done += kMaxRepeat) {
        const uint32_t rows = run - done < kMaxRepeat ? run - done : kMaxRepeat;
        for (uint32_t c = 0; c < P; c += kLanes) {
          const uint64_t lanes = P - c < kLanes ? P - c : kLanes;
          Mul(dst[(i + done) * P + c], a[(i + done) * P + c], table[j * P + c], lanes, uint8_t(rows),
              BinaryRepeatParams(1, 1, 1, pitch, pitch, 0));
        }
      }
      i += run;
    }
  }

  // dst (k table rows) = the sum of src's x rows per table row; dst = src when every x row has its own.
  __aicore__ inline void ReduceToTable(const LocalTensor<float>& dst, const LocalTensor<float>& src, uint64_t r0,
                                       uint32_t n, uint64_t q0, uint32_t k) {
    const uint32_t P = t_.row_pitch;
    if (t_.repeat == 1) {
      DataCopy(dst, src, n * P);
      return;
    }
    Duplicate(dst, 0.0f, int32_t(k * P));
    for (uint32_t i = 0; i < n; ++i) {
      const uint32_t j = uint32_t((r0 + i) / t_.repeat - q0);
      Add(dst[j * P], dst[j * P], src[i * P], int32_t(P));
    }
  }

  // dcos rows = sum g*x, dsin rows = sign * sum g*perm(x), into the table-rows out queue. `g` is the fp32 gradient
  // tile; `scratch` (the rotated operand, free again) takes perm(x).
  __aicore__ inline void TableGrads(const LocalTensor<float>& g, const LocalTensor<float>& scratch, uint64_t r0,
                                    uint32_t n, uint64_t q0, uint32_t k) {
    const uint32_t P = t_.row_pitch, xElems = n * P;
    LocalTensor<T> fx = inFwdX_.DeQue<T>();
    LocalTensor<float> xf;
    if constexpr (IsFloat<T>()) {
      xf = fx.template ReinterpretCast<float>();
    } else {
      xf = fwdXfBuf_.Get<float>();
      Cast(xf, fx, RoundMode::CAST_NONE, xElems);
    }
    LocalTensor<float> tab = tabOut_.AllocTensor<float>();
    const LocalTensor<float> prod = prodBuf_.Get<float>();
    const LocalTensor<float> dcosRows = tab, dsinRows = tab[k * P];
    Mul(prod, g, xf, int32_t(xElems));
    ReduceToTable(dcosRows, prod, r0, n, q0, k);
    Permute(scratch, xf, n);
    Mul(prod, g, scratch, int32_t(xElems));
    ReduceToTable(dsinRows, prod, r0, n, q0, k);
    const LocalTensor<float> sign = signBuf_.Get<float>();
    for (uint32_t j = 0; j < k; ++j) Mul(dsinRows[j * P], dsinRows[j * P], sign, int32_t(P));
    tabOut_.EnQue(tab);
    inFwdX_.FreeTensor(fx);
  }

  // Adds the tile's dcos/dsin rows into GM (atomically: other tiles and cores add to the same rows).
  __aicore__ inline void CopyOutTables(uint64_t q0, uint32_t k) {
    LocalTensor<float> tab = tabOut_.DeQue<float>();
    SetAtomicAdd<float>();
    for (uint32_t j = 0; j < k;) {
      const uint64_t start = (q0 + j) % t_.table_rows;
      const uint64_t left = t_.table_rows - start;
      const uint32_t run = uint32_t(k - j < left ? k - j : left);
      StoreRows(dcosGm_, tab[j * t_.row_pitch], start, run);
      StoreRows(dsinGm_, tab[(k + j) * t_.row_pitch], start, run);
      j += run;
    }
    SetAtomicNone();
    tabOut_.FreeTensor(tab);
  }

  __aicore__ inline void Compute(uint64_t r0, uint32_t n, uint64_t q0, uint32_t k) {
    LocalTensor<T> x = inX_.DeQue<T>();
    LocalTensor<C> c = inCos_.DeQue<C>();
    LocalTensor<C> s = inSin_.DeQue<C>();
    LocalTensor<T> out = outQ_.AllocTensor<T>();
    const uint32_t P = t_.row_pitch, xElems = n * P, tabElems = k * P;

    LocalTensor<float> xf, cf, sf, acc;
    if constexpr (IsFloat<T>()) {
      xf = x.template ReinterpretCast<float>();
      acc = out.template ReinterpretCast<float>();
    } else {
      xf = xfBuf_.Get<float>();
      acc = accBuf_.Get<float>();
      Cast(xf, x, RoundMode::CAST_NONE, xElems);
    }
    if constexpr (IsFloat<C>()) {
      cf = c.template ReinterpretCast<float>();
      sf = s.template ReinterpretCast<float>();
    } else {
      cf = cfBuf_.Get<float>();
      sf = sfBuf_.Get<float>();
      Cast(cf, c, RoundMode::CAST_NONE, tabElems);
      Cast(sf, s, RoundMode::CAST_NONE, tabElems);
    }
    const LocalTensor<float> sign = signBuf_.Get<float>();
    for (uint32_t j = 0; j < k; ++j) Mul(sf[j * P], sf[j * P], sign, int32_t(P));

    const LocalTensor<float> rot = rotBuf_.Get<float>();
    if (t_.is_grad == 0) {
      Permute(rot, xf, n);                      // perm(x)
      MulTable(rot, rot, sf, r0, n, q0);        // perm(x) * sign*sin
    } else {
      MulTable(acc, xf, sf, r0, n, q0);         // g * sign*sin
      Permute(rot, acc, n);                     // perm(g * sign*sin)
    }
    MulTable(acc, xf, cf, r0, n, q0);           // x*cos (g*cos)
    Add(acc, acc, rot, int32_t(xElems));
    if constexpr (!IsFloat<T>()) Cast(out, acc, RoundMode::CAST_RINT, xElems);
    if (t_.is_grad) TableGrads(xf, rot, r0, n, q0, k);

    outQ_.EnQue(out);
    inX_.FreeTensor(x);
    inCos_.FreeTensor(c);
    inSin_.FreeTensor(s);
  }

  __aicore__ inline void CopyOut(uint64_t r0, uint32_t n) {
    LocalTensor<T> out = outQ_.DeQue<T>();
    StoreRows(outGm_, out, r0, n);
    outQ_.FreeTensor(out);
  }

  RotaryPositionEmbeddingTiling t_;
  uint64_t firstRow_ = 0, rowCount_ = 0;
  TPipe pipe_;
  TQue<TPosition::VECIN, kBufferNum> inX_, inCos_, inSin_, inFwdX_;
  TQue<TPosition::VECOUT, kBufferNum> outQ_, tabOut_;
  TBuf<TPosition::VECCALC> rotBuf_, xfBuf_, accBuf_, cfBuf_, sfBuf_, signBuf_, offBuf_, fwdXfBuf_, prodBuf_;
  GlobalTensor<T> xGm_, outGm_, fwdXGm_;
  GlobalTensor<C> cosGm_, sinGm_;
  GlobalTensor<float> dcosGm_, dsinGm_;
};

template <typename T, typename C>
__aicore__ inline void Run(GM_ADDR x, GM_ADDR cos, GM_ADDR sin, GM_ADDR fwdX, GM_ADDR out, GM_ADDR dcos,
                           GM_ADDR dsin, const RotaryPositionEmbeddingTiling& t) {
  if (uint64_t(GetBlockIdx()) >= t.block_dim) return;
  RopeKernel<T, C> op;
  op.Init(x, cos, sin, fwdX, out, dcos, dsin, t);
  op.Process();
}

__aicore__ inline void Dispatch(GM_ADDR x, GM_ADDR cos, GM_ADDR sin, GM_ADDR fwdX, GM_ADDR out, GM_ADDR dcos,
                                GM_ADDR dsin, const RotaryPositionEmbeddingTiling& t) {
  using tot_ascendc::kRopeFloat16;
  using tot_ascendc::kRopeFloat32;
  const bool tableF32 = t.table_dtype == kRopeFloat32;
  if (t.x_dtype == kRopeFloat32) Run<float, float>(x, cos, sin, fwdX, out, dcos, dsin, t);
  else if (t.x_dtype == kRopeFloat16 && tableF32) Run<half, float>(x, cos, sin, fwdX, out, dcos, dsin, t);
  else if (t.x_dtype == kRopeFloat16) Run<half, half>(x, cos, sin, fwdX, out, dcos, dsin, t);
  else if (tableF32) Run<bfloat16_t, float>(x, cos, sin, fwdX, out, dcos, dsin, t);
  else Run<bfloat16_t, bfloat16_t>(x, cos, sin, fwdX, out, dcos, dsin, t);
}

}  // namespace

// x: [rows, D] of x_dtype; cos/sin: [table_rows, D] of table_dtype; out: [rows, D] of x_dtype. Tiling is_grad = 0.
extern "C" __global__ __aicore__ void rotary_position_embedding_kernel(GM_ADDR x, GM_ADDR cos, GM_ADDR sin,
                                                                       GM_ADDR out, GM_ADDR workspace,
                                                                       GM_ADDR tiling) {
  const RotaryPositionEmbeddingTiling t = *reinterpret_cast<__gm__ RotaryPositionEmbeddingTiling*>(tiling);
  if (t.is_grad == 0) Dispatch(x, cos, sin, nullptr, out, nullptr, nullptr, t);
}

// grad, x, dx: [rows, D] of x_dtype; cos/sin: [table_rows, D] of table_dtype; dcos/dsin: [table_rows, D] fp32,
// zeroed by the host (the kernel adds into them). Tiling is_grad = 1.
extern "C" __global__ __aicore__ void rotary_position_embedding_grad_kernel(GM_ADDR grad, GM_ADDR cos, GM_ADDR sin,
                                                                            GM_ADDR x, GM_ADDR dx, GM_ADDR dcos,
                                                                            GM_ADDR dsin, GM_ADDR workspace,
                                                                            GM_ADDR tiling) {
  const RotaryPositionEmbeddingTiling t = *reinterpret_cast<__gm__ RotaryPositionEmbeddingTiling*>(tiling);
  if (t.is_grad == 1) Dispatch(grad, cos, sin, x, dx, dcos, dsin, t);
}
