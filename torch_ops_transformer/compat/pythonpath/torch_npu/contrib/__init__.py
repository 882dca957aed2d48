"""torch_npu.contrib of the torch_npu shim: `transfer_to_npu` (import it to run code written for CUDA on npu)."""
