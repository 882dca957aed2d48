"""prompt_flash_attention / fused_infer_attention_score prefill on the simulated npu device: the FlashAttention
forward Ascend C kernel against float64 and the CPU backend (prefill_worker.py, run in a child process)."""
import pytest

from test.npu import prefill_worker as WORKER
from test.npu.runner import case_names


@pytest.mark.parametrize("case", case_names(WORKER))
def test_prefill_on_npu(results, case):
    assert results.get(case) == "ok", results.get(case, "did not run")
