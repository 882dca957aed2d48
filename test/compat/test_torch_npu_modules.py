"""torch_npu's modules and device functions beyond the npu_* functions, as vLLM-Ascend and torch_npu's own tests use
them: torch_npu.contrib.transfer_to_npu, "hccl" process groups (on gloo), torch_npu.profiler, the torch.npu memory
queries and device context, torch_npu.npu.get_soc_version, torch_npu.Format / empty_with_format / npu_format_cast,
and the ATB module path."""
import pytest
import torch

from test.compat.test_shim import _run
from torch_ops_transformer.compat import formats, profiler


def test_installed_modules_and_device_functions(tmp_path):
    out = _run(f"""
        import json, os, torch, torch_npu
        import torch.distributed as dist

        # torch.npu memory queries: host memory, allocator counters 0 (nothing tracks the device's allocations)
        free, total = torch.npu.mem_get_info()
        assert 0 < free <= total and torch.npu.mem_get_info("npu:0")[1] == total
        assert torch.npu.memory_reserved() == 0 and torch.npu.max_memory_reserved() == 0
        stats = torch.npu.memory_stats()
        assert stats["allocated_bytes.all.peak"] == 0 and stats["num_ooms"] == 0
        props = torch.npu.get_device_properties(0)
        assert props.total_memory == total and props.cube_core_num >= 1 and props.vector_core_num >= 1
        assert isinstance(props.uuid, str) and props.uuid == torch.npu.get_device_properties("npu:0").uuid
        with torch.npu.device(0):
            pass
        with torch.npu.device(torch.device("npu", 0)):
            pass
        for bad in (1, "cuda:0"):
            try:
                torch.npu.device(bad)
                raise AssertionError(bad)
            except ValueError as e:
                assert "argument 'device'" in str(e)
        assert torch_npu.npu.get_soc_version() == 220  # Ascend910B (Atlas A2)

        # formats
        assert torch_npu.Format.FRACTAL_NZ == 29 and torch_npu.Format.ND == 2
        cache = torch_npu.empty_with_format(size=(2, 3), dtype=torch.float16, device="npu", acl_format=29)
        assert cache.device.type == "npu" and cache.dtype == torch.float16 and torch_npu.get_npu_format(cache) == 29
        w = torch.randn(4, 8, dtype=torch.bfloat16).npu()
        nz = torch_npu.npu_format_cast(w, 29, customize_dtype=torch.float8_e4m3fn)
        assert nz.dtype == torch.bfloat16 and torch.equal(nz, w) and torch_npu.get_npu_format(nz) == 29
        # the option torch_npu's tests save and restore around a case (torch_npu._C._npu_getOption)
        saved = torch_npu._C._npu_getOption("ALLOW_INTERNAL_FORMAT")
        assert saved == b"disable"
        torch.npu.config.allow_internal_format = True
        assert torch_npu._C._npu_getOption("ALLOW_INTERNAL_FORMAT") == b"enable"
        torch.npu.config.allow_internal_format = saved
        assert torch_npu._C._npu_getOption("ALLOW_INTERNAL_FORMAT") == b"disable"
        assert torch_npu._C._npu_getOption("NO_SUCH_OPTION") is None

        # ATB functions: on torch_npu, and the module vLLM-Ascend imports
        from torch_npu.op_plugin.atb._atb_ops import _register_atb_extensions, _npu_paged_attention
        _register_atb_extensions()
        assert torch_npu._npu_paged_attention is _npu_paged_attention
        assert callable(torch_npu._npu_reshape_and_cache) and callable(torch_npu._npu_flash_attention_unpad)

        # "hccl" groups are gloo groups
        dist.init_process_group(backend="hccl", init_method="file://{tmp_path}/store", rank=0, world_size=1)
        assert dist.get_backend() == "gloo"
        group = dist.new_group([0], backend="hccl")
        assert dist.get_backend(group) == "gloo" and isinstance(group.get_hccl_comm_name(0), str)
        t = torch.ones(3)
        dist.all_reduce(t, group=group)
        assert torch.equal(t, torch.ones(3))

        # transfer_to_npu: CUDA code runs on npu (and "nccl" means hccl, i.e. gloo here)
        from torch_npu.contrib import transfer_to_npu
        assert torch.zeros(2, device="cuda").device.type == "npu"
        assert torch.randn(2).cuda().device.type == "npu" and torch.randn(2).to("cuda:0").device.type == "npu"
        assert torch.randn(2).to(0).device.type == "npu"
        assert torch.nn.Linear(2, 2).cuda().weight.device.type == "npu"
        assert torch.nn.Linear(2, 2).to(torch.device("cuda")).weight.device.type == "npu"
        assert torch.ones(1).new_zeros(2, device="cuda").device.type == "npu"
        assert torch.cuda.is_available() and torch.cuda.device_count() == 1
        assert dist.get_backend(dist.new_group([0], backend="nccl")) == "gloo"
        dist.destroy_process_group()

        # the profiler, configured as vLLM-Ascend configures it
        cfg = torch_npu.profiler._ExperimentalConfig(
            export_type=torch_npu.profiler.ExportType.Text, profiler_level=torch_npu.profiler.ProfilerLevel.Level1,
            msprof_tx=False, aic_metrics=torch_npu.profiler.AiCMetrics.PipeUtilization, l2_cache=False,
            op_attr=False, data_simplification=True, record_op_args=False, gc_detect_threshold=None)
        prof = torch_npu.profiler.profile(
            activities=[torch_npu.profiler.ProfilerActivity.CPU, torch_npu.profiler.ProfilerActivity.NPU],
            with_stack=False, profile_memory=False, with_modules=False, experimental_config=cfg,
            schedule=torch_npu.profiler.schedule(wait=0, warmup=0, active=1, repeat=1),
            on_trace_ready=torch_npu.profiler.tensorboard_trace_handler("{tmp_path}/prof", worker_name="w0"))
        prof.start()
        x = torch.randn(1, 3, 2, 8).npu()
        torch_npu.npu_rotary_mul(x, x[:, :, :1], x[:, :, :1])
        prof.step()
        prof.stop()
        traces = os.listdir("{tmp_path}/prof")
        assert traces and traces[0].startswith("w0"), traces
        assert "npu_fa::" in open(os.path.join("{tmp_path}/prof", traces[0])).read()
        from torch_npu.profiler import dynamic_profile as dp
        try:
            dp.step()
            raise AssertionError("dynamic_profile")
        except NotImplementedError as e:
            assert "not simulated" in str(e)
        print("all present")
        """)
    assert "all present" in out.stdout


