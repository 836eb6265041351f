"""Runs inside vLLM's worker processes, not in pqrl's: ``engine.vllm`` copies this file next to the
server and names ``PqrlWorker`` as vLLM's ``--worker-extension-cls``, whose methods
``/collective_rpc`` then calls by name. Imports nothing of pqrl's.

Why: vLLM 0.32's in-place ``reload_weights`` puts a layer's old tensors back when the checkpoint has
none for it. A model with tied input and output embeddings (SmolLM2, Qwen2.5-0.5B, Llama 3.2 1B)
saves no ``lm_head.weight``, so after a reload the output head would keep the base weights (and the
CPU build its packed copy of them) while the input embedding took the new ones: logprobs of
neither model.
"""

from __future__ import annotations

from typing import Any

__all__ = ["PqrlWorker"]


class PqrlWorker:
    """Mixed into vLLM's worker class; ``self`` is the worker."""

    def pqrl_reload(self, weights_path: str) -> str:
        """Loads ``weights_path`` in place, then makes a tied output head equal the new embedding."""
        worker: Any = self
        worker.reload_weights(weights_path=weights_path)
        model = worker.model_runner.get_model()
        config = worker.vllm_config.model_config.hf_text_config
        head = getattr(model, "lm_head", None)
        embed = getattr(getattr(model, "model", None), "embed_tokens", None)
        if not getattr(config, "tie_word_embeddings", False) or head is None or embed is None:
            return "reloaded"
        if head.weight is not embed.weight:
            head.weight.data.copy_(embed.weight.data)
        # the CPU build multiplies with a packed copy made after loading: make it again
        process = getattr(getattr(head, "quant_method", None), "process_weights_after_loading", None)
        if process is not None:
            process(head)
        return "reloaded; tied output head copied from the embedding"
