"""``trtrepo tune``: search a model's serving config on the real server (issue 17).

What is searched (:func:`search_space`), within what the model and this machine allow:

* ``instance_count``: 1, 2, 4 ... up to twice the cores (CPU models) or 4 (GPU models);
* ``intra_op_threads``: ONNX Runtime's intra-op threads, 1, 2, 4 ... up to the cores (the
  backend's ``BackendSpec.threads_parameter``: the Python backend's ``intra_op_threads``, the
  onnxruntime backend's ``intra_op_thread_count``); not for TensorRT plans;
* ``max_queue_delay_us``: dynamic batching off, or on with these queue delays (models with a batch
  axis only);
* ``max_batch_size``: the config's own (the engine's or the deployment's limit) and a quarter of
  it, when dynamic batching is on.

How: the server runs in explicit model-control mode on a copy of the repository, and each
candidate is loaded through Triton's model-control API with its config as an override
(``load_model(name, config=...)``), so nothing restarts and the repository is not touched. Each
candidate is measured with the stability rule of ``validate`` (:mod:`trtrepo.measure`) at the
given concurrency. The quick search (:func:`coordinate_descent`) starts from the model's current
config and sweeps each knob once, in the order above, with the other knobs at the best so far
(a move must gain more than half of ``--stability-percentage``, the noise two runs of one config
show). One sweep, not a descent to convergence: measured on the demos and a trained encoder
(docs/benchmarks.md), second passes were taken only when the noise of a 2-core machine crossed
that margin, and found nothing the head-to-head rounds could tell apart. ``--exhaustive`` measures
the whole grid. Both stop at ``--budget-s``. Before the first candidate the server is loaded for
one measurement interval and nothing is recorded: the first seconds after a start are slower.

Objective: the highest throughput whose p99 is within ``--max-p99-ms`` (``throughput``), or the
lowest p99 (``latency``). The result: the report (``tune.json``, ``tune.md``, ``tune.png``: every
candidate's throughput against its p99, the Pareto front, the starting and the chosen config
marked), and with ``--apply`` the chosen config written as the model's ``config.pbtxt``
(atomically; the old text kept in the report).

Pure parts (:class:`Candidate`, :func:`search_space`, :func:`grid`, :func:`coordinate_descent`,
:func:`score`, :func:`choose`, :func:`confirmed`, :func:`pareto_front`, :func:`apply_candidate`) have no I/O.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from . import __version__
from .contracts import backends
from .cpu import available_cores
from .data import DataOptions
from .errors import OptionError, TrtrepoError, UsageError, one_line
from .fsutil import report_json, write_report
from .measure import Stability
from .modelio import ModelIO, TensorSpec
from .pngplot import png_figure
from .repository import read_config, replace_config
from .server import TritonServer
from .tritonconfig import parse_config_text
from .validate import TritonTarget, ValidateOptions, make_payloads
from .validate.contract import stats_diff

log = logging.getLogger(__name__)
LOAD_TIMEOUT_S = 120.0  # one candidate's load_model call and its readiness wait

OBJECTIVES = ("throughput", "latency")
SCHEMA = "trtrepo.tune/1"
QUEUE_DELAYS_US = (0, 500, 2000)
CONFIRM = 3  # best candidates measured a second time, beside the starting config


# --------------------------------------------------------------------------------------------
# Candidates and the search (pure)


@dataclass(frozen=True, order=True)
class Candidate:
    """One serving config: ``max_queue_delay_us`` None = dynamic batching off; ``threads`` None =
    not a knob of this backend."""

    instance_count: int
    threads: int | None
    max_queue_delay_us: int | None
    max_batch_size: int

    def label(self) -> str:
        th = "" if self.threads is None else f" x{self.threads}t"
        db = "no batching" if self.max_queue_delay_us is None else f"batch<={self.max_batch_size} delay {self.max_queue_delay_us}us"
        return f"{self.instance_count} inst{th}, {db}"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "dynamic_batching": self.max_queue_delay_us is not None, "label": self.label()}


def _powers(limit: int) -> list[int]:
    out, v = [], 1
    while v <= max(1, limit):
        out.append(v)
        v *= 2
    return out


def search_space(start: Candidate, *, cores: int, backend: str, gpu: bool, batching: bool) -> dict[str, list[Any]]:
    """Each knob's values, the starting value included."""
    axes: dict[str, list[Any]] = {
        "instance_count": sorted({*_powers(4 if gpu else 2 * cores), start.instance_count}),
        "threads": [None] if start.threads is None or _threads_parameter(backend) is None
        else sorted({*_powers(cores), start.threads}),
        "max_queue_delay_us": [None] if not batching else [None, *sorted({*QUEUE_DELAYS_US, *(
            [] if start.max_queue_delay_us is None else [start.max_queue_delay_us])})],
        "max_batch_size": [start.max_batch_size] if not batching or start.max_batch_size < 8
        else sorted({start.max_batch_size // 4, start.max_batch_size}),
    }
    return axes


def normalise(c: Candidate, start: Candidate) -> Candidate:
    """Without dynamic batching the batch limit does not matter: keep the starting one."""
    return replace(c, max_batch_size=start.max_batch_size) if c.max_queue_delay_us is None else c


def grid(axes: Mapping[str, Sequence[Any]], start: Candidate) -> list[Candidate]:
    """Every distinct candidate of the axes (the starting one first)."""
    out = [start]
    for values in itertools.product(*(axes[k] for k in ("instance_count", "threads", "max_queue_delay_us", "max_batch_size"))):
        c = normalise(Candidate(*values), start)
        if c not in out:
            out.append(c)
    return out


def score(result: Mapping[str, Any], objective: str, max_p99_ms: float | None) -> float:
    """Higher is better; -inf for a failed candidate or one over the p99 budget."""
    if result.get("error") or result.get("throughput") is None:
        return float("-inf")
    p99 = float(result["p99_ms"])
    if max_p99_ms is not None and p99 > max_p99_ms:
        return float("-inf")
    return float(result["throughput"]) if objective == "throughput" else -p99


def coordinate_descent(start: Candidate, axes: Mapping[str, Sequence[Any]],
                       evaluate: Callable[[Candidate], float], *, passes: int = 1, min_gain: float = 0.0,
                       out_of_time: Callable[[], bool] = lambda: False) -> Candidate:
    """From ``start``, one knob at a time (in ``axes`` order): measure each of its values with the
    other knobs at the best so far and keep the best; repeat while a pass improves (at most
    ``passes``; ``tune`` makes one). ``evaluate`` returns the score (higher is better) and is
    expected to cache. A candidate replaces the best only when it beats it by more than
    ``min_gain`` (a fraction of the best score): measurements on a busy machine differ by a few
    percent between two runs of one config, and following that noise costs a second pass and
    finds nothing."""
    best, best_score = start, evaluate(start)
    for _ in range(passes):
        improved = False
        for axis, values in axes.items():
            if len(values) < 2:
                continue
            for v in values:
                if out_of_time():
                    return best
                c = normalise(replace(best, **{axis: v}), start)
                s = evaluate(c)
                if s > best_score + min_gain * abs(best_score):
                    best, best_score, improved = c, s, True
        if not improved:
            break
    return best


def choose(final: Mapping[Candidate, float], start: Candidate, min_gain: float) -> Candidate:
    """The finalist with the best score; the starting config unless that one beats it by more
    than ``min_gain`` (the margin a move of the search needed)."""
    best = max(final, key=lambda c: (final[c], c == start))
    s0 = final.get(start, float("-inf"))
    if s0 > float("-inf") and final[best] <= s0 + min_gain * abs(s0):
        return start
    return best


def confirmed(results: Sequence[Mapping[str, Any]], c: Candidate) -> dict[str, Any]:
    """The candidate's confirmation-round result (the last one); an error if it has none."""
    rows = [r for r in results if r["candidate"] == c.to_dict() and r.get("round") == 2]
    return dict(rows[-1]) if rows else {"candidate": c.to_dict(), "error": "not confirmed"}


def combined(results: Sequence[Mapping[str, Any]], c: Candidate) -> dict[str, Any]:
    """A candidate's figures over its measurements: mean throughput and p99 (an error if any failed)."""
    rows = [r for r in results if r["candidate"] == c.to_dict()]
    if not rows or any(r.get("error") for r in rows):
        return {"candidate": c.to_dict(), "error": next((r.get("error") for r in rows if r.get("error")), "not measured"),
                "throughput": None}
    out = dict(rows[0])
    for key in ("throughput", "p50_ms", "p99_ms", "mean_ms"):
        out[key] = sum(float(r[key]) for r in rows) / len(rows)
    out["stable"] = all(r["stable"] for r in rows)
    out["measurements"] = len(rows)
    out.pop("round", None)
    return out


def pareto_front(results: Sequence[Mapping[str, Any]]) -> list[int]:
    """Indices of the candidates no other beats on both throughput (higher) and p99 (lower)."""
    ok = [(i, r) for i, r in enumerate(results) if not r.get("error") and r.get("throughput") is not None]
    front = []
    for i, r in ok:
        dominated = any(o["throughput"] >= r["throughput"] and o["p99_ms"] <= r["p99_ms"]
                        and (o["throughput"] > r["throughput"] or o["p99_ms"] < r["p99_ms"]) for _, o in ok)
        if not dominated:
            front.append(i)
    return front


# --------------------------------------------------------------------------------------------
# Configs (pure, on the protobuf message)


def backend_of(msg: Any) -> str:
    """The backend's name (``python``, ``onnxruntime``, ``tensorrt``: its ``--backend`` name, from
    :func:`trtrepo.contracts.backends.for_config`), else the backend/platform named in the config."""
    spec = backends.for_config(msg.platform, msg.backend)
    return spec.name if spec is not None else (msg.backend or msg.platform)


def _threads_parameter(backend: str) -> str | None:
    spec = backends.for_option(backend)
    return spec.threads_parameter if spec is not None else None


def start_candidate(msg: Any) -> Candidate:
    """The candidate a config is."""
    spec = backends.for_config(msg.platform, msg.backend)
    count = int(msg.instance_group[0].count) if len(msg.instance_group) and msg.instance_group[0].count else 1
    param = spec.threads_parameter if spec is not None else None
    threads = None
    if param is not None:
        raw = msg.parameters[param].string_value if param in msg.parameters else ""
        threads = int(raw) if raw.strip().isdigit() and int(raw) > 0 else spec.threads_unset  # type: ignore[union-attr]
    delay = int(msg.dynamic_batching.max_queue_delay_microseconds) if msg.HasField("dynamic_batching") else None
    return Candidate(count, threads, delay, int(msg.max_batch_size))


def apply_candidate(msg: Any, c: Candidate) -> Any:
    """A copy of the config message with the candidate's values."""
    out = type(msg)()
    out.CopyFrom(msg)
    if not len(out.instance_group):
        out.instance_group.add()
    out.instance_group[0].count = c.instance_count
    param = _threads_parameter(backend_of(out))
    if param is not None and c.threads is not None:
        out.parameters[param].string_value = str(c.threads)
    out.max_batch_size = c.max_batch_size
    if c.max_queue_delay_us is None:
        out.ClearField("dynamic_batching")
    else:
        out.dynamic_batching.max_queue_delay_microseconds = c.max_queue_delay_us
        preferred = [b for b in out.dynamic_batching.preferred_batch_size if b <= c.max_batch_size]
        del out.dynamic_batching.preferred_batch_size[:]
        out.dynamic_batching.preferred_batch_size.extend(preferred)
    return out


def rebased_config(live_text: str, started: Any, chosen: Candidate, header: str, *, where: str) -> str:
    """The tuned candidate applied on top of a config that another writer changed while the tune
    ran (a three-way merge on the tuned fields): the other writer's changes are kept as long as
    they leave the tuned knobs (instance count, threads, dynamic batching, max batch size) as the
    tune found them; a change to one of those knobs is a conflict, refused naming them."""
    live = parse_config_text(live_text, f"{where} (changed while tuning; the tuned config was not written)")
    before, now = start_candidate(started), start_candidate(live)
    if before != now:
        changed = [k for k in asdict(before) if getattr(before, k) != getattr(now, k)]
        raise UsageError(f"{where}: changed while tuning, and the other writer set {', '.join(changed)} "
                         f"({before.label()} -> {now.label()}); the tuned config was not written (the report holds it)")
    return config_text(apply_candidate(live, chosen), header)


def config_json(msg: Any) -> str:
    from google.protobuf import json_format

    return json_format.MessageToJson(msg, preserving_proto_field_name=True)


def config_text(msg: Any, header: str = "") -> str:
    from google.protobuf import text_format

    return (f"# {header}\n" if header else "") + text_format.MessageToString(msg)


# --------------------------------------------------------------------------------------------
# The run


@dataclass(frozen=True)
class TuneOptions:
    model: str
    concurrency: int = 8
    objective: str = "throughput"
    max_p99_ms: float | None = None
    exhaustive: bool = False
    budget_s: float = 600.0
    interval_s: float = 1.0
    stability_pct: float = 10.0
    max_trials: int = 6
    warmup: int = 20
    batch_size: int = 1
    cores: int | None = None  # default: the cores available here (the server runs here)
    server_binary: str | None = None
    timeout: float = 30.0
    progress: bool | None = None

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise OptionError("objective", f"{self.objective!r}: one of {', '.join(OBJECTIVES)}")
        if not 1 <= self.concurrency <= 1024:
            raise OptionError("concurrency", f"{self.concurrency}: 1..1024")
        if self.max_p99_ms is not None and not self.max_p99_ms > 0:
            raise OptionError("max_p99_ms", f"{self.max_p99_ms}: must be > 0", concept="the p99 latency limit")
        if not self.budget_s > 0:
            raise OptionError("budget_s", f"{self.budget_s}: must be > 0", concept="the time budget in seconds")
        self.stability()  # its own checks (NaN included) before any server starts

    def stability(self) -> Any:
        return Stability(interval_s=self.interval_s, pct=self.stability_pct, max_trials=self.max_trials)


@dataclass
class TuneResult:
    model: str
    options: dict[str, Any]
    start: Candidate
    chosen: Candidate
    results: list[dict[str, Any]]
    axes: dict[str, list[Any]]
    seconds: float
    original_config: str
    chosen_config: str
    out_of_budget: bool = False
    applied: str | None = None
    files: dict[str, str] = field(default_factory=dict)
    machine: dict[str, Any] = field(default_factory=dict)

    def result_of(self, c: Candidate) -> dict[str, Any]:
        """The candidate's figures over its measurements (:func:`combined`)."""
        return combined(self.results, c)

    def decided(self) -> tuple[dict[str, Any], dict[str, Any], str]:
        """The start's and the chosen candidate's figures the choice and :attr:`gain` rest on: the
        confirmation round where both have one, else their means over every measurement; and
        which of the two it is (the summary prints these, not a mix of rounds)."""
        a, b = confirmed(self.results, self.start), confirmed(self.results, self.chosen)
        if a.get("error") or b.get("error"):
            return self.result_of(self.start), self.result_of(self.chosen), "mean of all measurements"
        return a, b, "confirmation round"

    @property
    def gain(self) -> float | None:
        """Chosen over start, in the confirmation round that decided (both are finalists)."""
        a, b, _ = self.decided()
        if a.get("throughput") and b.get("throughput"):
            return float(b["throughput"]) / float(a["throughput"])
        return None

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "trtrepo_version": __version__, "model": self.model, "options": self.options,
                "search": "exhaustive grid" if self.options.get("exhaustive") else "coordinate descent",
                "axes": self.axes, "start": self.start.to_dict(), "chosen": self.chosen.to_dict(),
                "start_result": self.result_of(self.start), "chosen_result": self.result_of(self.chosen),
                "gain_throughput": self.gain, "candidates_measured": len({r["candidate"]["label"] for r in self.results}),
                "measurements": len(self.results), "seconds": self.seconds,
                "out_of_budget": self.out_of_budget, "pareto_front": pareto_front(self.results),
                "results": self.results, "original_config": self.original_config,
                "chosen_config": self.chosen_config, "applied": self.applied, "machine": self.machine,
                "files": self.files}

    def to_markdown(self) -> str:
        d = self.to_dict()
        o = self.options
        budget = f", p99 <= {o['max_p99_ms']:g} ms" if o.get("max_p99_ms") else ""
        gain = "-" if self.gain is None else f"{self.gain:.2f}x"
        lines = [f"# trtrepo tune: model `{self.model}`", "",
                 f"{d['search']}: {len(self.results)} measurements in {self.seconds:.0f} s at concurrency "
                 f"{o['concurrency']} (objective: {o['objective']}{budget}); each candidate loaded through the model-control "
                 f"API and measured in {o['interval_s']:g} s windows until three agree within {o['stability_pct']:g}%; "
                 f"the starting config and the {CONFIRM} best were measured a second time, one after the other, and "
                 f"are judged on the mean of both.",
                 "", f"Machine: {self.machine.get('cpu', '?')}, {self.machine.get('cores', '?')} cores.", "",
                 f"**Chosen: {self.chosen.label()}**, throughput {gain} the starting config ({self.start.label()})."
                 + (" The budget ran out before the search ended." if self.out_of_budget else ""), "",
                 "| # | candidate | infer/s | p50 ms | p99 ms | stable | avg batch | note |", "|---|---|---|---|---|---|---|---|"]
        front = set(d["pareto_front"])
        for i, r in enumerate(self.results):
            c = r["candidate"]
            notes = [n for n, cond in (("start", c == self.start.to_dict()), ("**chosen**", c == self.chosen.to_dict()),
                                       ("pareto", i in front), ("over p99 budget", r.get("over_budget")),
                                       ("confirmation round", r.get("round") == 2)) if cond]
            if r.get("error"):
                lines.append(f"| {i} | {c['label']} | - | - | - | - | - | failed: {r['error']} |")
                continue
            avg = "-" if r.get("avg_batch") is None else f"{r['avg_batch']:.2f}"
            lines.append(f"| {i} | {c['label']} | {r['throughput']:.1f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | "
                         f"{'yes' if r['stable'] else 'no'} | {avg} | {', '.join(notes)} |")
        if self.files.get("plot"):
            lines += ["", f"![throughput vs p99]({Path(self.files['plot']).name})"]
        lines += ["", "## Chosen config", "", "```", self.chosen_config.rstrip(), "```"]
        if self.applied:
            lines += ["", f"Written to `{self.applied}`; the config it replaced:", "", "```", self.original_config.rstrip(), "```"]
        return "\n".join(lines) + "\n"

    def write(self, folder: str | Path) -> dict[str, Path]:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        paths = {"json": folder / "tune.json", "markdown": folder / "tune.md", "plot": folder / "tune.png"}
        self.files = {k: str(v) for k, v in paths.items()}
        write_plot(self, paths["plot"])
        write_report(folder, "tune", report_json(self.to_dict(), allow_nan=False), self.to_markdown())
        return paths


def write_plot(result: TuneResult, path: str | Path) -> Path:
    """Throughput against p99 per candidate, the Pareto front joined, start and chosen marked."""
    rs = [(i, r) for i, r in enumerate(result.results) if not r.get("error")]
    with png_figure(path, figsize=(7.5, 5), dpi=100) as (_fig, ax, _meta):
        ax.scatter([r["p99_ms"] for _, r in rs], [r["throughput"] for _, r in rs], s=18, c="0.6", label="candidates")
        front = sorted((result.results[i] for i in pareto_front(result.results)), key=lambda r: r["p99_ms"])
        if front:
            ax.plot([r["p99_ms"] for r in front], [r["throughput"] for r in front], "b.-", label="Pareto front")
        for c, style, label in ((result.start, "ks", "start"), (result.chosen, "r*", "chosen")):
            r = result.result_of(c)
            if not r.get("error"):
                ax.plot([r["p99_ms"]], [r["throughput"]], style, markersize=12, label=f"{label}: {c.label()}")
        if result.options.get("max_p99_ms"):
            ax.axvline(result.options["max_p99_ms"], color="r", ls=":", label="p99 budget")
        ax.set_xlabel("client p99 latency (ms)")
        ax.set_ylabel("throughput (inferences/s)")
        ax.set_title(f"trtrepo tune: {result.model} at concurrency {result.options['concurrency']}")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    return Path(path)


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "?")
    except OSError:
        return "?"


