// CPU entry points of the rotary position embedding ops declared in native_functions.yaml.
//
// Every mode is written as one formula over the last (head) dimension D:
//   out[j] = x[a(j)] * cos[j] + sign(j) * x[b(j)] * sin[j]
// with index maps a, b and signs chosen per mode:
//   0 half            rotate_half(x) = cat(-x2, x1)                      (GPT-NeoX / LLaMA)
//   1 interleave      rot[2i] = -x[2i+1], rot[2i+1] = x[2i]               (GPT-J)
//   2 quarter         cat(-x2, x1, -x4, x3) over the four quarters of D   (D % 4 == 0)
//   3 interleave-half y = cat(x[0::2], x[1::2]) then half mode on y       (output in y's order)
// The backward scatters through the same maps. Computation is in fp32 (fp64 for fp64 inputs).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>

#include <cstring>
#include <string>
#include <vector>

#include "common/rope/params.h"
#include "cpu/rope/rope_kernels.h"
#include "generated/kernels.h"

namespace npu_fa {
namespace {

struct RotaryMap {
  std::vector<int64_t> a, b;
  std::vector<int8_t> sign;
};

RotaryMap make_map(const char* op, int64_t mode, int64_t D) {
  rope::check_mode_and_dim(op, mode, D);
  RotaryMap m;
  m.a.resize(D);
  m.b.resize(D);
  m.sign.resize(D);
  const int64_t h = D / 2;
  for (int64_t j = 0; j < D; ++j) {
    switch (mode) {
      case 0:
        m.a[j] = j;
        m.b[j] = j < h ? j + h : j - h;
        m.sign[j] = j < h ? -1 : 1;
        break;
      case 1:
        m.a[j] = j;
        m.b[j] = j % 2 == 0 ? j + 1 : j - 1;
        m.sign[j] = j % 2 == 0 ? -1 : 1;
        break;
      case 2: {
        const int64_t q = D / 4, base = j < h ? 0 : h, k = j - base;
        m.a[j] = j;
        m.b[j] = base + (k < q ? k + q : k - q);
        m.sign[j] = k < q ? -1 : 1;
        break;
      }
      case 3: {
        auto src = [h](int64_t i) { return i < h ? 2 * i : 2 * (i - h) + 1; };
        m.a[j] = src(j);
        m.b[j] = src(j < h ? j + h : j - h);
        m.sign[j] = j < h ? -1 : 1;
        break;
      }
    }
  }
  return m;
}

using rope::check_float;

// cos/sin converted to the accumulation dtype, checked against x and expanded to x's shape (stride-0 views).
// Returns, per row of x (all dims but the last), the element offset of that row in the expanded cos/sin.
struct TableRows {
  at::Tensor cos, sin;                    // acc dtype, contiguous, original (broadcast) shapes
  std::vector<int64_t> cos_off, sin_off;  // per x row
};

std::vector<int64_t> row_offsets(const at::Tensor& table, at::IntArrayRef xsizes) {
  const at::Tensor e = table.expand(xsizes);
  const int64_t nd = static_cast<int64_t>(xsizes.size());
  int64_t rows = 1;
  for (int64_t d = 0; d + 1 < nd; ++d) rows *= xsizes[d];
  std::vector<int64_t> off(rows);
  std::vector<int64_t> idx(std::max<int64_t>(nd - 1, 0), 0);
  int64_t cur = 0;
  for (int64_t r = 0; r < rows; ++r) {
    off[r] = cur;
    for (int64_t d = nd - 2; d >= 0; --d) {  // odometer increment
      if (++idx[d] < xsizes[d]) {
        cur += e.stride(d);
        break;
      }
      cur -= e.stride(d) * (xsizes[d] - 1);
      idx[d] = 0;
    }
  }
  return off;
}

TableRows prepare_tables(const char* op, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                         at::ScalarType acc) {
  rope::check_tables(op, x, cos, sin);
  TableRows t;
  t.cos = cos.to(acc).contiguous();
  t.sin = sin.to(acc).contiguous();
  t.cos_off = row_offsets(t.cos, x.sizes());
  t.sin_off = row_offsets(t.sin, x.sizes());
  return t;
}

int64_t grain_rows(int64_t D) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(D, 1)); }

