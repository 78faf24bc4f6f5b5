// memplan-make-tokens: writes a synthetic, learnable token file (agent/io/synthetic_tokens.h) in
// the memplan token format (agent/io/token_file.h).
//   memplan-make-tokens --out=FILE --tokens=N --vocab=V [--seed=S] [--noise=P] [--token-bytes=2|4]
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "agent/io/synthetic_tokens.h"
#include "agent/io/token_file.h"

namespace {

constexpr char kUsage[] =
    "usage: memplan-make-tokens --out=FILE --tokens=N --vocab=V [--seed=S] [--noise=P]\n"
    "                           [--token-bytes=2|4]\n"
    "Writes N tokens in [0, V): each token follows a fixed random successor of the previous one,\n"
    "except with probability P (default 0.1) when it is uniform. --token-bytes defaults to 2 when\n"
    "V <= 65536, else 4.\n";

int Fail(const std::string& message) {
  std::fprintf(stderr, "memplan-make-tokens: %s\n%s", message.c_str(), kUsage);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string out;
  memplan::io::SyntheticTokenOptions options;
  options.num_tokens = -1;
  int token_bytes = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const size_t eq = arg.find('=');
    const std::string key = arg.substr(0, eq);
    const std::string value = eq == std::string::npos ? "" : arg.substr(eq + 1);
    bool ok = eq != std::string::npos;
    if (key == "--help" || key == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (key == "--out") {
      out = value;
    } else if (key == "--tokens") {
      ok = ok && absl::SimpleAtoi(value, &options.num_tokens);
    } else if (key == "--vocab") {
      ok = ok && absl::SimpleAtoi(value, &options.vocab_size);
    } else if (key == "--seed") {
      ok = ok && absl::SimpleAtoi(value, &options.seed);
    } else if (key == "--noise") {
      ok = ok && absl::SimpleAtod(value, &options.noise);
    } else if (key == "--token-bytes") {
      ok = ok && absl::SimpleAtoi(value, &token_bytes);
    } else {
      return Fail("unknown flag " + arg);
    }
    if (!ok) return Fail("bad value in " + arg);
  }
  if (out.empty()) return Fail("--out is required");
  if (options.num_tokens < 0) return Fail("--tokens is required");
  if (token_bytes == 0) token_bytes = options.vocab_size <= 65536 ? 2 : 4;

  auto tokens = memplan::io::MakeSyntheticTokens(options);
  if (!tokens.ok()) return Fail(std::string(tokens.status().message()));
  absl::Status written = memplan::io::WriteTokenFile(out, *tokens, token_bytes, options.vocab_size);
  if (!written.ok()) {
    std::fprintf(stderr, "memplan-make-tokens: %s\n", std::string(written.message()).c_str());
    return 1;
  }
  std::printf("wrote %s: %lld tokens, vocab %lld, %d bytes per token, seed %llu, noise %g\n",
              out.c_str(), static_cast<long long>(options.num_tokens),
              static_cast<long long>(options.vocab_size), token_bytes,
              static_cast<unsigned long long>(options.seed), options.noise);
  return 0;
}
