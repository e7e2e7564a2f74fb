"""SGLang 0.5.23's prefill context-parallel MoE all-gather path, as an nsa_cp_comm plug-in.

``engine``: the engine's functions, written from the ``sglang==0.5.23``
wheel's ``sglang/srt/layers/cp/`` and ``layers/layer_boundary/ops.py`` (read,
not copied); ``adapter``: the whole integration, ``impl``.
"""
