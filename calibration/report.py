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


def write_markdown(r: dict) -> str:
    lines = [f"# ortllm eval: {Path(r['artifact']).name} vs {Path(r['reference']).name}", "",
             f"- recipe: {r.get('recipe')}; build: `{r.get('build')}`",
             f"- machine: {r.get('machine')}; commit: {r.get('commit')}",
             f"- command: `{r.get('command')}`", ""]
    if "fidelity" in r:
        f = r["fidelity"]
        lines += ["## Fidelity (paired against the fp32 reference, same token streams)", "",
                  "| tokens | mean KLD | p99 KLD | top-1 agreement | PPL ratio | ln PPL ratio |",
                  "|---|---|---|---|---|---|",
                  f"| {f['tokens']} | {_fmt(f['kld_mean'])} | {_fmt(f['kld_p99'])} | {f['top1_agreement']:.4%} | "
                  f"{f['ppl_ratio']:.5f} ± {f['ppl_ratio_err']:.5f} | {f['ln_ppl_ratio']:.5f} ± "
                  f"{f['ln_ppl_ratio_err']:.5f} |", "",
                  f"Data: {f['data']['sources']}; {f['data']['windows']} windows of {f['data']['ctx']} tokens; "
                  f"sha256 {f['data']['sha256']}.", ""]
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
