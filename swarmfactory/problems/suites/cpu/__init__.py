"""The bundled CPU suite: one module per problem, each defining ``PROBLEM``."""

NAMES = ("rmsnorm", "softmax", "swiglu", "rope", "q4_1_matmul", "attention_decode", "layernorm",
         "add_rmsnorm", "geglu", "q8_0_matmul", "q4_1_packed_matvec")
