"""The argument rules the generated wrappers apply to every op of native_functions.yaml (docs/architecture.md,
"Arguments every op checks"):

- device: every tensor on the device of the op's first tensor; `host_tensors` there or on the CPU. One tensor on
  `meta` next to CPU tensors is an error naming it (without the rule the call reached the fake kernel and returned
  uninitialised memory). Driven by the YAML op list and each op's opcheck cases.
- overlap: a written tensor (Tensor(a!)) shares no element with itself or with any other argument; views of one
  buffer that do not share elements (q and k split from a fused qkv, the two halves of one KV cache) are accepted.
"""
import pytest
import torch
import torch.distributed as dist

from test.ops.test_opcheck import CASES
from tools.codegen import model

OPS = torch.ops.npu_fa
SPECS = {s.name: s for s in model.load("native_functions.yaml") if s.has_tensor_arguments}


def _bound(op, args, kwargs):
    """{argument name: value} of an opcheck case, in schema order."""
    names = [a.name for a in SPECS[op].arguments]
    bound = dict(zip(names, args))
    bound.update(kwargs)
    return {n: bound[n] for n in names if n in bound}


def _tensor_names(bound):
    return [name for name, value in bound.items()
            if isinstance(value, torch.Tensor) or (isinstance(value, (list, tuple)) and value
                                                   and isinstance(value[0], torch.Tensor))]


def _richest_case(op):
    """The op's opcheck case that passes the most tensor arguments: (case name, their names)."""
    named = {case: _tensor_names(_bound(op, *build())) for case, build in CASES[op].items()}
    case = max(named, key=lambda c: len(named[c]))
    return case, named[case]


def _richest_cases():
    # The MC2 ops' case builders create a one-rank default process group; collection must not leave it behind for
    # the modules that create their own.
    had_group = dist.is_initialized()
    try:
        return {op: _richest_case(op) for op in sorted(SPECS)}
    finally:
        if not had_group and dist.is_initialized():
            dist.destroy_process_group()


RICHEST = _richest_cases()
TENSOR_ARGS = {op: names for op, (_, names) in RICHEST.items()}
# With a single tensor there is no other device to disagree with: an all-meta call is a legitimate fake-kernel call.
SINGLE_TENSOR_OPS = {op for op, names in TENSOR_ARGS.items() if len(names) < 2}
DEVICE_CASES = [pytest.param(op, arg, id=f"{op}-{arg}") for op, names in TENSOR_ARGS.items()
                if op not in SINGLE_TENSOR_OPS for arg in names]


def test_every_op_with_tensors_is_covered():
    assert {p.values[0] for p in DEVICE_CASES} | SINGLE_TENSOR_OPS == set(SPECS)
    assert SINGLE_TENSOR_OPS == {"convert_weight_to_int4pack", "dynamic_block_quant", "moe_compute_expert_tokens",
                                 "moe_ffn_prepack", "swiglu"}


@pytest.mark.parametrize("op,arg", DEVICE_CASES)
def test_one_argument_on_meta_is_an_error_naming_it(op, arg):
    bound = _bound(op, *CASES[op][RICHEST[op][0]]())
    value = bound[arg]
    bound[arg] = value.to("meta") if isinstance(value, torch.Tensor) else [value[0].to("meta"), *value[1:]]
    with pytest.raises(ValueError, match=r"must be on device (cpu|meta)") as e:
        getattr(OPS, op)(**bound)
    assert f"'{arg}" in str(e.value), str(e.value)


def test_host_tensor_on_the_cpu_next_to_meta_inputs_is_accepted():
    """actual_seq_qlen is a host tensor of flash_attention_score: CPU lengths with meta q/k/v trace fine."""
    q = torch.empty(6, 2, 16, device="meta")
    lens = torch.tensor([2, 6])
    out = OPS.flash_attention_score(q, q, q, 2, "TND", actual_seq_qlen=lens, actual_seq_kvlen=lens)[0]
    assert out.device.type == "meta" and out.shape == q.shape


def test_all_meta_call_still_runs_the_fake_kernel():
    q = torch.empty(1, 2, 4, 16, device="meta")
    assert OPS.flash_attention_score(q, q, q, 2, "BNSD")[0].shape == (1, 2, 4, 16)


# ---- overlap of written tensors ----

def _rope_tables(S, D):
    cos = torch.randn(1, S, 1, D)
    return cos, torch.randn(1, S, 1, D)


def _rope_reference(x, cos, sin):
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return (x.double() * cos.double() + rotated.double() * sin.double()).to(x.dtype)


