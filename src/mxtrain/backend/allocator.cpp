#include "mxtrain/backend/allocator.hpp"

#include <algorithm>

#include "mxtrain/core/error.hpp"

namespace mxtrain {

const char* lifetime_name(Lifetime lifetime) {
  switch (lifetime) {
    case Lifetime::parameter: return "parameters";
    case Lifetime::master_parameter: return "master parameters";
    case Lifetime::gradient: return "gradients";
    case Lifetime::optimizer_state: return "optimizer states";
    case Lifetime::activation: return "activations";
    case Lifetime::scratch: return "scratch";
    case Lifetime::workspace: return "workspaces";
    case Lifetime::communication: return "communication buffers";
    case Lifetime::data: return "data";
  }
  return "?";
}

struct CachingAllocator::Block {
  Segment* segment = nullptr;
  uintptr_t address = 0;
  size_t size = 0;
  bool free = true;
  bool small = false;
  Block* previous = nullptr;  // neighbours inside the segment
  Block* next = nullptr;
  std::string name;
  Lifetime lifetime = Lifetime::scratch;
};

struct CachingAllocator::Segment {
  void* base = nullptr;
  size_t size = 0;
  bool small = false;
  std::vector<std::unique_ptr<Block>> blocks;  // ownership; linked list gives the order
};

bool CachingAllocator::BlockOrder::operator()(const Block* a, const Block* b) const {
  if (a->size != b->size) return a->size < b->size;
  return a->address < b->address;
}

CachingAllocator::CachingAllocator(std::unique_ptr<MemorySource> source) : source_(std::move(source)) {
  stats_.capacity_bytes = source_->capacity_bytes();
}

CachingAllocator::~CachingAllocator() {
  for (auto& segment : segments_) source_->free_segment(segment->base, segment->size);
}

size_t CachingAllocator::round_size(size_t bytes) {
  if (bytes == 0) bytes = 1;
  return (bytes + kRound - 1) / kRound * kRound;
}

CachingAllocator::Block* CachingAllocator::find_free_block(bool small, size_t size) {
  auto& pool = small ? free_small_ : free_large_;
  Block probe;
  probe.size = size;
  probe.address = 0;
  auto found = pool.lower_bound(&probe);
  if (found == pool.end()) return nullptr;
  Block* block = *found;
  pool.erase(found);
  return block;
}

// The free block holding [at, at + size), taken out of its pool with the free memory before
// `at` left behind as a free block of its own; null when no free block holds it.
CachingAllocator::Block* CachingAllocator::take_free_block_at(bool small, size_t size, uintptr_t at) {
  auto& pool = small ? free_small_ : free_large_;
  for (auto it = pool.begin(); it != pool.end(); ++it) {
    Block* block = *it;
    if (block->address > at || at + size > block->address + block->size) continue;
    pool.erase(it);
    if (block->address == at) return block;
    auto rest = std::make_unique<Block>();
    rest->segment = block->segment;
    rest->address = at;
    rest->size = block->address + block->size - at;
    rest->small = block->small;
    rest->previous = block;
    rest->next = block->next;
    if (block->next) block->next->previous = rest.get();
    block->next = rest.get();
    block->size = at - block->address;
    pool.insert(block);
    Block* taken = rest.get();
    block->segment->blocks.push_back(std::move(rest));
    return taken;
  }
  return nullptr;
}

CachingAllocator::Block* CachingAllocator::split_block(Block* block, size_t size) {
  size_t remaining = block->size - size;
  // Small-pool blocks split down to the rounding unit; large ones only when the rest is itself
  // large, so big segments are not shredded into pieces no large request can reuse.
  bool split = block->small ? remaining >= kRound : remaining > kSmallLimit;
  if (!split) return block;
  auto rest = std::make_unique<Block>();
  rest->segment = block->segment;
  rest->address = block->address + size;
  rest->size = remaining;
  rest->small = block->small;
  rest->previous = block;
  rest->next = block->next;
  if (block->next) block->next->previous = rest.get();
  block->next = rest.get();
  block->size = size;
  (block->small ? free_small_ : free_large_).insert(rest.get());
  block->segment->blocks.push_back(std::move(rest));
  return block;
}

CachingAllocator::Allocation CachingAllocator::allocate(size_t bytes, const std::string& name, Lifetime lifetime,
                                                        const void* at) {
  std::lock_guard<std::mutex> lock(mutex_);
  size_t size = round_size(bytes);
  bool small = size <= kSmallLimit;
  Block* block = at != nullptr ? take_free_block_at(small, size, reinterpret_cast<uintptr_t>(at)) : nullptr;
  if (block == nullptr) block = find_free_block(small, size);
  if (block == nullptr) {
    size_t segment_size = small ? kSmallSegment : (size + kSegmentRound - 1) / kSegmentRound * kSegmentRound;
    void* base = source_->allocate_segment(segment_size);
    if (base == nullptr) {
      free_unused_segments();
      base = source_->allocate_segment(segment_size);
    }
    if (base == nullptr) throw_out_of_memory(bytes, name);
    auto segment = std::make_unique<Segment>();
    segment->base = base;
    segment->size = segment_size;
    segment->small = small;
    auto whole = std::make_unique<Block>();
    whole->segment = segment.get();
    whole->address = reinterpret_cast<uintptr_t>(base);
    whole->size = segment_size;
    whole->small = small;
    block = whole.get();
    segment->blocks.push_back(std::move(whole));
    segments_.push_back(std::move(segment));
    stats_.reserved_bytes += segment_size;
    stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.reserved_bytes);
  }
  block = split_block(block, size);
  block->free = false;
  block->name = name;
  block->lifetime = lifetime;
  stats_.live_bytes += block->size;
  stats_.live_by_lifetime[static_cast<int>(lifetime)] += block->size;
  stats_.peak_live_bytes = std::max(stats_.peak_live_bytes, stats_.live_bytes);
  ++stats_.allocations;
  if (trace_)
    trace_(TraceEvent{false, name, lifetime, bytes, block->size, stats_.live_bytes, stats_.reserved_bytes});
  return Allocation{reinterpret_cast<void*>(block->address), block};
}

