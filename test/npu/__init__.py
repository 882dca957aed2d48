"""The simulated npu device and the Ascend C kernels on it: every *_worker.py module runs in a child process
(runner.py / runner_worker.py, sim_worker.py), the torch-free C++ programs are built by ascendc_programs.py."""