def tune(repo: str | Path, options: TuneOptions, *, data: DataOptions, apply: bool = False, report_dir: str | Path | None = None,
         say: Callable[[str], None] = lambda s: None) -> TuneResult:
    """Search the serving config of ``options.model`` in ``repo`` on a tritonserver started here in
    explicit model-control mode, with requests from ``data`` (its ``batch_size`` and ``extra`` are
    not used: ``options.batch_size`` sets the request size); write the report to ``report_dir``
    and, with ``apply``, the chosen config to the repository."""

    repo = Path(repo)
    model_dir = repo / options.model
    msg, original_text = _tunable_config(model_dir, options.model)
    start = start_candidate(msg)
    cores = options.cores or available_cores()
    gpu = any(g.kind == 1 for g in msg.instance_group)  # KIND_GPU
    axes = search_space(start, cores=cores, backend=backend_of(msg), gpu=gpu, batching=msg.max_batch_size > 0)
    candidates = grid(axes, start)
    say(f"tune {options.model}: {'grid of ' + str(len(candidates)) if options.exhaustive else 'coordinate descent over'} "
        f"candidates ({', '.join(f'{k} {v}' for k, v in axes.items() if len(v) > 1)}), concurrency {options.concurrency}")
    t0 = time.monotonic()  # the budget counts the server's start
    extra = ("--model-control-mode=explicit", f"--load-model={options.model}")
    with TritonServer(repo, binary=options.server_binary, extra_args=extra, timeout=120) as server:
        for lo in server.reaped:
            say(f"note: removed {lo.describe()}")
        search = _Search(CandidateRunner(server.grpc_url, options, msg, data=data), options, say, t0)
        try:
            search.explore(start, axes, candidates)
            chosen = search.confirm(start)
        finally:
            search.runner.close()
    results = search.results
    if search.cache.get(chosen, float("-inf")) == float("-inf"):
        raise _nothing_chosen(options, results)
    header = (f"Tuned by trtrepo tune: {chosen.label()} at concurrency {options.concurrency} "
              f"({options.objective}); the report holds the config it replaced")
    chosen_text = config_text(apply_candidate(msg, chosen), header)
    result = TuneResult(options.model, {**asdict(options), "cores": cores}, start, chosen, results,
                        {k: list(v) for k, v in axes.items()}, time.monotonic() - search.t0, original_text, chosen_text,
                        out_of_budget=search.out_of_budget, machine={"cpu": _cpu_name(), "cores": cores})
    if apply:
        _apply_tuned(repo, result, msg, header, say)
    if report_dir is not None:
        result.write(report_dir)
    return result


