// libFuzzer entry point: any byte string must parse to a header or a Status, never crash, and
// every tensor of an accepted file must be readable within the buffer.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "agent/io/random_access_file.h"
#include "agent/io/safetensors_reader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto reader = memplan::io::SafetensorsReader::Open(
      memplan::io::NewMemoryFile(std::string(reinterpret_cast<const char*>(data), size)));
  if (!reader.ok()) return 0;
  std::vector<char> buffer;
  for (const auto& tensor : (*reader)->header().tensors) {
    buffer.resize(static_cast<size_t>(tensor.size_bytes()));
    if (!(*reader)->ReadTensorBytes(tensor, buffer.data(), tensor.size_bytes()).ok())
      __builtin_trap();
  }
  return 0;
}