def test_format_cast_never_converts_values():
    w = torch.randn(4, 8, dtype=torch.bfloat16)
    for customize in (torch.float8_e4m3fn, torch.bfloat16, 3, None):
        nz = formats.npu_format_cast(w, 29, customize_dtype=customize)
        assert nz.dtype == w.dtype and torch.equal(nz, w) and nz.data_ptr() != w.data_ptr()
        assert formats.get_npu_format(nz) == 29
    packed = torch.randint(0, 255, (4, 8), dtype=torch.uint8)  # fp4 pairs, read as torch_npu.float4_e2m1fn_x2
    nz = formats.npu_format_cast(packed, 29, customize_dtype=torch.float8_e4m3fn, input_dtype=296)
    assert nz.dtype == torch.uint8 and torch.equal(nz, packed)
    assert formats.npu_format_cast(w, 2, customize_dtype=torch.float16) is w  # a plain format: the tensor itself
    with pytest.raises(TypeError, match="'customize_dtype' must be None, a torch.dtype or an int"):
        formats.npu_format_cast(w, 29, customize_dtype="float8")
    with pytest.raises(TypeError, match="'input_dtype'"):
        formats.npu_format_cast(w, 29, input_dtype=1.5)
    with pytest.raises(ValueError, match="'acl_format'.*got 28"):
        formats.empty_with_format((2, 2), acl_format=28)
    e = formats.empty_with_format((2, 3), dtype=torch.float16)
    assert e.shape == (2, 3) and formats.get_npu_format(e) == 2


def test_soc_version_follows_the_simulated_soc(monkeypatch):
    monkeypatch.setattr(formats, "SIMULATED_SOC", "Ascend910_9391")
    assert formats.get_soc_version() == 250
    monkeypatch.setattr(formats, "SIMULATED_SOC", "Ascend310P3")
    assert formats.get_soc_version() == 202
    monkeypatch.setattr(formats, "SIMULATED_SOC", "AscendX")
    with pytest.raises(ValueError, match="TOT_NPU_SOC='AscendX'"):
        formats.get_soc_version()


def test_profiler_configuration_rules():
    assert profiler.supported_activities() == [profiler.ProfilerActivity.CPU, profiler.ProfilerActivity.NPU]
    with pytest.raises(NotImplementedError, match="ExportType.Db"):
        profiler._ExperimentalConfig(export_type=profiler.ExportType.Db)
    with pytest.raises(ValueError, match="'profiler_level' must be one of"):
        profiler._ExperimentalConfig(profiler_level="Level9")
    with pytest.raises(ValueError, match="'aic_metrics' must be one of"):
        profiler._ExperimentalConfig(aic_metrics="Everything")
    with pytest.raises(ValueError, match="'gc_detect_threshold'"):
        profiler._ExperimentalConfig(gc_detect_threshold=-1)
    with pytest.raises(TypeError, match="'experimental_config' must be"):
        profiler.profile(experimental_config={"profiler_level": "Level1"})
    with pytest.raises(ValueError, match="'activities' holds"):
        profiler.profile(activities=["GPU"])
    assert profiler.ExperimentalConfig is profiler._ExperimentalConfig
    with profiler.profile(activities=[profiler.ProfilerActivity.NPU]) as prof:
        torch.ones(2).sum()
    assert prof.key_averages()  # recorded as CPU activity
