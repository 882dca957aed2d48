"""Argument validation: one test per rule, checking the exception type and that the message names the argument;
empty tensors; and the fake kernel failing with the eager message under torch.compile."""
import re

import pytest
import torch

OPS = torch.ops.npu_fa
B, SQ, SKV, N1, N2, D = 2, 5, 6, 4, 2, 8


def _t(*shape, dtype=torch.float32, device="cpu"):
    return torch.randn(shape, dtype=dtype, device=device)


def base_args(layout="BSND"):
    shapes = {"BSND": ((B, SQ, N1, D), (B, SKV, N2, D)), "BNSD": ((B, N1, SQ, D), (B, N2, SKV, D)),
              "BSH": ((B, SQ, N1 * D), (B, SKV, N2 * D)), "SBH": ((SQ, B, N1 * D), (SKV, B, N2 * D)),
              "TND": ((SQ, N1, D), (SKV, N2, D))}
    qs, ks = shapes[layout]
    args = dict(query=_t(*qs), key=_t(*ks), value=_t(*ks), head_num=N1, input_layout=layout)
    if layout == "TND":
        args.update(actual_seq_qlen=torch.tensor([2, SQ]), actual_seq_kvlen=torch.tensor([3, SKV]))
    return args


def forward(layout="BSND", **overrides):
    return OPS.flash_attention_score(**{**base_args(layout), **overrides})


def expect(exc, *names):
    """pytest.raises for `exc` whose message contains every name."""
    return pytest.raises(exc, match="(?s)" + "".join(f"(?=.*{re.escape(n)})" for n in names))


def test_unknown_layout():
    with expect(ValueError, "'input_layout'", "BSNDX"):
        forward(input_layout="BSNDX")


@pytest.mark.asan
@pytest.mark.parametrize("layout,arg,shape", [("BSND", "query", (B, SQ, N1 * D)), ("TND", "key", (1, SKV, N2, D)),
                                              ("BSH", "value", (B, SKV, N2, D))])
def test_rank_must_match_layout(layout, arg, shape):
    with expect(ValueError, f"'{arg}'", "3-D" if layout != "BSND" else "4-D"):
        forward(layout, **{arg: _t(*shape)})


def test_head_num_must_match_query_heads():
    with expect(ValueError, "'head_num'", "3"):
        forward(head_num=3)


def test_hidden_size_must_be_divisible_by_head_num():
    with expect(ValueError, "'query'", "head_num=3"):
        forward("BSH", head_num=3)


def test_query_heads_must_be_a_multiple_of_kv_heads():
    with expect(ValueError, "key", "N2=3", "N1=4"):
        forward(key=_t(B, SKV, 3, D), value=_t(B, SKV, 3, D))


def test_query_and_key_head_dims_must_agree():
    with expect(ValueError, "'query'", "'key'", "head dim"):
        forward(key=_t(B, SKV, N2, D + 2))


def test_value_head_dim_must_not_exceed_query_head_dim():
    with expect(ValueError, "value", "vD"):
        forward(value=_t(B, SKV, N2, D + 1))


@pytest.mark.asan
def test_key_and_value_must_agree():
    with expect(ValueError, "'key'", "'value'"):
        forward(value=_t(B, SKV + 1, N2, D))


def test_mixed_dtypes():
    with expect(TypeError, "'query'", "'key'", "'value'", "dtype"):
        forward(key=_t(B, SKV, N2, D, dtype=torch.float16))


def test_float64_is_rejected():
    with expect(TypeError, "'query'", "float32"):
        forward(query=_t(B, SQ, N1, D, dtype=torch.float64), key=_t(B, SKV, N2, D, dtype=torch.float64),
                value=_t(B, SKV, N2, D, dtype=torch.float64))


def test_mixed_devices():
    """A 'meta' key stands in for a second device: the call must fail, not dispatch to the Meta kernel and return
    uninitialised CPU tensors."""
    with expect(ValueError, "'key'", "device"):
        forward(key=_t(B, SKV, N2, D, device="meta"))


@pytest.mark.asan
@pytest.mark.parametrize("shape", [(1, 1, 1, SKV), (SQ, SKV + 1), (B, N1, SQ), (3, 1, SQ, SKV), (B, 2, SQ, SKV)])
def test_mask_shape(shape):
    with expect(ValueError, "'atten_mask'", str(list(shape)).replace(" ", "")[1:-1].replace(",", ", ")):
        forward(atten_mask=torch.zeros(shape, dtype=torch.bool))


@pytest.mark.asan
def test_tnd_mask_must_be_two_dimensional():
    with expect(ValueError, "'atten_mask'", "TND"):
        forward("TND", atten_mask=torch.zeros(1, 1, SQ, SKV, dtype=torch.bool))


