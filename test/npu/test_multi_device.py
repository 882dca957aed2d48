"""Several simulated npu devices: TOT_NPU_SIM_DEVICES (validated here, in this process, without enabling anything)
and the multi-device cases of multi_device_worker.py, run in one child process with TOT_NPU_SIM_DEVICES=2 (the
device count is fixed when a process enables the simulator, so these cannot share the other workers' child)."""
import pytest

from test.npu import multi_device_worker as DEVICES_WORKER  # only to list its cases; importing it enables nothing
from test.npu.runner import case_names, run_cases
from torch_ops_transformer.npu_sim import device


@pytest.fixture(scope="module")
def two_device_results():
    name = DEVICES_WORKER.__name__
    cases = [p if isinstance(p, str) else p.values[0] for p in case_names(DEVICES_WORKER)]
    return run_cases({name: cases}, timeout=600, env_vars={device.DEVICES_ENV_VAR: "2"})[name]


@pytest.mark.parametrize("case", case_names(DEVICES_WORKER))
def test_two_simulated_devices(two_device_results, case):
    assert two_device_results.get(case) == "ok", two_device_results.get(case, "did not run")


@pytest.mark.parametrize("value, count", [(None, 1), ("", 1), ("1", 1), ("2", 2), (" 8 ", 8), ("16", 16)])
def test_device_count_from_environment(value, count):
    environ = {} if value is None else {"TOT_NPU_SIM_DEVICES": value}
    assert device.device_count_from_environment(environ) == count


@pytest.mark.parametrize("value", ["0", "-1", "two", "1.5", "2x", "17", "١"])
def test_bad_device_count_is_refused(value):
    with pytest.raises(ValueError, match=f"TOT_NPU_SIM_DEVICES must be a positive integer, the number of simulated "
                                         f"npu devices \\(1 to 16\\); got '{value}'"):
        device.device_count_from_environment({"TOT_NPU_SIM_DEVICES": value})


def test_enable_refuses_a_bad_device_count_before_installing(monkeypatch):
    def must_not_install(devices):
        raise AssertionError(f"enable() went on to install {devices} devices")

    monkeypatch.setenv("TOT_NPU_SIM_DEVICES", "0")
    monkeypatch.setattr(device, "_install_cpp", must_not_install)
    monkeypatch.setattr(device, "_refusal_reason", lambda installed_torch_npu_failed=False: None)
    with pytest.raises(ValueError, match="TOT_NPU_SIM_DEVICES must be a positive integer"):
        device.enable()
    assert not device.is_enabled()
