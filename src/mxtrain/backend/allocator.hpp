// The caching allocator shared by every backend. Its logic — sizes rounded to 512 bytes,
// small requests carved from 2 MiB segments, large ones from segments rounded to 2 MiB,
// best-fit reuse with splitting and coalescing, cached segments released only to retry after
// a failed request — is the same on cuda, cpu and dryrun. Only the MemorySource differs
// (cudaMalloc, aligned host memory, or fake addresses), so the dryrun's live, peak and reserved
// bytes are what the real run will report, to the byte.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

namespace mxtrain {

// What a buffer is for; the planner's breakdown and OOM messages group bytes by it.
enum class Lifetime : uint8_t {
  parameter,        // compute-precision weights (gathered or local)
  master_parameter, // FP32 master weights
  gradient,
  optimizer_state,
  activation,       // saved for backward
  scratch,          // freed within the op sequence that made it
  workspace,        // library workspaces (cuBLASLt, cuDNN)
  communication,    // FSDP gather/reduce buffers
  data,             // token batches
};
constexpr int kLifetimeCount = 9;
const char* lifetime_name(Lifetime lifetime);

// Raw memory: whole segments. Returns nullptr when the device has no more memory.
class MemorySource {
 public:
  virtual ~MemorySource() = default;
  virtual void* allocate_segment(size_t bytes) = 0;
  virtual void free_segment(void* pointer, size_t bytes) = 0;
  virtual size_t capacity_bytes() const = 0;  // total memory of the device (0 = unknown)
  virtual const char* device_label() const = 0;
};

struct MemoryStats {
  size_t live_bytes = 0;           // sum of rounded sizes of live allocations
  size_t peak_live_bytes = 0;
  size_t reserved_bytes = 0;       // sum of segment sizes held from the source
  size_t peak_reserved_bytes = 0;
  size_t capacity_bytes = 0;
  size_t live_by_lifetime[kLifetimeCount] = {};
  size_t allocations = 0;          // number of allocate() calls since construction
};

class CachingAllocator {
 public:
  static constexpr size_t kRound = 512;
  static constexpr size_t kSmallLimit = 1 << 20;     // requests up to 1 MiB use the small pool
  static constexpr size_t kSmallSegment = 2 << 20;   // small-pool segment size
  static constexpr size_t kSegmentRound = 2 << 20;   // large segments are multiples of 2 MiB

  struct Block;
  struct Allocation {
    void* pointer = nullptr;
    Block* block = nullptr;
  };
  struct LiveEntry {
    std::string name;
    Lifetime lifetime;
    size_t bytes;
  };

  // One allocate() or release(), as the trace hook sees it. bytes: what the block charges to the
  // live bytes (the rounded request, or more where a large block was not split).
  struct TraceEvent {
    bool is_free = false;
    std::string name;
    Lifetime lifetime = Lifetime::scratch;
    size_t bytes_requested = 0;  // allocate() only
    size_t bytes = 0;
    size_t live_bytes_after = 0;
    size_t reserved_bytes_after = 0;
  };
  using TraceHook = std::function<void(const TraceEvent&)>;

  explicit CachingAllocator(std::unique_ptr<MemorySource> source);
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  static size_t round_size(size_t bytes);

  // Throws Error(out_of_memory) with the request, use, reservation and capacity. at: where the
  // block should start, if the free memory there holds it (else best fit as without it): a
  // buffer that lives from one step into the next can come back to the address a step graph
  // holds for it.
  Allocation allocate(size_t bytes, const std::string& name, Lifetime lifetime, const void* at = nullptr);
  void release(Block* block);

  MemoryStats stats() const;
  void reset_peak();
  void empty_cache();  // returns wholly free segments to the source
  std::vector<LiveEntry> live_entries() const;
  // Called after every allocate() and release() (under the allocator's lock: the hook must not
  // call back into it); an empty hook detaches. For tests and tools comparing backends' traces.
  void set_trace_hook(TraceHook hook);
  const MemorySource& source() const { return *source_; }

 private:
  struct Segment;
  Block* find_free_block(bool small, size_t size);
  Block* take_free_block_at(bool small, size_t size, uintptr_t at);
  Block* split_block(Block* block, size_t size);
  void free_unused_segments();
  [[noreturn]] void throw_out_of_memory(size_t requested, const std::string& name);

  std::unique_ptr<MemorySource> source_;
  mutable std::mutex mutex_;
  std::vector<std::unique_ptr<Segment>> segments_;
  // Free blocks ordered by (size, address) per pool: best fit = lower_bound.
  struct BlockOrder {
    bool operator()(const Block* a, const Block* b) const;
  };
  std::set<Block*, BlockOrder> free_small_;
  std::set<Block*, BlockOrder> free_large_;
  MemoryStats stats_;
  TraceHook trace_;
};

}  // namespace mxtrain
