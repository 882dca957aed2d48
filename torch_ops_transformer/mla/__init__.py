"""DeepSeek's Multi-head Latent Attention (aten_ops/cpu/mla, docs/mla.md).

- `prolog` — torch_npu's npu_mla_prolog(_v2, _v3, _v3_functional): query absorption, interleaved rope, latent
  RMSNorm and the in-place latent cache writes;
- `attention` — `MLAAttention`, `MLALatentCache`, `PagedMLARunner`: absorbed MLA over a paged latent cache, from a
  transformers DeepseekV3Attention, and a runner that drives a transformers DeepSeek-V3 with it;
- `sparse_attention_runner` — `DSAAttention`, `DSAIndexer`, `DSALatentCache`, `PagedDSARunner`: DeepSeek-V3.2's
  sparse attention (lightning indexer over a paged indexer-key cache + sparse flash attention) in a transformers
  DeepseekV32ForCausalLM, for greedy generation and training;
- `fake` — the fake kernels of the family's ops.
"""
from .attention import MLAAttention, MLABatch, MLALatentCache, PagedMLARunner
from .prolog import npu_mla_prolog, npu_mla_prolog_v2, npu_mla_prolog_v3, npu_mla_prolog_v3_functional
from .sparse_attention_runner import DSAAttention, DSAIndexer, DSALatentCache, DSATrainBatch, PagedDSARunner