def test_rope_query_and_key_overlapping_views_are_rejected():
    buf = torch.randn(1, 4, 3, 16)
    q, k = buf[:, :, 0:2], buf[:, :, 1:3]  # head 1 is in both
    cos, sin = _rope_tables(4, 16)
    before = buf.clone()
    with pytest.raises(ValueError, match="'query' is written in place and shares memory with argument 'key'"):
        OPS.apply_rotary_pos_emb(q, k, cos, sin)
    assert torch.equal(buf, before), "nothing may be written when the arguments are rejected"


def test_rope_same_tensor_twice_is_rejected():
    q = torch.randn(1, 4, 2, 16)
    cos, sin = _rope_tables(4, 16)
    with pytest.raises(ValueError, match="shares memory with argument 'key'"):
        OPS.apply_rotary_pos_emb(q, q, cos, sin)


def test_rope_query_and_key_split_from_one_fused_qkv_are_accepted():
    """The serving pattern: q, k, v = qkv.split(...): interleaved rows of one buffer, no common element."""
    T, Nq, Nk, D = 5, 4, 2, 16
    qkv = torch.randn(T, (Nq + 2 * Nk) * D)
    q = qkv[:, : Nq * D].view(T, 1, Nq, D).transpose(0, 1)  # [1, T, Nq, D], rows strided by the fused width
    k = qkv[:, Nq * D:(Nq + Nk) * D].view(T, 1, Nk, D).transpose(0, 1)
    cos, sin = _rope_tables(T, D)
    want_q, want_k = _rope_reference(q, cos, sin), _rope_reference(k, cos, sin)
    v_before = qkv[:, (Nq + Nk) * D:].clone()
    OPS.apply_rotary_pos_emb(q, k, cos, sin)
    torch.testing.assert_close(q, want_q)
    torch.testing.assert_close(k, want_k)
    assert torch.equal(qkv[:, (Nq + Nk) * D:], v_before)


def test_rope_written_tensor_overlapping_cos_is_rejected():
    buf = torch.randn(1, 4, 2, 16)
    with pytest.raises(ValueError, match="'query' is written in place and shares memory with argument 'cos'"):
        OPS.apply_rotary_pos_emb(buf, torch.randn(1, 4, 2, 16), buf[:, :, :1], torch.randn(1, 4, 1, 16))


def test_rope_expanded_query_is_rejected():
    q = torch.randn(1, 4, 1, 16).expand(1, 4, 3, 16)
    cos, sin = _rope_tables(4, 16)
    with pytest.raises(ValueError, match="'query' is written in place but some of its elements share memory"):
        OPS.apply_rotary_pos_emb(q, torch.randn(1, 4, 2, 16), cos, sin)


def _scatter_inputs(T=3, N=2, D=8, blocks=4, block_size=4):
    key, value = torch.randn(T, N, D), torch.randn(T, N, D)
    slots = torch.tensor([0, 5, 9])
    return key, value, slots, (blocks, block_size, N, D)


def test_scatter_caches_that_alias_each_other_are_rejected():
    key, value, slots, shape = _scatter_inputs()
    buf = torch.zeros(shape[0] + 1, *shape[1:])
    with pytest.raises(ValueError, match="'key_cache' is written in place and shares memory with argument "
                                           "'value_cache'"):
        OPS.scatter_pa_kv_cache(key, value, buf[:-1], buf[1:], slots)


def test_scatter_key_that_is_a_view_of_the_cache_is_rejected():
    _, value, slots, shape = _scatter_inputs()
    key_cache, value_cache = torch.zeros(shape), torch.zeros(shape)
    key = key_cache.view(-1, *shape[2:])[:3]
    with pytest.raises(ValueError, match="'key_cache' is written in place and shares memory with argument 'key'"):
        OPS.scatter_pa_kv_cache(key, value, key_cache, value_cache, slots)


def test_scatter_into_the_two_halves_of_one_kv_buffer_is_accepted():
    """vLLM's layout: kv_cache[0] and kv_cache[1] of one [2, blocks, block_size, N, D] tensor."""
    key, value, slots, shape = _scatter_inputs()
    kv = torch.zeros(2, *shape)
    OPS.scatter_pa_kv_cache(key, value, kv[0], kv[1], slots)
    flat_k, flat_v = kv[0].view(-1, *shape[2:]), kv[1].view(-1, *shape[2:])
    assert torch.equal(flat_k[slots], key) and torch.equal(flat_v[slots], value)


def test_scatter_into_an_expanded_cache_is_rejected():
    key, value, slots, shape = _scatter_inputs()
    with pytest.raises(ValueError, match="'value_cache' is written in place but some of its elements share"):
        OPS.scatter_pa_kv_cache(key, value, torch.zeros(shape), torch.zeros(1, *shape[1:]).expand(shape), slots)
