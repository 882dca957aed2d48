#include "common/rope/params.h"

namespace npu_fa::rope {

void check_mode_and_dim(const char* op, int64_t mode, int64_t D) {
  TORCH_CHECK(mode >= 0 && mode <= 3, op, ": unknown rotary mode ", mode,
              "; expected 0 (half), 1 (interleave), 2 (quarter) or 3 (interleave-half)");
  TORCH_CHECK(D % 2 == 0 && D > 0, op, ": the last (head) dimension must be even and positive; got D=", D);
  TORCH_CHECK(mode != 2 || D % 4 == 0, op, ": quarter mode needs D divisible by 4; got D=", D);
}

void check_float(const char* op, const char* name, const at::Tensor& t) {
  const auto s = t.scalar_type();
  TORCH_CHECK(s == at::kFloat || s == at::kHalf || s == at::kBFloat16 || s == at::kDouble, op, ": ", name,
              " must be float32, float16, bfloat16 or float64; got ", s);
}

void check_tables(const char* op, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  check_float(op, "x", x);
  check_float(op, "cos", cos);
  check_float(op, "sin", sin);
  TORCH_CHECK(x.dim() >= 1, op, ": x must have at least one dimension");
  const int64_t D = x.size(-1);
  for (const auto* p : {&cos, &sin}) {
    const char* name = p == &cos ? "cos" : "sin";
    TORCH_CHECK(p->dim() >= 1 && p->dim() <= x.dim() && p->size(-1) == D, op, ": ", name, " of shape ",
                p->sizes(), " must end in the head dimension D=", D, " and have at most x's rank (x: ", x.sizes(),
                ")");
    for (int64_t i = 1; i <= p->dim(); ++i) {
      const int64_t s = p->size(-i);
      TORCH_CHECK(s == 1 || s == x.size(-i), op, ": ", name, " of shape ", p->sizes(),
                  " is not broadcastable to x of shape ", x.sizes());
    }
  }
}

void check_grad(const char* op, const at::Tensor& grad, const at::Tensor& x) {
  TORCH_CHECK(grad.sizes() == x.sizes(), op, ": grad of shape ", grad.sizes(), " must match x of shape ", x.sizes());
  check_float(op, "grad", grad);
}

}  // namespace npu_fa::rope
