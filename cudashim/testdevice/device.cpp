// The test accelerator: a PrivateUse1 device with memory the host cannot touch.
//
// Device memory is whole pages mapped PROT_NONE. A kernel opens the pages of the tensors it
// is given, runs torch's CPU kernel on host views of them, and closes them again, so host code
// that reads or writes a device tensor without a copy (a missed .cpu(), .numpy() on a device
// tensor, a pointer handed to a host library) dies with SIGSEGV instead of silently working.
//
// Built from PyTorch's documented PrivateUse1 extension points: a device guard (devices,
// streams, events), the PrivateUse1 hooks (generators, pinned memory), a DeviceAllocator
// (memory statistics for torch.accelerator), kernels for allocation and copies, a boxed
// fallback for every other op, and autocast's lists for the AutocastPrivateUse1 key.
// Streams and events keep the API's semantics over a synchronous device.

#include <ATen/ATen.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/library.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/EmptyTensor.h>
#include <ATen/autocast_mode.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/Generator.h>

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace testdevice {

constexpr c10::DeviceType kDevice = c10::DeviceType::PrivateUse1;
constexpr size_t kCapacity = size_t{8} << 30;  // the memory each device reports
constexpr int kMaxDevices = 16;

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
  int opened = 0;            // kernels holding it open (threads share weights)
};

std::mutex memory_mutex;
std::map<uintptr_t, Region> regions;                  // by start address
c10::CachingDeviceAllocator::DeviceStats stats[kMaxDevices];

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

void update(c10::DeviceIndex device, const Region& region, bool allocated) {
  auto& s = stats[device];
  auto all = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  for (auto* stat : {&s.allocation[all], &s.segment[all], &s.active[all]}) {
    allocated ? stat->increase(1) : stat->decrease(1);
  }
  for (auto* stat : {&s.allocated_bytes[all], &s.reserved_bytes[all], &s.active_bytes[all]}) {
    allocated ? stat->increase(region.bytes) : stat->decrease(region.bytes);
  }
  allocated ? s.requested_bytes[all].increase(region.requested)
            : s.requested_bytes[all].decrease(region.requested);
  allocated ? ++s.num_device_alloc : ++s.num_device_free;
}

void release(void* address) {
  if (address == nullptr) return;
  std::lock_guard<std::mutex> lock(memory_mutex);
  auto it = regions.find(reinterpret_cast<uintptr_t>(address));
  TORCH_INTERNAL_ASSERT(it != regions.end(), "freeing memory the test accelerator never gave");
  update(it->second.device, it->second, false);
  munmap(address, it->second.bytes);
  regions.erase(it);
}

thread_local c10::DeviceIndex current_device = 0;

// ``reset`` applied to every statistic this allocator keeps for ``device``.
template <typename Reset>
void for_each_stat(c10::DeviceIndex device, Reset reset) {
  check_index(device);
  std::lock_guard<std::mutex> lock(memory_mutex);
  auto& s = stats[device];
  for (auto* array : {&s.allocation, &s.segment, &s.active, &s.allocated_bytes, &s.reserved_bytes,
                      &s.active_bytes, &s.requested_bytes}) {
    for (auto& stat : *array) reset(stat);
  }
}

struct DeviceMemory final : c10::DeviceAllocator {
  c10::DataPtr allocate(size_t requested) override {
    c10::Device device(kDevice, current_device);
    if (requested == 0) return {nullptr, nullptr, &release, device};
    size_t bytes = whole_pages(requested);
    void* address = mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    std::lock_guard<std::mutex> lock(memory_mutex);
    auto& allocated = stats[device.index()].reserved_bytes[0].current;
    TORCH_CHECK_WITH(OutOfMemoryError, address != MAP_FAILED && allocated + bytes <= kCapacity,
                     "out of memory on test accelerator ", device, ": tried to allocate ", requested,
                     " bytes with ", allocated, " of ", kCapacity, " in use");
    Region region{bytes, requested, device.index()};
    regions.emplace(reinterpret_cast<uintptr_t>(address), region);
    update(device.index(), region, true);
    return {address, address, &release, device};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* destination, const void* source, std::size_t count) const override;