def _tunable_config(model_dir: Path, model: str) -> tuple[Any, str]:
    """The model's config (parsed and as text); an ensemble is refused (tune the model behind it)."""
    if not (model_dir / "config.pbtxt").is_file():
        raise UsageError(f"{model_dir}: no model '{model}' in the repository (config.pbtxt not found)")
    msg = read_config(model_dir)
    if msg.platform == "ensemble":
        raise UsageError(f"model '{model}' is an ensemble: tune the model behind it")
    return msg, (model_dir / "config.pbtxt").read_text()


class _Search:
    """The search's state: every measurement (``results``), each candidate's score (``cache``),
    the clock (from ``t0``) against ``options.budget_s``."""

    def __init__(self, runner: CandidateRunner, options: TuneOptions, say: Callable[[str], None], t0: float) -> None:
        self.runner, self.options, self.say = runner, options, say
        self.results: list[dict[str, Any]] = []
        self.cache: dict[Candidate, float] = {}
        self.min_gain = options.stability_pct / 200  # a move must gain more than half the stability tolerance (5%)
        self.t0 = t0
        self.out_of_budget = False

    def out_of_time(self) -> bool:
        """Once the budget is spent, the search stops (and stays stopped)."""
        if time.monotonic() - self.t0 > self.options.budget_s:
            self.out_of_budget = True
        return self.out_of_budget

    def evaluate(self, c: Candidate) -> float:
        """A candidate's score, measured once (a cached score otherwise)."""
        options = self.options
        if c not in self.cache:
            r = self.runner.measure(c)
            self.results.append(r)
            self.cache[c] = score(r, options.objective, options.max_p99_ms)
            r["over_budget"] = options.max_p99_ms is not None and not r.get("error") and r["p99_ms"] > options.max_p99_ms
            self.say(f"  [{len(self.results)}] {c.label()}: " + (f"failed: {r['error']}" if r.get("error") else
                     f"{r['throughput']:.1f} infer/s, p99 {r['p99_ms']:.2f} ms{'' if r['stable'] else ' (not stable)'}"))
        return self.cache[c]

    def explore(self, start: Candidate, axes: Mapping[str, Sequence[Any]], candidates: list[Candidate]) -> None:
        """Decision: ``exhaustive`` measures the grid in order until the budget ends; otherwise
        coordinate descent from the starting config."""
        if self.options.exhaustive:
            for c in candidates:
                if self.out_of_time():
                    break
                self.evaluate(c)
        else:
            coordinate_descent(start, axes, self.evaluate, min_gain=self.min_gain, out_of_time=self.out_of_time)

    def confirm(self, start: Candidate) -> Candidate:
        """Confirmation: the starting config and the best ones measured once more, one after the
        other, and only this round decides: a finalist's first figure is biased upward by the
        very selection that made it a finalist (docs/benchmarks.md, "Issue 17: `trtrepo tune`
        quick search vs exhaustive grid, default config vs tuned"). Runs after the budget too:
        CONFIRM + 1 measurements at most."""
        cache, options = self.cache, self.options
        ranked = sorted((c for c in cache if cache[c] > float("-inf")), key=lambda c: cache[c], reverse=True)
        finalists = [start, *[c for c in ranked if c != start][:CONFIRM]]
        for c in finalists:
            r = self.runner.measure(c)
            r["round"] = 2
            self.results.append(r)
            self.say(f"  [confirm] {c.label()}: " + (f"failed: {r['error']}" if r.get("error") else
                     f"{r['throughput']:.1f} infer/s, p99 {r['p99_ms']:.2f} ms"))
        # only the finalists compete, on their confirmation figures, taken in one stretch of time
        final = {c: score(confirmed(self.results, c), options.objective, options.max_p99_ms) for c in finalists}
        chosen = choose(final, start, self.min_gain)
        cache.update(final)
        return chosen


