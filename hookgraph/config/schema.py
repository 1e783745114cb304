"""Structured configs: the schema Hydra validates the command line and YAML against.

Public names: ModelConfig, DataConfig, RunnerConfig, GradcamConfig, SinkConfig, HookgraphConfig,
register_configs, check_known_keys.

Each field has a one-line comment; unknown keys and wrong types are rejected by
OmegaConf with the full key. ``hooks`` is a plain dict so that specs can be added inline
(``+hooks.z={...}``); hookgraph's own validator checks every spec and reports them together.
A ``+`` override adds a key that OmegaConf lets through (``+runner.stpes=5``):
:func:`check_known_keys` refuses those before the run, with the nearest names.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, ListConfig, Node, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from hookgraph.errors import ConfigError, did_you_mean

__all__ = [
    "check_booleans",
    "ModelConfig",
    "DataConfig",
    "RunnerConfig",
    "GradcamConfig",
    "SinkConfig",
    "HookgraphConfig",
    "register_configs",
    "check_known_keys",
]


@dataclass
class ModelConfig:
    name: str | None = "conv_net"  # a built-in name (conv_net, product, ...) or any torchvision model name
    _target_: str | None = None  # dotted path of any nn.Module class or factory; replaces name
    kwargs: dict = field(default_factory=dict)  # constructor arguments
    weights: str | None = None  # torchvision weights name (needs them cached); null = random init, no network
    checkpoint: str | None = None  # local .safetensors or state_dict file (loaded with weights_only=True)


@dataclass
class DataConfig:
    kind: str = "auto"  # auto (the model's own input), none, random, fake, images, custom, torchvision, tokens, text
    shape: list = field(default_factory=lambda: [3, 32, 32])  # one sample's shape (random, fake)
    num_classes: int = 10  # label range for random/fake data
    size: int = 64  # number of samples in FakeData
    root: str | None = None  # image folder (flat, or ImageFolder class subfolders)
    image_size: list | None = None  # resize images to [H, W]
    normalize: Any = False  # true: ImageNet mean/std; or {mean: [...], std: [...]}
    seed: int = 0  # seed of the random inputs (and of shuffling)
    _target_: str | None = None  # custom: dotted path of a Dataset class or factory
    kwargs: dict = field(default_factory=dict)  # custom/torchvision: constructor arguments
    name: str | None = None  # torchvision: dataset class name (MNIST, CIFAR10, ...)
    num_workers: int = 0  # custom/torchvision: DataLoader workers
    shuffle: bool = False  # custom/torchvision: shuffle (seeded by seed)
    vocab_size: int | None = None  # tokens: ids in [0, vocab_size); null = the model's config.vocab_size
    seq_len: int = 16  # tokens: sequence length; text: truncation length
    path: str | None = None  # text: a text file, one sample per line
    tokenizer: str | None = None  # text: a local folder saved by tokenizer.save_pretrained()


@dataclass
class GenerateConfig:
    """runner.generate: generate's settings, typed so ``runner.generate.temperature=0.7`` is the one
    spelling on the command line. Every field null (the default): no generation, a plain forward.
    hookgraph/runner/generate.py checks the values (GENERATE_KEYS) and needs max_new_tokens."""

    max_new_tokens: int | None = None  # tokens to generate per prompt (>= 1); set: each step generates
    min_new_tokens: int | None = None
    do_sample: bool | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    repetition_penalty: float | None = None
    num_beams: int | None = None
    use_cache: bool | None = None
    seed: int | None = None  # torch.manual_seed(seed + step) before each step's generate (the caller's RNG restored)
    eos_token_id: int | None = None
    pad_token_id: int | None = None


@dataclass
class RunnerConfig:
    device: str = "auto"  # auto, cpu, cuda, cuda:N, mps
    dtype: str = "float32"  # float32, float64, bfloat16, float16: model and inputs
    autocast: str | None = None  # null, bf16 or fp16: mixed precision via torch.autocast
    seed: int = 0  # torch.manual_seed before the model is built
    steps: int = 1  # forward(/backward) passes
    batch_size: int = 1  # per rank under torchrun: the global batch is batch_size * world size
    mode: str = "eval"  # eval (default: BatchNorm statistics stay as they are, any batch size works) or train
    backward: bool = True  # false: forward only, under torch.no_grad()
    # sum, mean (of the logits), cross_entropy (needs labels), target_class, model (its .loss), lm (next token)
    loss: str = "sum"
    target_class: int = 0  # the class whose score is the loss when loss=target_class
    # null, loss, {name: logit_diff, correct, wrong}, {name: logprob, token}, {_target_: fn}: summary.json's metric
    metric: Any = None
    optimizer: str | None = None  # null, sgd, adam or adamw: step after each backward
    lr: float = 0.01  # the optimizer's learning rate, finite and >= 0
    # the optimizer's weight_decay: L2 in the gradient for sgd/adam, decoupled for adamw (0 here, not AdamW's 0.01)
    weight_decay: float = 0.0
    progress: bool = True  # a progress bar over steps (tqdm; hidden when not a terminal)
    compile: bool = False  # run the model under torch.compile; traceable hooks are traced into it
    compile_backend: str = "inductor"  # torch.compile backend (inductor, aot_eager, ...): a registered one
    distributed: str = "none"  # none, ddp (DistributedDataParallel) or fsdp (fully_shard); see the README
    shard: list = field(default_factory=list)  # fsdp: module class names fully_shard wraps, e.g. [BasicBlock]
    # ddp: DistributedDataParallel(find_unused_parameters=...); null: on when a spec may replace a forward value
    find_unused_parameters: bool | None = None
    dist_timeout_s: float = 300.0  # process group timeout: no rank waits longer on a collective
    # generate's settings {max_new_tokens, do_sample, temperature, top_k, top_p, seed, ...} (all null: off): each
    # step generates from its batch with the hooks on (positions: in the whole sequence); writes generations.jsonl
    generate: GenerateConfig | None = field(default_factory=GenerateConfig)
    # null, or {clean: [[token ids]], target: glob, at: forward|forward_pre, heads: bool}: after the steps,
    # attribution patching of the last batch (corrupted) against clean, on runner.metric; patching.csv/png
    attribution: Any = None
    # null, true, or {top, blocks, norm, unembed}: before the steps, the logit lens of the first batch (each
    # block's residual through the final norm and unembedding); logit_lens.csv and figures/logit_lens.png
    logit_lens: Any = None


@dataclass
class GradcamConfig:
    """The keys of ``sink.gradcam`` and their defaults."""

    activations: str = "activations"  # spec that records the target's output (at: forward, action: record)
    gradients: str = "gradients"  # spec that records the gradient of that output (at: output_grad, action: record)
    target: str = MISSING  # the layer both specs record, e.g. layer4


@dataclass
class SinkConfig:
    figures: bool = True  # write figures/ for records and stats (matplotlib, headless)
    feature_maps: list = field(default_factory=lambda: [0])  # which recorded 4-D targets (by record order) get a grid
    histograms: bool = True  # one histogram figure per record spec
    max_bytes: int | None = None  # stop the run with an error before records exceed this size
    # when record shards reach the disk: step (fsync each shard as written), end (once, before
    # summary.json lists them: the default) or never (the OS writes them back in its own time)
    fsync: str = "end"
    # figures/gradcam_<target>.png over the first step's input (with figures): a mapping with
    # GradcamConfig's keys. Typed Any because OmegaConf cannot merge a command-line mapping into
    # a None structured node (an AttributeError); run() checks the keys and fills the defaults.
    gradcam: Any = None
    weights: bool = False  # write the model's weights after the last step to model.safetensors (a training run)
    tensorboard: bool = False  # also write stats and records to tensorboard/ (pip install hookgraph[tensorboard])
    # record specs whose last step's values the end of the run prints (the numbers a tutorial exists to show)
    show: list = field(default_factory=list)


@dataclass
class HookgraphConfig:
    model: ModelConfig = field(default_factory=ModelConfig)  # the network to build
    data: DataConfig = field(default_factory=DataConfig)  # the batches it is fed
    runner: RunnerConfig = field(default_factory=RunnerConfig)  # how the steps run
    sink: SinkConfig = field(default_factory=SinkConfig)  # what is written besides the records
    hooks: dict = field(default_factory=dict)  # spec name -> spec (see the README's spec reference)
    dry_run: bool = False  # print the compiled plan and stop, without running the model
    list_targets: str | None = None  # a glob: print the model's matching names, types and shapes, and stop
    list_params: bool = False  # with list_targets: list parameters instead of modules
    ops: bool = False  # with list_targets: one forward on the data, listing each module's op calls


def register_configs() -> None:
    """Register the schema that conf/config.yaml names first in its defaults list: every
    group's values are then validated against these dataclasses (unknown keys and wrong
    types fail with the full key)."""
    cs = ConfigStore.instance()
    cs.store(name="hookgraph_schema", node=HookgraphConfig)


def check_known_keys(cfg: Mapping[str, Any], *, skip: Collection[str] = ("data",)) -> None:
    """Refuse a key that no field of :class:`HookgraphConfig` has (one a ``+`` override added:
    ``+runner.stpes=5``, ``+unknown_key=1``), naming it and the nearest valid keys.

    Sections typed ``dict`` or ``Any`` (``hooks``, ``model.kwargs``, ``runner.metric``, ...)
    are open and not looked into; ``hydra`` is Hydra's own. ``skip``: top-level sections checked
    elsewhere (``data``: the data kind refuses a key no registered kind has, naming its own keys).
    """
    _check_keys(cfg, HookgraphConfig, "", frozenset(skip) | {"hydra"})
    # The open sections and ``data`` (skipped above) are resolved here too, so that a cyclic
    # interpolation there (``data.shape=${data.shape}``, ``+model.kwargs.x=${model.kwargs.x}``)
    # is this one message, not OmegaConf's traceback from whichever builder reads it first.
    # ``hooks`` is left to the spec compiler, which names every bad spec field at once.
    if isinstance(cfg, DictConfig):
        for name in list(cfg.keys()):
            if str(name) not in ("hydra", "hooks") and str(name) in HookgraphConfig.__dataclass_fields__:
                _resolve_all(cfg, name, str(name))


def _unresolvable(node: Any, key: Any, full: str, exc: OmegaConfBaseException) -> ConfigError:
    """The ConfigError for ``node[key]`` whose interpolation does not resolve: its ``${...}`` text."""
    inner = node._get_node(key) if isinstance(node, (DictConfig, ListConfig)) else None
    raw = inner._value() if isinstance(inner, Node) else None  # the ${...} text, unresolved
    return ConfigError(full, f"cannot resolve {raw!r}: {str(exc).splitlines()[0]}")


def _resolve_all(node: DictConfig, key: Any, full: str) -> None:
    """Resolve ``node[key]`` and everything under it, walked without recursion; a value left
    ``???`` is skipped (the section's own check names it better)."""
    stack: list[tuple[DictConfig | ListConfig, Any, str]] = [(node, key, full)]
    while stack:
        parent, k, at = stack.pop()
        if OmegaConf.is_missing(parent, k):
            continue
        try:
            child = parent[k]
        except OmegaConfBaseException as exc:
            raise _unresolvable(parent, k, at, exc) from exc
        if isinstance(child, DictConfig):
            stack.extend((child, c, f"{at}.{c!s}") for c in child.keys())
        elif isinstance(child, ListConfig):
            stack.extend((child, i, f"{at}[{i}]") for i in range(len(child)))


def _check_keys(node: Mapping[str, Any], schema: type, prefix: str, skip: Collection[str]) -> None:
    hints = _hints(schema)
    names = [f.name for f in dataclasses.fields(schema)]
    for key in list(node.keys()):
        name = str(key)
        full = f"{prefix}{name}"
        if full in skip:
            continue
        if name not in hints:
            what = f"valid keys of {prefix[:-1]}" if prefix else "valid top-level keys"
            raise ConfigError(full, f"unknown key; {did_you_mean(name, names, what)}")
        try:
            child = node[key]  # resolves an interpolation here: a cyclic one is a ConfigError, not a traceback
        except OmegaConfBaseException as exc:
            raise _unresolvable(node, key, full, exc) from exc
        sub = hints[name]
        optional = [a for a in typing.get_args(sub) if a is not type(None)]
        if len(optional) == 1 and len(typing.get_args(sub)) == 2:  # X | None: the keys are X's
            sub = optional[0]
        if dataclasses.is_dataclass(sub) and isinstance(sub, type) and isinstance(child, Mapping):
            _check_keys(child, sub, f"{full}.", skip)


@functools.cache
def _hints(schema: type) -> dict[str, Any]:
    """The schema class's field types: typing evaluates the (postponed) annotations anew at every
    call, ~0.5 ms a class, and each key of every composed file asks."""
    return typing.get_type_hints(schema)


def _field_type(path: list[str]) -> Any:
    """The schema's type of a dotted key, or None where the key is not a field (or lies in an open section)."""
    schema: Any = HookgraphConfig
    for name in path:
        if not (dataclasses.is_dataclass(schema) and isinstance(schema, type)):
            return None
        hint = _hints(schema).get(name)
        if hint is None:
            return None
        schema = hint
    return schema


def _not_bool(full: str, value: Any) -> ConfigError:
    return ConfigError(full, f"expected true or false, got {value!r} (a boolean is never read from a number or a word)")


def check_booleans(raw: Any, overrides: Collection[str] | None = None) -> None:
    """Boolean fields hold booleans. OmegaConf reads ``2``, ``"yes"`` or ``"on"`` into a bool
    field as true when merging over the schema, so this looks at what was given before the
    merge: ``raw`` (a plain mapping passed to ``runner.run``) and the command line's
    ``overrides`` (``runner.compile=2``). ConfigError naming the key."""
    if isinstance(raw, Mapping) and not isinstance(raw, DictConfig):
        stack: list[tuple[Mapping, list[str]]] = [(raw, [])]
        while stack:
            node, path = stack.pop()
            for k, v in node.items():
                sub = [*path, str(k)]
                kind = _field_type(sub)
                if kind is bool and not isinstance(v, bool) and not _interpolation(v):
                    raise _not_bool(".".join(sub), v)
                if isinstance(v, Mapping) and dataclasses.is_dataclass(kind):
                    stack.append((v, sub))
    for o in overrides or ():
        key, eq, value = str(o).lstrip("+~").partition("=")
        if eq and _field_type(key.split(".")) is bool and value.strip().lower() not in ("true", "false") \
                and not _interpolation(value):
            raise _not_bool(key, value)


def _interpolation(v: Any) -> bool:
    return isinstance(v, str) and v.strip().startswith("${")
