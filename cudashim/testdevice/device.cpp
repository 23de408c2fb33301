// The test accelerator: a PrivateUse1 device with memory the host cannot touch.
//
// Device memory is whole pages mapped twice: at the address tensors hold, PROT_NONE for good,
// and at a second address, readable and writable, that only the device's kernels and copies
// use (``host_address``). A kernel runs torch's CPU kernel on host views over the second
// mapping, so host code that reads or writes a device tensor without a copy (a missed .cpu(),
// .numpy() on a device tensor, a pointer handed to a host library) dies with SIGSEGV instead
// of silently working, and no kernel changes a page's protection. While a kernel runs, the
// CPU allocator gives its thread device memory at the host mapping (``AllocateOnDevice``),
// so the kernel's results are made on the device rather than copied there.
//
// Built from PyTorch's documented PrivateUse1 extension points: a device guard (devices,
// streams, events), the PrivateUse1 hooks (generators, pinned memory), a DeviceAllocator
// (memory statistics for torch.accelerator), kernels for allocation and copies, a boxed
// fallback for every other op, and autocast's lists for the AutocastPrivateUse1 key.
// Streams and events keep the API's semantics over a synchronous device.
//
// It builds against every torch cudashim supports (2.4 and later): what a release lacks is
// left out by TESTDEVICE_TORCH_SINCE, and the device's own statistics, current device and
// streams are answered by this extension (the Python bindings at the end), not through
// torch.accelerator, which older releases lack and a CUDA build answers for CUDA.

#include "device.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/GeneratorForPrivateuseone.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/Generator.h>
#include <torch/csrc/Stream.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/version.h>

// Whether the torch this is built against is release major.minor or newer.
#define TESTDEVICE_TORCH_SINCE(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))
// torch 2.9 gave devices an allocator interface with statistics (torch.accelerator's memory
// functions read it); before, an allocator is only an allocator.
#define TESTDEVICE_DEVICE_ALLOCATOR TESTDEVICE_TORCH_SINCE(2, 9)
#if TESTDEVICE_DEVICE_ALLOCATOR
#include <c10/core/CachingDeviceAllocator.h>
#endif

#include <pthread.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <unordered_map>

namespace testdevice {

int device_count = 0;  // set once by init()

void check_index(c10::DeviceIndex index) {
  TORCH_CHECK_INDEX(index >= 0 && index < device_count, "invalid device ordinal ", int(index),
                    ": the test accelerator has ", device_count, " device(s)");
}

// --- device memory: mapped pages, readable only while a kernel holds them open ----------

struct Region {
  size_t bytes;              // whole pages
  size_t requested;
  c10::DeviceIndex device;
  uintptr_t host;            // where the host reaches the same pages
};

// Pages mapped at two addresses: ``device`` PROT_NONE, ``host`` readable and writable.
struct Mapping {
  uintptr_t device, host;
};

// One statistic, kept as torch's caching allocators keep theirs.
struct Stat {
  int64_t current = 0, peak = 0, allocated = 0, freed = 0;
  void increase(int64_t amount) {
    current += amount;
    peak = std::max(peak, current);
    allocated += amount;
  }
  void decrease(int64_t amount) {
    current -= amount;
    freed += amount;
  }
  void reset_accumulated() { allocated = freed = 0; }
  void reset_peak() { peak = current; }
};

// A device's statistics, by the names torch.cuda.memory_stats() gives them.
struct DeviceStats {
  Stat allocation, segment, active, allocated_bytes, reserved_bytes, active_bytes, requested_bytes;
  int64_t num_device_alloc = 0, num_device_free = 0;