def _nothing_chosen(options: TuneOptions, results: list[dict[str, Any]]) -> TrtrepoError:
    """Decision: with a p99 limit, no candidate met it (the best p99 said); else every one failed."""
    if options.max_p99_ms is not None:
        return TrtrepoError(f"model '{options.model}': no candidate met --max-p99-ms {options.max_p99_ms:g} at "
                            f"concurrency {options.concurrency} (best p99 "
                            f"{min((r['p99_ms'] for r in results if not r.get('error')), default=float('nan')):.2f} ms)")
    return TrtrepoError(f"model '{options.model}': every candidate failed; first error: {results[0].get('error')}")


def _apply_tuned(repo: Path, result: TuneResult, msg: Any, header: str, say: Callable[[str], None]) -> None:
    """Write the chosen config into the repository. Decision: when the live config changed while
    tuning (another writer), the tuned settings are applied on top of its new content, kept."""
    model_dir = repo / result.model
    merged: list[str] = []

    def rebase(live_text: str) -> str:
        merged.append(live_text)
        return rebased_config(live_text, msg, result.chosen, header, where=str(model_dir / "config.pbtxt"))

    result.applied = str(replace_config(repo, result.model, result.chosen_config, started_from=result.original_config,
                                        rebase=rebase))
    if merged:
        result.chosen_config = (model_dir / "config.pbtxt").read_text()
        say(f"note: {model_dir / 'config.pbtxt'} changed while tuning (another writer); the tuned settings "
            f"were applied on top of its new content, which is kept")


