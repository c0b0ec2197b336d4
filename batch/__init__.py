"""Offline batch inference on OpenAI Batch JSONL (`ortllm batch`): resumable, crash-safe, with progress; locally
on one Engine or on Ray Data with one Engine per actor. See docs/batch.md.

    from ortllm.batch import BatchOptions, run_batch
    run_batch("artifacts/smollm2-135m-instruct", "in.jsonl", "out.jsonl", BatchOptions(max_num_seqs=16))
"""
from .job import BatchOptions, Summary, run_batch
from .output import BatchFileError

__all__ = ["BatchFileError", "BatchOptions", "Summary", "run_batch"]
