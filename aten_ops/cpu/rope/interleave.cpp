// CPU entry points of interleave_rope (torch_npu's npu_interleave_rope) and its backward.
//
// Forward: each row of D values of x goes through npu_fa::mla::interleave_rope_row (the row function mla_prolog and
// kv_rms_norm_rope_cache use), in fp32 (fp64 for fp64). The map is rotary_position_embedding's mode 3
// (interleave-half), so the backward is that op's backward, behind this op's own argument checks.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <vector>

#include "common/rope/params.h"
#include "cpu/mla/latent_rows.h"
#include "generated/kernels.h"

namespace npu_fa {
namespace {

constexpr int64_t kInterleaveHalfMode = 3;

void check_interleave_args(const char* op, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  rope::check_tables(op, x, cos, sin);
  const int64_t D = x.size(-1);
  TORCH_CHECK_VALUE(D % 2 == 0 && D > 0, op, ": argument 'x' must end in an even, positive head dimension D; got "
                    "shape ", x.sizes());
  TORCH_CHECK_VALUE(cos.sizes() == sin.sizes(), op, ": arguments 'cos' ", cos.sizes(), " and 'sin' ", sin.sizes(),
                    " must have the same shape");
}

// Element offset, in a contiguous table of shape `tsizes` (right-aligned with x, size 1 = broadcast), of the row
// that x's row `r` (over x's leading dims `xsizes[:-1]`) reads.
struct TableIndex {
  std::vector<int64_t> xsizes, tstrides;  // over x's leading dims; tstrides 0 where the table broadcasts
  int64_t offset(int64_t r) const {
    int64_t off = 0;
    for (int64_t d = static_cast<int64_t>(xsizes.size()) - 1; d >= 0; --d) {
      off += (r % xsizes[d]) * tstrides[d];
      r /= xsizes[d];
    }
    return off;
  }
};

TableIndex table_index(const at::Tensor& x, const at::Tensor& table) {
  const int64_t lead = x.dim() - 1, tlead = table.dim() - 1;
  TableIndex t;
  t.xsizes.assign(x.sizes().begin(), x.sizes().end() - 1);
  t.tstrides.assign(lead, 0);
  int64_t stride = table.size(-1);
  for (int64_t i = 1; i <= tlead; ++i) {  // the table's dims from the right
    const int64_t s = table.size(-1 - i);
    if (s != 1) t.tstrides[lead - i] = stride;
    stride *= s;
  }
  return t;
}

}  // namespace

at::Tensor interleave_rope_cpu(const InterleaveRopeArgs& args) {
  const char* op = "interleave_rope";
  check_interleave_args(op, args.x, args.cos, args.sin);
  at::Tensor out = at::empty(args.x.sizes(), args.x.options().memory_format(at::MemoryFormat::Contiguous));
  if (args.x.numel() == 0) return out;
  const int64_t D = args.x.size(-1), rows = args.x.numel() / D;
  const at::Tensor xc = args.x.contiguous();
  const TableIndex ti = table_index(args.x, args.cos);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, args.x.scalar_type(), "interleave_rope", [&] {
    using acc_t = mla::acc_of<scalar_t>;
    const at::ScalarType acc = std::is_same_v<acc_t, double> ? at::kDouble : at::kFloat;
    const at::Tensor c = args.cos.to(acc).contiguous(), s = args.sin.to(acc).contiguous();
    const acc_t* cp = c.data_ptr<acc_t>();
    const acc_t* sp = s.data_ptr<acc_t>();
    const scalar_t* xp = xc.data_ptr<scalar_t>();
    scalar_t* op_ = out.data_ptr<scalar_t>();
    at::parallel_for(0, rows, std::max<int64_t>(1, 16384 / D), [&](int64_t r0, int64_t r1) {
      std::vector<acc_t> buf(D);
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t t = ti.offset(r);
        mla::interleave_rope_row(xp + r * D, cp + t, sp + t, D, buf.data());
        mla::write_cache_row(buf.data(), D, op_ + r * D, mla::RowAddr{0, mla::contiguous_row(D)});
      }
    });
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> interleave_rope_grad_cpu(const InterleaveRopeGradArgs& args) {
  const char* op = "interleave_rope_grad";
  check_interleave_args(op, args.x, args.cos, args.sin);
  rope::check_grad(op, args.grad, args.x);
  return rotary_position_embedding_grad_cpu({args.grad, args.cos, args.sin, args.x, kInterleaveHalfMode});
}

}  // namespace npu_fa