  bool initialized() override { return device_count > 0; }
  void emptyCache(c10::MempoolId_t) override {}           // nothing is cached
  void recordStream(const c10::DataPtr&, c10::Stream) override {}  // streams are synchronous
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    check_index(device);
    std::lock_guard<std::mutex> lock(memory_mutex);
    return stats[device];
  }
  void resetAccumulatedStats(c10::DeviceIndex device) override {
    for_each_stat(device, [](c10::CachingAllocator::Stat& stat) { stat.reset_accumulated(); });
    std::lock_guard<std::mutex> lock(memory_mutex);
    stats[device].num_device_alloc = stats[device].num_device_free = 0;
  }
  void resetPeakStats(c10::DeviceIndex device) override {
    for_each_stat(device, [](c10::CachingAllocator::Stat& stat) { stat.reset_peak(); });
  }
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override {
    check_index(device);
    std::lock_guard<std::mutex> lock(memory_mutex);
    return {kCapacity - stats[device].reserved_bytes[0].current, kCapacity};
  }
};

DeviceMemory device_memory;
REGISTER_ALLOCATOR(kDevice, &device_memory);

// Holds device memory open (readable and writable by the host) while it lives.
class OpenMemory {
 public:
  OpenMemory() = default;
  OpenMemory(const OpenMemory&) = delete;
  OpenMemory& operator=(const OpenMemory&) = delete;
  ~OpenMemory() {
    for (const void* address : opened_) change(address, -1);
  }
  void open(const void* address) {
    if (address != nullptr && change(address, +1)) opened_.push_back(address);
  }

 private:
  // Opens (+1) or closes (-1) the region holding ``address``; false where there is none
  // (host memory, or device memory freed since it was opened).
  static bool change(const void* address, int delta) {
    std::lock_guard<std::mutex> lock(memory_mutex);
    auto it = region_of(address);
    if (it == regions.end()) return false;
    Region& region = it->second;
    int before = region.opened;
    region.opened += delta;
    if ((before == 0) != (region.opened == 0)) {
      int protection = region.opened ? PROT_READ | PROT_WRITE : PROT_NONE;
      TORCH_CHECK(mprotect(reinterpret_cast<void*>(it->first), region.bytes, protection) == 0,
                  "mprotect failed on test accelerator memory: ", std::strerror(errno));
    }
    return true;
  }
  std::vector<const void*> opened_;
};

void DeviceMemory::copy_data(void* destination, const void* source, std::size_t count) const {
  OpenMemory memory;
  memory.open(destination);
  memory.open(source);
  std::memcpy(destination, source, count);
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

at::Generator engine_of(const at::Generator& generator) {
  return static_cast<Generator*>(generator.unsafeGetGeneratorImpl())->engine;
}

// --- the device guard: current device and streams per thread, events as host times ------

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
  }
  void uncheckedSetDevice(c10::Device device) const noexcept override { current_device = device.index(); }
  c10::Stream getStream(c10::Device device) const override {
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
  c10::Stream exchangeStream(c10::Stream stream) const override {
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
  void synchronizeDevice(const c10::DeviceIndex) const override {}
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

struct Hooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return device_count > 0; }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex index) const override {
    return default_generator(index);
  }
  at::Generator getNewGenerator(c10::DeviceIndex index) const override {
    if (index < 0) index = current_device;
    check_index(index);
    return at::make_generator<Generator>(index);
  }
  at::Device getDeviceFromPtr(void* address) const override {
    std::lock_guard<std::mutex> lock(memory_mutex);
    auto it = region_of(address);
    TORCH_CHECK(it != regions.end(), "the pointer is not in test accelerator memory");
    return {kDevice, it->second.device};
  }
  bool isPinnedPtr(const void* address) const override { return is_pinned(address); }
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

// --- kernels ---------------------------------------------------------------------------

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

