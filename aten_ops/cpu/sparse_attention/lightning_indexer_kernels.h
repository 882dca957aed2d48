// The loops of the lightning-indexer ops (cpu/sparse_attention/lightning_indexer.cpp), compiled once per instruction
// set by lightning_indexer_kernels_isa.cpp so the q.k dot products run at the CPU's vector width (at::vec). The
// entry points validate (common/sparse_attention), convert the small operands (queries, weights, scales, gradients)
// to the accumulation type A (float; double for double inputs) and call these; the key cache of the forward ops is
// read in its own dtype, a chunk of keys at a time.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>

#include "common/sparse_attention/lightning_indexer_params.h"
#include "cpu/isa_dispatch.h"

namespace npu_fa::cpu {

// Forward (lightning_indexer, quant_lightning_indexer). Per query token t of sequence b and key head n2:
//   score[s] = sum_h w[t, h] * ReLU(x),  x = q[t, h] . k[s]  (quant: * qscale[t, h] * kscale[s])
// over the keys s the token sees, then the top K (descending accumulated scores, ties by the lower position) written
// to indices (positions) and values (the scores).
struct IndexerForwardParams {
  const sparse_attention::IndexerGeometry* geo = nullptr;
  bool dbl = false;                       // A = double (else float)
  const void* q = nullptr;                // A [q_rows, N1, D]
  const void* w = nullptr;                // A [q_rows, N1]
  const void* qscale = nullptr;           // A [q_rows, N1] or nullptr
  const void* key = nullptr;              // key_dtype [k_rows, N2, D] (k_rows of the geometry)
  c10::ScalarType key_dtype = c10::ScalarType::Float;
  const float* kscale = nullptr;          // float [k_rows, N2] or nullptr
  int64_t K = 0;
  int32_t* indices = nullptr;             // [q_rows, N2, K], prefilled with -1
  void* values = nullptr;                 // A [q_rows, N2, K], prefilled with -inf; nullptr: not returned
};

// Backward of the scores through the selected entries (lightning_indexer_grad): see native_functions.yaml.
struct IndexerGradParams {
  const sparse_attention::IndexerGeometry* geo = nullptr;
  bool dbl = false;
  const void* q = nullptr;        // A [q_rows, N1, D]
  const void* k = nullptr;        // A [k_rows, N2, D]
  const void* w = nullptr;        // A [q_rows, N1]
  const void* dy = nullptr;       // A [q_rows, N2, K]
  const int64_t* idx = nullptr;   // [q_rows, N2, K]
  int64_t K = 0;
  void* dq = nullptr;             // A [q_rows, N1, D], zeroed
  void* dk = nullptr;             // A [k_rows, N2, D], zeroed
  void* dw = nullptr;             // A [q_rows, N1], zeroed
};

// sparse_lightning_indexer_grad_kl_loss (N2 = 1): the main attention's head-summed, L1-normalised probabilities of
// the selected keys as the target, KL against softmax of the indexer scores, and the gradients of that loss.
struct IndexerKlParams {
  const sparse_attention::IndexerGeometry* geo = nullptr;  // of query_index / key_index / weights
  bool dbl = false;
  int64_t N1 = 0, D = 0, Dr = 0;  // main attention heads, head dim, rope dim (0: none)
  const void* q = nullptr;        // A [q_rows, N1, D]
  const void* k = nullptr;        // A [k_rows, D]
  const void* qr = nullptr;       // A [q_rows, N1, Dr] or nullptr
  const void* kr = nullptr;       // A [k_rows, Dr] or nullptr
  const void* smax = nullptr;     // A [q_rows, N1]
  const void* ssum = nullptr;     // A [q_rows, N1]
  const void* sinks = nullptr;    // A [N1] or nullptr
  double scale = 1.0;
  const void* qi = nullptr;       // A [q_rows, Ni, Di]  (Ni, Di: the geometry's N1, D)
  const void* ki = nullptr;       // A [k_rows, Di]
  const void* w = nullptr;        // A [q_rows, Ni]
  const int64_t* idx = nullptr;   // [q_rows, K]
  int64_t K = 0;
  void* dqi = nullptr;            // A [q_rows, Ni, Di], zeroed
  void* dki = nullptr;            // A [k_rows, Di], zeroed
  void* dw = nullptr;             // A [q_rows, Ni], zeroed
  double* loss = nullptr;         // one value
};

NPU_FA_DECLARE_ISA_STUB(lightning_indexer_forward_stub, void (*)(const IndexerForwardParams&));
NPU_FA_DECLARE_ISA_STUB(lightning_indexer_grad_stub, void (*)(const IndexerGradParams&));
NPU_FA_DECLARE_ISA_STUB(lightning_indexer_kl_stub, void (*)(const IndexerKlParams&));

}  // namespace npu_fa::cpu
