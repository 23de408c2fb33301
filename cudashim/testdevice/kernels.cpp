// The test accelerator's kernels: every op runs torch's CPU kernel on host views of the
// device memory it is given, through the memory's host mapping (a boxed fallback, and a few
// kernels of its own), and autocast runs torch's CUDA lists for the device.

#include "device.h"

#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>

#include <optional>

namespace testdevice {

// A tensor of ``key`` (CPU or the device) over ``storage``, shaped as ``like``.
at::Tensor tensor_over(const c10::Storage& storage, c10::DispatchKey key, const at::Tensor& like) {
  auto made = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(storage), c10::DispatchKeySet(key), like.dtype());
  made.unsafeGetTensorImpl()->set_sizes_and_strides(like.sizes(), like.strides(), like.storage_offset());
  made._set_conj(like.is_conj());
  made._set_neg(like.is_neg());
  return made;
}

// A host storage over a device storage's memory, at its host mapping. Resizable with the CPU
// allocator: a kernel that grows it moves it to host memory, which the call then moves back
// to the device.
c10::Storage host_alias(const c10::Storage& storage, void* memory) {
  return c10::Storage(c10::Storage::use_byte_size_t(), storage.nbytes(),
                      c10::DataPtr(memory, c10::Device(c10::DeviceType::CPU)),
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
    void* memory = reachable(storage.data());
    auto alias = host_alias(storage, memory);
    host_of_.emplace(impl, Alias{storage, alias, memory});
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
    if (c10::DataPtr memory = take_device_memory(host)) {        // the kernel made it on the device
      c10::Storage made(c10::Storage::use_byte_size_t(), host.nbytes(), std::move(memory), device_allocator,
                        /*resizable=*/true);
      device_of_.emplace(host.unsafeGetStorageImpl(), made);
      return made;
    }
    c10::DeviceGuard guard(c10::Device(kDevice, index < 0 ? current_device : index));
    c10::Storage made(c10::Storage::use_byte_size_t(), host.nbytes(), device_allocator, /*resizable=*/true);
    if (host.nbytes() > 0) std::memcpy(reachable(made.data()), host.data(), host.nbytes());
    device_of_.emplace(host.unsafeGetStorageImpl(), made);
    return made;
  }

  struct Alias {
    c10::Storage storage;     // on the device
    c10::Storage alias;       // the host's view of it
    const void* memory;       // where it was when the call began
  };
  std::unordered_map<c10::StorageImpl*, Alias> host_of_;
  std::unordered_map<c10::StorageImpl*, c10::Storage> device_of_;
  std::vector<std::pair<at::Tensor, at::Tensor>> arguments_;
};

bool is_optional_generator(const c10::Argument& argument) {
  static const auto type = c10::OptionalType::create(c10::GeneratorType::get());
  return *argument.type() == *type;
}

// The device holds dense strided tensors only, as many vendors' do: a host kernel's sparse,
// nested or quantized result is refused, as a vendor's missing kernel is, not copied into a
// strided tensor that would say it is one.
void refuse_what_the_device_cannot_hold(const c10::FunctionSchema& schema, const at::Tensor& result) {
  if (!result.defined() || result.device().type() != c10::DeviceType::CPU) return;
  const char* kind = result.is_nested() ? "nested" : result.is_quantized() ? "quantized"
                     : result.layout() != at::kStrided ? "sparse" : nullptr;
  TORCH_CHECK_NOT_IMPLEMENTED(kind == nullptr, "Could not run '", schema.name(), "' on the test ",
                              "accelerator: its result would be a ", kind, " tensor, and the device ",
                              "has no ", kind, " tensors");
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
  {
    AllocateOnDevice results_on_the_device(call.device >= 0 ? call.device : current_device);
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
  }
  call.settle();
  const auto returned = schema.returns().size();
  auto results = stack->end() - static_cast<std::ptrdiff_t>(returned);
  for (size_t i = 0; i < returned; ++i) {
    if (results[i].isTensor()) refuse_what_the_device_cannot_hold(schema, results[i].toTensor());
  }
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
  return at::detail::empty_generic(size, device_allocator, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   c10::dtype_or_default(dtype), memory_format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<at::ScalarType> dtype,
                         std::optional<at::Layout>, std::optional<at::Device> device, std::optional<bool>) {
  c10::DeviceGuard guard(device.value_or(c10::Device(kDevice, current_device)));
  return at::detail::empty_strided_generic(size, stride, device_allocator,
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

// torch 2.7 and older look for it under the device's autograd key first, where nothing else
// stands in (module.cuda() failed there with NotImplementedError).
TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) {
  m.impl("_has_compatible_shallow_copy_type", has_compatible_shallow_copy_type);
}

// torch before 2.8 gives every device's autograd key its autograd fallback but PrivateUse1's:
// an op with no autograd kernel of its own (the functional collectives DTensor redistributes
// with) found nothing there. A vendor's extension registers torch's fallback itself; so does
// this device, where torch has not.
void register_autograd_fallback() {
  auto key = c10::DispatchKey::AutogradPrivateUse1;
  if (c10::Dispatcher::singleton().hasBackendFallbackForDispatchKey(key)) return;
  static torch::Library library(torch::Library::IMPL, "_", key, __FILE__, __LINE__);
  library.fallback(torch::autograd::basicAutogradNotImplementedFallback());
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

}  // namespace testdevice
