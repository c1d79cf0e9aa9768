"""The bundled GPU suite: one module per problem (``PROBLEM``, backend ``triton``), each with a
Triton template whose defaults are the seed kernel. Shapes come from real model configs (stated
per problem); ``interpret_shapes`` are the small ones Triton's interpreter verifies on a CPU."""

NAMES = ("gpu_rmsnorm", "gpu_softmax", "gpu_swiglu", "gpu_rope", "gpu_q4_gemv", "gpu_attention_decode",
         "gpu_kda")
