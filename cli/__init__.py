"""The `ortllm` command line: the dispatcher. Each verb's parser and handler live in its own module (cli/build.py,
generate.py, run.py, eval.py, adapters.py, bench.py, serve.py, batch.py, store_verbs.py for pull, list, show, rm,
cp and ps); the verb modules import what they run only when they run.

User errors print one line (`ortllm: error: ...`) and exit 1; nothing a user does prints a traceback.
Set ORTLLM_DEBUG=1 to see tracebacks of unexpected failures.
"""
from __future__ import annotations

import argparse
import os
import sys

from . import options
from .adapters import add_adapters
from .batch import add_batch
from .bench import add_bench
from .build import add_build
from .build_options import add_build_options, build_options
from .eval import add_eval
from .generate import add_generate
from .options import Parser
from .run import add_run
from .serve import add_serve
from .store_verbs import add_store_verbs


def make_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The command line; with argv, only the options of its verb are declared (the others' imports skipped)."""
    options.PARSING[0] = None if argv is None else next((x for x in argv if not x.startswith("-")), "")
    parser = Parser(prog="ortllm", description="small llama-family models with many LoRA "
                                     "adapters on CPUs, on ONNX Runtime")
    sub = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    for add in (add_build, add_generate, add_run, add_eval, add_adapters, add_bench, add_serve, add_batch):
        add(sub)
    add_store_verbs(sub, add_build_options, build_options)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = make_parser(argv).parse_args(argv)
    try:
        from .store_verbs import resolve_artifact_args
        if hasattr(args, "prepare"):
            args.prepare(args)           # options from other sources than the command line (serve: env, file)
        resolve_artifact_args(args)      # store names (NAME:TAG) -> their artifact directories
        return args.run(args)
    except KeyboardInterrupt:
        print("ortllm: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - the one place that turns errors into a line for the user
        from ortllm.runtime.artifact import ArtifactError
        from ortllm.runtime.errors import OrtllmError
        from ortllm.runtime.store import with_store_repair_hint
        if isinstance(e, ArtifactError):
            e = with_store_repair_hint(e)          # a damaged store model: the pull that repairs it
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
