"""The process-wide SDPA override (`enable_sdpa_override`) across threads: a thread sees the override turned on in
another, any thread may turn it off, concurrent enable/disable from several threads leaves a consistent state,
torch.compile(fullgraph=True) follows the process-wide flag. `sdpa_override()` stays per thread."""
import threading

import pytest
import torch
import torch.nn.functional as F

from torch_ops_transformer import disable_sdpa_override, enable_sdpa_override, sdpa_override
from torch_ops_transformer.integrations import sdpa as sdpa_module

BUILTIN_SDPA = torch._C._nn.scaled_dot_product_attention


def _qkv():
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(2, 4, 5, 16, generator=g) for _ in range(3))


def _routed_in_thread(fn) -> int:
    """Runs fn in a new thread; returns how many calls took our prefill route meanwhile."""
    errors = []

    def body():
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - reported in the main thread
            errors.append(e)

    before = sdpa_module.route_counts["prefill"]
    t = threading.Thread(target=body)
    t.start()
    t.join(60)
    assert not t.is_alive() and not errors, errors
    return sdpa_module.route_counts["prefill"] - before


@pytest.fixture(autouse=True)
def _override_off():
    disable_sdpa_override()
    yield
    disable_sdpa_override()
    assert F.scaled_dot_product_attention is BUILTIN_SDPA


def test_worker_thread_sees_enable_of_main_thread():
    q, k, v = _qkv()
    assert _routed_in_thread(lambda: F.scaled_dot_product_attention(q, k, v)) == 0
    enable_sdpa_override()
    got = []
    assert _routed_in_thread(lambda: got.append(F.scaled_dot_product_attention(q, k, v))) == 1
    torch.testing.assert_close(got[0], BUILTIN_SDPA(q, k, v), atol=2e-6, rtol=1e-5)
    # a thread started before the enable sees it too
    started, go = threading.Event(), threading.Event()
    before = sdpa_module.route_counts["prefill"]

    def waiting():
        started.set()
        go.wait(30)
        F.scaled_dot_product_attention(q, k, v)

    disable_sdpa_override()
    t = threading.Thread(target=waiting)
    t.start()
    started.wait(30)
    enable_sdpa_override()
    go.set()
    t.join(60)
    assert sdpa_module.route_counts["prefill"] == before + 1


def test_disable_from_another_thread():
    q, k, v = _qkv()
    enable_sdpa_override()
    assert _routed_in_thread(disable_sdpa_override) == 0
    assert not sdpa_module.sdpa_override_enabled()
    assert F.scaled_dot_product_attention is BUILTIN_SDPA
    before = sdpa_module.route_counts["prefill"]
    F.scaled_dot_product_attention(q, k, v)
    assert sdpa_module.route_counts["prefill"] == before
    # and enable from another thread reaches this one
    _routed_in_thread(enable_sdpa_override)
    F.scaled_dot_product_attention(q, k, v)
    assert sdpa_module.route_counts["prefill"] == before + 1


def test_enable_is_idempotent_not_counted():
    enable_sdpa_override()
    enable_sdpa_override()
    disable_sdpa_override()
    assert not sdpa_module.sdpa_override_enabled()
    assert F.scaled_dot_product_attention is BUILTIN_SDPA
    disable_sdpa_override()  # a no-op when off
    assert not sdpa_module.sdpa_override_enabled()


def test_concurrent_enable_disable_leaves_a_consistent_state():
    q, k, v = _qkv()
    want = BUILTIN_SDPA(q, k, v)
    errors = []
    barrier = threading.Barrier(6)

    def toggler(seed):
        g = torch.Generator().manual_seed(seed)
        try:
            barrier.wait(30)
            for _ in range(200):
                (enable_sdpa_override if torch.rand(1, generator=g) < 0.5 else disable_sdpa_override)()
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    def caller():
        try:
            barrier.wait(30)
            for _ in range(30):
                torch.testing.assert_close(F.scaled_dot_product_attention(q, k, v), want, atol=2e-6, rtol=1e-5)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=toggler, args=(s,)) for s in range(4)]
    threads += [threading.Thread(target=caller) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads) and not errors, errors
    # consistent: the flag and the installed function agree, and both transitions still work from here
    on = sdpa_module.sdpa_override_enabled()
    assert (F.scaled_dot_product_attention is not BUILTIN_SDPA) == on
    before = sdpa_module.route_counts["prefill"]
    F.scaled_dot_product_attention(q, k, v)
    assert sdpa_module.route_counts["prefill"] == before + int(on)
    disable_sdpa_override()
    assert F.scaled_dot_product_attention is BUILTIN_SDPA
    F.scaled_dot_product_attention(q, k, v)
    assert sdpa_module.route_counts["prefill"] == before + int(on)
    enable_sdpa_override()
    F.scaled_dot_product_attention(q, k, v)
    assert sdpa_module.route_counts["prefill"] == before + int(on) + 1


def test_context_manager_stays_in_its_thread():
    q, k, v = _qkv()
    with sdpa_override():
        assert _routed_in_thread(lambda: F.scaled_dot_product_attention(q, k, v)) == 0
        before = sdpa_module.route_counts["prefill"]
        F.scaled_dot_product_attention(q, k, v)
        assert sdpa_module.route_counts["prefill"] == before + 1


@pytest.mark.usefixtures("dynamo_reset")
def test_compile_fullgraph_follows_the_process_wide_flag():
    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm.code)
        return gm

    def plain(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    q, k, v = _qkv()
    compiled = torch.compile(plain, backend=capture, fullgraph=True)
    enable_sdpa_override()
    on = compiled(q, k, v)
    # compiled and called in another thread while the override is on
    assert _routed_in_thread(lambda: compiled(q, k, v)) == 0  # compiled code does not count routes
    disable_sdpa_override()
    off = compiled(q, k, v)
    assert "npu_fa.flash_attention_score" in graphs[0]
    assert "npu_fa" not in graphs[-1]
    torch.testing.assert_close(on, off, atol=2e-6, rtol=1e-5)
