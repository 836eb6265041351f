"""Token log-probabilities from final hidden states without materializing ``[tokens, vocab]`` logits.

``log_softmax(h W^T / T)[target]`` for every selected token, computed in chunks of tokens: each
chunk's logits live only inside the chunk, the forward keeps one float per token (the
log-sum-exp), and the backward recomputes each chunk's logits to form ``dlogits`` and the two
matmul gradients. With a 150k vocabulary and 16k tokens the plain path holds about 10 GB of float32
logits plus as much again for their log-softmax and its gradient; here it is one chunk at a time.

Gradients, with ``z = logits / T``, ``p = softmax(z)``, ``H = -sum p log p``::

    d logp / dz = onehot(target) - p
    d H    / dz = -p * (log p + H)

Matmuls run in the autocast dtype when autocast is on (as ``lm_head`` would), everything after
them in float32. ``compile=True`` (CUDA only) compiles the per-chunk math with ``torch.compile`` so
the float32 logits are never written to memory; a compile failure falls back to eager once, loudly.

Deliberately left out: logit soft-capping and scaling, biased heads, vocabulary-parallel heads
(``model_logprobs`` falls back to full logits for those).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import Tensor

from trainer.losses import entropy_from_logits

__all__ = ["fused_logprobs", "full_logprobs", "has_plain_head", "head_logprobs", "token_logprobs"]

log = logging.getLogger(__name__)


def _upcast(x: Tensor) -> Tensor:
    """Half precision to float32; float32 and float64 stay as they are."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def _chunk_forward(
    h: Tensor, w: Tensor, target: Tensor, inv_t: float, with_entropy: bool
) -> tuple[Tensor, Tensor, Tensor | None]:
    """(logp, lse, entropy or None) of one chunk; ``h`` and ``w`` already in the matmul dtype."""
    z = _upcast(h @ w.T)
    if inv_t != 1.0:
        z.mul_(inv_t)
    lse = torch.logsumexp(z, dim=-1)
    logp = z.gather(-1, target[:, None])[:, 0] - lse
    if not with_entropy:
        return logp, lse, None
    z.sub_(lse[:, None])  # now log p
    # -sum p log p directly: lse - sum p z cancels two numbers of the size of the logits
    entropy = -torch.exp(z).mul_(z).sum(-1)
    return logp, lse, entropy


def _chunk_dlogits(
    h: Tensor, w: Tensor, target: Tensor, lse: Tensor, entropy: Tensor, g_logp: Tensor, g_ent: Tensor | None,
    inv_t: float,
) -> Tensor:  # fmt: skip
    """d loss / d logits of one chunk in float32, in place where it can (each [C, V] temporary is large)."""
    logp = _upcast(h @ w.T)
    if inv_t != 1.0:
        logp.mul_(inv_t)
    logp.sub_(lse[:, None])
    if g_ent is None:
        dz = logp.exp_().mul_(-g_logp[:, None])
    else:
        coef = g_logp[:, None] + g_ent[:, None] * (logp + entropy[:, None])
        dz = logp.exp_().mul_(coef).neg_()
    dz.scatter_add_(-1, target[:, None], g_logp[:, None])
    return dz.mul_(inv_t) if inv_t != 1.0 else dz


_EAGER = {"forward": _chunk_forward, "dlogits": _chunk_dlogits}
_compiled: dict[str, Any] = {}


def _kernel(name: str, compile: bool):
    if not compile:
        return _EAGER[name]
    if name not in _compiled:
        _compiled[name] = torch.compile(_EAGER[name], dynamic=True)
    return _compiled[name]


def _run(name: str, compile: bool, *args: Any) -> Any:
    if compile and _compiled.get(name) is not False:
        try:
            return _kernel(name, True)(*args)
        except Exception as e:  # noqa: BLE001 - any compiler failure: eager is always correct
            log.warning("torch.compile of the fused logprob %s failed, running eager: %s", name, e)
            _compiled[name] = False
    return _EAGER[name](*args)


class _ChunkedLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, target, temperature, chunk, dtype, compile, with_entropy):
        ctx.set_materialize_grads(False)  # an unused entropy output gets None, not a [N] zero tensor
        n = hidden.shape[0]
        w = weight.to(dtype)
        acc = _upcast(torch.empty((), dtype=dtype)).dtype
        logp, lse, entropy = (hidden.new_zeros(n, dtype=acc) for _ in range(3))
        for s in range(0, n, chunk):
            e = min(s + chunk, n)
            out = _run(
                "forward", compile, hidden[s:e].to(dtype), w, target[s:e], 1.0 / temperature, with_entropy
            )
            logp[s:e], lse[s:e] = out[0], out[1]
            if with_entropy:
                entropy[s:e] = out[2]
        if not with_entropy:
            ctx.mark_non_differentiable(entropy)
        ctx.save_for_backward(hidden, weight, target, lse, entropy)
        ctx.temperature, ctx.chunk, ctx.dtype, ctx.compile = temperature, chunk, dtype, compile
        return logp, entropy

    @staticmethod
    def backward(ctx, g_logp, g_ent):
        hidden, weight, target, lse, entropy = ctx.saved_tensors
        n, dtype = hidden.shape[0], ctx.dtype
        g_logp = torch.zeros_like(lse) if g_logp is None else g_logp.to(lse.dtype)
        g_ent = None if g_ent is None else g_ent.to(lse.dtype)
        w = weight.to(dtype)
        grad_h = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_w = torch.zeros(weight.shape, dtype=lse.dtype, device=weight.device)
        for s in range(0, n, ctx.chunk):
            e = min(s + ctx.chunk, n)
            h = hidden[s:e].to(dtype)
            g_ent_c = None if g_ent is None else g_ent[s:e]
            args = (h, w, target[s:e], lse[s:e], entropy[s:e], g_logp[s:e], g_ent_c, 1.0 / ctx.temperature)
            dz = _run("dlogits", ctx.compile, *args).to(dtype)
            if grad_h is not None:
                grad_h[s:e] = dz @ w
            if ctx.needs_input_grad[1]:
                grad_w += _upcast(dz.T @ h)
        grad_w = grad_w.to(weight.dtype) if ctx.needs_input_grad[1] else None
        return grad_h, grad_w, None, None, None, None, None, None


