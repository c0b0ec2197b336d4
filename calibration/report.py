"""report.md and the PNG plots of an eval report (matplotlib, Agg backend: no display needed)."""
from __future__ import annotations

from pathlib import Path

import numpy as np


def write_plots(out_dir: Path, stats, tensors: dict) -> list[str]:
    """kld_hist.png (per-token KLD, log bins) when fidelity ran; tensor_error.png from quality.json tensors."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    if stats is not None:
        kld = np.maximum(stats.kld_values(), 1e-9)
        fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
        ax.hist(kld, bins=np.logspace(-9, max(1.0, np.log10(kld.max()) + 0.1), 60), color="#4477aa")
        ax.set_xscale("log")
        ax.axvline(kld.mean(), color="#cc3311", label=f"mean {kld.mean():.2e}")
        ax.axvline(np.percentile(kld, 99), color="#ee7733", ls="--", label=f"p99 {np.percentile(kld, 99):.2e}")
        ax.set_xlabel("KL(reference || artifact) per token (nats)")
        ax.set_ylabel("tokens")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out_dir / "kld_hist.png", metadata={"Software": None})
        plt.close(fig)
        written.append("kld_hist.png")
    if tensors:
        names = list(tensors)
        fig, ax = plt.subplots(figsize=(max(6, len(names) * 0.05), 3.5), dpi=100)
        ax.plot(range(len(names)), [tensors[n]["rms_rel"] for n in names], ".", label="RMS relative error")
        ax.plot(range(len(names)), [tensors[n]["max_rel"] for n in names], ".", label="max relative error")
        ax.set_yscale("log")
        ax.set_xlabel("quantized tensor (build order)")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out_dir / "tensor_error.png", metadata={"Software": None})
        plt.close(fig)
        written.append("tensor_error.png")
    return written


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    return "-" if v is None else str(v)


def _pm(d: dict, key: str, spec: str) -> str:
    """A figure with its standard error where the report has one ("kld_mean" and "kld_mean_err")."""
    err = d.get(key + "_err")
    return f"{d[key]:{spec}}" + (f" ± {err:{spec}}" if err is not None else "")


def fidelity_table(f: dict) -> str:
    """A markdown table of a fidelity section: one row per domain, then all domains together."""
    rows = ["| text | positions | mean KLD | p99 KLD | top-1 agreement | PPL ratio |", "|---|---|---|---|---|---|"]
    for name, d in [*f.get("domains", {}).items(), ("all", f)]:
        rows.append(f"| {name} | {d['tokens']} | {_pm(d, 'kld_mean', '.5f')} | {_fmt(d['kld_p99'])} | "
                    f"{_pm(d, 'top1_agreement', '.2%')} | {d['ppl_ratio']:.4f} ± {d['ppl_ratio_err']:.4f} |")
    return "\n".join(rows)


def build_label(build: dict) -> str:
    """The build options a reader compares: weights, block, algorithm, head, KV cache."""
    if not build:
        return "?"
    w = build.get("quant")
    if w != "fp32":
        w += f" b{build.get('block_size')} {build.get('algo')}"
    return f"{w}, head {build.get('lm_head')}, KV {build.get('kv')}"


def write_summary(reports: list[dict]) -> str:
    """One table of several reports' fidelity (ortllm eval A B ...: OUT/summary.md), a row per artifact and domain."""
    rows = [f"# ortllm eval: {len(reports)} artifacts against {Path(reports[0]['reference']).name}", "",
            f"- machine: {reports[0].get('machine')}; commit: {reports[0].get('commit')}; ops path: "
            f"{reports[0].get('fidelity', {}).get('isa')}", f"- command: `{reports[0].get('command')}`", "",
            "| artifact | build | text | positions | mean KLD | p99 KLD | top-1 | PPL ratio |",
            "|---|---|---|---|---|---|---|---|"]
    for r in reports:
        f = r.get("fidelity")
        if not f:
            continue
        for name, d in [*f.get("domains", {}).items(), ("all", f)]:
            rows.append(f"| {Path(r['artifact']).name} | {build_label(r.get('build', {}))} | {name} | {d['tokens']} | "
                        f"{_pm(d, 'kld_mean', '.5f')} | {d['kld_p99']:.4f} | {_pm(d, 'top1_agreement', '.2%')} | "
                        f"{d['ppl_ratio']:.4f} ± {d['ppl_ratio_err']:.4f} |")
    return "\n".join(rows) + "\n"


def write_markdown(r: dict) -> str:
    lines = [f"# ortllm eval: {Path(r['artifact']).name} vs {Path(r['reference']).name}", "",
             f"- recipe: {r.get('recipe')}; build: `{r.get('build')}`",
             f"- machine: {r.get('machine')}; commit: {r.get('commit')}",
             f"- command: `{r.get('command')}`", ""]
    if "fidelity" in r:
        f = r["fidelity"]
        lines += [f"## Fidelity on held-out text (paired against the fp32 reference; ops path {f.get('isa')})", "",
                  fidelity_table(f), ""]
        for name, d in f["data"].items():
            srcs = ", ".join(f"{s['name']} ({s['sha256'][:12]})" for s in d.get("sources", []))
            lines.append(f"- {name}: {d['description']}; {d['windows']} windows of {d['ctx']} tokens"
                         + (f"; sources (sha256): {srcs}" if srcs else ""))
        lines.append("")
    if "humaneval" in r:
        h = r["humaneval"]
        lines += ["## HumanEval", "", "| n | NLL/token | reference NLL/token | greedy pass@1 |", "|---|---|---|---|",
                  f"| {h['n']} | {_fmt(h.get('nll_per_token'))} | {_fmt(h.get('reference_nll_per_token'))} | "
                  f"{_fmt(h.get('pass_at_1'))} |", ""]
    if r.get("adapters"):
        lines += ["## Adapters (held-out task accuracy, greedy, through the engine)", "",
                  "| adapter | task | n | base | adapter |", "|---|---|---|---|---|"]
        lines += [f"| {name} | {a['task']} | {a['n']} | {a['base_accuracy']:.1%} | {a['adapter_accuracy']:.1%} |"
                  for name, a in sorted(r["adapters"].items())] + [""]
    for p in r.get("plots", []):
        lines.append(f"![{p}]({p})")
    return "\n".join(lines) + "\n"
