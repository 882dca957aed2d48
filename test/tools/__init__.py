"""Repository tools: the code generator, the CANN build helper, the Ascend C signature checker."""
