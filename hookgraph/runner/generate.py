"""``runner.generate``: each step generates from its batch with the hooks on, instead of one forward.

Public names: GENERATE_KEYS, check_generate, check_can_generate, generate_set, Generator, generation.

``runner.generate`` is a mapping of ``generate``'s settings (``max_new_tokens``,
``do_sample``, ``temperature``, ``top_k``, ``top_p``, ``seed``, ...); null (the default)
keeps the plain forward pass. Every step calls ``model.generate(**batch, ...)`` with the
graph attached: positions in the specs are positions in the sequence (prompt + generated
tokens), the same with and without the KV cache (:mod:`hookgraph.core.sequence`).

What a step gives the rest of the runner:

- the loss: the mean negative log-likelihood of the generated tokens under the model's
  own (hooked) step logits;
- the metric (``runner.metric``): computed on the step logits, ``[batch, new tokens,
  vocab]`` (``position: -1`` is the step that chose the last token; ``0`` the first);
- one line per batch row in ``generations.jsonl``: step, row, prompt ids, generated ids,
  the text when ``data.tokenizer`` names a local tokenizer folder, and the step's metric.

Beam search (``num_beams > 1``): the loss and the metric are those of the written
generations (each step's logits taken from the beam its token came from, as a
teacher-forced pass over them gives), and each line's ``beam`` is the row of the step's
records, read back with ``Run.sequences``, that holds that generation.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F

from hookgraph.core.sequence import pack_span
from hookgraph.data.kinds.text import load_tokenizer
from hookgraph.errors import ConfigError, did_you_mean
from hookgraph.runs import layout
from hookgraph.runs.writer import atomic_write

__all__ = ["GENERATE_KEYS", "check_generate", "check_can_generate", "generate_set", "Generator", "generation"]

KEY = "runner.generate"

# key -> (types, what it is): what generate takes that matters, checked before anything is built.
GENERATE_KEYS: dict[str, tuple[tuple[type, ...], str]] = {
    "max_new_tokens": ((int,), "tokens to generate per prompt (>= 1)"),
    "min_new_tokens": ((int,), "generate at least this many tokens (EOS is ignored until then)"),
    "do_sample": ((bool,), "sample (true) or greedy (false)"),
    "temperature": ((int, float), "sampling temperature (> 0)"),
    "top_k": ((int,), "sample among the k most likely tokens (0: all)"),
    "top_p": ((int, float), "nucleus sampling: the smallest set of tokens with this much probability"),
    "repetition_penalty": ((int, float), "penalise repeated tokens (1.0: none)"),
    "num_beams": ((int,), "beam search width (1: none)"),
    "use_cache": ((bool,), "the KV cache (positions mean the same either way)"),
    "seed": ((int, type(None)), "torch.manual_seed(seed + step) before each step's generate"),
    "eos_token_id": ((int, type(None)), "stop at this token (null: the model's)"),
    "pad_token_id": ((int, type(None)), "pad finished rows with this token (null: eos, or 0)"),
}


def check_generate(cfg: Any) -> dict[str, Any] | None:
    """``runner.generate`` -> generate's keyword arguments (``seed`` kept aside), or None.
    ConfigError naming the key for anything wrong, before anything is built."""
    r = cfg.runner
    raw = r.get("generate") if isinstance(r, Mapping) else getattr(r, "generate", None)
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise ConfigError(KEY, f"expected a mapping such as {{max_new_tokens: 20, do_sample: false}}, got {raw!r}")
    # The schema's typed fields are all there, null when not set: a null one is not a setting.
    raw = {k: v for k, v in raw.items() if v is not None}
    if not raw:
        return None
    out: dict[str, Any] = {}
    for k, v in raw.items():
        if k not in GENERATE_KEYS:
            hint = did_you_mean(str(k), GENERATE_KEYS, "settings")
            raise ConfigError(f"{KEY}.{k}", f"not a generate setting; {hint}")
        types, what = GENERATE_KEYS[k]
        if not isinstance(v, types) or (isinstance(v, bool) and bool not in types):
            raise ConfigError(f"{KEY}.{k}", f"expected {what}, got {v!r}")
        out[k] = v
    if "max_new_tokens" not in out:
        raise ConfigError(f"{KEY}.max_new_tokens", "runner.generate needs max_new_tokens (tokens per prompt)")
    for k, low in (("max_new_tokens", 1), ("num_beams", 1), ("min_new_tokens", 0), ("top_k", 0)):
        if k in out and out[k] < low:
            raise ConfigError(f"{KEY}.{k}", f"must be >= {low}, got {out[k]}")
    for k in ("temperature", "top_p"):
        if k in out and not out[k] > 0:
            raise ConfigError(f"{KEY}.{k}", f"must be > 0, got {out[k]}")
    if r.backward:
        raise ConfigError(
            "runner.backward", "runner.generate runs without gradients (generate is a no_grad loop); "
            "set runner.backward=false"
        )
    if r.compile:
        raise ConfigError("runner.compile", "runner.generate runs eagerly; set runner.compile=false")
    if r.distributed != "none":
        raise ConfigError("runner.distributed", "runner.generate runs in one process; set runner.distributed=none")
    return out


def generate_set(r: Any) -> bool:
    """``runner.generate`` holds a setting (the schema's default has every field null)."""
    raw = r.get("generate") if isinstance(r, Mapping) else getattr(r, "generate", None)
    return raw is not None and (not isinstance(raw, Mapping) or any(v is not None for v in raw.values()))


def check_can_generate(model: Any, cfg: Any) -> None:
    """The model has a ``generate`` (a Hugging Face causal LM, or any model with a compatible one)."""
    if not callable(getattr(model, "generate", None)):
        name = cfg.model.get("name") or cfg.model.get("_target_") or type(model).__name__
        raise ConfigError(
            KEY, f"the model ({name}, {type(model).__name__}) has no generate method: runner.generate needs a "
            "causal language model (a Hugging Face *ForCausalLM / *LMHeadModel) or a model with a compatible "
            "generate(input_ids, max_new_tokens=...); drop runner.generate for a plain forward pass"
        )


def _tokenizer(cfg: Any) -> Any:
    folder = cfg.data.get("tokenizer") if isinstance(cfg.data, Mapping) else None
    if folder is None:
        return None
    return load_tokenizer(folder, "data")


class Generator:
    """One run's generation: ``step(model, inputs, step) -> (output for the metric, loss)``,
    and the lines of ``generations.jsonl``."""

    def __init__(self, settings: dict[str, Any], cfg: Any, out_dir: Any):
        self.seed = settings.pop("seed", None)
        self.settings = settings
        self.tokenizer = _tokenizer(cfg)
        self.path = out_dir / layout.GENERATIONS
        self.rows: list[dict[str, Any]] = []
        # spec -> target -> packed spans (core.sequence.pack_span) of every recorded call, for
        # summary.json's record_positions: Run.sequences reads a generation back from them.
        self.positions: dict[str, dict[str, list[list]]] = {}

    def collect(self, store: Any, step: int) -> None:
        """Keep the step's record spans (its records then leave as a shard, and the spans with them)."""
        for spec, targets in store.records.items():
            for target, entries in targets.items():
                if entries.spans:
                    kept = self.positions.setdefault(spec, {}).setdefault(target, [])
                    kept.extend(pack_span(step, call, span) for call, span in enumerate(entries.spans))

    def step(self, model: Any, inputs: Any, step: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        if not isinstance(inputs, Mapping) or not isinstance(inputs.get("input_ids"), torch.Tensor):
            raise ConfigError(
                "data", "runner.generate needs batches of token ids ({input_ids: ...}): data=tokens, data=text, "
                "or data=custom with hookgraph.data.prompts.Prompts"
            )
        mask = inputs.get("attention_mask")
        if isinstance(mask, torch.Tensor) and mask.dim() == 2 and bool((mask[:, -1] == 0).any()):
            raise ConfigError(
                "data", "a right-padded batch (attention_mask ends in 0): generate would continue after the "
                "padding; give prompts of one length (data=custom with hookgraph.data.prompts.Prompts, or "
                "runner.batch_size=1)"
            )
        kwargs = dict(self.settings)
        if kwargs.get("pad_token_id") is None:
            eos = kwargs.get("eos_token_id", getattr(getattr(model, "generation_config", None), "eos_token_id", None))
            kwargs["pad_token_id"] = eos if isinstance(eos, int) else 0
        ids = inputs["input_ids"]
        # The seed is this call's: the caller's random state (CPU, and the batch's GPU) comes back after it.
        gpu = ids.device.index if ids.device.index is not None else (torch.cuda.current_device() if ids.is_cuda else 0)
        gpus = [gpu] if ids.is_cuda else []
        with torch.random.fork_rng(devices=gpus, enabled=self.seed is not None), torch.no_grad():
            if self.seed is not None:
                torch.manual_seed(self.seed + step)
            out = model.generate(**inputs, **kwargs, output_logits=True, return_dict_in_generate=True)
        sequences = out.sequences if hasattr(out, "sequences") else out
        new = sequences[:, ids.shape[1]:]
        logits = torch.stack(list(out.logits), 1) if getattr(out, "logits", None) else None
        if logits is None:
            raise ConfigError(KEY, "the model's generate gave no step logits (output_logits=True)")
        beams = getattr(out, "beam_indices", None)
        valid = None
        if isinstance(beams, torch.Tensor) and logits.shape[0] != new.shape[0]:
            # Beam search: step logits are [batch * num_beams, ...], one row per beam slot; a
            # written generation's logits at step t are those of the slot its token t came from.
            valid = beams[:, : logits.shape[1]] >= 0
            slot = beams[:, : logits.shape[1]].clamp(min=0).to(logits.device)
            logits = logits[slot, torch.arange(slot.shape[1], device=logits.device)]
        logp = F.log_softmax(logits.float(), -1).gather(-1, new[:, : logits.shape[1], None].to(logits.device))
        loss = -logp.mean() if valid is None else -logp[..., 0][valid.to(logp.device)].mean()
        self._keep(step, ids, new, None if valid is None else beams, len(out.logits))
        return {"logits": logits}, loss

    def _keep(self, step: int, ids: torch.Tensor, new: torch.Tensor, beams: torch.Tensor | None, calls: int) -> None:
        for row, (p, g) in enumerate(zip(ids.tolist(), new.tolist(), strict=True)):
            line: dict[str, Any] = {"step": step, "row": row, "prompt_ids": p, "generated_ids": g}
            if beams is not None:
                # The row of the step's records (read back as a sequence: the beams of the
                # last call) that holds this generation: the slot that chose its last token in
                # that call. None for one that ended (EOS) before the last call: no row holds it.
                chose = [int(b) for b in beams[row].tolist() if b >= 0]
                line["beam"] = chose[-1] if chose and len(chose) == calls else None
            if self.tokenizer is not None:
                line["prompt"] = self.tokenizer.decode(p)
                line["text"] = self.tokenizer.decode(g)
            self.rows.append(line)

    def write(self, step: int, metric: float | None) -> None:
        """The file as it stands after ``step`` (rewritten whole, atomically: a run that
        fails later keeps the steps it finished)."""
        if metric is not None:
            for line in self.rows:
                if line["step"] == step:
                    line["metric"] = metric
        data = "".join(json.dumps(line) + "\n" for line in self.rows)
        atomic_write(self.path, data.encode())

    def headline(self) -> str | None:
        """The last step's first generation, for the summary and the sweep table."""
        if not self.rows:
            return None
        last = self.rows[-1]["step"]
        first = next(r for r in self.rows if r["step"] == last)
        text = first.get("text")
        return text if text is not None else " ".join(str(i) for i in first["generated_ids"])


def generation(job: Any, parts: Any) -> Generator | None:
    """The run's :class:`Generator` when ``runner.generate`` is set (its settings checked
    again, and the model asked for ``generate``, before the model runs), else None."""
    settings = check_generate(job.cfg)
    if settings is None:
        _refuse_generated_without_generate(job.cfg)
        return None
    check_can_generate(parts.bare, job.cfg)
    return Generator(settings, job.cfg, job.writer.dir)


def _refuse_generated_without_generate(cfg: Any) -> None:
    """``positions: generated`` in a run that only reads its prompts would act on nothing."""
    hooks = cfg.get("hooks") or {}
    for name, spec in hooks.items() if isinstance(hooks, Mapping) else ():
        args = spec.get("args") if isinstance(spec, Mapping) else None
        if isinstance(args, Mapping) and args.get("positions") == "generated":
            raise ConfigError(
                f"hooks.{name}.args.positions", "'generated' names no token of a plain forward pass: the run "
                "only reads its prompts; set runner.generate (e.g. runner.generate.max_new_tokens=20) or name "
                "prompt positions"
            )
