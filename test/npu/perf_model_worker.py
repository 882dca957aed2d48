"""Cases for test_perf_model.py run on the simulated npu device (child process, see runner.py): the
bench's path from the extension's counter hooks to a prediction."""
import ctypes

from torch_ops_transformer.bench import npu_counters, npu_model
from torch_ops_transformer.bench import npu_model_kernels as nk
from torch_ops_transformer.bench import npu_perf_model as pm

SHAPE = pm.AttentionShape(batch=1, heads=2, seq=256, head_dim=64)


class FakeHooks:
    """Stands in for the extension's three C functions; answers with the analytic counters of the last blocks."""

    def __init__(self):
        self.blocks, self.count_only, self.calls = (0, 0), 0, []

    def npu_attention_tile_config(self, s1, s2):
        self.blocks = (s1, s2)
        self.calls.append(("blocks", s1, s2))

    def tot_ascendc_set_count_only(self, on):
        self.count_only = on
        self.calls.append(("count_only", on))

    def tot_ascendc_last_stats(self, buf, max_cores):
        recs = pm.fa_forward_counts(self.shape, *self.blocks)
        for i, r in enumerate(recs[:max_cores]):
            row = [0 if r.core_type == pm.AIC else 1, r.block_idx, r.gm_read_bytes, r.gm_write_bytes, r.cube_macs,
                   r.vector_elements, r.vector_repeats, r.copies, r.vector_instrs, r.cube_jobs, r.scalar_gm, r.scalar_ub]
            for j, x in enumerate(row):
                buf[pm.VALUES_PER_CORE * i + j] = x
        return len(recs)


def case_simulated_path_parses_and_scales():
    fake = FakeHooks()
    fake.shape = pm.AttentionShape(batch=1, heads=1, seq=256, head_dim=64)
    full = pm.AttentionShape(batch=2, heads=3, seq=256, head_dim=64)
    preds = npu_model.predict_blocks(full, pm.Ascend910B(), fake, sim_shape=fake.shape)
    # the hooks were driven in order and reset afterwards
    assert fake.calls[:2] == [("blocks", 64, 64), ("count_only", 1)] and fake.calls[-2:] == [
        ("count_only", 0), ("blocks", -1, -1)]
    analytic = npu_model.predict_blocks(full, pm.Ascend910B())
    for b, res in preds.items():
        waves = pm.fa_tasks_per_aiv(full, b) / pm.fa_tasks_per_aiv(fake.shape, b)
        assert res.pred.scale == waves and "simulated kernel (1 heads" in res.source
        assert res.gm_bytes == analytic[b].gm_bytes  # traffic scales with the heads exactly


def case_real_hooks_or_a_clear_note():
    lib, why = npu_counters.runtime_hooks()
    if lib is None:  # the FlashAttention kernel is not built into this extension: the bench says so
        assert "does not export" in why and "tot_ascendc_last_stats" in why
        return
    for block in (64, 128):
        sim = npu_model.simulated_fa_counts(lib, SHAPE, block, block)
        key = lambda r: (r.core_type, r.block_idx)  # noqa: E731
        ana = sorted(pm.fa_forward_counts(SHAPE, block, block), key=key)
        sim = sorted(sim, key=key)
        assert [key(r) for r in sim] == [key(r) for r in ana]
        for x, y in zip(sim, ana):
            assert (x.gm_read_bytes, x.gm_write_bytes, x.cube_macs, x.copies) == \
                (y.gm_read_bytes, y.gm_write_bytes, y.cube_macs, y.copies)
    buf = (ctypes.c_ulonglong * pm.VALUES_PER_CORE)()
    assert lib.tot_ascendc_last_stats(buf, 1) > 1  # counts every core, writes at most one row


def case_per_kernel_peak_shares():
    """Every Ascend C kernel counted on a small shape: MIX kernels use the cube and hand work to their AIVs, vector
    kernels do not; each share of a peak lies in (0, 1]."""
    lib, why = npu_counters.runtime_hooks()
    assert lib is not None, why
    rows = nk.predict_kernels(lib, nk.kernel_cases(quick=True), pm.Ascend910B())
    names = [r.case.name for r in rows]
    assert names == ["flash_attention_score", "flash_attention_score_grad", "incre_flash_attention",
                     "rotary_position_embedding", "moe_gating_top_k_softmax", "moe_init_routing_v2",
                     "grouped_matmul", "moe_finalize_routing", "lightning_indexer",
                     "recurrent_gated_delta_rule", "fused_causal_conv1d"], names
    for r in rows:
        mix = r.case.name in ("flash_attention_score", "flash_attention_score_grad", "grouped_matmul")
        s = r.shares
        assert (s.cube > 0) == mix and 0 < s.vector <= 1 and 0 < s.bandwidth <= 1 and 0 <= s.issue < 1, (r.case, s)
        assert (r.pred.slowest.sync_s > 0) == mix, r.case.name
        assert r.pred.totals.vector_instrs > 0
        if r.case.name == "moe_init_routing_v2":  # the counting sort runs on the scalar units
            assert r.pred.totals.scalar_gm > 0 and r.pred.totals.scalar_ub > 0, r.pred.totals
    table = nk.kernel_table(rows)
    assert "moe_finalize_routing" in table and "vector issue" in table
