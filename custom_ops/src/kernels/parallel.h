// A minimal parallel-for hook so the pure kernels can use the session's intra-op thread pool
// without seeing ORT types. The ORT wrapper fills it with KernelContext_ParallelFor; tests or
// tools may leave it serial.
#pragma once
#include <cstddef>

namespace ortllm {

struct Parallel {
  // Runs fn(usr, i) for every i in [0, total), possibly concurrently; returns when all are done.
  void (*for_each)(void* ctx, void (*fn)(void*, size_t), size_t total, void* usr) = nullptr;
  void* ctx = nullptr;

  void run(size_t total, void (*fn)(void*, size_t), void* usr) const {
    if (for_each && total > 1) {
      for_each(ctx, fn, total, usr);
    } else {
      for (size_t i = 0; i < total; ++i) fn(usr, i);
    }
  }
};

}  // namespace ortllm
