// A CUDA injection library that records every kernel, memcpy and memset of a process with its
// GPU start and end time (CUPTI activity API) and writes them as CSV when the process exits:
// the real-step timeline that ncu (which serialises kernels) cannot give and nsys (absent on
// the GPU machine) would. Works on any CUDA program, mxtrain and the PyTorch baseline alike.
//
//   build: g++ -std=c++17 -O2 -shared -fPIC bench/cupti_trace.cpp -I$CUDA/include -L$CUDA/lib64 -lcupti \
//            -o build/libmxtrain_cupti_trace.so
//   use:   CUDA_INJECTION64_PATH=$PWD/build/libmxtrain_cupti_trace.so CUPTI_TRACE_OUT=trace.csv mxtrain bench ...
//          python3 bench/step_timeline.py trace.csv
//
// The library needs libcupti.so.13 on the loader path at run time (the CUDA toolkit's lib64; on
// the GPU machine a copy carried in .gpu-libs, which scripts/gpu_env.sh puts on the path).
// CSV columns: kind (K kernel, C memcpy, S memset), start_ns, end_ns, stream, name.
//
// CUPTI_TRACE_MEMSET_CALLERS=1 also counts every memset call by the call stack that made it (the
// shared object and offset of each of its first frames, through the driver API callback) and
// prints the counts at exit: whose memsets they are (the program's, cuBLASLt's, cuDNN's).
#include <cupti.h>
#include <dlfcn.h>
#include <execinfo.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace {

struct Record {
  char kind;
  uint64_t start, end;
  uint32_t stream;
  std::string name;
};

std::mutex records_mutex;
std::vector<Record> records;
std::atomic<bool> flushed{false};
constexpr size_t kBufferBytes = 8u << 20;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(aligned_alloc(8, kBufferBytes));
  *size = kBufferBytes;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* activity = nullptr;
  std::vector<Record> batch;
  while (cuptiActivityGetNextRecord(buffer, valid, &activity) == CUPTI_SUCCESS) {
    switch (activity->kind) {
      case CUPTI_ACTIVITY_KIND_KERNEL:
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        auto* k = reinterpret_cast<CUpti_ActivityKernel9*>(activity);
        batch.push_back({'K', k->start, k->end, k->streamId, k->name ? k->name : "?"});
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        auto* m = reinterpret_cast<CUpti_ActivityMemcpy6*>(activity);
        batch.push_back({'C', m->start, m->end, m->streamId, "memcpy kind " + std::to_string(m->copyKind) +
                                                                " bytes " + std::to_string(m->bytes)});
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        auto* m = reinterpret_cast<CUpti_ActivityMemset4*>(activity);
        batch.push_back({'S', m->start, m->end, m->streamId, "memset bytes " + std::to_string(m->bytes)});
        break;
      }
      default: break;
    }
  }
  free(buffer);
  std::lock_guard<std::mutex> lock(records_mutex);
  for (Record& r : batch) records.push_back(std::move(r));
}

std::mutex callers_mutex;
std::map<std::string, uint64_t> memset_callers;  // call stack -> calls

// "object+0xoffset" for each frame past the callback's own.
std::string call_stack() {
  void* frames[24];
  const int n = backtrace(frames, 24);
  std::string stack;
  for (int i = 2; i < n; ++i) {
    Dl_info info{};
    char frame[256];
    if (dladdr(frames[i], &info) != 0 && info.dli_fname != nullptr) {
      const char* base = std::strrchr(info.dli_fname, '/');
      std::snprintf(frame, sizeof frame, "%s+0x%lx", base ? base + 1 : info.dli_fname,
                    static_cast<unsigned long>(static_cast<char*>(frames[i]) - static_cast<char*>(info.dli_fbase)));
    } else {
      std::snprintf(frame, sizeof frame, "%p", frames[i]);
    }
    stack += stack.empty() ? "" : " < ";
    stack += frame;
  }
  return stack;
}

void CUPTIAPI api_callback(void*, CUpti_CallbackDomain, CUpti_CallbackId, const void* data) {
  const auto* info = static_cast<const CUpti_CallbackData*>(data);
  if (info->callbackSite != CUPTI_API_ENTER || info->functionName == nullptr ||
      std::strstr(info->functionName, "Memset") == nullptr)
    return;
  std::string key = std::string(info->functionName) + ": " + call_stack();
  std::lock_guard<std::mutex> lock(callers_mutex);
  ++memset_callers[key];
}

void write_trace() {
  if (flushed.exchange(true)) return;
  {
    std::lock_guard<std::mutex> lock(callers_mutex);
    for (const auto& [stack, calls] : memset_callers)
      std::fprintf(stderr, "cupti_trace: memset calls %llu from %s\n", static_cast<unsigned long long>(calls),
                   stack.c_str());
  }
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  const char* path = std::getenv("CUPTI_TRACE_OUT");
  FILE* out = std::fopen(path ? path : "cupti_trace.csv", "w");
  if (!out) {
    std::fprintf(stderr, "cupti_trace: cannot write %s\n", path ? path : "cupti_trace.csv");
    return;
  }
  std::lock_guard<std::mutex> lock(records_mutex);
  std::fprintf(out, "kind,start_ns,end_ns,stream,name\n");
  for (const Record& r : records) {
    std::string name = r.name;
    for (char& c : name)
      if (c == '"') c = '\'';
    std::fprintf(out, "%c,%llu,%llu,%u,\"%s\"\n", r.kind, static_cast<unsigned long long>(r.start),
                 static_cast<unsigned long long>(r.end), r.stream, name.c_str());
  }
  std::fclose(out);
  std::fprintf(stderr, "cupti_trace: %zu records -> %s\n", records.size(), path ? path : "cupti_trace.csv");
}

}  // namespace

extern "C" int InitializeInjection(void) {
  cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET);
  if (const char* callers = std::getenv("CUPTI_TRACE_MEMSET_CALLERS"); callers != nullptr && callers[0] == '1') {
    CUpti_SubscriberHandle subscriber;
    if (cuptiSubscribe(&subscriber, api_callback, nullptr) == CUPTI_SUCCESS)
      cuptiEnableDomain(1, subscriber, CUPTI_CB_DOMAIN_DRIVER_API);
  }
  std::atexit(write_trace);  // before the runtime's own teardown (registered earlier, so run later)
  return 1;
}