// A tensor of ``key`` (CPU or the device) over ``storage``, shaped as ``like``.
at::Tensor tensor_over(const c10::Storage& storage, c10::DispatchKey key, const at::Tensor& like) {
  auto made = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(storage), c10::DispatchKeySet(key), like.dtype());
  made.unsafeGetTensorImpl()->set_sizes_and_strides(like.sizes(), like.strides(), like.storage_offset());
  made._set_conj(like.is_conj());
  made._set_neg(like.is_neg());
  return made;
}

// A host storage over a device storage's memory, which the caller keeps open. Resizable with
// the CPU allocator: a kernel that grows it moves it to host memory, which the call then
// moves back to the device.
c10::Storage host_alias(const c10::Storage& storage) {
  return c10::Storage(c10::Storage::use_byte_size_t(), storage.nbytes(),
                      c10::DataPtr(const_cast<void*>(storage.data()), c10::Device(c10::DeviceType::CPU)),
                      c10::GetCPUAllocator(), /*resizable=*/true);
}

// One op run by torch's CPU kernel on host views of the device memory it is given.
class HostCall {
 public:
  c10::DeviceIndex device = -1;  // of the first device argument

  at::Tensor to_host(const at::Tensor& tensor) {
    if (!tensor.defined() || tensor.device().type() != kDevice) return tensor;
    note_device(tensor.device().index());
    auto host = tensor_over(to_host(tensor.storage()), c10::DispatchKey::CPU, tensor);
    arguments_.emplace_back(tensor, host);
    return host;
  }

  c10::Storage to_host(const c10::Storage& storage) {
    auto* impl = storage.unsafeGetStorageImpl();
    auto found = host_of_.find(impl);
    if (found != host_of_.end()) return found->second.alias;
    memory_.open(storage.data());
    auto alias = host_alias(storage);
    host_of_.emplace(impl, Alias{storage, alias, storage.data()});
    device_of_.emplace(alias.unsafeGetStorageImpl(), storage);
    return alias;
  }

  void note_device(c10::DeviceIndex index) {
    if (device < 0) device = index;
  }

  // After the kernel: storages it grew move back to device memory, and the device tensors
  // take the sizes, strides and storages it gave their host views (resize_, set_, t_, ...).
  void settle() {
    for (auto& [impl, alias] : host_of_) {
      const c10::Storage& host = alias.alias;
      if (host.data() != alias.memory) {
        move_to_new_memory(alias.storage, host.data(), host.nbytes(), host.nbytes(), alias.storage.device().index());
        memory_.open(alias.storage.data());
      } else if (host.nbytes() != alias.storage.nbytes()) {
        impl->set_nbytes(host.nbytes());
      }
    }
    for (auto& [tensor, host] : arguments_) {
      auto* impl = tensor.unsafeGetTensorImpl();
      auto storage = to_device(host.storage(), host.device().index());
      if (!storage.is_alias_of(tensor.storage())) impl->set_storage_keep_dtype(storage);
      if (host.sizes() != tensor.sizes() || host.strides() != tensor.strides() ||
          host.storage_offset() != tensor.storage_offset()) {
        impl->set_sizes_and_strides(host.sizes(), host.strides(), host.storage_offset());
      }
    }
  }

  // What the kernel returned, as the program should see it: an argument itself, a view of an
  // argument's device memory, or a new tensor copied to the device.
  at::Tensor to_device(const at::Tensor& host) {
    if (!host.defined() || host.device().type() != c10::DeviceType::CPU) return host;
    for (auto& [tensor, view] : arguments_) {
      if (view.unsafeGetTensorImpl() == host.unsafeGetTensorImpl()) return tensor;
    }
    return tensor_over(to_device(host.storage(), device), c10::DispatchKey::PrivateUse1, host);
  }

 private:
  c10::Storage to_device(const c10::Storage& host, c10::DeviceIndex index) {
    auto found = device_of_.find(host.unsafeGetStorageImpl());
    if (found != device_of_.end()) return found->second;
    c10::DeviceGuard guard(c10::Device(kDevice, index < 0 ? current_device : index));
    c10::Storage made(c10::Storage::use_byte_size_t(), host.nbytes(), &device_memory, /*resizable=*/true);
    if (host.nbytes() > 0) {
      memory_.open(made.data());
      std::memcpy(made.mutable_data(), host.data(), host.nbytes());
    }
    device_of_.emplace(host.unsafeGetStorageImpl(), made);
    return made;
  }

