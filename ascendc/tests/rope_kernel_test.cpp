// Host program for the rotary position embedding kernel in CANN's CPU-debug style (GmAlloc, SetKernelMode,
// ICPU_RUN_KF), checked against a float64 reference of the CPU op's formula. Covers both modes, forward and dx,
// fp32 / fp16 / bf16 x with cos/sin of x's dtype or fp32, D in {2, 6, 8, 64, 128}, row counts that are not
// multiples of the tile or of the core count, and the broadcast patterns of the tiling (outer x table x repeat).
// Prints the failing cases; reports through test_main.h.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "rope/rotary_position_embedding_tiling.h"
#include "test_main.h"
#include "tikicpulib.h"
#include "rope/rotary_position_embedding_kernel.h"


using namespace tot_ascendc;

namespace {

struct Case {
  uint64_t outer, table_rows, repeat;  // rows = outer * table_rows * repeat
  int64_t d, mode;
  bool grad;
  uint32_t x_dtype, table_dtype;
};

double ToDouble(uint32_t dtype, const uint8_t* p, uint64_t i) {
  if (dtype == kRopeFloat32) return reinterpret_cast<const float*>(p)[i];
  if (dtype == kRopeFloat16) return float(reinterpret_cast<const half*>(p)[i]);
  return float(reinterpret_cast<const bfloat16_t*>(p)[i]);
}
void Store(uint32_t dtype, uint8_t* p, uint64_t i, float v) {
  if (dtype == kRopeFloat32) reinterpret_cast<float*>(p)[i] = v;
  else if (dtype == kRopeFloat16) reinterpret_cast<half*>(p)[i] = half(v);
  else reinterpret_cast<bfloat16_t*>(p)[i] = bfloat16_t(v);
}
double Eps(uint32_t dtype) { return dtype == kRopeFloat32 ? 1e-6 : dtype == kRopeFloat16 ? 1.0 / 1024 : 1.0 / 128; }

// rot(x)[j] = sign[j] * x[b(j)] as in aten_ops/cpu/rope/ops.cpp.
int64_t Partner(int64_t mode, int64_t d, int64_t j) {
  const int64_t h = d / 2;
  return mode == 0 ? (j < h ? j + h : j - h) : (j % 2 == 0 ? j + 1 : j - 1);
}
double Sign(int64_t mode, int64_t d, int64_t j) { return (mode == 0 ? j < d / 2 : j % 2 == 0) ? -1.0 : 1.0; }

std::string Name(const Case& c) {
  char b[200];
  std::snprintf(b, sizeof b, "outer=%llu table_rows=%llu repeat=%llu D=%lld mode=%lld grad=%d x=%u table=%u",
                (unsigned long long)c.outer, (unsigned long long)c.table_rows, (unsigned long long)c.repeat,
                (long long)c.d, (long long)c.mode, int(c.grad), c.x_dtype, c.table_dtype);
  return b;
}

bool RunCase(const Case& c, std::mt19937& rng) {
  const uint64_t rows = c.outer * c.table_rows * c.repeat, d = uint64_t(c.d);
  RopeProblem p;
  p.rows = rows;
  p.d = c.d;
  p.mode = c.mode;
  p.is_grad = c.grad;
  p.x_dtype = c.x_dtype;
  p.table_dtype = c.table_dtype;
  p.table_rows = c.table_rows;
  p.repeat = c.repeat;
  RotaryPositionEmbeddingTiling t{};
  const std::string err = RopeTiling(p, Ascend910B(), &t);
  if (!err.empty()) {
    std::printf("FAIL %s: tiling: %s\n", Name(c).c_str(), err.c_str());
    return false;
  }
  const size_t xb = RopeDtypeBytes(c.x_dtype), tb = RopeDtypeBytes(c.table_dtype);
  auto* x = static_cast<uint8_t*>(AscendC::GmAlloc(rows * d * xb));
  auto* out = static_cast<uint8_t*>(AscendC::GmAlloc(rows * d * xb));
  auto* cs = static_cast<uint8_t*>(AscendC::GmAlloc(c.table_rows * d * tb));
  auto* sn = static_cast<uint8_t*>(AscendC::GmAlloc(c.table_rows * d * tb));
  auto* ws = static_cast<uint8_t*>(AscendC::GmAlloc(32));
  auto* g = static_cast<uint8_t*>(AscendC::GmAlloc(rows * d * xb));   // the incoming gradient (backward)
  auto* dcos = static_cast<float*>(AscendC::GmAlloc(c.table_rows * d * 4));
  auto* dsin = static_cast<float*>(AscendC::GmAlloc(c.table_rows * d * 4));
  std::memset(dcos, 0, c.table_rows * d * 4);
  std::memset(dsin, 0, c.table_rows * d * 4);
  auto* tl = static_cast<uint8_t*>(AscendC::GmAlloc(sizeof t));
  std::memcpy(tl, &t, sizeof t);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f), angle(-3.2f, 3.2f);
  for (uint64_t i = 0; i < rows * d; ++i) Store(c.x_dtype, x, i, u(rng));
  for (uint64_t i = 0; i < rows * d; ++i) Store(c.x_dtype, g, i, u(rng));
  for (uint64_t i = 0; i < c.table_rows * d; ++i) {
    const float a = angle(rng);  // cos/sin of independent angles: halves/pairs need not repeat
    Store(c.table_dtype, cs, i, std::cos(a));
    Store(c.table_dtype, sn, i, std::sin(a));
  }
  AscendC::SetKernelMode(AscendC::KernelMode::AIV_MODE);
  bool ok = true;
  try {
    if (c.grad)
      ICPU_RUN_KF(rotary_position_embedding_grad_kernel, t.block_dim, g, cs, sn, x, out,
                  reinterpret_cast<uint8_t*>(dcos), reinterpret_cast<uint8_t*>(dsin), ws, tl);
    else
      ICPU_RUN_KF(rotary_position_embedding_kernel, t.block_dim, x, cs, sn, out, ws, tl);
  } catch (const std::exception& e) {
    std::printf("FAIL %s: %s\n", Name(c).c_str(), e.what());
    ok = false;
  }
  // float64 reference: out = x*cos + sign*x[b]*sin; dx[j] = g[j]*cos[j] + sign[b]*g[b]*sin[b] (b = partner of j);
  // dcos[tr][j] = sum g[j]*x[j], dsin[tr][j] = sum sign[j]*g[j]*x[b] over the x rows r using table row tr.
  const uint8_t* in = c.grad ? g : x;
  std::vector<double> rc(c.table_rows * d, 0.0), rs(c.table_rows * d, 0.0), mag(c.table_rows * d, 0.0);
  for (uint64_t r = 0; c.grad && r < rows; ++r) {
    const uint64_t tr = (r / c.repeat) % c.table_rows;
    for (uint64_t j = 0; j < d; ++j) {
      const uint64_t b = uint64_t(Partner(c.mode, c.d, int64_t(j)));
      const double gj = ToDouble(c.x_dtype, g, r * d + j);
      rc[tr * d + j] += gj * ToDouble(c.x_dtype, x, r * d + j);
      rs[tr * d + j] += Sign(c.mode, c.d, int64_t(j)) * gj * ToDouble(c.x_dtype, x, r * d + b);
      mag[tr * d + j] += std::fabs(gj) * 4.0;
    }
  }
  for (uint64_t i = 0; ok && c.grad && i < c.table_rows * d; ++i) {
    const double tol = 1e-6 * mag[i] + 1e-6;  // fp32 products and sums
    if (!(std::fabs(dcos[i] - rc[i]) <= tol && std::fabs(dsin[i] - rs[i]) <= tol)) {
      std::printf("FAIL %s: table element %llu dcos %g want %g, dsin %g want %g\n", Name(c).c_str(),
                  (unsigned long long)i, dcos[i], rc[i], dsin[i], rs[i]);
      ok = false;
    }
  }
  double worst = 0;
  for (uint64_t r = 0; ok && r < rows; ++r) {
    const uint64_t tr = (r / c.repeat) % c.table_rows;
    for (uint64_t j = 0; j < d; ++j) {
      const uint64_t b = uint64_t(Partner(c.mode, c.d, int64_t(j)));
      const double xj = ToDouble(c.x_dtype, in, r * d + j), xb_ = ToDouble(c.x_dtype, in, r * d + b);
      const double cj = ToDouble(c.table_dtype, cs, tr * d + j);
      double ref;
      if (!c.grad) ref = xj * cj + Sign(c.mode, c.d, int64_t(j)) * xb_ * ToDouble(c.table_dtype, sn, tr * d + j);
      else ref = xj * cj + Sign(c.mode, c.d, int64_t(b)) * xb_ * ToDouble(c.table_dtype, sn, tr * d + b);
      const double got = ToDouble(c.x_dtype, out, r * d + j);
      const double tol = Eps(c.x_dtype) * (std::fabs(ref) + 1e-3) + 1e-6;  // one rounding to x's dtype + fp32 ops
      const double e = std::fabs(got - ref);
      if (!(e <= tol)) {
        if (ok) std::printf("FAIL %s: row %llu col %llu got %g want %g\n", Name(c).c_str(), (unsigned long long)r,
                            (unsigned long long)j, got, ref);
        ok = false;
      }
      worst = std::max(worst, e);
    }
  }
  for (auto* ptr : {x, out, cs, sn, ws, tl, g}) AscendC::GmFree(ptr);
  AscendC::GmFree(dcos);
  AscendC::GmFree(dsin);
  return ok;
}

}  // namespace

