// CPU entry points of the lightning-indexer ops (DeepSeek-V3.2 sparse attention): lightning_indexer,
// quant_lightning_indexer, lightning_indexer_grad and sparse_lightning_indexer_grad_kl_loss. Each validates through
// common/sparse_attention (layouts, shapes, lengths, block table), checks dtypes, converts the small operands to
// the accumulation type (float; double for double inputs), allocates the outputs and runs the loops of
// cpu/sparse_attention/lightning_indexer_kernels_isa.cpp. The simulated npu device runs these too.
#include <ATen/ATen.h>

#include <cmath>
#include <limits>
#include <string>

#include "common/sparse_attention/lightning_indexer_params.h"
#include "cpu/sparse_attention/lightning_indexer_kernels.h"
#include "generated/kernels.h"

namespace npu_fa {

namespace {

using sparse_attention::IndexerGeometry;
using sparse_attention::IndexerInputs;

at::ScalarType acc_type(const at::Tensor& t) { return t.scalar_type() == at::kDouble ? at::kDouble : at::kFloat; }

at::Tensor acc(const at::Tensor& t, at::ScalarType a) { return t.to(at::kCPU).to(a).contiguous(); }

// The output of an indexer call: [B, S1, N2, K] (BSND) or [T1, N2, K] (TND).
std::vector<int64_t> indices_shape(const at::Tensor& query, const IndexerGeometry& g, int64_t K) {
  std::vector<int64_t> s(query.sizes().begin(), query.sizes().end() - 2);
  s.push_back(g.N2);
  s.push_back(K);
  return s;
}

IndexerInputs indexer_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& w,
                             const std::optional<at::Tensor>& asq, const std::optional<at::Tensor>& ask,
                             const std::optional<at::Tensor>& bt, c10::string_view lq, c10::string_view lk,
                             int64_t sparse_mode, int64_t pre, int64_t next) {
  return IndexerInputs{q, k, w, asq, ask, bt, std::string(lq), std::string(lk), sparse_mode, pre, next};
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> lightning_indexer_cpu(const LightningIndexerArgs& args) {
  const char* op = "lightning_indexer";
  const IndexerGeometry g = sparse_attention::parse_lightning_indexer(
      op, indexer_inputs(args.query, args.key, args.weights, args.actual_seq_lengths_query,
                         args.actual_seq_lengths_key, args.block_table, args.layout_query, args.layout_key,
                         args.sparse_mode, args.pre_tokens, args.next_tokens),
      args.sparse_count, args.return_value);
  const int64_t K = args.sparse_count;
  const auto shape = indices_shape(args.query, g, K);
  at::Tensor indices = at::full(shape, -1, args.query.options().dtype(at::kInt));
  const at::ScalarType A = acc_type(args.query);
  at::Tensor values_acc;
  if (args.return_value) values_acc = at::full(shape, -std::numeric_limits<double>::infinity(), indices.options().dtype(A));
  if (indices.numel() > 0 && g.N1 > 0) {
    const at::Tensor q = acc(args.query, A), w = acc(args.weights, A), key = args.key.contiguous();
    cpu::IndexerForwardParams p;
    p.geo = &g;
    p.dbl = A == at::kDouble;
    p.q = q.data_ptr();
    p.w = w.data_ptr();
    p.key = key.data_ptr();
    p.key_dtype = key.scalar_type();
    p.K = K;
    p.indices = indices.data_ptr<int32_t>();
    p.values = args.return_value ? values_acc.data_ptr() : nullptr;
    cpu::lightning_indexer_forward_stub(p);
  }
  at::Tensor values = args.return_value ? values_acc.to(args.query.scalar_type())
                                        : at::empty({0}, args.query.options());
  return {indices, values};
}

at::Tensor quant_lightning_indexer_cpu(const QuantLightningIndexerArgs& args) {
  const char* op = "quant_lightning_indexer";
  TORCH_CHECK_TYPE(args.query.scalar_type() == at::kChar, op, ": argument 'query' must be int8; got ",
                   args.query.scalar_type());
  TORCH_CHECK_TYPE(args.key.scalar_type() == at::kChar, op, ": argument 'key' must be int8; got ",
                   args.key.scalar_type());
  TORCH_CHECK_TYPE(args.weights.scalar_type() == at::kHalf || args.weights.scalar_type() == at::kBFloat16 ||
                       args.weights.scalar_type() == at::kFloat,
                   op, ": argument 'weights' must be float16, bfloat16 or float32; got ", args.weights.scalar_type());
  for (const auto& [name, t] : {std::pair<const char*, const at::Tensor*>{"query_dequant_scale", &args.query_dequant_scale},
                                {"key_dequant_scale", &args.key_dequant_scale}})
    TORCH_CHECK_TYPE(t->scalar_type() == at::kHalf || t->scalar_type() == at::kFloat, op, ": argument '", name,
                     "' must be float16 or float32; got ", t->scalar_type());
  TORCH_CHECK_VALUE(args.query_quant_mode == 0, op,
                    ": argument 'query_quant_mode' must be 0 (per token and head, the only mode upstream); got ",
                    args.query_quant_mode);
  TORCH_CHECK_VALUE(args.key_quant_mode == 0, op,
                    ": argument 'key_quant_mode' must be 0 (per token and head, the only mode upstream); got ",
                    args.key_quant_mode);
  sparse_attention::check_sparse_count(op, args.sparse_count);
  const IndexerGeometry g = sparse_attention::parse_indexer_geometry(
      op, indexer_inputs(args.query, args.key, args.weights, args.actual_seq_lengths_query,
                         args.actual_seq_lengths_key, args.block_table, args.layout_query, args.layout_key,
                         args.sparse_mode, args.pre_tokens, args.next_tokens));
  TORCH_CHECK_VALUE(args.query_dequant_scale.sizes() == args.weights.sizes(), op,
                    ": argument 'query_dequant_scale' must have the shape of 'weights' ", args.weights.sizes(),
                    "; got ", args.query_dequant_scale.sizes());
  const at::IntArrayRef kshape = args.key.sizes().slice(0, args.key.dim() - 1);
  TORCH_CHECK_VALUE(args.key_dequant_scale.sizes() == kshape, op,
                    ": argument 'key_dequant_scale' must have the shape of 'key' without its head dim ", kshape,
                    "; got ", args.key_dequant_scale.sizes());
  const int64_t K = args.sparse_count;
  at::Tensor indices = at::full(indices_shape(args.query, g, K), -1, args.query.options().dtype(at::kInt));
  if (indices.numel() > 0 && g.N1 > 0) {
    const at::Tensor q = acc(args.query, at::kFloat), w = acc(args.weights, at::kFloat);
    const at::Tensor qs = acc(args.query_dequant_scale, at::kFloat), ks = acc(args.key_dequant_scale, at::kFloat);
    const at::Tensor key = args.key.contiguous();
    cpu::IndexerForwardParams p;
    p.geo = &g;
    p.q = q.data_ptr();
    p.w = w.data_ptr();
    p.qscale = qs.data_ptr();
    p.key = key.data_ptr();
    p.key_dtype = at::kChar;
    p.kscale = ks.data_ptr<float>();
    p.K = K;
    p.indices = indices.data_ptr<int32_t>();
    cpu::lightning_indexer_forward_stub(p);
  }
  return indices;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> lightning_indexer_grad_cpu(const LightningIndexerGradArgs& args) {
  const char* op = "lightning_indexer_grad";
  sparse_attention::check_indexer_dtypes(op, args.query, "query", args.key, "key", args.weights, "weights");
  const std::optional<at::Tensor> no_table;
  const std::string layout(args.layout);
  TORCH_CHECK_VALUE(layout == "BSND" || layout == "TND", op, ": argument 'layout' must be \"BSND\" or \"TND\"; got \"",
                    layout, "\"");
  IndexerInputs in = indexer_inputs(args.query, args.key, args.weights, args.actual_seq_lengths_query,
                                    args.actual_seq_lengths_key, no_table, args.layout, args.layout,
                                    args.sparse_mode, args.pre_tokens, args.next_tokens);
  in.name_layout_query = in.name_layout_key = "layout";
  const IndexerGeometry g = sparse_attention::parse_indexer_geometry(op, in);
  const int64_t K = sparse_attention::check_sparse_indices(op, "sparse_indices", args.sparse_indices, args.query, g);
  const at::ScalarType A = acc_type(args.query);
  const bool no_dy = args.dy.numel() == 0;
  if (!no_dy) {
    sparse_attention::check_indexer_floating(op, "dy", args.dy);
    TORCH_CHECK_VALUE(args.dy.sizes() == args.sparse_indices.sizes(), op,
                      ": argument 'dy' must have the shape of 'sparse_indices' ", args.sparse_indices.sizes(),
                      " (or be empty: no gradient); got ", args.dy.sizes());
  }
  at::Tensor dq = at::zeros(args.query.sizes(), args.query.options().dtype(A));
  at::Tensor dk = at::zeros(args.key.sizes(), args.key.options().dtype(A));
  at::Tensor dw = at::zeros(args.weights.sizes(), args.weights.options().dtype(A));
  if (!no_dy && args.dy.numel() > 0 && g.N1 > 0 && g.D > 0) {
    const at::Tensor q = acc(args.query, A), k = acc(args.key, A), w = acc(args.weights, A), dy = acc(args.dy, A);
    const at::Tensor idx = args.sparse_indices.to(at::kCPU, at::kLong).contiguous();
    cpu::IndexerGradParams p;
    p.geo = &g;
    p.dbl = A == at::kDouble;
    p.q = q.data_ptr();
    p.k = k.data_ptr();
    p.w = w.data_ptr();
    p.dy = dy.data_ptr();
    p.idx = idx.data_ptr<int64_t>();
    p.K = K;
    p.dq = dq.data_ptr();
    p.dk = dk.data_ptr();
    p.dw = dw.data_ptr();
    cpu::lightning_indexer_grad_stub(p);
  }
  return {dq.to(args.query.scalar_type()), dk.to(args.key.scalar_type()), dw.to(args.weights.scalar_type())};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> sparse_lightning_indexer_grad_kl_loss_cpu(
    const SparseLightningIndexerGradKlLossArgs& args) {
  const char* op = "sparse_lightning_indexer_grad_kl_loss";
  const std::string layout(args.layout);
  TORCH_CHECK_VALUE(layout == "BSND" || layout == "TND", op, ": argument 'layout' must be \"BSND\" or \"TND\"; got \"",
                    layout, "\"");
  sparse_attention::check_indexer_dtypes(op, args.query_index, "query_index", args.key_index, "key_index",
                                         args.weights, "weights");
  for (const auto& [name, t] : {std::pair<const char*, const at::Tensor*>{"query", &args.query}, {"key", &args.key}})
    TORCH_CHECK_TYPE(t->scalar_type() == args.query_index.scalar_type(), op, ": argument '", name,
                     "' must have the dtype of 'query_index' (", args.query_index.scalar_type(), "); got ",
                     t->scalar_type());
  const std::optional<at::Tensor> no_table;
  IndexerInputs in = indexer_inputs(args.query_index, args.key_index, args.weights, args.actual_seq_qlen,
                                    args.actual_seq_klen, no_table, args.layout, args.layout, args.sparse_mode,
                                    args.pre_tokens, args.next_tokens);
  in.name_query = "query_index";
  in.name_key = "key_index";
  in.name_seq_q = "actual_seq_qlen";
  in.name_seq_k = "actual_seq_klen";
  in.name_layout_query = in.name_layout_key = "layout";
  in.cumulative_bsnd_lengths = true;
  const IndexerGeometry g = sparse_attention::parse_indexer_geometry(op, in);
  TORCH_CHECK_VALUE(g.N2 == 1, op, ": argument 'key_index' must have one head (N2 = 1); got shape ",
                    args.key_index.sizes());
  const bool tnd = layout == "TND";
  // the main attention's query / key: the index tensors' token dims, N2 = 1, their own head dim
  const at::Tensor& q = args.query;
  const at::Tensor& k = args.key;
  TORCH_CHECK_VALUE(q.dim() == args.query_index.dim() &&
                        q.sizes().slice(0, q.dim() - 2) == args.query_index.sizes().slice(0, q.dim() - 2),
                    op, ": argument 'query' must be ", tnd ? "[T1, N1, D]" : "[B, S1, N1, D]",
                    " with the tokens of 'query_index' ", args.query_index.sizes(), "; got ", q.sizes());
  TORCH_CHECK_VALUE(k.dim() == args.key_index.dim() &&
                        k.sizes().slice(0, k.dim() - 2) == args.key_index.sizes().slice(0, k.dim() - 2) &&
                        k.size(-2) == 1 && k.size(-1) == q.size(-1),
                    op, ": argument 'key' must be ", tnd ? "[T2, 1, D]" : "[B, S2, 1, D]",
                    " with the tokens of 'key_index' and query's head dim D=", q.size(-1), "; got ", k.sizes());
  const int64_t N1 = q.size(-2), D = q.size(-1);
  TORCH_CHECK_VALUE(args.query_rope.has_value() == args.key_rope.has_value(), op,
                    ": arguments 'query_rope' and 'key_rope' must be given together");
  int64_t Dr = 0;
  if (args.query_rope.has_value()) {
    const at::Tensor& qr = *args.query_rope;
    const at::Tensor& kr = *args.key_rope;
    TORCH_CHECK_TYPE(qr.scalar_type() == q.scalar_type() && kr.scalar_type() == q.scalar_type(), op,
                     ": arguments 'query_rope' and 'key_rope' must have the dtype of 'query' (", q.scalar_type(),
                     "); got ", qr.scalar_type(), " and ", kr.scalar_type());
    Dr = qr.size(-1);
    TORCH_CHECK_VALUE(qr.dim() == q.dim() && qr.sizes().slice(0, q.dim() - 1) == q.sizes().slice(0, q.dim() - 1), op,
                      ": argument 'query_rope' must have the shape of 'query' but its last dim; got ", qr.sizes());
    TORCH_CHECK_VALUE(kr.dim() == k.dim() && kr.sizes().slice(0, k.dim() - 1) == k.sizes().slice(0, k.dim() - 1) &&
                          kr.size(-1) == Dr,
                      op, ": argument 'key_rope' must have the shape of 'key' with the rope dim of 'query_rope' (", Dr,
                      "); got ", kr.sizes());
  }
  const int64_t K = sparse_attention::check_sparse_indices(op, "sparse_indices", args.sparse_indices,
                                                           args.query_index, g);
  std::vector<int64_t> sshape = tnd ? std::vector<int64_t>{1, q.size(0), N1}
                                    : std::vector<int64_t>{q.size(0), 1, q.size(1), N1};
  for (const auto& [name, t] : {std::pair<const char*, const at::Tensor*>{"softmax_max", &args.softmax_max},
                                {"softmax_sum", &args.softmax_sum}}) {
    sparse_attention::check_indexer_floating(op, name, *t);
    TORCH_CHECK_VALUE(t->sizes() == at::IntArrayRef(sshape), op, ": argument '", name, "' must be ",
                      tnd ? "[N2=1, T1, G=N1] " : "[B, N2=1, S1, G=N1] ", at::IntArrayRef(sshape), "; got ",
                      t->sizes());
  }
  if (args.sinks.has_value()) {
    sparse_attention::check_indexer_floating(op, "sinks", *args.sinks);
    TORCH_CHECK_VALUE(args.sinks->dim() == 1 && args.sinks->size(0) == N1, op,
                      ": argument 'sinks' must be 1-D [N1=", N1, "]; got shape ", args.sinks->sizes());
  }
  TORCH_CHECK_VALUE(std::isfinite(args.scale_value), op, ": argument 'scale_value' must be finite; got ",
                    args.scale_value);
  const at::ScalarType A = acc_type(args.query_index);
  at::Tensor dqi = at::zeros(args.query_index.sizes(), args.query_index.options().dtype(A));
  at::Tensor dki = at::zeros(args.key_index.sizes(), args.key_index.options().dtype(A));
  at::Tensor dw = at::zeros(args.weights.sizes(), args.weights.options().dtype(A));
  double loss = 0;
  if (args.sparse_indices.numel() > 0 && g.N1 > 0 && N1 > 0) {
    const at::Tensor qa = acc(q, A), ka = acc(k, A), qia = acc(args.query_index, A), kia = acc(args.key_index, A);
    const at::Tensor wa = acc(args.weights, A), sm = acc(args.softmax_max, A), ss = acc(args.softmax_sum, A);
    const at::Tensor qra = Dr ? acc(*args.query_rope, A) : at::Tensor();
    const at::Tensor kra = Dr ? acc(*args.key_rope, A) : at::Tensor();
    const at::Tensor sinks = args.sinks.has_value() ? acc(*args.sinks, A) : at::Tensor();
    const at::Tensor idx = args.sparse_indices.to(at::kCPU, at::kLong).contiguous();
    cpu::IndexerKlParams p;
    p.geo = &g;
    p.dbl = A == at::kDouble;
    p.N1 = N1;
    p.D = D;
    p.Dr = Dr;
    p.q = qa.data_ptr();
    p.k = ka.data_ptr();
    p.qr = Dr ? qra.data_ptr() : nullptr;
    p.kr = Dr ? kra.data_ptr() : nullptr;
    p.smax = sm.data_ptr();
    p.ssum = ss.data_ptr();
    p.sinks = sinks.defined() ? sinks.data_ptr() : nullptr;
    p.scale = args.scale_value;
    p.qi = qia.data_ptr();
    p.ki = kia.data_ptr();
    p.w = wa.data_ptr();
    p.idx = idx.data_ptr<int64_t>();
    p.K = K;
    p.dqi = dqi.data_ptr();
    p.dki = dki.data_ptr();
    p.dw = dw.data_ptr();
    p.loss = &loss;
    cpu::lightning_indexer_kl_stub(p);
  }
  // float32 as upstream; float64 inputs get a float64 loss (the float64 reference checks)
  at::Tensor loss_t = at::full({1}, loss, args.query_index.options().dtype(A == at::kDouble ? at::kDouble : at::kFloat));
  return {dqi.to(args.query_index.scalar_type()), dki.to(args.key_index.scalar_type()),
          dw.to(args.weights.scalar_type()), loss_t};
}

}  // namespace npu_fa
