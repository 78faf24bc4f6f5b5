#include "agent/profiler/memory_timeline.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "agent/train/trainer.h"
#include "tests/agent/tiny_spec.h"

namespace memplan {
namespace {

const bool kSingleThread = [] {
  torch::set_num_threads(1);
  return true;
}();


std::unique_ptr<LlamaModel> MakeModel() {
  LlamaModelOptions options;
  options.spec = testing::TinySpec();
  options.seed = 5;
  auto model = LlamaModel::Create(options);
  EXPECT_TRUE(model.ok()) << model.status();
  return std::move(model).value();
}

std::vector<MicroBatch> Batch(int64_t step) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(77 + step);
  MicroBatch b;
  b.input_ids = torch::randint(128, {2, 32}, gen, torch::kLong);
  b.labels = b.input_ids.clone();
  return {b};
}

TrainerOptions Options(ParamResidency* observer) {
  TrainerOptions o;
  o.adamw.lr = 1e-2;
  o.block_modes = {BlockMode::kCkpt, BlockMode::kNone, BlockMode::kCkpt, BlockMode::kNone};
  o.managed = true;
  o.chunks.chunk_bytes = 16 << 10;
  o.chunks.n_persist = 1;
  o.chunks.n_buffer = 4;
  o.chunks.host_memory = HostMemoryKind::kPageable;
  o.chunks.cpu_threads = 1;
  o.observer = observer;
  return o;
}

TEST(MemoryTimelineTest, RecordsEveryGroupHookOfTheStepWithoutChangingTraining) {
  std::unique_ptr<LlamaModel> plain_model = MakeModel();
  std::unique_ptr<LlamaModel> observed_model = MakeModel();
  auto plain = Trainer::Create(plain_model.get(), Options(nullptr));
  ASSERT_TRUE(plain.ok()) << plain.status();

  std::unique_ptr<MemoryProbe> probe = MemoryProbe::Create(torch::kCPU);
  MemoryTimeline timeline(probe.get());
  auto observed = Trainer::Create(observed_model.get(), Options(&timeline));
  ASSERT_TRUE(observed.ok()) << observed.status();

  // Step 1 is not recorded; step 2 is.
  for (int64_t step = 1; step <= 2; ++step) {
    if (step == 2) timeline.BeginStep(step);
    auto a = (*plain)->Step(Batch(step));
    auto b = (*observed)->Step(Batch(step));
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(a->loss, b->loss) << "step " << step;  // observing changes nothing
    if (step == 2) timeline.EndStep();
  }
  const std::vector<NamedParam> pa = (*plain)->Params(), pb = (*observed)->Params();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(torch::equal(pa[i].param, pb[i].param));

  // Groups: 0 embedding, 1..4 blocks, 5 head. Forward in order, backward in reverse.
  std::vector<std::string> expected = {"step_begin/-1"};
  for (int g = 0; g <= 5; ++g) {
    expected.push_back("pre_forward/" + std::to_string(g));
    expected.push_back("post_forward/" + std::to_string(g));
  }
  for (int g = 5; g >= 0; --g) {
    expected.push_back("pre_backward/" + std::to_string(g));
    expected.push_back("post_backward/" + std::to_string(g));
  }
  expected.push_back("step_end/-1");
  std::vector<std::string> got;
  for (const MemoryEvent& e : timeline.events()) {
    got.push_back(e.event + "/" + std::to_string(e.group));
    EXPECT_EQ(e.step, 2);
    EXPECT_GE(e.peak_since, e.allocated) << got.back();
  }
  EXPECT_EQ(got, expected);
  int64_t max_peak = 0;
  for (const MemoryEvent& e : timeline.events()) max_peak = std::max(max_peak, e.peak_since);
  EXPECT_EQ(timeline.StepPeakAllocated(), max_peak);
  EXPECT_GT(timeline.StepPeakAllocated(), timeline.events().front().allocated);

  // Activations of NONE blocks are held from their forward to their backward: more is live when
  // the head starts its backward than when the step began.
  const auto& ev = timeline.events();
  auto at = [&](const std::string& key) {
    for (size_t i = 0; i < got.size(); ++i) {
      if (got[i] == key) return ev[i].allocated;
    }
    ADD_FAILURE() << key;
    return int64_t{0};
  };
  EXPECT_GT(at("pre_backward/5"), at("step_begin/-1"));
  EXPECT_GT(at("post_forward/2"), at("post_forward/1"));  // block 2 (NONE) kept its saved set

  // TSV: a header and one line per event.
  const std::string path = ::testing::TempDir() + "/memplan_timeline_" +
                           std::to_string(::getpid()) + ".tsv";
  ASSERT_TRUE(timeline.WriteTsv(path).ok());
  std::ifstream in(path);
  std::string line;
  std::vector<std::string> lines;
  while (std::getline(in, line)) lines.push_back(line);
  ASSERT_EQ(lines.size(), ev.size() + 1);
  EXPECT_EQ(lines[0],
            "step\tevent\tgroup\tallocated\treserved\tpeak_since_previous\tactive\t"
            "peak_active_since_previous\tinactive_split\tdevice_allocs\tseconds\t"
            "cpu_updates_started");
  EXPECT_EQ(lines[1].rfind("2\tstep_begin\t-1\t", 0), 0u) << lines[1];
  // Without a counter the CPU-update column says so; host seconds never go back.
  EXPECT_EQ(lines[1].substr(lines[1].rfind('\t') + 1), "-1");
  for (size_t i = 1; i < ev.size(); ++i) EXPECT_GE(ev[i].seconds, ev[i - 1].seconds);
  ::unlink(path.c_str());
}

// Without clipping the offloaded chunks' CPU updates start during backward: the timeline's
// cpu_updates column (read from the ChunkManager at every hook) grows through backward's hooks.
// With clipping (the updates wait for the global norm) it stays 0 and this test fails.
TEST(MemoryTimelineTest, ShowsCpuUpdatesStartingDuringBackward) {
  std::unique_ptr<LlamaModel> model = MakeModel();
  std::unique_ptr<MemoryProbe> probe = MemoryProbe::Create(torch::kCPU);
  MemoryTimeline timeline(probe.get());
  TrainerOptions options = Options(&timeline);
  options.max_grad_norm = 0;  // no clipping: an update needs only its chunk's final grads
  auto trainer = Trainer::Create(model.get(), options);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  ChunkManager* chunks = (*trainer)->chunk_manager();
  ASSERT_NE(chunks, nullptr);
  timeline.SetCpuUpdateCounter([chunks] { return chunks->UpdatesStartedBeforeStep(); });
  timeline.BeginStep(1);
  auto result = (*trainer)->Step(Batch(1));
  ASSERT_TRUE(result.ok()) << result.status();
  timeline.EndStep();
  // Forward starts none; backward's hooks see them start group by group (the head's first, block
  // 1's last before the embedding's group), none waiting for the optimizer step.
  std::vector<int64_t> backward;  // post_backward of the head, blocks 4..1 (not the embedding's)
  for (const MemoryEvent& e : timeline.events()) {
    if (e.event == "pre_forward" || e.event == "post_forward") {
      EXPECT_EQ(e.cpu_updates, 0) << e.event << " " << e.group;
    }
    if (e.event == "post_backward" && e.group > 0) backward.push_back(e.cpu_updates);
  }
  ASSERT_EQ(backward.size(), 5u);
  EXPECT_TRUE(std::is_sorted(backward.begin(), backward.end()));
  EXPECT_GT(backward.front(), 0) << "no CPU update started at the head's backward";
  EXPECT_LT(backward.front(), backward.back()) << "no CPU update started during the blocks";
  const ChunkMemoryStats stats = chunks->MemoryStats();
  EXPECT_EQ(backward.back(), stats.n_chunks - stats.n_persist);  // the embedding's is persistent
}

TEST(MemoryTimelineTest, IgnoresHooksOutsideARecordedStep) {
  std::unique_ptr<MemoryProbe> probe = MemoryProbe::Create(torch::kCPU);
  MemoryTimeline timeline(probe.get());
  timeline.PreForward(0);
  timeline.Mark("ignored");
  EXPECT_TRUE(timeline.events().empty());
  timeline.BeginStep(3);
  timeline.PreForward(0);
  timeline.Mark("optimizer");
  timeline.EndStep();
  timeline.PostForward(0);
  ASSERT_EQ(timeline.events().size(), 4u);
  EXPECT_EQ(timeline.events()[2].event, "optimizer");
  EXPECT_FALSE(timeline.recording());
}

}  // namespace
}  // namespace memplan