  std::vector<std::pair<const char*, Stat*>> named() {
    return {{"allocation", &allocation}, {"segment", &segment}, {"active", &active},
            {"allocated_bytes", &allocated_bytes}, {"reserved_bytes", &reserved_bytes},
            {"active_bytes", &active_bytes}, {"requested_bytes", &requested_bytes}};
  }
};

std::mutex memory_mutex;
std::map<uintptr_t, Region> regions;                  // by start address
DeviceStats stats[kMaxDevices];
// Freed regions kept mapped (PROT_NONE, their pages resident) for the next allocation of the
// same size, as CUDA's caching allocator keeps its blocks: a fresh mapping costs a page fault
// per page at its first touch, and unmapping one a TLB flush. empty_cache() unmaps them.
std::multimap<size_t, Mapping> cached[kMaxDevices];    // bytes -> its two addresses
std::unordered_map<uintptr_t, uintptr_t> device_of_host;  // host start -> device start, allocated regions

size_t whole_pages(size_t bytes) {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return (bytes + page - 1) / page * page;
}

// The region holding ``address``; the caller holds memory_mutex.
std::map<uintptr_t, Region>::iterator region_of(const void* address) {
  auto key = reinterpret_cast<uintptr_t>(address);
  auto it = regions.upper_bound(key);
  if (it == regions.begin()) return regions.end();
  --it;
  return key < it->first + it->second.bytes ? it : regions.end();
}

// A region handed out (allocated) or given back (freed): the allocation statistics.
void update(c10::DeviceIndex device, const Region& region, bool allocated) {
  auto& s = stats[device];
  for (auto* stat : {&s.allocation, &s.active}) {
    allocated ? stat->increase(1) : stat->decrease(1);
  }
  for (auto* stat : {&s.allocated_bytes, &s.active_bytes}) {
    allocated ? stat->increase(region.bytes) : stat->decrease(region.bytes);
  }
  allocated ? s.requested_bytes.increase(region.requested) : s.requested_bytes.decrease(region.requested);
}

// A mapping made (reserved) or unmapped: the segment statistics.
void update_segments(c10::DeviceIndex device, size_t bytes, bool reserved) {
  auto& s = stats[device];
  reserved ? s.segment.increase(1) : s.segment.decrease(1);
  reserved ? s.reserved_bytes.increase(bytes) : s.reserved_bytes.decrease(bytes);
  reserved ? ++s.num_device_alloc : ++s.num_device_free;
}

// Unmaps a device's cached regions; the caller holds memory_mutex.
void unmap_cached(c10::DeviceIndex device) {
  for (auto& [bytes, mapping] : cached[device]) {
    munmap(reinterpret_cast<void*>(mapping.device), bytes);
    munmap(reinterpret_cast<void*>(mapping.host), bytes);
    update_segments(device, bytes, false);
  }
  cached[device].clear();
}

void empty_cache() {
  std::lock_guard<std::mutex> lock(memory_mutex);
  for (c10::DeviceIndex device = 0; device < device_count; ++device) unmap_cached(device);
}

void release(void* address) {
  if (address == nullptr) return;
  std::lock_guard<std::mutex> lock(memory_mutex);
  auto it = regions.find(reinterpret_cast<uintptr_t>(address));
  TORCH_INTERNAL_ASSERT(it != regions.end(), "freeing memory the test accelerator never gave");
  Region& region = it->second;
  update(region.device, region, false);
  cached[region.device].emplace(region.bytes, Mapping{it->first, region.host});
  device_of_host.erase(region.host);
  regions.erase(it);
}

thread_local c10::DeviceIndex current_device = 0;

DeviceStats device_stats(c10::DeviceIndex device) {
  check_index(device);
  std::lock_guard<std::mutex> lock(memory_mutex);
  return stats[device];
}

void reset_accumulated_stats(c10::DeviceIndex device) {
  check_index(device);
  std::lock_guard<std::mutex> lock(memory_mutex);
  for (auto& named : stats[device].named()) named.second->reset_accumulated();
  stats[device].num_device_alloc = stats[device].num_device_free = 0;
}

void reset_peak_stats(c10::DeviceIndex device) {
  check_index(device);
  std::lock_guard<std::mutex> lock(memory_mutex);
  for (auto& named : stats[device].named()) named.second->reset_peak();
}

std::pair<size_t, size_t> memory_info(c10::DeviceIndex device) {
  check_index(device);
  std::lock_guard<std::mutex> lock(memory_mutex);
  return {kCapacity - stats[device].reserved_bytes.current, kCapacity};
}

#if TESTDEVICE_DEVICE_ALLOCATOR
// Ours in torch's form: the aggregate entry of each of its arrays (the only pool here).
c10::CachingDeviceAllocator::DeviceStats torch_stats(DeviceStats ours) {
  c10::CachingDeviceAllocator::DeviceStats theirs;
  auto all = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  auto copy = [all](c10::CachingAllocator::StatArray& to, const Stat& from) {
    to[all].current = from.current;
    to[all].peak = from.peak;
    to[all].allocated = from.allocated;
    to[all].freed = from.freed;
  };
  copy(theirs.allocation, ours.allocation);
  copy(theirs.segment, ours.segment);
  copy(theirs.active, ours.active);
  copy(theirs.allocated_bytes, ours.allocated_bytes);
  copy(theirs.reserved_bytes, ours.reserved_bytes);
  copy(theirs.active_bytes, ours.active_bytes);
  copy(theirs.requested_bytes, ours.requested_bytes);
  theirs.num_device_alloc = ours.num_device_alloc;
  theirs.num_device_free = ours.num_device_free;
  return theirs;
}
using AllocatorBase = c10::DeviceAllocator;
#else
using AllocatorBase = c10::Allocator;
#endif

// ``bytes`` of fresh device memory: a memory file mapped PROT_NONE where tensors will point,
// and again readable and writable for the device's kernels. The file is closed at once; the
// mappings keep its pages.
Mapping map_twice(size_t bytes, c10::Device device) {
  int file = static_cast<int>(syscall(SYS_memfd_create, "shimdev", 1u /* MFD_CLOEXEC */));
  TORCH_CHECK_WITH(OutOfMemoryError, file >= 0 && ftruncate(file, static_cast<off_t>(bytes)) == 0,
                   "out of memory on test accelerator ", device, ": no memory file of ", bytes,
                   " bytes: ", std::strerror(errno));
  void* at_device = mmap(nullptr, bytes, PROT_NONE, MAP_SHARED | MAP_NORESERVE, file, 0);
  void* at_host = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, file, 0);
  close(file);
  if (at_device == MAP_FAILED || at_host == MAP_FAILED) {
    if (at_device != MAP_FAILED) munmap(at_device, bytes);
    if (at_host != MAP_FAILED) munmap(at_host, bytes);
    TORCH_CHECK_WITH(OutOfMemoryError, false, "out of memory on test accelerator ", device, ": mmap of ",
                     bytes, " bytes failed: ", std::strerror(errno));
  }
  return {reinterpret_cast<uintptr_t>(at_device), reinterpret_cast<uintptr_t>(at_host)};
}

