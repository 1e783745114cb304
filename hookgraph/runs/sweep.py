"""A sweep folder's table: one row per job, from the rows the jobs returned or their run folders.

Public names: inside_sweep, sweep_rows, job_folders, returned_rows, job_return_row, write_job_return.

``sweep.csv`` (written by the Hydra callback :class:`hookgraph.cli.callbacks.SweepTable`) holds
one row per job with its overrides and headline figures (status, steps, loss, records per
spec, and for each stats spec its min, max and mean norm at the last step). A job that failed
is a row with its status and error; a job whose folder or summary is missing is a row saying
``missing``; a job whose files are damaged, a row saying ``unreadable`` and which file.

A job folder is a subfolder of the sweep folder that holds Hydra's ``.hydra/`` (its number
is ``hydra.job.num`` in ``.hydra/hydra.yaml``) or is named with a number: ``hydra.sweep.subdir``
need not be ``${hydra.job.num}``.

The rows come from the jobs' returned results. Hydra hands a launcher's ``JobReturn``s to the
sweeper and no further: the end of a multirun sees none of them, and a custom sweeper would
replace the user's (optuna, ...). What every launcher does run is ``on_job_end(job_return)``
in the job's own process (the driver for the basic launcher, a SLURM node for submitit, a Ray
worker). So each job writes its row there (:func:`write_job_return`), built from its
``JobReturn`` (status, overrides, the value the task returned, Hydra's job id) and its own run
folder, into the sweep folder: ``job_returns/<num>.json``. The sweep folder is absolute
(``${hookgraph.launch_dir:}``), so the driver finds every row where the jobs wrote it, whatever
working directory each job had; a job that wrote no row (killed, or its process died) is read
from its folder, or is ``missing``.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, JobStatus

from hookgraph.runs import layout
from hookgraph.runs.files import DamagedFileError, read_config, read_csv, read_json, read_overrides
from hookgraph.runs.writer import atomic_write

__all__ = ["inside_sweep", "sweep_rows", "job_folders", "returned_rows", "job_return_row", "write_job_return"]

log = logging.getLogger("hookgraph")

_ERROR_CHARS = 200  # a row's error is a table cell: the start of the message


def _job_num(folder: Path) -> int | None:
    """A job folder's number: ``hydra.job.num`` as Hydra saved it, else the folder's name."""
    try:
        num = _select(read_config(folder / layout.HYDRA_JOB), "hydra.job.num")
        if isinstance(num, int) and not isinstance(num, bool):
            return num
    except Exception:  # a damaged file: the name may still tell
        pass
    return int(folder.name) if folder.name.isdigit() else None


def inside_sweep(sweep_dir: Path, folder: Path) -> bool:
    """Whether ``folder`` lies inside ``sweep_dir`` once ``..`` and links are resolved: the only
    job folders a sweep's table may send a reader (or the report's writer) to."""
    try:
        return Path(folder).resolve().is_relative_to(Path(sweep_dir).resolve())
    except (OSError, RuntimeError):  # a link loop
        return False


def job_folders(sweep_dir: Path) -> tuple[dict[int, Path], list[Path]]:
    """A sweep's job folders: those holding ``.hydra/`` at any depth (``hydra.sweep.subdir`` may
    hold a ``/``) and the numbered ones, as {job number: folder} and those without a number."""
    numbered: dict[int, Path] = {}
    unnumbered: list[Path] = []
    if not sweep_dir.is_dir():
        return numbered, unnumbered
    for root, dirs, _ in os.walk(sweep_dir):
        here = Path(root)
        if here == sweep_dir:
            candidates = [d for d in dirs if (here / d / layout.HYDRA).is_dir() or d.isdigit()]
        else:
            candidates = [d for d in dirs if (here / d / layout.HYDRA).is_dir()]
        for d in sorted(candidates):
            num = _job_num(here / d)
            if num is None or num in numbered:
                unnumbered.append(here / d)
            else:
                numbered[num] = here / d
        # A job folder's own subfolders (records/, .hydra/) are not jobs: do not walk them.
        dirs[:] = [d for d in dirs if d not in candidates and d != layout.HYDRA]
    return numbered, unnumbered


def sweep_rows(sweep_dir: Path, expected: list[str] | None = None) -> list[dict[str, Any]]:
    """One row per job of a sweep: its folder (see :func:`job_folders`), or ``status: missing``.

    ``expected``: each job's overrides in job order, when known; otherwise the jobs are the
    numbered folders, and a gap in the numbers is a missing job. A job folder whose number
    cannot be read is a row of its own (``status: unreadable``) after the numbered ones.
    """
    returned = returned_rows(sweep_dir)
    found, unnumbered = job_folders(sweep_dir)
    count = max(len(expected or []), max(found, default=-1) + 1, max(returned, default=-1) + 1)
    rows = []
    for num in range(count):
        row: dict[str, Any] = {"job": num}
        if expected and num < len(expected):
            row["overrides"] = expected[num]
        if num in returned:
            rows.append({**row, **returned[num]})
            continue
        job = found.get(num)
        if job is None:
            row.update(status="missing", error="no job folder")
            rows.append(row)
            continue
        if not inside_sweep(sweep_dir, job):  # a link out of the sweep: another run's numbers, not this job's
            row.update(status="unreadable", error=f"{job.name} links to a folder outside the sweep; not read")
            rows.append(row)
            continue
        rows.append(_job_row(job, row))
    reported = {str(r.get("folder")) for r in returned.values()}
    for job in unnumbered:
        if job.relative_to(sweep_dir).as_posix() in reported:
            continue
        rows.append(
            {
                "job": job.relative_to(sweep_dir).as_posix(),
                "status": "unreadable",
                "error": f"{layout.HYDRA_JOB}: no hydra.job.num",
            }
        )
    return rows


def returned_rows(sweep_dir: Path) -> dict[int, dict[str, Any]]:
    """{job number: row} of the rows the jobs wrote when they ended (``job_returns/<num>.json``).
    An unreadable file is a row saying so: the job ran, its table row is damaged."""
    rows: dict[int, dict[str, Any]] = {}
    folder = Path(sweep_dir) / layout.JOB_RETURNS
    if not folder.is_dir():
        return rows
    for path in sorted(folder.iterdir()):
        num = layout.job_return_num(path.name)
        if num is None:
            continue
        name = f"{layout.JOB_RETURNS}/{path.name}"
        try:
            row = read_json(path, dict) or {"status": "unreadable", "error": f"{name}: removed while read"}
        except DamagedFileError as exc:
            row = {"status": "unreadable", "error": f"{name}: {exc.reason}"[:_ERROR_CHARS]}
        row["job"] = num
        rows[num] = row
    return rows


def _select(config: Any, key: str, default: Any = None) -> Any:
    """``config``'s value at a dotted ``key`` (nested mappings), or ``default`` where a level is missing."""
    for name in key.split("."):
        if not isinstance(config, Mapping) or name not in config:
            return default
        config = config[name]
    return config


