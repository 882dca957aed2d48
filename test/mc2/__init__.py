"""MC2 ops and tensor-parallel layers (ops_worker.py ranks), MC2Optimizer / MC2DistributedDataParallel
(training_worker.py ranks). Case builders: mc2_cases.py (opcheck in a one-rank group)."""
