"""`ortllm bench`: scenarios that report figures (DESIGN.md, Benchmarks), never timed tests."""
