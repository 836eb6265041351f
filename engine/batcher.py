"""Continuous batching for the built-in engine: one model, many sequences, one decode step at a time.

``BatchEngine.step(admit)`` is the whole compute interface. Each call prefills the sequences it is
given (left-padded, with an attention mask and explicit position ids, so every row sees exactly its
own tokens at its own positions), merges their KV cache into the running batch, then runs one decode
step for every running row. Rows finish individually (stop token, stop string, ``max_new_tokens``,
context limit) and leave the batch; new rows join at the next call. Nothing here is asynchronous or
thread-safe: the caller (``engine.scheduler``) serializes ``step`` with the control
operations (abort, retract, weight loading), so every control operation lands between decode steps.
Tokens are drawn by ``engine.token_sampling`` (whose docstring gives the logprob convention); new
weights come in through ``engine.weights_loading``.

Determinism: every sequence samples with its own ``torch.Generator``, seeded by
``SamplingParams.sampling_seed`` when given, else by a seed drawn from the engine's seeded RNG in
admission order. So a request with a ``sampling_seed`` samples the same tokens whatever else is in
the batch (up to the float noise of different batch shapes), and a whole run is reproducible given
the engine seed and the order of requests.

Prefix sharing: identical prompts admitted together (a GRPO group's G copies) are prefilled once and
their KV copied to each row; and a prompt that starts like a sequence computed before (the same
instructions, the conversation so far of a multi-turn episode) prefills only what follows the
longest cached prefix (``engine.prefix_cache``). The cache is flushed whenever the weights change,
so reused KV is always what a fresh prefill would compute.

Deliberately left out: chunked prefill, paged KV memory, CUDA graphs, speculative decoding,
input-token logprobs, penalties.

Imports only torch, transformers (and safetensors, which transformers requires), the standard library
and the engine modules above (torch and the standard library only), so it runs on a bare GPU box.
"""

from __future__ import annotations

import inspect
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from engine.kv_cache import cache_from, kv_layers, new_cache
from engine.lora_merge import AdapterMerger, is_adapter
from engine.prefix_cache import KV, PrefixCache, common_prefix_len
from engine.sampling_params import SamplingParams
from engine.token_sampling import sample_tokens
from engine.weights_loading import load_state_dict

__all__ = ["BatchEngine", "EngineStats", "Sequence"]

_TRIM_MIN_COLUMNS = 32  # drop all-padding KV columns once this many pile up at the left
_MIN_STEM = 32  # shorter common starts are not worth a forward pass of their own


@dataclass(eq=False)
class Sequence:
    """One request's state: prompt, generated tokens with their logprobs and weight versions."""

    rid: str
    prompt_ids: list[int]
    params: SamplingParams
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[str] = field(default_factory=list)  # weight version that produced each token
    finish_reason: dict[str, Any] | None = None  # SGLang's shape: {"type": "stop", "matched": ...}
    weight_version: str = ""  # the engine's version when the sequence finished
    text: str = ""
    generator: torch.Generator | None = field(default=None, repr=False)
    kv_epoch: int = -1  # the engine's cache epoch when this row's KV was computed

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class EngineStats:
    """Counters for tests, benchmarks and ``/engine_stats``."""

    prefill_steps: int = 0
    decode_steps: int = 0
    prompt_tokens: int = 0  # tokens of every admitted row's prompt (and output so far, when retracted)
    prefill_tokens: int = 0  # of those, the ones the model computed (the rest were shared or cached)
    generated_tokens: int = 0
    max_batch_rows: int = 0
    prefill_s: float = 0.0  # wall time in prefills (shared stems included)
    decode_s: float = 0.0  # wall time in decode steps (sampling and stop checks included)
    decode_rows: int = 0  # rows summed over decode steps (over decode_steps: the mean batch)


