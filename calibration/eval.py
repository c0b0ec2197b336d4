"""`ortllm eval ARTIFACT --reference REF --suite fidelity,humaneval --out DIR`: quality report of an artifact.

    load both (verified; same source weights and model config, else refused)
    fidelity:  windows of held-out text (prose, code, chat; calibration/heldout.py) -> candidate and reference
               logits, position by position -> kld_mean, kld_p99, top1_agreement, ppl_ratio +- err, tokens,
               all domains together and under "domains" each alone; "isa": the ops' kernel path
                                                                                        (calibration/fidelity.py)
    humaneval: NLL per canonical-solution token (candidate and reference), greedy pass@1 in a sandbox
                                                                                        (calibration/humaneval.py)
    -> DIR/report.json, DIR/report.md, DIR/kld_hist.png (+ DIR/tensor_error.png when the artifact has quality.json)

The same artifacts and options give the same report (greedy decoding, fixed data, fixed thread count).
"""
from __future__ import annotations

import json
import platform
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ortllm.runtime import contract as C
from ortllm.runtime.artifact import load_artifact
from ortllm.runtime.errors import OrtllmError

SUITES = ("fidelity", "humaneval", "adapters")
REPORT_VERSION = 1


class EvalError(OrtllmError):
    """An eval input is wrong; the message says what to change."""


@dataclass(frozen=True)
class EvalOptions:
    suites: tuple[str, ...] = SUITES
    tokens: int = 16384          # scored positions of the fidelity suite (>= 16k for the full run)
    ctx: int = 2048              # tokens per window
    chunk: int = 512             # prefill chunk of the scorers
    humaneval_n: int = 164       # problems (the first n, in file order)
    max_tokens: int = 384        # greedy completion budget per HumanEval problem
    pass_at_1: bool = True       # False: NLL only (fast)
    threads: int | None = None
    progress: bool = True

    def __post_init__(self):
        unknown = sorted(set(self.suites) - set(SUITES))
        if unknown or not self.suites:
            raise EvalError(f"--suite takes a comma-separated subset of {', '.join(SUITES)}; "
                            f"got {','.join(self.suites) or 'nothing'}")
        for name, lo in (("tokens", 16), ("ctx", 16), ("chunk", 1), ("humaneval_n", 1), ("max_tokens", 1)):
            v = getattr(self, name)
            if not isinstance(v, int) or v < lo:
                raise EvalError(f"--{name.replace('_', '-')} must be an integer >= {lo}; got {v!r}")
        if self.humaneval_n > 164:
            raise EvalError(f"--humaneval-n must be <= 164 (HumanEval's size); got {self.humaneval_n}")


def _same_model(cand, ref) -> None:
    a, b = cand.manifest, ref.manifest
    if a.source_sha256 != b.source_sha256 or a.model != b.model:
        raise EvalError(f"--reference {ref.path} is another model (source {b.recipe or b.source.get('desc')}"
                        f") than {cand.path} ({a.recipe or a.source.get('desc')}); build the fp32 "
                        "reference from the same recipe: ortllm build RECIPE --quant fp32 --kv fp32 --out REF")
    build = b.build
    if b.quant != "fp32" or b.kv != "fp32" or build.get("lm_head") != "fp32":
        raise EvalError(f"--reference {ref.path} is itself quantized ({build}); give an fp32 build "
                        "(--quant fp32 --lm-head fp32 --kv fp32)")


def _progress(total: int, desc: str, on: bool):
    from tqdm import tqdm
    return tqdm(total=total, desc=desc, unit="tok" if "fidelity" in desc else "it", disable=not on, leave=False)


def _commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def run_fidelity(cands: list, ref, opts: EvalOptions) -> list[tuple[dict, object]]:
    """Fidelity of each candidate against the reference on the held-out windows (calibration/heldout.py), per
    domain and all together (reference scored once)."""
    from ortllm.runtime.ops_library import ops_isa
    from ortllm.runtime.tokenizer import Tokenizer

    from .fidelity import PairedStats, domain_summary, make_scorer, score_domains
    from .heldout import heldout_windows

    tok = Tokenizer.from_dir(ref.path)
    eos = tok.eos_token_ids[0] if tok.eos_token_ids else None
    held = heldout_windows(tok, opts.tokens, opts.ctx, eos)
    scorers = [make_scorer(c, opts.ctx, opts.threads) for c in cands]
    total = sum(len(w) for ws in held.windows.values() for w in ws)
    with _progress(total, "fidelity", opts.progress) as bar:
        per = score_domains(scorers, make_scorer(ref, opts.ctx, opts.threads), held.windows, opts.chunk, bar)
    isa = ops_isa() if any(c.graph == "engine" for c in [*cands, ref]) else None
    return [({**domain_summary(d), "isa": isa, "data": held.report()}, PairedStats.merged(list(d.values())))
            for d in per]


