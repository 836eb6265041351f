"""Sampling the next token of every row of a batch from its logits, with the logprob the trainer
recomputes.

Logprob convention (SGLang's): the logprob of a sampled token is
``log_softmax(logits / T)`` at that token, without top-p/top-k renormalization. Temperature 0 means
greedy decoding, and its logprob is then taken under T = 1 (SGLang samples greedy rows as T = 1,
top_k = 1, and reports the same).

Imports only torch and ``engine.sampling_params`` (standard library only), so it runs on a bare GPU box.
"""

from __future__ import annotations

import torch

from engine.sampling_params import SamplingParams

__all__ = ["sample_tokens"]

_GREEDY_EPS = 1e-6  # temperatures below this decode greedily (SGLang's threshold)


def sample_tokens(
    logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Samples one token per row and returns ``(tokens, logprobs)``, both of shape ``[B]``.

    ``logprobs`` is ``log_softmax(logits / T)`` at the chosen token; top-k/top-p only restrict which
    tokens may be drawn (SGLang's convention). Greedy rows (T = 0) take the argmax, logprob at T = 1.
    """
    logits = logits.float()
    B, V = logits.shape
    dev = logits.device
    temps = torch.tensor([p.temperature for p in params], device=dev, dtype=torch.float32)
    greedy = temps < _GREEDY_EPS
    logp = torch.log_softmax(logits / torch.where(greedy, 1.0, temps)[:, None], dim=-1)
    tokens = logits.argmax(dim=-1)
    rows = [i for i, g in enumerate(greedy.tolist()) if not g]  # one device sync, not B
    if rows:
        idx = torch.tensor(rows, device=dev)
        probs = logp[idx].exp()
        top_k = torch.tensor([params[i].top_k if params[i].top_k > 0 else V for i in rows], device=dev)
        top_p = torch.tensor([params[i].top_p for i in rows], device=dev, dtype=torch.float32)
        order = None
        if bool((top_k < V).any() or (top_p < 1.0).any()):
            # Keep the top-k tokens, then the smallest prefix whose mass reaches top_p (the first token
            # always stays); the kept probabilities are not renormalized: multinomial does not need it.
            probs, order = probs.sort(dim=-1, descending=True)
            ranks = torch.arange(V, device=dev)[None, :]
            keep = (ranks < top_k[:, None]) & ((probs.cumsum(-1) - probs) < top_p[:, None])
            probs = torch.where(keep, probs, 0.0)
        # Inverse-CDF sampling, one uniform per row from the row's own generator (a loop of
        # multinomial calls costs ~1 ms per row on CPU); float64 keeps the tail's mass exact enough.
        u = torch.stack([torch.rand((), generator=generators[i], device=dev) for i in rows]).double()
        cdf = probs.double().cumsum(dim=-1)
        pick = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True).clamp(max=V - 1)
        if order is not None:
            pick = order.gather(1, pick)
        tokens[idx] = pick[:, 0]
    return tokens, logp.gather(1, tokens[:, None])[:, 0]