def job_return_row(config: Mapping[str, Any], job_return: JobReturn, error: str | None = None) -> dict[str, Any]:
    """A job's row of sweep.csv, in the job's process: what its launcher returns (status,
    overrides, the task's return value, Hydra's job id) and its run folder's headlines.
    ``error``: why the job failed, as the job said it; where its summary does not say
    (a config check before the summary was written), the row is failed with it. ``config``:
    the job's ``hydra`` settings as plain values (``hydra.job.num``, ``hydra.job.id``,
    ``hydra.runtime.output_dir``, ``hydra.runtime.cwd``, ``hydra.sweep.dir``)."""
    num = int(_select(config, "hydra.job.num"))
    out_dir = Path(str(_select(config, "hydra.runtime.output_dir")))
    row: dict[str, Any] = {"job": num, "overrides": " ".join(str(o) for o in job_return.overrides or [])}
    row = _job_row(out_dir, row)
    # JobReturn.return_value re-raises a failed job's exception; the field holds it.
    value = job_return._return_value
    if job_return.status == JobStatus.FAILED:
        if row.get("status") in (None, "missing", "completed"):  # the summary does not say why
            row["status"] = "failed"
            row["error"] = f"{type(value).__name__}: {value}"[:_ERROR_CHARS]
    elif error is not None and row.get("status") in (None, "missing"):
        row["status"] = "failed"
        row["error"] = error[:_ERROR_CHARS]
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        row["objective"] = float(value)  # what the task returned: a sweeper's objective
    row["job_id"] = str(_select(config, "hydra.job.id", "") or "")
    row["host"] = socket.gethostname()
    try:
        folder = out_dir.relative_to(_job_sweep_dir(config)).as_posix()
    except ValueError:  # hydra.sweep.subdir may be absolute
        folder = str(out_dir)
    if folder != str(num):
        row["folder"] = folder
    return row