class BatchEngine:
    """A causal LM serving a changing batch of sequences with one shared, left-padded KV cache.

    Args:
        model: a Hugging Face causal LM (any device and dtype; its device is used for all tensors).
        tokenizer: the model's tokenizer (stop strings and response text).
        weight_version: the version string reported with every token until ``weight_version`` is set.
        seed: seeds the per-request seeds of requests that bring none.
        max_running: most rows decoded together.
        max_prefill_tokens: most (padded) prompt tokens prefilled in one step; one sequence always fits.
        prefix_cache_tokens: most tokens whose KV the prefix cache holds (0: no prefix sharing at
            all, every prompt prefilled in full).
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        weight_version: str = "0",
        seed: int = 0,
        max_running: int = 64,
        max_prefill_tokens: int = 8192,
        prefix_cache_tokens: int = 16384,
    ) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.weight_version = weight_version
        self.max_running = max_running
        self.max_prefill_tokens = max_prefill_tokens
        self.device = next(model.parameters()).device
        self.max_context: int | None = getattr(model.config, "max_position_embeddings", None)
        self.vocab_size: int = model.get_input_embeddings().num_embeddings  # valid token ids: [0, vocab_size)
        self.eos_ids = _eos_ids(model, tokenizer)
        self.pad_id = (
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(self.eos_ids, default=0)
        )
        self.stats = EngineStats()
        self.adapters = AdapterMerger()  # the base weights LoRA adapters are merged into
        self.prefix_cache = PrefixCache(prefix_cache_tokens)
        self._kv_epoch = 0  # advances when the weights change: KV computed before is stale
        self.rows: list[Sequence] = []
        self._seeds = random.Random(seed)
        forward_args = inspect.signature(model.forward).parameters
        # transformers 5 renamed past_key_values to cache; both take a DynamicCache.
        self._cache_arg = "cache" if "cache" in forward_args else "past_key_values"
        self._last_only = {"logits_to_keep": 1} if "logits_to_keep" in forward_args else {}
        self._cache: Any = None
        self._mask = torch.zeros(0, 0, dtype=torch.long, device=self.device)  # [B, L] 1 = real token
        self._pos = torch.zeros(0, dtype=torch.long, device=self.device)  # [B] position of the next input

    # -- the compute interface -------------------------------------------------------------------

    def admissible(self, waiting: list[Sequence]) -> int:
        """How many of ``waiting`` (in order) the next ``step`` may admit."""
        room = self.max_running - len(self.rows)
        n, longest = 0, 0
        for seq in waiting[: max(room, 0)]:
            longest = max(longest, len(seq.prompt_ids) + len(seq.output_ids))
            if n > 0 and longest * (n + 1) > self.max_prefill_tokens:
                break
            n += 1
        return n

    @torch.inference_mode()
    def step(self, admit: list[Sequence]) -> list[Sequence]:
        """Prefills ``admit`` into the batch, decodes one token for every row; returns finished rows."""
        finished: list[Sequence] = []
        t0 = time.perf_counter()
        if admit:
            finished += self._prefill(admit)
        t1 = time.perf_counter()
        self.stats.prefill_s += t1 - t0
        if self.rows:
            self.stats.decode_rows += len(self.rows)
            finished += self._decode()
            self.stats.decode_s += time.perf_counter() - t1
        return finished

    def abort(self, rids: set[str] | None, message: str) -> list[Sequence]:
        """Ends the running rows in ``rids`` (all when None): finish reason abort, tokens kept."""
        aborted = [s for s in self.rows if rids is None or s.rid in rids]
        for seq in aborted:
            self._finish(seq, {"type": "abort", "message": message})
        self._keep([i for i, s in enumerate(self.rows) if not s.finished])
        return aborted

    def retract(self) -> list[Sequence]:
        """Takes every running row out of the batch, unfinished; their KV cache is dropped and rebuilt
        from prompt + tokens so far when they are admitted again."""
        retracted, self.rows = self.rows, []
        self._reset_cache()
        return retracted

    def load_weights(self, model_path: str | Path, load_format: str | None = None) -> None:
        """Copies the weights of a Hugging Face safetensors directory into the model, in place.

        Everything is checked before anything is copied, so a bad checkpoint leaves the model as it was.
        Running rows keep their KV cache (computed with the old weights), as in SGLang.
        """
        if load_format not in (None, "auto", "safetensors"):
            raise ValueError(f"load_format {load_format!r} is not supported (use 'auto' or 'safetensors')")
        if is_adapter(model_path):  # a LoRA trainer's: served as base + adapter
            merged = self.adapters.merged(model_path, self.model.state_dict())
            self.load_state(merged, source=str(model_path), base=False)
            return
        self.load_state(load_state_dict(model_path, self.device), source=str(model_path), complete=True)

    def check_state(self, new: dict[str, torch.Tensor], *, source: str, complete: bool) -> None:
        """Raises ValueError unless ``new`` fits the model: known names (as in ``state_dict()``), same
        shapes and, when ``complete``, every tensor present (tied ones may be left out)."""
        own = self.model.state_dict()
        unknown = sorted(set(new) - set(own))
        if unknown:
            raise ValueError(f"{source}: tensors the model does not have: {unknown[:5]}")
        bad = [
            f"{k} {tuple(t.shape)} != {tuple(own[k].shape)}"
            for k, t in new.items()
            if t.shape != own[k].shape
        ]
        if bad:
            raise ValueError(f"{source}: shape mismatch for {bad[:5]}")
        if complete:
            # A tensor may be absent only when it shares storage with a loaded one (tied embeddings).
            loaded = {own[k].data_ptr() for k in new}
            missing = sorted(k for k in set(own) - set(new) if own[k].data_ptr() not in loaded)
            if missing:
                raise ValueError(f"{source}: tensors missing from the checkpoint: {missing[:5]}")

    def load_state(
        self,
        new: dict[str, torch.Tensor],
        *,
        source: str = "weights",
        complete: bool = False,
        base: bool = True,
    ) -> None:
        """Checks ``new`` (``check_state``), then copies it into the model in place (converting dtype and
        device), so a bad set of tensors leaves the model as it was. ``base``: ``new`` are whole weights,
        the base of later adapters (False for an adapter's merge)."""
        self.check_state(new, source=source, complete=complete)
        if base:
            self.adapters.forget(new)
        own = self.model.state_dict()
        with torch.no_grad():
            for k, t in new.items():
                own[k].copy_(t)
        self.flush_cache()

    def flush_cache(self) -> None:
        """Forgets every cached prefix; rows already running keep their KV (as in SGLang)."""
        self.prefix_cache.flush()
        self._kv_epoch += 1

    # -- internals --------------------------------------------------------------------------------

    def _prefill(self, seqs: list[Sequence]) -> list[Sequence]:
        for seq in seqs:
            if seq.generator is None:
                seed = seq.params.sampling_seed
                seed = self._seeds.getrandbits(63) if seed is None else seed
                seq.generator = torch.Generator(device=self.device).manual_seed(seed)
            seq.kv_epoch = self._kv_epoch
        # Retracted rows resume from all their tokens. Identical token lists are computed once
        # (unless prefix sharing is off: then every prompt is computed in full, as before it existed).
        tokens = [tuple(s.prompt_ids + s.output_ids) for s in seqs]
        sharing = self.prefix_cache.enabled
        unique: dict[tuple[int, ...], int] = {}
        row_of = [unique.setdefault(x, len(unique)) for x in tokens] if sharing else list(range(len(seqs)))
        ids = list(unique) if sharing else tokens
        self.stats.prompt_tokens += sum(len(ids[r]) for r in row_of)
        if sharing:
            self._prefill_stems(ids)
        cache, mask, logits = self._forward(ids)
        rows = torch.tensor(row_of, device=self.device)
        done = self._append(seqs, logits[rows])
        keep = [i for i, s in enumerate(seqs) if not s.finished]
        if keep:
            idx = rows[keep]
            if idx.tolist() != list(range(len(ids))):
                cache.batch_select_indices(idx)
            self._merge([seqs[i] for i in keep], cache, mask[idx], mask[idx].sum(-1))
        return done

    def _forward(self, ids: list[tuple[int, ...]]) -> tuple[Any, torch.Tensor, torch.Tensor]:
        """Computes the KV of every row, each from its longest cached prefix on (at least its last
        token), and caches it; returns the batch's KV cache, its mask and the last logits."""
        hits = [self.prefix_cache.match(x, limit=len(x) - 1) for x in ids]
        cached = [n for n, _ in hits]
        todo = [x[n:] for x, n in zip(ids, cached, strict=True)]
        self.stats.prefill_tokens += sum(map(len, todo))
        # Row layout: [padding, cached prefix | padding, new tokens]; positions count real tokens only.
        cache, past = self._past(hits)
        S = max(map(len, todo))
        input_ids = torch.tensor([[self.pad_id] * (S - len(x)) + list(x) for x in todo], device=self.device)
        new = torch.tensor([[0] * (S - len(x)) + [1] * len(x) for x in todo], device=self.device)
        mask = torch.cat([past, new], dim=1)
        positions = torch.tensor(cached, device=self.device)[:, None] + (new.cumsum(-1) - 1).clamp(min=0)
        out = self.model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            **{self._cache_arg: cache},
            **self._last_only,
        )
        self.stats.prefill_steps += 1
        if self.prefix_cache.enabled:
            layers = kv_layers(cache)
            for r, x in enumerate(ids):
                self.prefix_cache.insert(x, _row_kv(layers, r, mask[r]))
        return cache, mask, out.logits[:, -1, :]

    def _prefill_stems(self, ids: list[tuple[int, ...]]) -> None:
        """Computes once, and caches, the starts that several rows share beyond their cached prefix,
        so that rows admitted together share them too: a group resumed after a weight update (the
        cache was flushed; each row has its own output after the common prompt), or tasks with the
        same instructions."""
        if len(ids) < 2:
            return
        # In sorted order a row's longest common start with any other row is with a neighbour.
        order = sorted(range(len(ids)), key=ids.__getitem__)
        rows = [torch.tensor(ids[i]) for i in order]
        between = [common_prefix_len(a, b) for a, b in zip(rows, rows[1:], strict=False)]
        stems: list[tuple[int, ...]] = []
        for k, i in enumerate(order):
            x = ids[i]
            shared = max(between[k - 1] if k else 0, between[k] if k < len(between) else 0)
            shared = min(shared, len(x) - 1)  # the row's own last token is computed with the row
            if shared >= _MIN_STEM and shared > self.prefix_cache.match(x, limit=shared)[0]:
                stems.append(x[:shared])
        # Longest first; a stem that starts a chosen one is covered by it.
        chosen: list[tuple[int, ...]] = []
        for stem in sorted(set(stems), key=len, reverse=True):
            if not any(c[: len(stem)] == stem for c in chosen):
                chosen.append(stem)
        if chosen:
            self._forward(chosen)

    def _past(self, hits: list[tuple[int, KV | None]]) -> tuple[Any, torch.Tensor]:
        """A KV cache holding each row's cached prefix, left-padded to the longest, and its mask."""
        lengths = [n for n, _ in hits]
        P = max(lengths)
        mask = torch.tensor([[0] * (P - n) + [1] * n for n in lengths], device=self.device, dtype=torch.long)
        if P == 0:
            return new_cache(), mask
        template = next(kv for _, kv in hits if kv is not None)  # any row's, to shape the empty ones
        layers = []
        for layer, (k0, v0) in enumerate(template):
            rows = [kv[layer] if kv is not None else (k0, v0) for _, kv in hits]
            keys = torch.stack([_pad_left(k[:, :n], P) for (k, _), n in zip(rows, lengths, strict=True)])
            values = torch.stack([_pad_left(v[:, :n], P) for (_, v), n in zip(rows, lengths, strict=True)])
            layers.append((keys, values))
        return cache_from(layers), mask

    def _decode(self) -> list[Sequence]:
        B = len(self.rows)
        input_ids = torch.tensor([[s.output_ids[-1]] for s in self.rows], device=self.device)
        self._mask = torch.cat([self._mask, torch.ones(B, 1, dtype=torch.long, device=self.device)], dim=1)
        out = self.model(
            input_ids=input_ids,
            attention_mask=self._mask,
            position_ids=self._pos[:, None],
            use_cache=True,
            **{self._cache_arg: self._cache},
        )
        self._pos = self._pos + 1
        self.stats.decode_steps += 1
        done = self._append(self.rows, out.logits[:, -1, :])
        if done:
            self._remember(done)
            self._keep([i for i, s in enumerate(self.rows) if not s.finished])
        return done

    def _remember(self, done: list[Sequence]) -> None:
        """Caches the KV of rows that just finished (prompt + output but the last token, which was
        never fed back): the next turn of an episode starts with exactly these tokens."""
        if not self.prefix_cache.enabled:
            return
        layers = kv_layers(self._cache)
        finished = {id(s) for s in done if s.kv_epoch == self._kv_epoch}  # KV of the current weights
        for r, seq in enumerate(self.rows):
            if id(seq) in finished:
                tokens = seq.prompt_ids + seq.output_ids[:-1]
                self.prefix_cache.insert(tokens, _row_kv(layers, r, self._mask[r]))

    def _append(self, seqs: list[Sequence], logits: torch.Tensor) -> list[Sequence]:
        """Samples a token for each sequence, records it, and finishes the sequences that must stop."""
        tokens, logprobs = sample_tokens(logits, [s.params for s in seqs], [s.generator for s in seqs])
        done = []
        for seq, token, logprob in zip(seqs, tokens.tolist(), logprobs.tolist(), strict=True):
            seq.output_ids.append(token)
            seq.logprobs.append(logprob)
            seq.versions.append(self.weight_version)
            self.stats.generated_tokens += 1
            reason = self._stop_reason(seq, token)
            if reason is not None:
                self._finish(seq, reason)
                done.append(seq)
        return done

    def _stop_reason(self, seq: Sequence, token: int) -> dict[str, Any] | None:
        p = seq.params
        # A stop token or string wins over the length limit when both hold: the model did stop.
        if token in p.stop_token_ids or (not p.ignore_eos and token in self.eos_ids):
            return {"type": "stop", "matched": token}
        if p.stop:
            text = self.tokenizer.decode(seq.output_ids, skip_special_tokens=p.skip_special_tokens)
            hits = [(text.find(s), s) for s in p.stop if s and s in text]
            if hits:
                return {"type": "stop", "matched": min(hits)[1]}
        n = len(seq.output_ids)
        if n >= p.max_new_tokens:
            return {"type": "length", "length": n}
        if self.max_context is not None and len(seq.prompt_ids) + n >= self.max_context:
            return {"type": "length", "length": n}
        return None

    def _finish(self, seq: Sequence, reason: dict[str, Any]) -> None:
        seq.finish_reason = reason
        seq.weight_version = self.weight_version
        seq.text = self.response_text(seq)

    def response_text(self, seq: Sequence) -> str:
        """The decoded output, with the matched stop token or string cut off unless ``no_stop_trim``."""
        p, reason = seq.params, seq.finish_reason or {}
        matched = reason.get("matched")
        ids = seq.output_ids
        if reason.get("type") == "stop" and isinstance(matched, int) and not p.no_stop_trim:
            ids = ids[:-1]
        text = self.tokenizer.decode(ids, skip_special_tokens=p.skip_special_tokens)
        if isinstance(matched, str) and not p.no_stop_trim and matched in text:
            text = text[: text.find(matched)]
        return text

    def _merge(self, seqs: list[Sequence], cache: Any, mask: torch.Tensor, pos: torch.Tensor) -> None:
        """Appends prefilled rows to the batch, left-padding whichever KV cache is shorter."""
        if not self.rows:
            self.rows, self._cache, self._mask, self._pos = list(seqs), cache, mask, pos
        else:
            La, Lb = self._mask.shape[1], mask.shape[1]
            L = max(La, Lb)
            kv = [
                (
                    torch.cat([_pad_left(ka, L), _pad_left(kb, L)]),
                    torch.cat([_pad_left(va, L), _pad_left(vb, L)]),
                )
                for (ka, va), (kb, vb) in zip(kv_layers(self._cache), kv_layers(cache), strict=True)
            ]
            self._cache = cache_from(kv)
            self._mask = torch.cat([F.pad(self._mask, (L - La, 0)), F.pad(mask, (L - Lb, 0))])
            self._pos = torch.cat([self._pos, pos])
            self.rows += seqs
        self.stats.max_batch_rows = max(self.stats.max_batch_rows, len(self.rows))

    def _keep(self, indices: list[int]) -> None:
        """Keeps only these rows (in this order) of the batch."""
        if len(indices) == len(self.rows):
            return
        self.rows = [self.rows[i] for i in indices]
        if not self.rows:
            self._reset_cache()
            return
        idx = torch.tensor(indices, device=self.device)
        self._cache.batch_select_indices(idx)
        self._mask, self._pos = self._mask[idx], self._pos[idx]
        # Columns that are padding in every remaining row (their longest prompts left) only cost time.
        lead = int(self._mask.any(dim=0).int().argmax())
        if lead >= _TRIM_MIN_COLUMNS:
            self._cache = cache_from(
                [(k[..., lead:, :], v[..., lead:, :]) for k, v in kv_layers(self._cache)]
            )
            self._mask = self._mask[:, lead:]

    def _reset_cache(self) -> None:
        self._cache = None
        self._mask = self._mask[:0, :0]
        self._pos = self._pos[:0]


def _eos_ids(model: Any, tokenizer: Any) -> frozenset[int]:
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config, tokenizer):
        eos = getattr(source, "eos_token_id", None)
        if isinstance(eos, int):
            ids.add(eos)
        elif isinstance(eos, list | tuple):
            ids.update(int(e) for e in eos)
    return frozenset(ids)


def _row_kv(layers: list[tuple[torch.Tensor, torch.Tensor]], row: int, mask: torch.Tensor) -> KV:
    """One row's keys and values at its real tokens (``mask`` 1), copied out of a batch's ``[B, H, L, D]``."""
    cols = mask.nonzero()[:, 0]
    return [(k[row].index_select(1, cols), v[row].index_select(1, cols)) for k, v in layers]


def _pad_left(t: torch.Tensor, length: int) -> torch.Tensor:
    """Zero-pads a ``[B, H, L, D]`` KV tensor on the left of its sequence axis (masked out anyway)."""
    return F.pad(t, (0, 0, length - t.shape[-2], 0))