// Forward over a contiguous tensor (rows of D) with the per-ISA row loop (cpu/rope/rope_kernels_isa.cpp); `src` may
// equal `dst`. The tables are in the accumulation type, mode and D validated.
void forward_rows(const at::Tensor& src, const at::Tensor& dst, int64_t mode, const TableRows& t) {
  cpu::RopeRowsParams p;
  p.dtype = src.scalar_type();
  p.D = src.size(-1);
  p.rows = src.numel() / p.D;
  p.mode = mode;
  p.src = src.data_ptr();
  p.dst = dst.data_ptr();
  p.cos = t.cos.data_ptr();
  p.sin = t.sin.data_ptr();
  p.cos_off = t.cos_off.data();
  p.sin_off = t.sin_off.data();
  cpu::rope_rows_stub(p);
}

at::ScalarType acc_type(const at::Tensor& x) { return x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat; }

void rope_inplace(const char* op, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, int64_t mode) {
  rope::check_mode_and_dim(op, mode, x.dim() ? x.size(-1) : 0);
  const TableRows t = prepare_tables(op, x, cos, sin, acc_type(x));
  if (x.numel() == 0) return;
  at::Tensor xc = x.contiguous();
  forward_rows(xc, xc, mode, t);
  if (!xc.is_same(x)) x.copy_(xc);
}

int64_t parse_rotary_mode(const char* op, c10::string_view s) {
  const std::string v(s);
  if (v == "half") return 0;
  if (v == "interleave") return 1;
  if (v == "quarter") return 2;
  if (v == "interleave-half" || v == "interleave_half") return 3;
  TORCH_CHECK(false, op, ": unknown rotary_mode '", v,
              "'; expected 'half', 'interleave', 'quarter' or 'interleave-half'");
}

// A 2-D [S, D] table is placed on the sequence axis of the layout; other ranks broadcast as they are.
at::Tensor align_table(const char* op, const at::Tensor& table, const std::string& layout, const at::Tensor& x) {
  const int64_t want = layout == "TND" ? 3 : 4;
  TORCH_CHECK(x.dim() == want, op, ": layout ", layout, " expects ", want, "-D query/key; got ", x.dim(), "-D");
  if (table.dim() != 2) return table;
  const int64_t S = table.size(0), D = table.size(1);
  if (layout == "TND") return table.view({S, 1, D});
  if (layout == "BSND") return table.view({1, S, 1, D});
  if (layout == "BNSD") return table.view({1, 1, S, D});
  return table.view({S, 1, 1, D});  // SBND
}

}  // namespace