def _job_sweep_dir(config: Mapping[str, Any]) -> Path:
    """The sweep folder as a job sees it, absolute. A relative one (basic and joblib launchers
    only) means the folder under the sweep's working directory (``hydra.runtime.cwd``), not
    under the job's: with ``hydra.job.chdir=true`` the job runs inside its own folder."""
    sweep = Path(str(_select(config, "hydra.sweep.dir")))
    if sweep.is_absolute():
        return sweep
    return Path(str(_select(config, "hydra.runtime.cwd") or os.getcwd())) / sweep


def write_job_return(config: Mapping[str, Any], job_return: JobReturn, error: str | None = None) -> Path:
    """``job_returns/<num>.json`` in the sweep folder: the job's row, written atomically;
    ``error``: why the job failed, as it said (see :func:`job_return_row`)."""
    row = job_return_row(config, job_return, error)
    path = _job_sweep_dir(config) / layout.job_return(row["job"])
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(row, indent=1, default=str).encode())
    return path


def _job_row(job: Path, row: dict[str, Any]) -> dict[str, Any]:
    """``row`` with what a job's folder says: its overrides, and its summary's headlines."""
    num = row["job"]
    try:
        listed = read_overrides(job / layout.OVERRIDES)
    except DamagedFileError as exc:  # one damaged file must not cost the sweep its table
        row.update(status="unreadable", error=f"{layout.OVERRIDES}: {exc.reason}"[:_ERROR_CHARS])
        return row
    if listed is not None:
        row["overrides"] = " ".join(listed)
    try:
        s = read_json(job / layout.SUMMARY, dict)
    except DamagedFileError as exc:
        row.update(status="unreadable", error=f"{layout.SUMMARY}: {exc.reason}"[:_ERROR_CHARS])
        return row
    if s is None:
        row.update(status="missing", error=f"no {layout.SUMMARY} (the job was killed, or never started)")
        return row
    row.update(status=s.get("status"), steps=s.get("steps"), loss=s.get("loss"), device=s.get("device"))
    if "metric" in s:
        row["metric"] = s["metric"]
    if "generation" in s:  # runner.generate: the job's first generation, side by side with its overrides
        row["generation"] = s["generation"]
    run_s = (s.get("timings") or {}).get("run_s")
    if isinstance(run_s, (int, float)):
        row["run_s"] = round(run_s, 4)
    for spec, counts in (s.get("specs") or {}).items():
        row[f"{spec}.records"] = counts.get("records")
    try:
        row.update(_stat_headlines(job))
    except Exception as exc:  # a damaged table must not hide the other jobs
        log.warning("job %s: no stats headline: %s", num, exc)
    if "error" in s:
        row["error"] = str((s["error"] or {}).get("message", ""))[:_ERROR_CHARS]
    return row


def _stat_headlines(job: Path) -> dict[str, float]:
    """Per stats spec, over its targets at the job's last step: the smallest min, the largest
    max and the mean norm (what a sweep over a clamp or a scale moves)."""
    rows = read_csv(job / layout.STATS)
    if not rows:
        return {}
    last = max(r["step"] for r in rows)
    out: dict[str, float] = {}
    for spec in dict.fromkeys(r["spec"] for r in rows):
        mine = [r for r in rows if r["spec"] == spec and r["step"] == last]
        out[f"{spec}.min"] = min(r["min"] for r in mine)
        out[f"{spec}.max"] = max(r["max"] for r in mine)
        out[f"{spec}.norm"] = sum(r["norm"] for r in mine) / len(mine)
    return out