  struct Alias {
    c10::Storage storage;     // on the device
    c10::Storage alias;       // the host's view of it
    const void* memory;       // where it was when the call began
  };
  OpenMemory memory_;         // declared first among the maps it must outlive: closes last
  std::unordered_map<c10::StorageImpl*, Alias> host_of_;
  std::unordered_map<c10::StorageImpl*, c10::Storage> device_of_;
  std::vector<std::pair<at::Tensor, at::Tensor>> arguments_;
};

bool is_optional_generator(const c10::Argument& argument) {
  static const auto type = c10::OptionalType::create(c10::GeneratorType::get());
  return *argument.type() == *type;
}

// Every op without a kernel of its own: torch's CPU kernel, run on the device memory.
void cpu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const auto count = schema.arguments().size();
  auto arguments = stack->end() - static_cast<std::ptrdiff_t>(count);
  HostCall call;
  for (size_t i = 0; i < count; ++i) {
    c10::IValue& value = arguments[i];
    if (value.isTensor()) {
      value = call.to_host(value.toTensor());
    } else if (value.isTensorList()) {
      auto list = value.toTensorList();
      for (size_t j = 0; j < list.size(); ++j) list[j] = call.to_host(list[j]);
    } else if (value.isList()) {                       // Tensor?[] (index, index_put_)
      auto list = value.toList();
      for (size_t j = 0; j < list.size(); ++j) {
        c10::IValue item = list.get(j);
        if (item.isTensor()) list.set(j, call.to_host(item.toTensor()));
      }
    } else if (value.isDevice() && value.toDevice().type() == kDevice) {
      call.note_device(value.toDevice().index() < 0 ? current_device : value.toDevice().index());
      value = c10::Device(c10::DeviceType::CPU);
    } else if (value.isStorage() && value.toStorage().device_type() == kDevice) {
      call.note_device(value.toStorage().device().index());
      value = call.to_host(value.toStorage());
    }
  }
  for (size_t i = 0; i < count; ++i) {              // the device's generator, not the CPU's
    c10::IValue& value = arguments[i];
    if (value.isGenerator() && value.toGenerator().device().type() == kDevice) {
      value = engine_of(value.toGenerator());
    } else if (value.isNone() && is_optional_generator(schema.arguments()[i])) {
      value = engine_of(default_generator(call.device));
    }
  }
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
  call.settle();
  const auto returned = schema.returns().size();
  auto results = stack->end() - static_cast<std::ptrdiff_t>(returned);
  for (size_t i = 0; i < returned; ++i) {
    c10::IValue& value = results[i];
    if (value.isTensor()) {
      value = call.to_device(value.toTensor());
    } else if (value.isTensorList()) {
      auto list = value.toTensorList();
      for (size_t j = 0; j < list.size(); ++j) list[j] = call.to_device(list[j]);
    }
  }
}

