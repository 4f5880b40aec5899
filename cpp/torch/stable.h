// What the binding uses of the LibTorch stable ABI, and its error helper.
//
// The binding talks to torch only through the stable C shim (aoti_torch_* / torch_* functions) and
// the header-only wrappers around it (torch/csrc/stable, torch/headeronly): no ATen or c10 C++
// symbol is compiled into or imported by the library, so one build serves every torch from the
// version TORCH_TARGET_VERSION names (2.9; CMakeLists.txt sets it) on. tests/test_abi.py checks the
// library's imports.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>

#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>

namespace fa::torch_binding {

using Tensor = torch::stable::Tensor;
using ScalarType = torch::headeronly::ScalarType;
using IntArrayRef = torch::headeronly::IntHeaderOnlyArrayRef;

// Numbers in error messages are formatted with snprintf, never inserted into a std::ostream:
// iostream's numeric insertion is inline template code that gets compiled into this library, and a
// GCC 13 toolchain that links newer libstdc++ pieces statically (seen on the H100 image) makes it
// crash in the locale facets once loaded into torch's process. (The stable ABI's STD_TORCH_CHECK
// formats with an ostringstream; FA_CHECK below does not.)
std::string str_of(int64_t value);
std::string str_of(double value);
std::string str_of(IntArrayRef values);  // "[2, 16, 64]"
inline std::string str_of(std::initializer_list<int64_t> values) { return str_of(IntArrayRef(values)); }

std::string dtype_name(ScalarType dtype);  // torch's names: Half, BFloat16, Float
std::string device_name(const Tensor& t);  // cpu, cuda:0

// Throws std::runtime_error (Python sees RuntimeError) with the pieces joined; pieces are strings,
// numbers go through str_of.
template <class... Pieces>
[[noreturn]] void fail(const Pieces&... pieces) {
  std::string message;
  ((message += pieces), ...);
  throw std::runtime_error(message);
}

#define FA_CHECK(cond, ...)                          \
  do {                                               \
    if (!(cond)) ::fa::torch_binding::fail(__VA_ARGS__); \
  } while (0)

}  // namespace fa::torch_binding
