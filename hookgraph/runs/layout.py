"""The run folder's contract: every file and folder a run folder or a sweep folder can hold,
named here once. Whatever writes or reads a run folder (the runner, :mod:`hookgraph.runs.writer`,
:mod:`hookgraph.runs.reader`, the sweep table, the report pages, the figures) takes its names
from this module; a new file of a run folder is a constant and an :class:`Entry` here (a test
fails when a name from here is spelled out anywhere else in the package).

Public names: Entry, RUN_FOLDER, SWEEP_FOLDER, RUN_CONTENT, entry, renamed, MARKER, RESERVE, SUMMARY,
PLAN, MODULES, PLAN_SVG, STATS, TRACE, RECORDS, RANKS, FIGURES, TENSORBOARD, REPORT, HYDRA,
CONFIG, OVERRIDES, HYDRA_JOB, LOG, SWEEP_TABLE, SWEEP_FIGURE, JOB_RETURNS, PATCHING_TABLE,
PATCHING_FIGURE, MULTIRUN, SHARD_SUFFIX, FIGURE_SUFFIX, STATS_FIGURE, LENS_TABLE, LENS_FIGURE, shard_name, rank_folder,
rank_of, rank_file, rank_records, job_return, job_return_num, hist_figure, fmap_figure,
pattern_figure, gradcam_figure.

A run folder (``runs/<date>/<time>`` by default)::

    .hookgraph            the claim: written first, exclusively (a second run in the folder fails)
    .reserve              room kept for summary.json on a disk that fills up (removed at the end)
    summary.json          status, steps, losses, timings, error, per-spec counts
    plan.json             the bindings (spec, target, type, at, action, order, when)
    modules.json          the model's module tree
    plan.svg              the plan drawn on the module tree
    generations.jsonl     runner.generate: one line per generated sample (prompt, generated ids, text)
    stats.csv, trace.csv  the tables of the stats and trace-style actions
    records/              one safetensors shard per step (step-000003.safetensors); each
                          shard indexes itself in its metadata, there is no index file
    ranks/rank-N/         a torchrun run: each rank's summary.json, stats.csv, trace.csv
                          (its shards are in records/rank-N/)
    figures/              PNG figures (hist_<spec>.png, fmap_..., gradcam_..., stats_over_steps.png)
    tensorboard/          event files (sink.tensorboard)
    report.html           the run's page
    .hydra/               Hydra's: config.yaml, overrides.yaml, hydra.yaml
    hookgraph.log         Hydra's job log

A sweep folder (``runs/multirun/<date_time>``): ``sweep.csv``, ``sweep.png``, ``report.html``,
``job_returns/<num>.json``, ``patching.csv`` and ``patching.png`` (a layer x position sweep),
Hydra's ``multirun.yaml``, and one run folder per job (``hydra.sweep.subdir``, ``<num>`` by default).

Names are relative paths with ``/`` (``.hydra/config.yaml``): ``root / name`` is the file.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "Entry", "RUN_FOLDER", "SWEEP_FOLDER", "RUN_CONTENT", "entry", "renamed",
    "MARKER", "RESERVE", "SUMMARY", "PLAN", "MODULES", "PLAN_SVG", "STATS", "TRACE", "RECORDS", "RANKS", "FIGURES",
    "TENSORBOARD", "REPORT", "GENERATIONS", "HYDRA", "CONFIG", "OVERRIDES", "HYDRA_JOB", "LOG",
    "SWEEP_TABLE", "SWEEP_FIGURE", "JOB_RETURNS", "PATCHING_TABLE", "PATCHING_FIGURE", "MULTIRUN",
    "SHARD_SUFFIX", "FIGURE_SUFFIX", "STATS_FIGURE", "LENS_TABLE", "LENS_FIGURE",
    "shard_name", "rank_folder", "rank_of", "rank_file", "rank_records", "job_return", "job_return_num",
    "hist_figure", "fmap_figure", "pattern_figure", "gradcam_figure",
]


@dataclass(frozen=True)
class Entry:
    """One file or folder of a run folder (or a sweep folder).

    ``name``: its path relative to the folder; ``holds``: what it holds; ``writer``: who
    writes it; ``always``: whether every run has it (False: ``when`` says when it is there);
    ``folder``: a folder, not a file; ``hookgraph``: written by hookgraph (not Hydra), so a
    folder holding it is a run folder (:data:`RUN_CONTENT`); ``renamed``: for a table, the
    columns named otherwise in memory and in folders written before hookgraph 0.1 settled
    the name, as ``(old, new)`` pairs: the writer writes ``new``, the reader reads either."""

    name: str
    holds: str
    writer: str
    always: bool
    when: str = ""
    folder: bool = False
    hookgraph: bool = True
    renamed: tuple[tuple[str, str], ...] = ()


# -- a run folder ------------------------------------------------------------------------

MARKER = ".hookgraph"
RESERVE = ".reserve"
SUMMARY = "summary.json"
PLAN = "plan.json"
MODULES = "modules.json"
PLAN_SVG = "plan.svg"
STATS = "stats.csv"
TRACE = "trace.csv"
RECORDS = "records"
RANKS = "ranks"
FIGURES = "figures"
TENSORBOARD = "tensorboard"
REPORT = "report.html"
WEIGHTS = "model.safetensors"
HYDRA = ".hydra"
CONFIG = f"{HYDRA}/config.yaml"
OVERRIDES = f"{HYDRA}/overrides.yaml"
HYDRA_JOB = f"{HYDRA}/hydra.yaml"
GENERATIONS = "generations.jsonl"
LENS_TABLE = "logit_lens.csv"
LOG = "hookgraph.log"  # Hydra's ${hydra.job.name}.log; conf/config.yaml names the job hookgraph

SHARD_SUFFIX = ".safetensors"
FIGURE_SUFFIX = ".png"
STATS_FIGURE = "stats_over_steps.png"
LENS_FIGURE = "logit_lens.png"  # under FIGURES

# A hook point is ``at`` everywhere (a spec, plan.json, graph.stats / graph.rows, the tables,
# summary.json); folders written before this name was settled say ``point`` in their tables.
_AT = (("point", "at"),)

RUN_FOLDER: tuple[Entry, ...] = (
    # In this order in messages that list what a folder holds (run_content).
    Entry(MARKER, "the run's claim on the folder: JSON {hookgraph: version, pid, host}; a folder holding it "
          "belongs to a run, finished or not", "runner (lifecycle.claim_run_dir), first, by exclusive create",
          always=True),
    Entry(RESERVE, "bytes kept free for the summary: released when the disk is full, removed at the end",
          "RunWriter, when it opens the folder", always=False, when="while the run runs (or one killed left it)"),
    Entry(SUMMARY, "status, steps, losses, timings, error, per-spec counts, warnings; a torchrun run's "
          "merged over its ranks", "runner (loop._close), whatever happened", always=False,
          when="a run killed (SIGKILL) before it ended has none"),
    Entry(PLAN, "the bindings: [{spec, target, type, at, action, order, when}]", "runner (loop._compile), rank 0",
          always=False, when="once the specs compiled"),
    Entry(RECORDS, f"record shards, one per step: step-NNNNNN{SHARD_SUFFIX}, each indexing itself in its "
          "metadata; a torchrun run's in rank-N/ subfolders", "RunWriter.flush_records, every step",
          always=False, when="a record spec recorded something", folder=True),
    Entry(STATS, "one row per stats call: spec, target, at, step, call, the statistics; a torchrun run's "
          "with a rank column", "runner (loop._write_tables; ranks.merge_tables for torchrun)",
          always=False, when="a stats spec ran", renamed=_AT),
    Entry(TRACE, "one row per trace-style call (trace, check_finite with stop=false): spec, step, module, "
          "type, at, ...", "runner (loop._write_tables; ranks.merge_tables for torchrun)",
          always=False, when="a trace-style spec ran", renamed=_AT),
    Entry(MODULES, "the model's module tree: [{name, type, params}] in named_modules() order",
          "runner (loop._prepare), rank 0", always=False, when="once the model was built"),
    Entry(PLAN_SVG, "the plan drawn on the module tree", "runner (loop._compile, report.write_plan_svg)",
          always=False, when="once the specs compiled"),
    Entry(REPORT, "the run's page, self-contained", "runner (loop._close, report.write_report); "
          "python -m hookgraph report", always=False, when="after summary.json, unless only listing targets"),
    Entry(FIGURES, f"PNG figures: hist_<spec>{FIGURE_SUFFIX}, fmap_<spec>_<i>_<target>{FIGURE_SUFFIX}, "
          f"attn_<spec>_<target>{FIGURE_SUFFIX} (attention patterns), "
          f"gradcam_<target>{FIGURE_SUFFIX}, {STATS_FIGURE}", "runner (report.figures.write_figures), rank 0",
          always=False, when="sink.figures and something to draw", folder=True),
    Entry(WEIGHTS, "the model's weights after the last step (its state_dict, tied tensors saved under each "
          "name): what a training run made", "runner (outputs.write_weights), rank 0", always=False,
          when="sink.weights"),
    Entry(TENSORBOARD, "TensorBoard event files: stats as scalars, records as histograms",
          "runner (writer.TensorBoardSink), rank 0", always=False, when="sink.tensorboard", folder=True),
    Entry(GENERATIONS, "one JSON line per generated sample: step, row, prompt_ids, generated_ids, prompt and "
          "text (with data.tokenizer), metric", "runner (runner.generate.Generator.write), every step",
          always=False, when="runner.generate"),
    Entry(LENS_TABLE, "the logit lens of the first batch: layer, position, next_logprob, top_ids, top_probs, "
          f"metric (figure: {FIGURES}/{LENS_FIGURE})", "runner (runner.lens.lens_run), rank 0", always=False,
          when="runner.logit_lens"),
    Entry(RANKS, f"rank-N/ per rank of a torchrun run: its own {SUMMARY}, {STATS}, {TRACE}",
          "each rank (loop._close, loop._write_tables)", always=False, when="a run of several processes",
          folder=True),
    Entry(HYDRA, "Hydra's record of the job", "Hydra (run_job)", always=False, when="runs from the command line",
          folder=True, hookgraph=False),
    Entry(CONFIG, "the resolved config (Run.config)", "Hydra", always=False, when="runs from the command line",
          hookgraph=False),
    Entry(OVERRIDES, "the command line's overrides, a YAML list", "Hydra", always=False,
          when="runs from the command line", hookgraph=False),
    Entry(HYDRA_JOB, "Hydra's own config; hydra.job.num numbers a sweep's job", "Hydra", always=False,
          when="runs from the command line", hookgraph=False),
    Entry(LOG, "the job's log", "Hydra (job logging)", always=False, when="runs from the command line",
          hookgraph=False),
)

# -- a sweep folder ----------------------------------------------------------------------

SWEEP_TABLE = "sweep.csv"
SWEEP_FIGURE = "sweep.png"
JOB_RETURNS = "job_returns"
PATCHING_TABLE = "patching.csv"
PATCHING_FIGURE = "patching.png"
MULTIRUN = "multirun.yaml"

SWEEP_FOLDER: tuple[Entry, ...] = (
    Entry(SWEEP_TABLE, "one row per job: overrides, status, steps, loss, metric, records per spec, "
          "stats headlines", "cli.callbacks.SweepTable (runs.sweep.sweep_rows), when the sweep ends",
          always=False, when="a sweep that ended"),
    Entry(JOB_RETURNS, "<num>.json per job: its row of the sweep table, written in the job's own process",
          "cli.callbacks.SweepTable.on_job_end (runs.sweep.write_job_return)", always=False,
          when="jobs that ended", folder=True),
    Entry(SWEEP_FIGURE, "runner.metric (else the loss) per job, labelled by the overrides that differ",
          "cli.callbacks.SweepTable (report.figures.sweep_figure)", always=False,
          when="a job has a loss"),
    Entry(REPORT, "the sweep's page", "cli.callbacks.SweepTable (report.write_sweep_report); "
          "python -m hookgraph report", always=False, when="a sweep that ended"),
    Entry(PATCHING_TABLE, "layer, position, metric, job, status per job", "report.patching_sweep.write_patching",
          always=False, when="a sweep over a layer and positions with runner.metric"),
    Entry(PATCHING_FIGURE, "the layer x position heatmap of the metric", "report.patching_sweep.write_patching",
          always=False, when="a sweep over a layer and positions with runner.metric"),
    Entry(MULTIRUN, "the sweep's config", "Hydra", always=True, hookgraph=False),
)

# What a run writes, in RUN_FOLDER's order: a folder holding any of them holds a run, and a new
# run refuses it. Not the log: Hydra writes the current run's log before the runner looks.
RUN_CONTENT: tuple[str, ...] = tuple(e.name for e in RUN_FOLDER if e.hookgraph)

_BY_NAME = {e.name: e for e in (*SWEEP_FOLDER, *RUN_FOLDER)}  # a run's report.html, not the sweep's


def entry(name: str) -> Entry:
    """The entry of ``name``: a layout name, or a rank's copy of one (``ranks/rank-1/stats.csv``)."""
    found = _BY_NAME.get(name) or _BY_NAME.get(name.rsplit("/", 1)[-1])
    if found is None:
        raise KeyError(f"{name!r} is not a file of a run folder; the files: {', '.join(_BY_NAME)}")
    return found


