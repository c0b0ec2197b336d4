"""`ortllm eval`: the quality report of artifacts against their fp32 reference (ortllm.calibration.eval)."""
from __future__ import annotations

import sys
from pathlib import Path

from .options import Bool


def add_eval(sub) -> None:
    p = sub.add_parser("eval", help="quality report of an artifact against its fp32 reference (docs/quality.md)")
    p.add_argument("artifact", type=Path, nargs="+",
                   help="artifact(s) to evaluate; several share one pass of the reference (reports in OUT/<name>/)")
    p.add_argument("--reference", required=True, type=Path, help="fp32 artifact of the same model")
    p.add_argument("--suite", default="fidelity,humaneval", help="comma-separated: fidelity, humaneval, adapters")
    p.add_argument("--out", required=True, type=Path, help="directory for report.json, report.md and plots")
    p.add_argument("--tokens", type=int, default=16384, help="scored tokens of the fidelity suite")
    p.add_argument("--ctx", type=int, default=2048, help="tokens per fidelity window")
    p.add_argument("--humaneval-n", type=int, default=164, help="HumanEval problems (the first N)")
    p.add_argument("--max-tokens", type=int, default=384, help="completion budget per HumanEval problem")
    p.add_argument("--pass-at-1", action=Bool, default=True,
                   help="HumanEval pass@1 by generation (--no-pass-at-1: NLL only) (default: on)")
    p.add_argument("--threads", type=int, default=None)
    p.set_defaults(run=run_eval)


def run_eval(a) -> int:
    from ortllm.calibration.eval import EvalOptions, evaluate, evaluate_many
    from ortllm.calibration.report import write_markdown

    opts = EvalOptions(suites=tuple(s.strip() for s in a.suite.split(",") if s.strip()), tokens=a.tokens,
                       ctx=a.ctx, humaneval_n=a.humaneval_n, max_tokens=a.max_tokens,
                       pass_at_1=a.pass_at_1, threads=a.threads)
    command = "ortllm " + " ".join(sys.argv[1:])
    if len(a.artifact) == 1:
        reports = [evaluate(a.artifact[0], a.reference, a.out, opts, command=command)]
    else:
        reports = evaluate_many(a.artifact, a.reference, a.out, opts, command=command)
    for report in reports:
        print(write_markdown(report))
    print(f"report(s) written under {a.out}", file=sys.stderr)
    return 0