at::Tensor rotary_position_embedding_cpu(const RotaryPositionEmbeddingArgs& args) {
  const char* op = "rotary_position_embedding";
  rope::check_mode_and_dim(op, args.mode, args.x.dim() ? args.x.size(-1) : 0);
  const TableRows t = prepare_tables(op, args.x, args.cos, args.sin, acc_type(args.x));
  at::Tensor out = at::empty(args.x.sizes(), args.x.options().memory_format(at::MemoryFormat::Contiguous));
  if (args.x.numel() == 0) return out;
  const at::Tensor xc = args.x.contiguous();
  forward_rows(xc, out, args.mode, t);
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> rotary_position_embedding_grad_cpu(
    const RotaryPositionEmbeddingGradArgs& args) {
  const char* op = "rotary_position_embedding_grad";
  rope::check_grad(op, args.grad, args.x);
  const RotaryMap m = make_map(op, args.mode, args.x.dim() ? args.x.size(-1) : 0);
  const at::ScalarType acc = acc_type(args.x);
  const TableRows t = prepare_tables(op, args.x, args.cos, args.sin, acc);
  at::Tensor dx = at::empty(args.x.sizes(), args.x.options().memory_format(at::MemoryFormat::Contiguous));
  const int64_t D = args.x.dim() ? args.x.size(-1) : 0, rows = D ? args.x.numel() / D : 0;
  const int64_t cn = t.cos.numel(), sn = t.sin.numel();
  // dcos/dsin: when cos/sin are broadcast, each of `chunks` row ranges accumulates into its own cos/sin-sized
  // partial buffer (summed in a fixed order afterwards: deterministic for a given thread count); when that would
  // cost more memory than x itself (or nothing is broadcast), per-element products at x's shape are reduced instead.
  const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), rows));
  const bool partial = (cn < args.x.numel() || sn < args.x.numel()) && chunks * (cn + sn) <= 2 * args.x.numel();
  at::Tensor dc_buf = partial ? at::zeros({chunks, cn}, args.x.options().dtype(acc))
                              : at::zeros(args.x.sizes(), args.x.options().dtype(acc));
  at::Tensor ds_buf = partial ? at::zeros({chunks, sn}, args.x.options().dtype(acc))
                              : at::zeros(args.x.sizes(), args.x.options().dtype(acc));
  if (rows > 0) {
    const at::Tensor xc = args.x.contiguous();
    const at::Tensor gc = args.grad.to(args.x.scalar_type()).contiguous();
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, args.x.scalar_type(), "rope_backward", [&] {
      using acc_t = std::conditional_t<std::is_same_v<scalar_t, double>, double, float>;
      const scalar_t* xp = xc.data_ptr<scalar_t>();
      const scalar_t* gp = gc.data_ptr<scalar_t>();
      scalar_t* dxp = dx.data_ptr<scalar_t>();
      acc_t* dcp = dc_buf.data_ptr<acc_t>();
      acc_t* dsp = ds_buf.data_ptr<acc_t>();
      const acc_t* cp = t.cos.data_ptr<acc_t>();
      const acc_t* sp = t.sin.data_ptr<acc_t>();
      auto run_rows = [&](int64_t r0, int64_t r1, int64_t chunk) {
        std::vector<acc_t> xr(D), gr(D), dxr(D);
        for (int64_t r = r0; r < r1; ++r) {
          for (int64_t j = 0; j < D; ++j) {
            xr[j] = static_cast<acc_t>(xp[r * D + j]);
            gr[j] = static_cast<acc_t>(gp[r * D + j]);
            dxr[j] = 0;
          }
          const acc_t* c = cp + t.cos_off[r];
          const acc_t* s = sp + t.sin_off[r];
          acc_t* dc = partial ? dcp + chunk * cn + t.cos_off[r] : dcp + r * D;
          acc_t* ds = partial ? dsp + chunk * sn + t.sin_off[r] : dsp + r * D;
          for (int64_t j = 0; j < D; ++j) {
            const acc_t sg = static_cast<acc_t>(m.sign[j]);
            dxr[m.a[j]] += gr[j] * c[j];
            dxr[m.b[j]] += sg * gr[j] * s[j];
            dc[j] += gr[j] * xr[m.a[j]];
            ds[j] += sg * gr[j] * xr[m.b[j]];
          }
          for (int64_t j = 0; j < D; ++j) dxp[r * D + j] = static_cast<scalar_t>(dxr[j]);
        }
      };
      if (partial) {
        at::parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
          for (int64_t c = c0; c < c1; ++c) run_rows(rows * c / chunks, rows * (c + 1) / chunks, c);
        });
      } else {
        at::parallel_for(0, rows, grain_rows(D), [&](int64_t r0, int64_t r1) { run_rows(r0, r1, 0); });
      }
    });
  }
  at::Tensor dcos, dsin;
  if (partial) {
    dcos = dc_buf.sum(0).view(t.cos.sizes());
    dsin = ds_buf.sum(0).view(t.sin.sizes());
  } else {
    dcos = at::sum_to(dc_buf, args.cos.sizes());
    dsin = at::sum_to(ds_buf, args.sin.sizes());
  }
  return {dx, dcos.to(args.cos.scalar_type()).contiguous(), dsin.to(args.sin.scalar_type()).contiguous()};
}