def run_humaneval(cand, ref, opts: EvalOptions) -> dict:
    from ortllm.runtime.tokenizer import Tokenizer

    from .data import humaneval_problems
    from .fidelity import EngineScorer, make_scorer
    from .humaneval import pass_at_1, solution_nll

    problems = list(humaneval_problems()[:opts.humaneval_n])
    tok = Tokenizer.from_dir(cand.path)
    ctx = max(len(tok.encode(p.prompt + p.canonical_solution)) for p in problems) + 8
    with _progress(len(problems), "humaneval nll (reference)", opts.progress) as bar:
        ref_nll, _ = solution_nll(make_scorer(ref, ctx, opts.threads), tok, problems, bar)
    out = {"reference_nll_per_token": ref_nll, "pass_at_1": None, "max_tokens": opts.max_tokens}
    if cand.graph == "engine":
        from ortllm.runtime.engine import Engine
        overrides = {"threads": opts.threads} if opts.threads else {}
        block = cand.manifest.kv_block_size
        # enough blocks for every problem at once, capped (the scheduler queues the rest)
        per_seq = -(-(ctx + opts.max_tokens) // block)
        blocks = 2 + max(per_seq, min(len(problems) * per_seq, 1024))
        with Engine.from_artifact(cand.path, num_blocks=blocks, **overrides) as engine:
            with _progress(len(problems), "humaneval nll", opts.progress) as bar:
                out["nll_per_token"], out["solution_tokens"] = solution_nll(
                    EngineScorer(None, ctx, engine=engine), tok, problems, bar)
            if opts.pass_at_1:
                with _progress(len(problems), "humaneval pass@1", opts.progress) as bar:
                    out["pass_at_1"], out["results"] = pass_at_1(engine, problems, opts.max_tokens, bar)
    else:
        with _progress(len(problems), "humaneval nll", opts.progress) as bar:
            out["nll_per_token"], out["solution_tokens"] = solution_nll(make_scorer(cand, ctx, opts.threads), tok,
                                                                        problems, bar)
        out["note"] = "pass@1 needs an engine-graph artifact (continuous batching); portable: NLL only"
    out["n"] = len(problems)
    return out


def run_adapters(cand, n: int = 100) -> dict:
    """Per adapter with a task (made by `ortllm adapters train`): held-out accuracy, base vs adapter, through
    the engine (greedy)."""
    from ortllm.runtime.engine import Engine

    from .adapter_eval import task_accuracy

    tasks = {name: e["task"] for name, e in cand.manifest.adapters.items() if e.get("task")}
    if not tasks:
        return {}
    out = {}
    with Engine.from_artifact(cand.path) as engine:
        base = {t: task_accuracy(engine, t, None, n=n).accuracy for t in set(tasks.values())}
        for name, task in sorted(tasks.items()):
            out[name] = {"task": task, "n": n, "base_accuracy": base[task],
                         "adapter_accuracy": task_accuracy(engine, task, name, n=n).accuracy}
    return out


def evaluate(artifact: Path, reference: Path, out_dir: Path, opts: EvalOptions, command: str = "") -> dict:
    """Evaluate one artifact; the report goes to out_dir."""
    return evaluate_many([artifact], reference, out_dir, opts, command, subdirs=False)[0]


def evaluate_many(artifacts: list[Path], reference: Path, out_dir: Path, opts: EvalOptions, command: str = "",
                  subdirs: bool = True) -> list[dict]:
    """Evaluate several artifacts of one model against one reference (its logits computed once per chunk);
    each report goes to out_dir/<artifact dir name>/ (or out_dir itself when subdirs is False)."""
    cands, ref = [load_artifact(Path(a)) for a in artifacts], load_artifact(Path(reference))
    for cand in cands:
        _same_model(cand, ref)
    names = [c.path.name for c in cands]
    if subdirs and len(set(names)) != len(names):
        raise EvalError(f"artifact directory names must differ (reports go to --out/<name>); got {names}")
    reports, stats = [], [None] * len(cands)
    for cand in cands:
        reports.append({
            "version": REPORT_VERSION,
            "artifact": str(cand.path), "reference": str(ref.path),
            "build": cand.manifest.build, "recipe": cand.manifest.recipe,
            "machine": f"{platform.machine()} {platform.processor() or ''} {platform.node()}".strip(),
            "commit": _commit(), "command": command,
            "options": {k: v for k, v in opts.__dict__.items() if k != "progress"},
        })
    if "fidelity" in opts.suites:
        for r, (fid, st), i in zip(reports, run_fidelity(cands, ref, opts), range(len(cands))):
            r["fidelity"], stats[i] = fid, st
    from .report import write_markdown, write_plots, write_summary
    for cand, r, st in zip(cands, reports, stats):
        if "humaneval" in opts.suites:
            r["humaneval"] = run_humaneval(cand, ref, opts)
        if "adapters" in opts.suites:
            r["adapters"] = run_adapters(cand)
        d = Path(out_dir) / cand.path.name if subdirs else Path(out_dir)
        d.mkdir(parents=True, exist_ok=True)
        quality = cand.path / C.QUALITY
        tensors = json.loads(quality.read_text()).get("tensors", {}) if quality.is_file() else {}
        r["plots"] = write_plots(d, st, tensors)
        (d / "report.json").write_text(json.dumps(r, indent=2, sort_keys=True) + "\n")
        (d / "report.md").write_text(write_markdown(r))
    if subdirs and "fidelity" in opts.suites:
        (Path(out_dir) / "summary.md").write_text(write_summary(reports))
    return reports