def renamed(name: str) -> dict[str, str]:
    """A table's columns named otherwise in memory and in older folders: ``{old: new}`` (empty
    for a file that is not a table of this layout, e.g. one a user writes with RunWriter)."""
    found = _BY_NAME.get(name) or _BY_NAME.get(name.rsplit("/", 1)[-1])
    return dict(found.renamed) if found is not None else {}


# -- names with a number in them -----------------------------------------------------------


def shard_name(step: int) -> str:
    """The file of one step's records, inside ``records/`` (or ``records/rank-N/``)."""
    return f"step-{step:06d}{SHARD_SUFFIX}"


_RANK = "rank-"


def rank_folder(rank: int) -> str:
    """A rank's own subfolder name, inside ``ranks/`` and ``records/``."""
    return f"{_RANK}{rank}"


def rank_of(folder_name: str) -> int | None:
    """The rank a subfolder of ``ranks/`` or ``records/`` belongs to (None: not a rank's)."""
    number = folder_name.removeprefix(_RANK)
    return int(number) if number != folder_name and number.isdigit() else None


def rank_file(rank: int, name: str) -> str:
    """A rank's own copy of a run-folder file: ``ranks/rank-N/<name>``."""
    return f"{RANKS}/{rank_folder(rank)}/{name}"