void apply_rotary_pos_emb_cpu(const ApplyRotaryPosEmbArgs& args) {
  const char* op = "apply_rotary_pos_emb";
  std::string lay(args.layout);
  if (lay == "BSH") lay = "BSND";  // torch_npu's name for the same 4-D layout
  TORCH_CHECK(lay == "BSND" || lay == "BNSD" || lay == "SBND" || lay == "TND", op, ": unknown layout '", lay,
              "'; expected BSND (or BSH), BNSD, SBND or TND");
  const int64_t mode = parse_rotary_mode(op, args.rotary_mode);
  TORCH_CHECK(args.query.size(-1) == args.key.size(-1), op, ": query and key must share the head dimension; got ",
              args.query.size(-1), " and ", args.key.size(-1));
  rope_inplace(op, args.query, align_table(op, args.cos, lay, args.query), align_table(op, args.sin, lay, args.query),
               mode);
  rope_inplace(op, args.key, align_table(op, args.cos, lay, args.key), align_table(op, args.sin, lay, args.key), mode);
}

namespace {

// The rope_with_sin_cos_cache call after validation: for each token, the column of the position row its cos/sin come
// from (one row without sections; for multimodal RoPE a row per column of the rotary half).
struct RopeCachePlan {
  int64_t tokens = 0;          // T
  int64_t rot = 0, half = 0;   // rot_dim, rot_dim / 2
  int64_t rows = 1;            // position rows: 1, or len(mrope_section)
  std::vector<int64_t> row_of; // [half]: which position row column j reads (all 0 without sections)
};

// One of query/key for rope_with_sin_cos_cache: x viewed as [T, heads, head_size]. Per token the cos/sin of the
// rotary half are gathered once (from one position row, or per column from its section's row), then every head is
// rotated in the accumulation dtype by the per-ISA loop (cpu/rope/rope_kernels_isa.cpp).
at::Tensor rope_cache_one(const char* op, const char* name, const at::Tensor& pos, const at::IntArrayRef token_shape,
                          const at::Tensor& x, const at::Tensor& cache, int64_t head_size, bool neox,
                          const RopeCachePlan& plan) {
  check_float(op, name, x);
  const int64_t td = static_cast<int64_t>(token_shape.size());
  TORCH_CHECK(x.dim() > td, op, ": ", name, " of shape ", x.sizes(), " must have more dimensions than the tokens' shape ",
              token_shape, " (positions' shape", plan.rows > 1 ? " without its section dimension" : "", ")");
  for (int64_t d = 0; d < td; ++d)
    TORCH_CHECK(x.size(d) == token_shape[d], op, ": ", name, " of shape ", x.sizes(), " must start with the tokens' shape ",
                token_shape, plan.rows > 1 ? " (positions [sections, T] without the section dimension)" : " (positions' shape)");
  int64_t tail = 1;
  for (int64_t d = td; d < x.dim(); ++d) tail *= x.size(d);
  TORCH_CHECK(tail % head_size == 0, op, ": ", name, " of shape ", x.sizes(), " holds ", tail,
              " values per token, not a multiple of head_size=", head_size);
  at::Tensor out = x.contiguous().clone(at::MemoryFormat::Contiguous);
  if (out.numel() == 0) return out;
  cpu::RopeCacheParams p;
  p.dtype = x.scalar_type();
  p.table_dtype = cache.scalar_type();
  p.tokens = plan.tokens;
  p.heads = tail / head_size;
  p.head_size = head_size;
  p.rot = plan.rot;
  p.neox = neox;
  p.one_row = plan.rows == 1;
  p.x = out.data_ptr();
  p.table = cache.data_ptr();
  p.pos = pos.data_ptr<int64_t>();
  p.row_of = plan.row_of.data();
  cpu::rope_cache_stub(p);
  return out;
}

// The cache as the kernel reads it: contiguous, in x's dtype or x's accumulation type (any other dtype, e.g. a
// float16 cache for bfloat16 x, is converted to the accumulation type once).
at::Tensor table_for(const at::Tensor& cache, const at::Tensor& x) {
  const at::ScalarType acc = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const at::ScalarType want = cache.scalar_type() == x.scalar_type() ? x.scalar_type() : acc;
  return cache.to(want).contiguous();
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> rope_with_sin_cos_cache_cpu(const RopeWithSinCosCacheArgs& args) {
  const char* op = "rope_with_sin_cos_cache";
  TORCH_CHECK(args.positions.scalar_type() == at::kLong || args.positions.scalar_type() == at::kInt, op,
              ": positions must be int64 (or int32); got ", args.positions.scalar_type());
  check_float(op, "cos_sin_cache", args.cos_sin_cache);
  TORCH_CHECK(args.cos_sin_cache.dim() == 2, op, ": cos_sin_cache must be 2-D [max_position, rot_dim]; got shape ",
              args.cos_sin_cache.sizes());
  const int64_t rot = args.cos_sin_cache.size(1), max_pos = args.cos_sin_cache.size(0);
  TORCH_CHECK(args.head_size > 0, op, ": head_size must be positive; got ", args.head_size);
  TORCH_CHECK(rot > 0 && rot % 2 == 0 && rot <= args.head_size, op, ": rot_dim (cos_sin_cache.size(1)=", rot,
              ") must be even, positive and at most head_size=", args.head_size);
  const std::string cache_mode(args.cache_mode);
  TORCH_CHECK(cache_mode == "default" || cache_mode == "interleave", op,
              ": cache_mode must be 'default' or 'interleave'; got '", cache_mode, "'");
  RopeCachePlan plan;
  plan.rot = rot;
  plan.half = rot / 2;
  plan.row_of.assign(plan.half, 0);
  bool mrope = false;
  if (args.mrope_section.has_value()) {
    const auto sec = *args.mrope_section;
    for (int64_t v : sec) mrope = mrope || v != 0;
    if (mrope) {
      const int64_t m = static_cast<int64_t>(sec.size());
      TORCH_CHECK(m == 3 || m == 4, op, ": mrope_section must have 3 or 4 entries; got ", sec);
      int64_t sum = 0;
      for (int64_t v : sec) {
        TORCH_CHECK(v >= 0, op, ": mrope_section entries must be non-negative; got ", sec);
        sum += v;
      }
      TORCH_CHECK(sum == plan.half, op, ": mrope_section ", sec, " must sum to rot_dim/2 = ", plan.half,
                  " (cos_sin_cache.size(1)=", rot, "); its sum is ", sum);
      TORCH_CHECK(cache_mode == "default" || m == 3, op,
                  ": cache_mode='interleave' needs a 3-entry mrope_section; got ", sec);
      TORCH_CHECK(args.positions.dim() == 2 && args.positions.size(0) == m, op,
                  ": with mrope_section ", sec, ", positions must be 2-D [", m, ", num_tokens]; got shape ",
                  args.positions.sizes());
      plan.rows = m;
      if (cache_mode == "default") {
        int64_t j = 0;
        for (int64_t r = 0; r < m; ++r)
          for (int64_t e = 0; e < sec[r]; ++e) plan.row_of[j++] = r;
      } else {
        for (int64_t j = 0; j < plan.half; ++j)
          if (j < 3 * sec[1] && j % 3 != 0) plan.row_of[j] = j % 3;
      }
    }
  }
  const at::Tensor pos = args.positions.to(at::kLong).contiguous();
  const at::IntArrayRef token_shape = mrope ? pos.sizes().slice(1) : pos.sizes();
  plan.tokens = mrope ? pos.size(1) : pos.numel();
  if (pos.numel() > 0) {
    const int64_t lo = pos.min().item<int64_t>(), hi = pos.max().item<int64_t>();
    TORCH_CHECK(lo >= 0 && hi < max_pos, op, ": positions must lie in [0, ", max_pos,
                ") (cos_sin_cache rows); got values in [", lo, ", ", hi, "]");
  }
  return {rope_cache_one(op, "query", pos, token_shape, args.query, table_for(args.cos_sin_cache, args.query),
                         args.head_size, args.is_neox_style, plan),
          rope_cache_one(op, "key", pos, token_shape, args.key, table_for(args.cos_sin_cache, args.key),
                         args.head_size, args.is_neox_style, plan)};
}

}  // namespace npu_fa