def test_mask_dtype():
    with expect(TypeError, "'atten_mask'", "bool or uint8"):
        forward(atten_mask=torch.zeros(SQ, SKV))


@pytest.mark.asan
def test_sequence_lengths_must_be_cumulative():
    with expect(ValueError, "'actual_seq_qlen'", "cumulative"):
        forward("TND", actual_seq_qlen=torch.tensor([3, 2]))  # per-sequence lengths instead of ends


@pytest.mark.asan
def test_sequence_lengths_must_end_at_token_count():
    with expect(ValueError, "'actual_seq_kvlen'", f"T={SKV}"):
        forward("TND", actual_seq_kvlen=torch.tensor([3, SKV - 1]))


@pytest.mark.asan
def test_sequence_lengths_need_same_batch():
    with expect(ValueError, "'actual_seq_qlen'", "'actual_seq_kvlen'"):
        forward("TND", actual_seq_kvlen=torch.tensor([1, 3, SKV]))


@pytest.mark.asan
def test_tnd_requires_sequence_lengths():
    with expect(ValueError, "'actual_seq_qlen'", "TND"):
        forward("TND", actual_seq_qlen=None)


@pytest.mark.asan
@pytest.mark.parametrize("arg", ["actual_seq_qlen", "actual_seq_kvlen"])
def test_sequence_lengths_only_with_tnd(arg):
    with expect(ValueError, f"'{arg}'", "TND"):
        forward(**{arg: torch.tensor([SQ])})


@pytest.mark.parametrize("keep_prob", [0.0, 1.5, -0.1])
def test_keep_prob_range(keep_prob):
    with expect(ValueError, "'keep_prob'", "(0, 1]"):
        forward(keep_prob=keep_prob)


@pytest.mark.parametrize("mode", [5, -1, 9])
def test_unknown_sparse_mode(mode):
    with expect(ValueError, "'sparse_mode'", str(mode)):
        forward(sparse_mode=mode)


@pytest.mark.parametrize("pse_type", [4, -1])  # 2/3 (ALiBi slopes): test_softcap_alibi.py
def test_pse_type(pse_type):
    with expect(ValueError, "'pse_type'"):
        forward(pse=_t(B, N1, SQ, SKV), pse_type=pse_type)


@pytest.mark.asan
@pytest.mark.parametrize("shape", [(B, N1, SQ, SKV + 1), (1, N1, 1, SKV), (B, 1, SQ, SKV), (N1, SQ, SKV)])
def test_pse_shape(shape):
    with expect(ValueError, "'pse'"):
        forward(pse=_t(*shape))


@pytest.mark.asan
def test_pse_with_tnd():
    with expect(ValueError, "'pse'", "TND"):
        forward("TND", pse=_t(2, N1, 3, 3))


@pytest.mark.asan
@pytest.mark.parametrize("mode", [2, 3, 4])
@pytest.mark.parametrize("mask", ["full", "wrong_content"])
def test_causal_modes_need_compressed_mask(mode, mask):
    m = (torch.ones(SQ, SKV, dtype=torch.bool).triu(1) if mask == "full"
         else torch.ones(2048, 2048, dtype=torch.bool).tril(-1))
    with expect(ValueError, "'atten_mask'", f"sparse_mode {mode}", "2048"):
        forward(sparse_mode=mode, atten_mask=m)


def test_seed_must_be_an_integer_scalar():
    with expect(ValueError, "'seed'"):
        forward(keep_prob=0.5, seed=torch.tensor(1.5), offset=torch.tensor(0))


def test_non_finite_scale():
    with expect(ValueError, "'scale'"):
        forward(scale=float("nan"))


def test_inner_precise_range():
    with expect(ValueError, "'inner_precise'"):
        forward(inner_precise=7)


# ---------------------------------------------------------------- the backward's own rules
def grad_args(**overrides):
    args = base_args()
    q = args["query"]
    out = torch.zeros(B, SQ, N1, D)
    stats = torch.zeros(B, N1, SQ, 8)
    args.update(dy=torch.zeros_like(out), softmax_max=stats, softmax_sum=stats.clone(), attention_in=out)
    args.update(overrides)
    assert q is args["query"] or "query" in overrides
    return args


def test_grad_with_dropout_needs_seed():
    with expect(ValueError, "'seed'", "keep_prob"):
        OPS.flash_attention_score_grad(**grad_args(keep_prob=0.9))


@pytest.mark.asan
@pytest.mark.parametrize("arg,shape", [("dy", (B, SQ, N1, D + 1)), ("attention_in", (B, SQ, N1)),
                                       ("softmax_max", (B, N1, SQ, 1)), ("softmax_sum", (B, N1, SQ + 1, 8))])
