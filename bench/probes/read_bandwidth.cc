// Read bandwidth of this machine: a streaming AVX2 sum over 512 MB, per thread count (docs/notes/benchmarks.md).
//   g++ -O2 -mavx2 -pthread bench/probes/read_bandwidth.cc -o /tmp/bw && /tmp/bw 1 && /tmp/bw 2
#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>
int main(int argc, char** argv) {
  size_t n = size_t(512) << 20; int th = argc > 1 ? atoi(argv[1]) : 2;
  char* a = (char*)aligned_alloc(64, n); for (size_t i = 0; i < n; i += 4096) a[i] = 1;
  for (size_t i = 0; i < n; ++i) a[i] = (char)i;
  for (int rep = 0; rep < 5; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> ts; std::vector<long long> out(th);
    for (int t = 0; t < th; ++t) ts.emplace_back([&, t] {
      __m256i acc = _mm256_setzero_si256(); size_t lo = n / th * t, hi = n / th * (t + 1);
      for (size_t i = lo; i < hi; i += 128) {
        acc = _mm256_add_epi64(acc, _mm256_load_si256((__m256i*)(a + i)));
        acc = _mm256_add_epi64(acc, _mm256_load_si256((__m256i*)(a + i + 32)));
        acc = _mm256_add_epi64(acc, _mm256_load_si256((__m256i*)(a + i + 64)));
        acc = _mm256_add_epi64(acc, _mm256_load_si256((__m256i*)(a + i + 96)));
      }
      out[t] = _mm256_extract_epi64(acc, 0); });
    for (auto& t : ts) t.join();
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    printf("%d threads: %.1f GB/s\n", th, n / s / 1e9);
  }
}
