"""npu_fusion_attention(_grad)'s newer arguments on the simulated npu device: sink, softmax_layout, dropout_mask,
seed/offset ints, and sequence lengths given on the host (cases in attention_args_worker.py, one child process)."""
import pytest

from test.npu import attention_args_worker as WORKER
from test.npu.runner import case_names


@pytest.mark.parametrize("case", case_names(WORKER))
def test_attention_arguments_on_npu(results, case):
    assert results.get(case) == "ok", results.get(case, "did not run")