int main() {
  std::mt19937 rng(7);
  std::vector<Case> cases;
  const uint32_t dtypes[] = {kRopeFloat32, kRopeFloat16, kRopeBFloat16};
  // Shapes: [outer, table_rows, repeat] = BSND-like [2,5,3], BNSD-like [6,5,1], SBND-like [1,5,6], full [1,33,1],
  // a single table row [1,1,7], and a long BNSD sequence over several tiles per core [1,300,1] (D=128).
  const uint64_t shapes[][3] = {{2, 5, 3}, {6, 5, 1}, {1, 5, 6}, {1, 33, 1}, {1, 1, 7}};
  for (int64_t d : {8, 64, 6, 2})
    for (int64_t mode : {0, 1})
      for (bool grad : {false, true})
        for (uint32_t xd : dtypes)
          for (const auto& s : shapes) cases.push_back({s[0], s[1], s[2], d, mode, grad, xd, xd});
  for (int64_t mode : {0, 1})
    for (uint32_t xd : dtypes)
      for (bool grad : {false, true}) {
        cases.push_back({1, 1500, 1, 128, mode, grad, xd, xd});             // several tiles per core + tails
        cases.push_back({3, 40, 37, 128, mode, grad, xd, kRopeFloat32});    // repeat runs across tiles and cores
        cases.push_back({2, 7, 3, 8, mode, grad, xd, kRopeFloat32});        // fp32 tables, padded halves
      }
  int failed = 0;
  for (const Case& c : cases) failed += !RunCase(c, rng);
  return tot_test::Finish(failed, int(cases.size()), "cases");
}
