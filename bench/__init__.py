"""`ortllm bench`: scenarios that report figures (docs/architecture.md, Benchmarks), never timed tests."""