struct DeviceMemory final : AllocatorBase {
  c10::DataPtr allocate(size_t requested) override {
    c10::Device device(kDevice, current_device);
    if (requested == 0) return {nullptr, nullptr, &release, device};
    size_t bytes = whole_pages(requested);
    std::lock_guard<std::mutex> lock(memory_mutex);
    auto& pool = cached[device.index()];
    Mapping mapping;
    auto reusable = pool.find(bytes);
    if (reusable != pool.end()) {
      mapping = reusable->second;
      pool.erase(reusable);
    } else {
      auto& reserved = stats[device.index()].reserved_bytes.current;
      if (static_cast<size_t>(reserved) + bytes > kCapacity) unmap_cached(device.index());
      TORCH_CHECK_WITH(OutOfMemoryError, static_cast<size_t>(reserved) + bytes <= kCapacity,
                       "out of memory on test accelerator ", device, ": tried to allocate ", requested,
                       " bytes with ", reserved, " of ", kCapacity, " in use");
      mapping = map_twice(bytes, device);
      update_segments(device.index(), bytes, true);
    }
    Region region{bytes, requested, device.index(), mapping.host};
    regions.emplace(mapping.device, region);
    device_of_host.emplace(mapping.host, mapping.device);
    update(device.index(), region, true);
    void* address = reinterpret_cast<void*>(mapping.device);
    return {address, address, &release, device};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* destination, const void* source, std::size_t count) const override;

#if TESTDEVICE_DEVICE_ALLOCATOR
  bool initialized() override { return device_count > 0; }
  void emptyCache(c10::MempoolId_t) override { empty_cache(); }
  void recordStream(const c10::DataPtr&, c10::Stream) override {}  // streams are synchronous
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    return torch_stats(device_stats(device));
  }
  void resetAccumulatedStats(c10::DeviceIndex device) override { reset_accumulated_stats(device); }
  void resetPeakStats(c10::DeviceIndex device) override { reset_peak_stats(device); }
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override { return memory_info(device); }
#endif
};

DeviceMemory device_memory;
c10::Allocator* const device_allocator = &device_memory;
REGISTER_ALLOCATOR(kDevice, &device_memory);

