#pragma once
// Where a tensor lives: the host, or one CUDA device by index.
#include <string>

namespace dpt {

struct Device {
  enum class Kind { CPU, CUDA };
  Kind kind = Kind::CPU;
  int index = 0;

  static Device cpu() { return {Kind::CPU, 0}; }
  static Device cuda(int index = 0) { return {Kind::CUDA, index}; }
  static Device parse(const std::string& text);  // "cpu", "cuda", "cuda:1"

  bool is_cpu() const { return kind == Kind::CPU; }
  bool is_cuda() const { return kind == Kind::CUDA; }
  std::string str() const;
  bool operator==(const Device& other) const = default;
};

}  // namespace dpt
