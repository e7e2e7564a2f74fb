"""vLLM 0.33's prefill context-parallel MoE all-gather path, as an nsa_cp_comm plug-in.

``engine``: the engine's functions, written from ``vllm/v1/worker/gpu/pcp_manager.py``
and the fused-MoE runner (read, not copied); ``adapter``: the whole integration, ``impl``.
"""