void* host_address(const void* address) {
  std::lock_guard<std::mutex> lock(memory_mutex);
  auto it = region_of(address);
  if (it == regions.end()) return nullptr;
  return reinterpret_cast<void*>(it->second.host + (reinterpret_cast<uintptr_t>(address) - it->first));
}

void* reachable(const void* address) {
  void* host = host_address(address);
  return host != nullptr ? host : const_cast<void*>(address);
}

void DeviceMemory::copy_data(void* destination, const void* source, std::size_t count) const {
  std::memcpy(reachable(destination), reachable(source), count);
}

// --- host memory: torch's own, or the device's while a kernel runs on the device ---------

thread_local c10::DeviceIndex allocating_on = -1;
c10::DeleterFnPtr host_raw_deleter = nullptr;      // torch's CPU allocator's

// The device start of the region whose host mapping starts at ``host``, or 0.
uintptr_t device_start_of(void* host) {
  std::lock_guard<std::mutex> lock(memory_mutex);
  auto it = device_of_host.find(reinterpret_cast<uintptr_t>(host));
  return it == device_of_host.end() ? 0 : it->second;
}

// A host pointer's deleter where it is device memory at its host mapping: the region goes.
void release_at_host(void* host) {
  if (uintptr_t device = device_start_of(host)) release(reinterpret_cast<void*>(device));
}

void do_not_release(void*) {}

// Every pointer this allocator hands out, raw ones too (raw_allocate keeps only the pointer).
void raw_release(void* pointer) {
  if (uintptr_t device = device_start_of(pointer)) {
    release(reinterpret_cast<void*>(device));
  } else {
    host_raw_deleter(pointer);
  }
}

struct HostMemory final : c10::Allocator {
  c10::Allocator* host = nullptr;            // torch's CPU allocator
  c10::DataPtr allocate(size_t bytes) override {
    if (allocating_on < 0 || bytes == 0) return host->allocate(bytes);
    c10::DeviceGuard guard(c10::Device(kDevice, allocating_on));
    c10::DataPtr memory = device_memory.allocate(bytes);
    void* at_host = host_address(memory.get());
    memory.release_context();                  // owned by the host pointer from here on
    return {at_host, at_host, &release_at_host, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &raw_release; }
  void copy_data(void* destination, const void* source, std::size_t count) const override {
    std::memcpy(destination, source, count);
  }
};

HostMemory host_memory;

AllocateOnDevice::AllocateOnDevice(c10::DeviceIndex device) : outer_(allocating_on) { allocating_on = device; }
AllocateOnDevice::~AllocateOnDevice() { allocating_on = outer_; }

c10::DataPtr take_device_memory(const c10::Storage& host) {
  at::DataPtr& pointer = host.unsafeGetStorageImpl()->_mutable_data_ptr_no_checks();
  if (pointer.get_deleter() != &release_at_host) return {};
  uintptr_t device = device_start_of(pointer.get());
  if (device == 0 || !pointer.compare_exchange_deleter(&release_at_host, &do_not_release)) return {};
  c10::DeviceIndex index;
  {
    std::lock_guard<std::mutex> lock(memory_mutex);
    index = regions.at(device).device;
  }
  void* address = reinterpret_cast<void*>(device);
  return {address, address, &release, c10::Device(kDevice, index)};
}

// --- pinned host memory: ordinary memory, remembered so is_pinned() can answer ---------

std::mutex pinned_mutex;
std::map<uintptr_t, size_t> pinned;  // start -> bytes

void release_pinned(void* address) {
  if (address == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(pinned_mutex);
    pinned.erase(reinterpret_cast<uintptr_t>(address));
  }
  std::free(address);
}

struct PinnedMemory final : c10::Allocator {
  c10::DataPtr allocate(size_t bytes) override {
    c10::Device host(c10::DeviceType::CPU);
    if (bytes == 0) return {nullptr, nullptr, &release_pinned, host};
    void* address = nullptr;
    TORCH_CHECK_WITH(OutOfMemoryError, posix_memalign(&address, 64, bytes) == 0,
                     "out of pinned host memory: tried to allocate ", bytes, " bytes");
    std::lock_guard<std::mutex> lock(pinned_mutex);
    pinned.emplace(reinterpret_cast<uintptr_t>(address), bytes);
    return {address, address, &release_pinned, host};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release_pinned; }
  void copy_data(void* destination, const void* source, std::size_t count) const override {
    std::memcpy(destination, source, count);
  }
};

PinnedMemory pinned_memory;

bool is_pinned(const void* address) {
  std::lock_guard<std::mutex> lock(pinned_mutex);
  auto key = reinterpret_cast<uintptr_t>(address);
  auto it = pinned.upper_bound(key);
  if (it == pinned.begin()) return false;
  --it;
  return key < it->first + it->second;
}

// --- generators: one per device, each drawing with a CPU engine of its own --------------

struct Generator final : c10::GeneratorImpl {
  explicit Generator(c10::DeviceIndex index, uint64_t seed = c10::default_rng_seed_val)
      : c10::GeneratorImpl(c10::Device(kDevice, index), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
        engine(at::make_generator<at::CPUGeneratorImpl>(seed)) {}

  // The CPU generator the fallback hands to CPU kernels in this generator's place.
  at::Generator engine;

  void set_current_seed(uint64_t seed) override { engine.set_current_seed(seed); }
  void set_offset(uint64_t offset) override { engine.set_offset(offset); }
  uint64_t get_offset() const override { return engine.get_offset(); }
  uint64_t current_seed() const override { return engine.current_seed(); }
  uint64_t seed() override { return engine.seed(); }
  void set_state(const c10::TensorImpl& state) override {
    engine.unsafeGetGeneratorImpl()->set_state(state);
  }
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    return engine.unsafeGetGeneratorImpl()->get_state();
  }

