#include "agent/model/normal_draw.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "agent/chunks/cpu_adamw.h"

namespace memplan {

namespace {

uint64_t SegmentSeed(uint64_t seed, int64_t j) {
  if (j == 0) return seed;
  uint64_t z = seed + 0xBF58476D1CE4E5B9ull * static_cast<uint64_t>(j);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}


}  // namespace

torch::Tensor DrawNormalRange(uint64_t seed, int64_t numel, int64_t begin, int64_t len,
                              int max_threads, torch::ScalarType dtype) {
  torch::Tensor out = at::empty({len}, dtype);
  if (len == 0) return out;
  const bool fp32 = dtype == torch::kFloat32;
  const int64_t first = begin / kDrawSegment;
  const int64_t last = (begin + len - 1) / kDrawSegment;
  // `scratch`: the worker's fp32 segment, reused across its segments. [Draw workers] A fresh
  // 16 MiB allocation per segment and torch's own threaded copy per segment (an OpenMP team per
  // worker thread) are what a load of 32 B bf16 values on 16 cores spent its time on.
  auto draw = [&](int64_t j, std::vector<float>& scratch) {
    const int64_t seg_begin = j * kDrawSegment;
    const int64_t seg_len = std::min(kDrawSegment, numel - seg_begin);
    auto gen = at::make_generator<at::CPUGeneratorImpl>(SegmentSeed(seed, j));
    const int64_t a = std::max(begin, seg_begin);
    const int64_t b = std::min(begin + len, seg_begin + seg_len);
    if (fp32 && a == seg_begin && b == seg_begin + seg_len) {
      float* dst = out.data_ptr<float>() + (a - begin);
      torch::from_blob(dst, {seg_len}, torch::kFloat32).normal_(0.0, 0.02, gen);
      return;
    }
    // One segment in fp32 (16 MiB), its part rounded into `out`: the same values as rounding the
    // whole fp32 draw, without the fp32 copy of the range.
    scratch.resize(static_cast<size_t>(seg_len));
    torch::from_blob(scratch.data(), {seg_len}, torch::kFloat32).normal_(0.0, 0.02, gen);
    const float* part = scratch.data() + (a - seg_begin);
    const int64_t at_out = a - begin;
    if (fp32) {
      std::copy(part, part + (b - a), out.data_ptr<float>() + at_out);
    } else if (dtype == torch::kBFloat16) {
      // Round to nearest even, as torch's fp32 -> bf16 copy (the vectorised kernel of
      // agent/chunks/cpu_adamw.h).
      RoundToBf16(b - a, part, reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>()) + at_out);
    } else if (dtype == torch::kHalf) {
      at::Half* dst = out.data_ptr<at::Half>() + at_out;
      for (int64_t i = 0; i < b - a; ++i) dst[i] = static_cast<at::Half>(part[i]);
    } else {
      out.narrow(0, at_out, b - a)
          .copy_(torch::from_blob(const_cast<float*>(part), {b - a}, torch::kFloat32));
    }
  };
  // Up to max_threads threads of our own: at::parallel_for's OpenMP team exists only in
  // translation units built with OpenMP, which this one is not (the segments ran one after
  // another there: 300 M values/s on an H200 host).
  const int64_t threads = std::min<int64_t>(last - first + 1, std::max(max_threads, 1));
  if (threads <= 1) {
    std::vector<float> scratch;
    for (int64_t j = first; j <= last; ++j) draw(j, scratch);
    return out;
  }
  std::atomic<int64_t> next{first};
  std::mutex error_mu;
  std::exception_ptr error;
  auto work = [&] {
    std::vector<float> scratch;
    for (int64_t j = next++; j <= last; j = next++) {
      try {
        draw(j, scratch);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mu);
        if (!error) error = std::current_exception();
        next = last + 1;
      }
    }
  };
  std::vector<std::thread> pool;
  for (int64_t t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  if (error) std::rethrow_exception(error);
  return out;
}

}  // namespace memplan