def _matmul_dtype(hidden: Tensor, weight: Tensor) -> torch.dtype:
    """The dtype ``lm_head`` would multiply in: the autocast dtype when autocast is on."""
    kind = hidden.device.type
    try:
        if torch.is_autocast_enabled(kind):
            return torch.get_autocast_dtype(kind)
    except (TypeError, AttributeError):  # torch < 2.4: no device argument
        if kind == "cuda" and torch.is_autocast_enabled():
            return torch.get_autocast_gpu_dtype()
    return torch.promote_types(hidden.dtype, weight.dtype)


def fused_logprobs(
    hidden: Tensor,
    weight: Tensor,
    target: Tensor,
    *,
    temperature: float = 1.0,
    chunk_tokens: int = 2048,
    compile: bool = False,
    with_entropy: bool = False,
) -> tuple[Tensor, Tensor]:
    """Per-token ``log_softmax(hidden @ weight.T / T)[target]`` and the entropy, in chunks.

    Args:
        hidden: ``[N, H]`` final hidden states of the tokens whose next token is scored.
        weight: ``[V, H]`` output embedding (``lm_head.weight``).
        target: ``[N]`` the next token of each row.
        temperature: the sampling temperature ``T``.
        chunk_tokens: tokens per chunk; peak memory is about ``3 * chunk_tokens * V * 4`` bytes.
        compile: ``torch.compile`` the per-chunk math (CUDA only; ignored elsewhere).
        with_entropy: also compute the entropy of each token's distribution (one more pass per chunk).

    Returns:
        ``(logp, entropy)``, both ``[N]`` float32 (float64 for float64 inputs) and differentiable
        w.r.t. ``hidden`` and ``weight``; ``entropy`` is zeros (not differentiable) without ``with_entropy``.
    """
    if hidden.dim() != 2 or target.shape != hidden.shape[:1]:
        raise ValueError(
            f"hidden must be [N, H] and target [N]; got {tuple(hidden.shape)}, {tuple(target.shape)}"
        )
    dtype = _matmul_dtype(hidden, weight)
    compile = compile and hidden.is_cuda
    with torch.autocast(hidden.device.type, enabled=False):  # dtypes are chosen above, explicitly
        return _ChunkedLogprobs.apply(
            hidden, weight, target, float(temperature), chunk_tokens, dtype, compile, with_entropy
        )


def full_logprobs(
    logits: Tensor, target: Tensor, temperature: float = 1.0, with_entropy: bool = True
) -> tuple[Tensor, Tensor]:
    """The plain computation: float32 ``log_softmax(logits / T)`` gathered at ``target``, and the entropy."""
    z = _upcast(logits) / temperature
    logp = torch.log_softmax(z, dim=-1).gather(-1, target[..., None])[..., 0]
    return logp, entropy_from_logits(z) if with_entropy else torch.zeros_like(logp)


def token_logprobs(model: Any, tokens: Tensor, attention_mask: Tensor, temperature: float) -> Tensor:
    """``[B, T]`` log-probability of each token given its prefix (position 0 gets 0), from the
    model's full logits: the plain reference the other paths are checked against."""
    logits = model(input_ids=tokens, attention_mask=attention_mask).logits[:, :-1].float()
    logp = torch.log_softmax(logits / temperature, dim=-1).gather(-1, tokens[:, 1:, None])[..., 0]
    return torch.nn.functional.pad(logp, (1, 0))


def has_plain_head(model: Any) -> bool:
    """Whether ``model``'s logits are exactly ``lm_head(last hidden state)`` (no bias, scale or cap)."""
    head = model.get_output_embeddings()
    cfg = model.config
    scaled = any(
        getattr(cfg, k, None) not in (None, 1.0)
        for k in ("final_logit_softcapping", "logit_scale", "logits_scaling")
    )
    return isinstance(head, torch.nn.Linear) and head.bias is None and not scaled


def head_logprobs(
    model: Any,
    hidden: Tensor,
    target: Tensor,
    *,
    temperature: float,
    fused: bool = True,
    chunk_tokens: int = 2048,
    compile: bool = False,
    with_entropy: bool = False,
) -> tuple[Tensor, Tensor]:
    """``(logp, entropy)`` of ``target`` given final hidden states ``[N, H]``, through ``model``'s head."""
    head = model.get_output_embeddings()
    if fused:
        return fused_logprobs(
            hidden, head.weight, target, temperature=temperature, chunk_tokens=chunk_tokens, compile=compile,
            with_entropy=with_entropy,
        )  # fmt: skip
    return full_logprobs(head(hidden), target, temperature, with_entropy)
