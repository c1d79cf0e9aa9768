"""The bundled CPU suite: one module per problem, each defining ``PROBLEM``."""

NAMES = ("rmsnorm", "softmax", "swiglu", "rope", "q4_1_matmul", "attention_decode", "layernorm",
         "add_rmsnorm", "geglu", "q8_0_matmul", "q4_1_packed_matvec")
# quantised matmuls per GGUF block type: loaded by name and by problems derived from a model; not in `all`
BLOCK_NAMES = ("q4_0_matmul", "q5_0_matmul", "q4_k_matmul", "q5_k_matmul", "q6_k_matmul")
# the engine's own linear layer per GGUF block type, with its numerics (8-bit activations; qengine.py for
# the 32-element types, qengine_k.py for the K-quants): loaded by name and by problems derived from a
# model, as BLOCK_NAMES; not in `all`
ENGINE_NAMES = ("q4_0_engine_matmul", "q4_1_engine_matmul", "q5_0_engine_matmul", "q5_1_engine_matmul",
                "q8_0_engine_matmul", "q4_k_engine_matmul", "q5_k_engine_matmul", "q6_k_engine_matmul",
                # the same on the engine's packed copies (qengine_packed.py), where its CPU has vpdpbusd
                "q4_0_engine_packed_matmul", "q4_1_engine_packed_matmul", "q5_0_engine_packed_matmul",
                "q5_1_engine_packed_matmul", "q8_0_engine_packed_matmul")