class CandidateRunner:
    """Loads candidates into the explicit-mode server and measures them."""

    def __init__(self, url: str, options: TuneOptions, msg: Any, *, data: DataOptions) -> None:
        import tritonclient.grpc as grpcclient

        self.options = options
        self.msg = msg
        self.warmed = False
        self.admin = grpcclient.InferenceServerClient(url)
        self.target = TritonTarget(ValidateOptions(model=options.model, url=url, timeout=options.timeout,
                                                   progress=False, speed=None))
        self.target.wait_ready(120)
        io = _served_io(self.target.metadata(), msg)
        self.target.prepare(io)

        source = data.open(io)
        self.payloads, _ = make_payloads(source, io, options.batch_size)

    def measure(self, c: Candidate) -> dict[str, Any]:
        row: dict[str, Any] = {"candidate": c.to_dict()}
        t = time.monotonic()
        try:
            # bounded: a server that accepts the request and never answers costs one candidate, not the run
            self.admin.load_model(self.options.model, config=config_json(apply_candidate(self.msg, c)),
                                  client_timeout=LOAD_TIMEOUT_S)
            self.target.wait_ready(LOAD_TIMEOUT_S)
        except Exception as exc:

            row.update(error=f"load failed: {one_line(exc)}", throughput=None)
            return row
        row["load_s"] = time.monotonic() - t
        try:
            if not self.warmed:  # the first seconds after the server starts are slower: not measured
                self.target.load(self.payloads, self.options.concurrency, duration=self.options.interval_s)
                self.warmed = True
            if self.options.warmup:
                self.target.load(self.payloads, self.options.concurrency, requests=max(self.options.warmup, self.options.concurrency))
            version = self.target.resolve_version(self.target.metadata())
            before = self.target.settled_statistics(version)
            m = self.target.measure(self.payloads, self.options.stability(), concurrency=self.options.concurrency,
                                    books=self.target.server_books(version, before))
            # the server's figures (avg_batch) of the same requests as the client's (issue 41)
            span = m.reported_readings() or (before, self.target.settled_statistics(version))
            server = stats_diff(*span, self.options.model, version)
        except TrtrepoError as exc:
            row.update(error=str(exc).splitlines()[0], throughput=None)
            return row
        lat = m.latency_ms()
        row.update(throughput=m.throughput, p50_ms=lat["p50"], p99_ms=lat["p99"], mean_ms=lat["mean"], stable=m.stable,
                   windows=len(m.windows), spread_pct=m.summary()["spread_pct"]["throughput_pct"],
                   avg_batch=server.get("avg_batch"), measured_s=m.total_s)
        return row

    def close(self) -> None:
        self.target.close()
        self.admin.close()


def _served_io(metadata: Mapping[str, Any], msg: Any) -> Any:
    """The IO the server states (names, types, shapes; the batch axis is in the metadata's shapes)."""

    def specs(items: Any) -> tuple[TensorSpec, ...]:
        return tuple(TensorSpec(t["name"], "object" if t["datatype"] == "BYTES" else _np_name(t["datatype"]),
                                tuple(int(d) for d in t["shape"])) for t in items)

    return ModelIO(specs(metadata.get("inputs", [])), specs(metadata.get("outputs", [])))


def _np_name(triton: str) -> str:
    return {"FP32": "float32", "FP16": "float16", "FP64": "float64", "INT64": "int64", "INT32": "int32", "INT8": "int8",
            "UINT8": "uint8", "BOOL": "bool", "INT16": "int16", "BF16": "float32"}.get(triton, "float32")