void CachingAllocator::release(Block* block) {
  if (block == nullptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  MXTRAIN_ASSERT(!block->free, "double free of %s", block->name.c_str());
  stats_.live_bytes -= block->size;
  stats_.live_by_lifetime[static_cast<int>(block->lifetime)] -= block->size;
  if (trace_)
    trace_(TraceEvent{true, block->name, block->lifetime, 0, block->size, stats_.live_bytes, stats_.reserved_bytes});
  block->free = true;
  block->name.clear();
  auto& pool = block->small ? free_small_ : free_large_;
  // Coalesce with free neighbours; the merged-away block stays owned by the segment, unlinked.
  auto merge = [&](Block* left, Block* right) {
    pool.erase(right);
    left->size += right->size;
    left->next = right->next;
    if (right->next) right->next->previous = left;
    right->size = 0;
    right->segment = nullptr;
  };
  if (block->next && block->next->free) merge(block, block->next);
  if (block->previous && block->previous->free) {
    Block* left = block->previous;
    pool.erase(left);
    merge(left, block);
    block = left;
  }
  pool.insert(block);
  // Drop unlinked blocks so a long run does not grow the segment's vector without bound.
  auto& owned = block->segment->blocks;
  owned.erase(std::remove_if(owned.begin(), owned.end(), [](const auto& b) { return b->segment == nullptr; }),
              owned.end());
}

void CachingAllocator::free_unused_segments() {
  for (auto it = segments_.begin(); it != segments_.end();) {
    Segment* segment = it->get();
    Block* first = nullptr;
    for (auto& block : segment->blocks)
      if (block->segment != nullptr && block->previous == nullptr) first = block.get();
    if (first && first->free && first->next == nullptr && first->size == segment->size) {
      (segment->small ? free_small_ : free_large_).erase(first);
      source_->free_segment(segment->base, segment->size);
      stats_.reserved_bytes -= segment->size;
      it = segments_.erase(it);
    } else {
      ++it;
    }
  }
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mutex_);
  free_unused_segments();
}

MemoryStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void CachingAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.peak_live_bytes = stats_.live_bytes;
  stats_.peak_reserved_bytes = stats_.reserved_bytes;
}

void CachingAllocator::set_trace_hook(TraceHook hook) {
  std::lock_guard<std::mutex> lock(mutex_);
  trace_ = std::move(hook);
}

std::vector<CachingAllocator::LiveEntry> CachingAllocator::live_entries() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<LiveEntry> entries;
  for (const auto& segment : segments_)
    for (const auto& block : segment->blocks)
      if (block->segment != nullptr && !block->free) entries.push_back({block->name, block->lifetime, block->size});
  std::sort(entries.begin(), entries.end(), [](const LiveEntry& a, const LiveEntry& b) { return a.bytes > b.bytes; });
  return entries;
}

static std::string gib(size_t bytes) { return strf("%.2f GiB", static_cast<double>(bytes) / (1ull << 30)); }

void CachingAllocator::throw_out_of_memory(size_t requested, const std::string& name) {
  std::string what = strf("%s memory exhausted: could not allocate %s for '%s'; %s in use by live buffers, %s reserved",
                          source_->device_label(), gib(requested).c_str(), name.c_str(), gib(stats_.live_bytes).c_str(),
                          gib(stats_.reserved_bytes).c_str());
  if (stats_.capacity_bytes) what += strf(", device capacity %s", gib(stats_.capacity_bytes).c_str());
  std::string by_kind;
  for (int kind = 0; kind < kLifetimeCount; ++kind) {
    if (stats_.live_by_lifetime[kind] == 0) continue;
    by_kind += strf("%s%s %s", by_kind.empty() ? "" : ", ", lifetime_name(static_cast<Lifetime>(kind)),
                    gib(stats_.live_by_lifetime[kind]).c_str());
  }
  if (!by_kind.empty()) what += " (" + by_kind + ")";
  throw Error(ErrorKind::out_of_memory, what,
              "lower train.micro_batch_size or train.seq_len, turn on activation checkpointing "
              "(--recompute full or selective), shard across more GPUs (dist.strategy=full_shard), or use a "
              "smaller precision (--precision bf16/fp8); `mxtrain plan` shows what fits");
}

}  // namespace mxtrain
