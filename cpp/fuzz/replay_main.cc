// A main() for a fuzz target built without libFuzzer: runs LLVMFuzzerTestOneInput once on every
// file given, or on every file inside the folders given (sorted, recursively; README files are
// skipped). CTest runs it on tests/fuzz/regressions/<target>/ in every build, sanitizers or not,
// so each input that once crashed stoker keeps being checked.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace fs = std::filesystem;

namespace {

std::vector<uint8_t> read_all(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s FILE_OR_FOLDER...\n", argv[0]);
    return 2;
  }
  std::vector<fs::path> inputs;
  for (int i = 1; i < argc; ++i) {
    const fs::path arg = argv[i];
    if (fs::is_directory(arg)) {
      for (const auto& e : fs::recursive_directory_iterator(arg))
        if (e.is_regular_file() && e.path().filename().string().rfind("README", 0) != 0)
          inputs.push_back(e.path());
    } else if (fs::is_regular_file(arg)) {
      inputs.push_back(arg);
    } else {
      std::fprintf(stderr, "%s: no such file or folder\n", argv[i]);
      return 2;
    }
  }
  std::sort(inputs.begin(), inputs.end());
  for (const fs::path& path : inputs) {
    std::fprintf(stderr, "replaying %s\n", path.c_str());
    // A copy of exactly the file's size, as libFuzzer gives it: a read past the end is caught.
    const std::vector<uint8_t> bytes = read_all(path);
    auto* copy = new uint8_t[bytes.size()];
    std::copy(bytes.begin(), bytes.end(), copy);
    LLVMFuzzerTestOneInput(copy, bytes.size());
    delete[] copy;
  }
  std::fprintf(stderr, "%zu inputs replayed without a crash\n", inputs.size());
  return 0;
}