 private:
  Generator* clone_impl() const override {
    auto* copy = new Generator(device_.index());
    copy->engine = engine.clone();
    return copy;
  }
};

const at::Generator& default_generator(c10::DeviceIndex index) {
  static std::vector<at::Generator> generators = [] {
    std::vector<at::Generator> made;
    for (c10::DeviceIndex i = 0; i < device_count; ++i) made.push_back(at::make_generator<Generator>(i));
    return made;
  }();
  if (index < 0) index = current_device;
  check_index(index);
  return generators[index];
}

// torch.Generator(device="shimdev:N"): torch 2.4 makes it through this registration (which 2.14
// calls deprecated), 2.7 and later through the hooks' getNewGenerator; both give the same.
at::Generator new_generator(c10::DeviceIndex index) {
  if (index < 0) index = current_device;
  check_index(index);
  return at::make_generator<Generator>(index);
}
#if !TESTDEVICE_TORCH_SINCE(2, 7)
REGISTER_GENERATOR_PRIVATEUSE1(new_generator)
#endif

at::Generator engine_of(const at::Generator& generator) {
  return static_cast<Generator*>(generator.unsafeGetGeneratorImpl())->engine;
}

// --- the device guard: current device and streams per thread, events as host times ------

// torch's autograd runs a device's backward on a thread of its own ("pt_autograd_N"), and this
// device's kernels are the host's: OpenMP gives that thread a team of its own beside the
// program thread's, and each team's idle threads spin for the cores the other computes on (a
// relu's forward ran 3-4x slower after a backward had run, on two cores). The autograd thread
// computes on itself alone; the program's thread keeps its team. Weak: where torch's OpenMP
// runtime is absent (a build without it), nothing changes.
extern "C" void omp_set_num_threads(int) __attribute__((weak));

void compute_alone_on_autograd_threads() {
  thread_local bool seen = false;
  if (seen) return;
  seen = true;
  char name[16] = {};
  if (omp_set_num_threads != nullptr && pthread_getname_np(pthread_self(), name, sizeof name) == 0 &&
      std::strncmp(name, "pt_autograd_", 12) == 0) {
    omp_set_num_threads(1);
  }
}

thread_local c10::StreamId current_streams[kMaxDevices] = {};
std::atomic<c10::StreamId> next_stream{1};

struct Event {
  std::chrono::steady_clock::time_point when;
  bool recorded = false;
};

struct Guard final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kDevice; }
  c10::Device exchangeDevice(c10::Device device) const override {
    c10::Device previous = getDevice();
    setDevice(device);
    return previous;
  }
  c10::Device getDevice() const override { return {kDevice, current_device}; }
  void setDevice(c10::Device device) const override {
    check_index(device.index());
    current_device = device.index();
    compute_alone_on_autograd_threads();       // torch's autograd threads set their device first
  }
  void uncheckedSetDevice(c10::Device device) const noexcept override { current_device = device.index(); }
  // noexcept: torch 2.4's interface declares these so; later ones allow what is stricter.
  c10::Stream getStream(c10::Device device) const noexcept override {
    return c10::Stream(c10::Stream::UNSAFE, device, current_streams[device.index()]);
  }
  c10::Stream getDefaultStream(c10::Device device) const override {
    return c10::Stream(c10::Stream::DEFAULT, device);
  }
  c10::Stream getNewStream(c10::Device device, int) const override {
    return c10::Stream(c10::Stream::UNSAFE, device, next_stream++);
  }
  c10::Stream getStreamFromGlobalPool(c10::Device device, bool) const override {
    return getNewStream(device, 0);
  }
  c10::Stream exchangeStream(c10::Stream stream) const noexcept override {
    c10::Stream previous = getStream(stream.device());
    current_streams[stream.device_index()] = stream.id();
    return previous;
  }
  c10::DeviceIndex deviceCount() const noexcept override { return static_cast<c10::DeviceIndex>(device_count); }

  // Work finishes when it is issued, so an event completes when it is recorded.
  void record(void** event, const c10::Stream&, const c10::DeviceIndex, const c10::EventFlag) const override {
    if (*event == nullptr) *event = new Event();
    auto* recorded = static_cast<Event*>(*event);
    recorded->when = std::chrono::steady_clock::now();
    recorded->recorded = true;
  }
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    delete static_cast<Event*>(event);
  }
  bool queryStream(const c10::Stream&) const override { return true; }
  void synchronizeStream(const c10::Stream&) const override {}
  void synchronizeEvent(void*) const override {}
  void synchronizeDevice(const c10::DeviceIndex) const {}      // in the interface since 2.5
  double elapsedTime(void* start, void* end, const c10::DeviceIndex) const override {
    auto* first = static_cast<Event*>(start);
    auto* second = static_cast<Event*>(end);
    TORCH_CHECK(first && second && first->recorded && second->recorded,
                "Both events must be recorded before calculating elapsed time.");
    return std::chrono::duration<double, std::milli>(second->when - first->when).count();
  }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, Guard);

