// memplan-make-tokens: writes a synthetic, learnable token file (agent/io/synthetic_tokens.h) in
// the memplan token format (agent/io/token_file.h).
//   memplan-make-tokens --out=FILE --tokens=N --vocab=V [--seed=S] [--noise=P] [--token-bytes=2|4]
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "agent/io/synthetic_tokens.h"
#include "agent/io/token_file.h"
#include "common/flags.h"
#include "common/validate.h"

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
  bool help = false;
  memplan::FlagSet flags("see --help");
  flags.Switch("--help", &help)
      .Alias("-h", "--help")
      .String("--out", &out)
      .Int("--tokens", &options.num_tokens, 0, int64_t{1} << 40)
      .Int("--vocab", &options.vocab_size, 1, memplan::kMaxVocabSize)
      .Int("--seed", &options.seed, 0, std::numeric_limits<int64_t>::max())
      .Double("--noise", &options.noise, 0, 1)
      .Choice("--token-bytes", &token_bytes, memplan::FlagSet::Choices<int>{{"2", 2}, {"4", 4}});
  const absl::Status parsed = flags.Parse(std::vector<std::string>(argv + 1, argv + argc));
  if (help) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (!parsed.ok()) return Fail(std::string(parsed.message()));
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