def rank_records(rank: int) -> str:
    """A rank's record shards: ``records/rank-N``."""
    return f"{RECORDS}/{rank_folder(rank)}"


def job_return(num: int | str) -> str:
    """A job's returned row, in the sweep folder: ``job_returns/<num>.json``."""
    return f"{JOB_RETURNS}/{num}.json"


def job_return_num(file_name: str) -> int | None:
    """The job number of a file in ``job_returns/`` (None: not a job's row)."""
    stem, dot, suffix = file_name.rpartition(".")
    return int(stem) if dot and suffix == "json" and stem.isdigit() else None


def hist_figure(spec: str) -> str:
    """Inside ``figures/``: the histograms of a spec's first records (``spec`` made file-safe)."""
    return f"hist_{spec}{FIGURE_SUFFIX}"


def pattern_figure(spec: str, target: str) -> str:
    """Inside ``figures/``: the attention patterns of a target, a panel per head (both made file-safe)."""
    return f"attn_{spec}_{target}{FIGURE_SUFFIX}"


def fmap_figure(spec: str, index: int, target: str) -> str:
    """Inside ``figures/``: a feature-map grid (``spec`` and ``target`` made file-safe)."""
    return f"fmap_{spec}_{index:02d}_{target}{FIGURE_SUFFIX}"


def gradcam_figure(target: str) -> str:
    """Inside ``figures/``: the Grad-CAM overlay of ``target`` (made file-safe)."""
    return f"gradcam_{target}{FIGURE_SUFFIX}"