// --- hooks: what torch asks of a PrivateUse1 backend ------------------------------------

// isBuilt, isAvailable, getNewGenerator and isPinnedPtr joined the interface in later releases
// than 2.4, and getDefaultGenerator became const: declared without ``override``, each
// overrides where the interface has it.
struct Hooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const { return true; }
  bool isAvailable() const { return device_count > 0; }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex index) const { return default_generator(index); }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex index) { return default_generator(index); }
  at::Generator getNewGenerator(c10::DeviceIndex index) const { return new_generator(index); }
  at::Device getDeviceFromPtr(void* address) const override {
    std::lock_guard<std::mutex> lock(memory_mutex);
    auto it = region_of(address);
    TORCH_CHECK(it != regions.end(), "the pointer is not in test accelerator memory");
    return {kDevice, it->second.device};
  }
  bool isPinnedPtr(const void* address) const { return is_pinned(address); }
  at::Allocator* getPinnedMemoryAllocator() const override { return &pinned_memory; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  c10::DeviceIndex deviceCount() const override { return static_cast<c10::DeviceIndex>(device_count); }
  void setCurrentDevice(c10::DeviceIndex index) const override {
    check_index(index);
    current_device = index;
  }
  c10::DeviceIndex getCurrentDevice() const override { return current_device; }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex index) const override {
    auto previous = current_device;
    setCurrentDevice(index);
    return previous;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex index) const override { return exchangeDevice(index); }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t bytes) const override;
};

// --- storage that moves: resize_, and a kernel that grew one ---------------------------

// A storage whose bytes move to fresh device memory on ``device`` (contents kept up to the
// smaller size): what resize_ and a kernel that grew a storage need.
void move_to_new_memory(const c10::Storage& storage, const void* source, size_t bytes, size_t keep,
                        c10::DeviceIndex device) {
  c10::DeviceGuard guard(c10::Device(kDevice, device));
  c10::DataPtr fresh = device_memory.allocate(bytes);
  if (keep > 0) device_memory.copy_data(fresh.get(), source, keep);
  storage.unsafeGetStorageImpl()->set_data_ptr_noswap(std::move(fresh));
  storage.unsafeGetStorageImpl()->set_nbytes(bytes);
}

