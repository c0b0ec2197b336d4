"""The `ortllm` command line. Each verb parses its options here and calls its package.

User errors print one line (`ortllm: error: ...`) and exit 1; nothing a user does prints a traceback.
Set ORTLLM_DEBUG=1 to see tracebacks of unexpected failures.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


# ---------------------------------------------------------------- build

def _add_build(sub) -> None:
    p = sub.add_parser("build", help="build an artifact from a recipe, a GGUF file or a HF directory")
    p.add_argument("model", metavar="RECIPE|PATH")
    p.add_argument("--out", required=True, type=Path, help="artifact directory to write")
    p.add_argument("--source", help="weights for recipes that take a local path (e.g. tinyllama-1.1b-chat)")
    p.add_argument("--quant", default=None, help="fp32|int8|int4 (default: the recipe's)")
    p.add_argument("--block-size", type=int, default=None, help="quantization block size (default: recipe's)")
    p.add_argument("--algo", default="rtn", help="rtn|hqq|gptq")
    p.add_argument("--lm-head", default="fp32", help="fp32|int8|int4")
    p.add_argument("--kv", default=None, help="KV cache dtype fp32|int8|fp8 (default: recipe's)")
    p.add_argument("--kv-block-size", type=int, default=16, help="tokens per paged KV block (engine graph)")
    p.add_argument("--graph", default="portable", help="engine|portable (portable: stock ONNX Runtime)")
    p.add_argument("--exporter", default="native", help="native|optimum (optimum also writes optimum/)")
    p.add_argument("--force", action="store_true", help="replace whatever --out holds")
    p.set_defaults(run=_run_build)


def _run_build(a) -> int:
    from ortllm.pipeline.build import BuildOptions, build
    from ortllm.pipeline.recipes import known_recipes

    defaults = known_recipes()[a.model].build if a.model in known_recipes() else {}
    opts = BuildOptions(
        quant=a.quant or defaults.get("quant", "fp32"),
        block_size=a.block_size or defaults.get("block_size", 32),
        algo=a.algo, lm_head=a.lm_head, kv=a.kv or defaults.get("kv", "fp32"),
        graph=a.graph, exporter=a.exporter, kv_block_size=a.kv_block_size)
    build(a.model, a.out, opts, source=a.source, force=a.force, log=lambda m: print(m, file=sys.stderr))
    return 0


# ---------------------------------------------------------------- generate

def _add_generate(sub) -> None:
    p = sub.add_parser("generate", help="print a completion for one prompt")
    p.add_argument("artifact", type=Path)
    p.add_argument("--prompt", required=True)
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    p.add_argument("--system", default=None, help="system message (with --chat)")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--threads", type=int, default=None, help="intra-op threads (default: physical cores)")
    p.set_defaults(run=_run_generate)


def _run_generate(a) -> int:
    from ortllm.runtime.generate import generate_text

    for piece in generate_text(a.artifact, a.prompt, chat=a.chat, system=a.system, max_tokens=a.max_tokens,
                               temperature=a.temperature, seed=a.seed, threads=a.threads):
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    return 0


# ---------------------------------------------------------------- main

def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ortllm", description="small llama-family models with many LoRA "
                                     "adapters on CPUs, on ONNX Runtime")
    sub = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    _add_build(sub)
    _add_generate(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    try:
        return args.run(args)
    except KeyboardInterrupt:
        print("ortllm: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - the one place that turns errors into a line for the user
        from ortllm.runtime.errors import OrtllmError
        if isinstance(e, OrtllmError):
            print(f"ortllm: error: {e}", file=sys.stderr)
            return 1
        if os.environ.get("ORTLLM_DEBUG"):
            raise
        print(f"ortllm: internal error: {type(e).__name__}: {e} (rerun with ORTLLM_DEBUG=1 for details; "
              "please report it)", file=sys.stderr)
        return 70


if __name__ == "__main__":
    sys.exit(main())
