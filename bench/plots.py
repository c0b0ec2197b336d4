"""PNG plots of `ortllm bench` rows (matplotlib, Agg backend: no display needed).

  decode_throughput.png  decode tok/s (median, min-max bars) vs batch size, one line per system; from rows of
                         the scenarios "decode" (peers, alternating) and "single-stream decode"/"batched decode"
                         (engine scenario)
                         (engine scenario); a system with held-out quality has its KLD in its label
  speed_quality.png      each system's speed against its held-out KLD (log scale) in the first speed case of the
                         run (decode at the smallest batch, else prefill, else long-context), with the line at
                         1.5x ortllm's KLD: the peers left of it are the ones "at quality" (bench/quality.py)
  serve_latency.png      TTFT, TPOT and ITL p50/p90/p99 (median, min-max bars) vs concurrency; from "serve" rows
A plot whose rows are absent is not written. matplotlib comes with the `build` extra.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

DECODE_SCENARIOS = ("decode", "single-stream decode", "batched decode")
SERVE_SERIES = (("ttft", "time to first token"), ("tpot", "time per output token"), ("itl", "inter-token latency"))
HINT = "pip install matplotlib (or: pip install -e '.[build]')"


def available() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def write_plots(out_dir: Path, rows: list[dict]) -> list[str]:
    """Writes the plots the rows allow into out_dir; returns their file names."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    written = []
    for name, draw in (("decode_throughput.png", _decode), ("speed_quality.png", _speed_quality),
                       ("serve_latency.png", _serve)):
        fig = draw(plt, rows)
        if fig is not None:
            fig.tight_layout()
            fig.savefig(out_dir / name, metadata={"Software": None})
            plt.close(fig)
            written.append(name)
    return written


def _errorbar(ax, points: list[dict], label: str, **kw) -> None:
    """points: rows of one series; x = batch, y = median with min-max bars."""
    points = sorted(points, key=lambda r: r["batch"])
    x = [r["batch"] for r in points]
    y = [r["median"] for r in points]
    err = [[r["median"] - r["min"] for r in points], [r["max"] - r["median"] for r in points]]
    ax.errorbar(x, y, yerr=err, marker="o", capsize=3, label=label, **kw)


def _decode(plt, rows):
    """One line per system; an engine-scenario series is labelled apart when the same system also has "decode"."""
    picked = [r for r in rows if r["scenario"] in DECODE_SCENARIOS and r["metric"] == "decode_tokens_per_s"]
    if not picked:
        return None
    in_decode = {r["system"] for r in picked if r["scenario"] == "decode"}
    series: dict[str, list[dict]] = {}
    for r in picked:
        engine = r["scenario"] != "decode" and r["system"] in in_decode
        label = f"{r['system']} (engine scenario)" if engine else r["system"]
        if r.get("quality"):
            label += f" (KLD {r['quality']['kld_mean']:.4f})"
        series.setdefault(label, []).append(r)
    fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
    for label, points in series.items():
        _errorbar(ax, points, label)
    ax.set_xscale("log", base=2)
    batches = sorted({r["batch"] for r in picked})
    ax.set_xticks(batches, [str(b) for b in batches])
    ax.set_xlabel("batch size (concurrent sequences)")
    ax.set_ylabel("decode tokens/s (aggregate)")
    ax.set_title("Decode throughput vs batch size")
    ax.grid(alpha=0.3)
    ax.legend()
    return fig


KLD_FLOOR = 1e-6     # an fp32 peer's KLD against the fp32 reference can round to 0: drawn at the floor


def _speed_quality(plt, rows):
    """One point per system: x = held-out KLD mean (log), y = its speed in the run's first speed case."""
    from .peer_runner import KLD_FACTOR, SCENARIO_SHAPES

    speed = [r for r in rows if r.get("quality") and r["scenario"] in SCENARIO_SHAPES]
    if not speed:
        return None
    scenario, batch = min(((r["scenario"], r["batch"]) for r in speed),
                          key=lambda k: (list(SCENARIO_SHAPES).index(k[0]), k[1]))
    points = [r for r in speed if (r["scenario"], r["batch"]) == (scenario, batch)]
    fig, ax = plt.subplots(figsize=(6.5, 4.2), dpi=100)
    for r in points:
        x = max(r["quality"]["kld_mean"], KLD_FLOOR)
        mark = dict(marker="*", s=160, color="#cc3311") if r["system"] == "ortllm" else dict(marker="o", s=50)
        ax.scatter([x], [r["median"]], zorder=3, **mark)
        ax.errorbar([x], [r["median"]], yerr=[[r["median"] - r["min"]], [r["max"] - r["median"]]], fmt="none",
                    ecolor="#777777", capsize=3)
        name = f"{r['system']} ({r['gguf_type']})" if r.get("gguf_type") else r["system"]
        ax.annotate(name, (x, r["median"]), textcoords="offset points", xytext=(5, 5), fontsize=8)
    ours = next((r for r in points if r["system"] == "ortllm"), None)
    if ours:
        ax.axvline(KLD_FACTOR * ours["quality"]["kld_mean"], color="#cc3311", ls="--", lw=1,
                   label=f"{KLD_FACTOR:g}x ortllm's KLD")
        ax.legend(loc="best", fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("held-out KLD mean against the fp32 reference (log scale; lower is better)")
    ax.set_ylabel(f"{SCENARIO_SHAPES[scenario][2]} ({points[0]['unit']})")
    ax.set_title(f"Speed and quality: {scenario} B={batch}")
    ax.grid(alpha=0.3)
    return fig


def _serve(plt, rows):
    """Three panels (TTFT, TPOT, ITL), one line per percentile, x = concurrent streams."""
    serve = [r for r in rows if r["scenario"] == "serve"]
    if not any(r["metric"].startswith(k + "_p") for r in serve for k, _ in SERVE_SERIES):
        return None
    fig, axes = plt.subplots(1, len(SERVE_SERIES), figsize=(12, 3.8), dpi=100)
    levels = sorted({r["batch"] for r in serve})
    slo = next((r for r in serve if "slo_ttft_ms" in r), {})
    for ax, (key, title) in zip(axes, SERVE_SERIES):
        for q in (50, 90, 99):
            points = [r for r in serve if r["metric"] == f"{key}_p{q}"]
            if points:
                _errorbar(ax, points, f"p{q}")
        if f"slo_{key}_ms" in slo:
            ax.axhline(slo[f"slo_{key}_ms"], color="#cc3311", ls="--", lw=1, label="SLO")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")                  # p99 and the SLO line can sit decades above p50
        ax.yaxis.set_major_formatter(plt.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(plt.FuncFormatter(lambda v, _: f"{v:g}" if f"{v:g}"[0] in "125" else ""))
        ax.set_xticks(levels, [str(c) for c in levels])
        ax.set_xlabel("concurrent streams")
        ax.set_ylabel(f"{key.upper()} (ms, log scale)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend()
    if slo:
        fig.suptitle(f"ortllm serve latency (SLOs: TTFT <= {slo['slo_ttft_ms']:g} ms, "
                     f"TPOT <= {slo['slo_tpot_ms']:g} ms)")
    return fig