at::Tensor empty(c10::IntArrayRef size, std::optional<at::ScalarType> dtype, std::optional<at::Layout>,
                 std::optional<at::Device> device, std::optional<bool>,
                 std::optional<at::MemoryFormat> memory_format) {
  c10::DeviceGuard guard(device.value_or(c10::Device(kDevice, current_device)));
  return at::detail::empty_generic(size, &device_memory, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   c10::dtype_or_default(dtype), memory_format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<at::ScalarType> dtype,
                         std::optional<at::Layout>, std::optional<at::Device> device, std::optional<bool>) {
  c10::DeviceGuard guard(device.value_or(c10::Device(kDevice, current_device)));
  return at::detail::empty_strided_generic(size, stride, &device_memory,
                                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                           c10::dtype_or_default(dtype));
}

// Every copy into, out of, or within the device: the CPU's copy between host views.
at::Tensor copy_from(const at::Tensor& source, const at::Tensor& destination, bool) {
  HostCall call;
  auto host_destination = call.to_host(destination);
  host_destination.copy_(call.to_host(source));
  return destination;
}

at::Tensor copy_from_and_resize(const at::Tensor& source, const at::Tensor& destination) {
  destination.resize_(source.sizes());
  return copy_from(source, destination, false);
}

// Dropout draws from the device's generator: torch's CPU kernel would draw from the CPU's.
std::tuple<at::Tensor, at::Tensor> native_dropout(const at::Tensor& input, double p, std::optional<bool> train) {
  if (!train.value_or(true)) {
    return {input.clone(), at::ones_like(input, input.options().dtype(at::kBool))};
  }
  double keep = 1.0 - p;
  auto mask = at::empty_like(input, input.options().dtype(at::kBool)).bernoulli_(keep);
  return {input.mul(mask).mul_(keep == 0 ? 0.0 : 1.0 / keep), mask};
}

// torch sends convolutions on devices other than its own to these two hooks.
at::Tensor convolution(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                       c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation,
                       bool transposed, c10::IntArrayRef output_padding, int64_t groups) {
  HostCall call;
  std::optional<at::Tensor> host_bias;
  if (bias.has_value()) host_bias = call.to_host(*bias);
  auto output = at::convolution(call.to_host(input), call.to_host(weight), host_bias, stride, padding,
                                dilation, transposed, output_padding, groups);
  return call.to_device(output);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> convolution_backward(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight, c10::IntArrayRef stride,
    c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed, c10::IntArrayRef output_padding,
    int64_t groups, std::array<bool, 3> output_mask) {
  HostCall call;
  int64_t channels = transposed ? weight.size(1) * groups : weight.size(0);
  auto [grad_input, grad_weight, grad_bias] = at::convolution_backward(
      call.to_host(grad_output), call.to_host(input), call.to_host(weight), std::vector<int64_t>{channels},
      stride, padding, dilation, transposed, output_padding, groups, output_mask);
  return {call.to_device(grad_input), call.to_device(grad_weight), call.to_device(grad_bias)};
}

// ``param.data = tensor`` between the device and the host: allowed for dense tensors, as it
// is between CUDA and the CPU (torch's own rule lists only its in-tree devices).
bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  auto dense = [](const at::Tensor& tensor) {
    return tensor.layout() == at::kStrided && (tensor.is_cpu() || tensor.device().type() == kDevice);
  };
  return self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set()) ||
         (dense(self) && dense(from));
}

void record_stream(at::Tensor&, c10::Stream) {}  // synchronous streams: nothing to wait for

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&cpu_fallback>());
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", empty);
  m.impl("empty_strided", empty_strided);
  m.impl("_copy_from", copy_from);
  m.impl("_copy_from_and_resize", copy_from_and_resize);
  m.impl("native_dropout", native_dropout);
  m.impl("record_stream", record_stream);
  m.impl("convolution_overrideable", convolution);
  m.impl("convolution_backward_overrideable", convolution_backward);
  m.impl("_has_compatible_shallow_copy_type", has_compatible_shallow_copy_type);
  // torch's generic kernel for these calls the out= form with a 0-d output that the CPU
  // kernel then resizes (a deprecation warning on every call): the CPU's own functional
  // kernel computes the same without one.
  m.impl("mse_loss", torch::CppFunction::makeFromBoxedFunction<&cpu_fallback>());
}

// --- autocast: torch's CUDA lists, for the dtypes the device declares -------------------

TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFallthrough());
}

#define LOWER_PRECISION(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define IN_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define PROMOTED(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
  AT_FORALL_LOWER_PRECISION_FP(LOWER_PRECISION)
  AT_FORALL_FP32(IN_FP32)
  AT_FORALL_PROMOTE(PROMOTED)
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
  }
}

bool host_readable(const at::Tensor& tensor) {
  std::lock_guard<std::mutex> lock(memory_mutex);
  auto it = region_of(tensor.storage().data());
  return it == regions.end() || it->second.opened > 0;
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
}