void Hooks::resizePrivateUse1Bytes(const c10::Storage& storage, size_t bytes) const {
  auto device = storage.device().index();
  move_to_new_memory(storage, storage.data(), bytes, std::min(bytes, storage.nbytes()), device);
}

// --- Python ------------------------------------------------------------------------------

void init(int devices) {
  TORCH_CHECK(devices > 0 && devices <= kMaxDevices, "the test accelerator has 1 to ", kMaxDevices,
              " devices, not ", devices);
  TORCH_CHECK(device_count == 0 || device_count == devices, "the test accelerator is loaded with ",
              device_count, " devices; it cannot change to ", devices, " in the same process");
  if (device_count == 0) {
    device_count = devices;
    at::RegisterPrivateUse1HooksInterface(new Hooks());
    register_autograd_fallback();
    host_memory.host = c10::GetCPUAllocator();
    host_raw_deleter = host_memory.host->raw_deleter();
    c10::SetCPUAllocator(&host_memory, /*priority=*/1);
  }
}

bool host_readable(const at::Tensor& tensor) {
  std::lock_guard<std::mutex> lock(memory_mutex);
  return region_of(tensor.storage().data()) == regions.end();
}

}  // namespace testdevice

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  module.def("init", &testdevice::init, "Make the test accelerator's N devices (once per process).");
  module.def("device_count", [] { return testdevice::device_count; });
  module.def("default_generator", [](int index) {
    return py::reinterpret_steal<py::object>(THPGenerator_initDefaultGenerator(
        testdevice::default_generator(static_cast<c10::DeviceIndex>(index))));
  });
  module.def("host_readable", &testdevice::host_readable,
             "Whether the host may touch this tensor's memory now (never, between kernels).");
  // The device module's own answers (module.py), on every torch release.
  module.def("current_device", [] { return int(testdevice::current_device); });
  module.def("set_device", [](int index) {
    testdevice::check_index(static_cast<c10::DeviceIndex>(index));
    testdevice::current_device = static_cast<c10::DeviceIndex>(index);
  });
  module.def("memory_stats", [](int index) {
    auto stats = testdevice::device_stats(static_cast<c10::DeviceIndex>(index));
    py::dict flat;           // torch.cuda.memory_stats()'s keys: "allocated_bytes.all.current"
    for (auto& named : stats.named()) {
      std::string prefix = std::string(named.first) + ".all.";
      flat[py::str(prefix + "current")] = named.second->current;
      flat[py::str(prefix + "peak")] = named.second->peak;
      flat[py::str(prefix + "allocated")] = named.second->allocated;
      flat[py::str(prefix + "freed")] = named.second->freed;
    }
    flat["num_device_alloc"] = stats.num_device_alloc;
    flat["num_device_free"] = stats.num_device_free;
    return flat;
  });
  module.def("reset_peak_stats", [](int index) { testdevice::reset_peak_stats(static_cast<c10::DeviceIndex>(index)); });
  module.def("reset_accumulated_stats", [](int index) {
    testdevice::reset_accumulated_stats(static_cast<c10::DeviceIndex>(index));
  });
  module.def("empty_cache", &testdevice::empty_cache, "Unmap the freed memory kept for reuse.");
  module.def("memory_info", [](int index) { return testdevice::memory_info(static_cast<c10::DeviceIndex>(index)); });
  module.def("current_stream", [](int index) {
    auto device = c10::Device(testdevice::kDevice, static_cast<c10::DeviceIndex>(index));
    testdevice::check_index(device.index());
    return py::reinterpret_steal<py::object>(THPStream_Wrap(c10::impl::getDeviceGuardImpl(testdevice::kDevice)->getStream(device)));
  });
  module.def("set_stream", [](int64_t stream_id, int index) {
    auto device = c10::Device(testdevice::kDevice, static_cast<c10::DeviceIndex>(index));
    testdevice::check_index(device.index());
    c10::impl::getDeviceGuardImpl(testdevice::kDevice)->exchangeStream(
        c10::Stream(c10::Stream::UNSAFE, device, stream_id));
  });
}