def test_grad_tensor_shapes(arg, shape):
    with expect(ValueError, f"'{arg}'"):
        OPS.flash_attention_score_grad(**grad_args(**{arg: torch.zeros(shape)}))


def test_grad_dtypes():
    with expect(TypeError, "'dy'"):
        OPS.flash_attention_score_grad(**grad_args(dy=torch.zeros(B, SQ, N1, D, dtype=torch.float16)))
    with expect(TypeError, "'softmax_max'"):
        OPS.flash_attention_score_grad(**grad_args(softmax_max=torch.zeros(B, N1, SQ, 8, dtype=torch.float16)))


@pytest.mark.asan
def test_grad_validates_like_forward():
    with expect(ValueError, "flash_attention_score_grad", "'input_layout'"):
        OPS.flash_attention_score_grad(**grad_args(input_layout="NSD"))


# ---------------------------------------------------------------- empty tensors
@pytest.mark.asan
@pytest.mark.parametrize("layout", ["BSND", "BNSD", "BSH", "SBH"])
def test_empty_batch(layout):
    args = base_args(layout)
    bdim = 1 if layout == "SBH" else 0
    for name in ("query", "key", "value"):
        args[name] = args[name].narrow(bdim, 0, 0).requires_grad_()
    out, smax, ssum, sout, _, _ = OPS.flash_attention_score(**args)
    assert out.shape == args["query"].shape
    assert smax.shape == ssum.shape == (0, N1, SQ, 8), f"softmax stats {list(smax.shape)}, want [B, N1, Sq, 8]"
    grads = torch.autograd.grad(out.sum(), [args[n] for n in ("query", "key", "value")])
    assert [g.shape for g in grads] == [args[n].shape for n in ("query", "key", "value")]


@pytest.mark.asan
@pytest.mark.parametrize("layout", ["BSND", "TND"])
def test_empty_keys_give_zeros(layout):
    args = base_args(layout)
    kv_axis = 0 if layout == "TND" else 1
    for name in ("query", "key", "value"):
        if name != "query":
            args[name] = args[name].narrow(kv_axis, 0, 0)
        args[name].requires_grad_()
    if layout == "TND":
        args["actual_seq_kvlen"] = torch.tensor([0, 0])
    out, smax, ssum, *_ = OPS.flash_attention_score(**args)
    assert out.shape == args["query"].shape and not out.isnan().any() and out.abs().max() == 0
    dq, dk, dv = torch.autograd.grad(out, [args[n] for n in ("query", "key", "value")], torch.ones_like(out))
    assert dq.abs().max() == 0 and dk.numel() == 0 and dv.numel() == 0


@pytest.mark.asan
def test_empty_query_sequence():
    args = base_args()
    args["query"] = args["query"][:, :0]
    out, smax, ssum, *_ = OPS.flash_attention_score(**args)
    assert out.shape == (B, 0, N1, D) and smax.shape == (B, N1, 0, 8)


# ---------------------------------------------------------------- fake kernel parity
SHAPE_ERRORS = {
    "rank": dict(query=_t(B, SQ, N1 * D)),
    "head_num": dict(head_num=3),
    "head_dim": dict(key=_t(B, SKV, N2, D + 2)),
    "gqa": dict(key=_t(B, SKV, 3, D), value=_t(B, SKV, 3, D)),
    "layout": dict(input_layout="XYZ"),
}


def _eager_message(overrides):
    with pytest.raises(Exception) as info:
        forward(**overrides)
    return str(info.value).splitlines()[0]


@pytest.mark.parametrize("name", list(SHAPE_ERRORS))
def test_fake_kernel_raises_eager_message(name):
    from torch._subclasses.fake_tensor import FakeTensorMode
    overrides = SHAPE_ERRORS[name]
    message = _eager_message(overrides)
    args = {**base_args(), **overrides}
    with FakeTensorMode() as mode:
        fake_args = {k: mode.from_tensor(v) if isinstance(v, torch.Tensor) else v for k, v in args.items()}
        with pytest.raises(ValueError) as info:
            OPS.flash_attention_score(**fake_args)
    assert message in str(info.value)


@pytest.mark.usefixtures("dynamo_reset")
@pytest.mark.parametrize("name", ["rank", "head_num"])
def test_compile_reports_the_eager_message(name):
    overrides = SHAPE_ERRORS[name]
    message = _eager_message(overrides)
    args = {**base_args(), **overrides}

    @torch.compile(fullgraph=True, backend="aot_eager")
    def fn(query, key, value):
        return OPS.flash_attention_score(query, key, value, args["head_num"], args["input_layout"])[0]

    with pytest.raises(Exception) as info:
        fn(args["query"], args["key"], args["value"])
    assert message in str(info.value)
