// Vision-language data: the sample file (agent/io/vl_samples.h), its batches, synthetic samples,
// the train flags and the refusals (agent/train/vl_data.h).
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "agent/io/safetensors_torch.h"
#include "agent/io/vl_samples.h"
#include "agent/train/train_config.h"
#include "agent/train/vl_data.h"
#include "tests/agent/tiny_spec.h"

namespace memplan {
namespace {

constexpr int64_t kImage = testing::kTinyVlImage, kVideo = testing::kTinyVlVideo,
                  kStart = testing::kTinyVlStart, kEnd = testing::kTinyVlEnd;

ModelSpec VlSpec() { return testing::TinyVlSpec(2); }

std::string TempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          (name + "-" + std::to_string(::getpid()) + ".safetensors"))
      .string();
}

// Sample 0: text, one 4x4-patch image (4 tokens), text (9 tokens); sample 1: text only (5);
// sample 2: two images, 4x4 and 4x8 (4 and 8 tokens; 17 tokens in all).
std::vector<NamedParam> ThreeSamples(const ModelSpec& s) {
  std::vector<int64_t> ids = {1, 2, kStart, kImage, kImage, kImage, kImage, kEnd, 3};
  const std::vector<int64_t> text = {4, 5, 6, 7, 8};
  ids.insert(ids.end(), text.begin(), text.end());
  ids.insert(ids.end(), {9, kStart, kImage, kImage, kImage, kImage, kEnd, kStart});
  for (int i = 0; i < 8; ++i) ids.push_back(kImage);
  ids.push_back(kEnd);
  const int64_t n = static_cast<int64_t>(ids.size());
  return {{"input_ids", torch::tensor(ids)},
          {"sample_tokens", torch::tensor({int64_t{0}, int64_t{9}, int64_t{14}, n})},
          {"image_grid_thw", torch::tensor({1, 4, 4, 1, 4, 4, 1, 4, 8}, torch::kLong).view({3, 3})},
          {"sample_images", torch::tensor({int64_t{0}, int64_t{1}, int64_t{1}, int64_t{3}})},
          {"pixel_values",
           torch::arange((16 + 16 + 32) * s.vision.PatchDim(), torch::kFloat32)
               .view({64, s.vision.PatchDim()})}};
}

TEST(VlSampleFileTest, ReadsSamplesAndTheirImages) {
  const ModelSpec s = VlSpec();
  const std::string path = TempPath("vl-samples");
  ASSERT_TRUE(io::SaveSafetensorsFile(path, ThreeSamples(s)).ok());
  auto file = io::VlSampleFile::Open(path, s);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->num_samples(), 3);
  EXPECT_EQ((*file)->num_images(), 3);
  EXPECT_EQ((*file)->max_sample_tokens(), 17);
  auto s2 = (*file)->Read(2);
  ASSERT_TRUE(s2.ok()) << s2.status();
  EXPECT_EQ(s2->input_ids.size(), 17u);
  EXPECT_EQ(s2->images.num_images(), 2);
  // Its pixels are patches 16..63 of the file.
  EXPECT_EQ(s2->images.pixel_values.size(0), 48);
  EXPECT_EQ(s2->images.pixel_values[0][0].item<float>(), 16.0f * s.vision.PatchDim());
  // Default labels: the ids, image tokens not scored.
  EXPECT_EQ(s2->labels[2], -100);
  EXPECT_EQ(s2->labels[1], kStart);
  auto s1 = (*file)->Read(1);
  ASSERT_TRUE(s1.ok());
  EXPECT_EQ(s1->images.num_images(), 0);
  std::filesystem::remove(path);
}

TEST(VlSampleFileTest, RefusesMalformedFiles) {
  const ModelSpec s = VlSpec();
  const std::string path = TempPath("vl-bad");
  auto expect_error = [&](std::vector<NamedParam> tensors, const std::string& word) {
    ASSERT_TRUE(io::SaveSafetensorsFile(path, tensors).ok());
    auto file = io::VlSampleFile::Open(path, s);
    ASSERT_FALSE(file.ok()) << word;
    EXPECT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument) << file.status();
    EXPECT_NE(file.status().message().find(word), std::string::npos) << file.status();
  };
  std::vector<NamedParam> t = ThreeSamples(s);
  t[4].param = t[4].param.view({32, -1});  // patches twice as wide
  expect_error(t, "pixel_values");
  t = ThreeSamples(s);
  t[2].param = torch::tensor({1, 4, 4, 1, 4, 4, 1, 4, 4}, torch::kLong).view({3, 3});
  expect_error(t, "image_grid_thw adds up to");
  t = ThreeSamples(s);
  // Same patch count, but sample 0's four image tokens stand for a 4x8-patch image (8 tokens).
  t[2].param = torch::tensor({1, 4, 8, 1, 4, 4, 1, 4, 4}, torch::kLong).view({3, 3});
  expect_error(t, "sample 0");
  t = ThreeSamples(s);
  t.erase(t.begin() + 3);
  expect_error(t, "sample_images");
  t = ThreeSamples(s);
  t[0].param = t[0].param.clone();
  t[0].param[0] = 500;
  expect_error(t, "outside the vocabulary");
  std::filesystem::remove(path);
}

TEST(VlBatcherTest, PadsShiftsAndKeepsImagesInRowOrder) {
  const ModelSpec s = VlSpec();
  const std::string path = TempPath("vl-batch");
  ASSERT_TRUE(io::SaveSafetensorsFile(path, ThreeSamples(s)).ok());
  auto opened = io::VlSampleFile::Open(path, s);
  ASSERT_TRUE(opened.ok());
  std::shared_ptr<const io::VlSampleFile> file = *std::move(opened);
  io::VlBatcher::Options o;
  o.batch_size = 3;
  o.seq_len = 20;
  auto batcher = io::VlBatcher::Create(s, file, {}, o);
  ASSERT_TRUE(batcher.ok()) << batcher.status();
  auto batch = (*batcher)->Batch(0);
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_EQ(batch->input_ids.sizes(), (std::vector<int64_t>{3, 20}));
  // Every sample once per epoch, each row's images in order: patches add up to all 64.
  EXPECT_EQ(batch->images.pixel_values.size(0), 64);
  EXPECT_EQ(batch->images.num_images(), 3);
  for (int64_t r = 0; r < 3; ++r) {
    const int64_t len = (batch->input_ids[r] != 0).sum().item<int64_t>();
    // targets[t] = labels[t + 1]; the last real position and the padding are not scored.
    for (int64_t t = len - 1; t < 20; ++t) EXPECT_EQ(batch->targets[r][t].item<int64_t>(), -100);
    for (int64_t t = 0; t + 1 < len; ++t) {
      const int64_t next = batch->input_ids[r][t + 1].item<int64_t>();
      EXPECT_EQ(batch->targets[r][t].item<int64_t>(), next == kImage ? -100 : next);
    }
  }
  // A row's images are the ones its image tokens stand for: the model accepts the batch.
  o.seq_len = 15;  // sample 2 has 17 tokens: a row holds seq_len + 1
  auto short_seq = io::VlBatcher::Create(s, file, {}, o);
  ASSERT_FALSE(short_seq.ok());
  EXPECT_NE(short_seq.status().message().find("never cut"), std::string::npos);
  std::filesystem::remove(path);
}

TEST(VlBatcherTest, SyntheticImages) {
  const ModelSpec s = VlSpec();
  io::SyntheticVlOptions syn;
  syn.images = 2;
  syn.height = 8;
  syn.width = 12;  // 4x6 patches, 2x3 merged: 6 tokens each
  io::VlBatcher::Options o;
  o.batch_size = 2;
  o.seq_len = 24;
  auto batcher = io::VlBatcher::Create(s, nullptr, syn, o);
  ASSERT_TRUE(batcher.ok()) << batcher.status();
  auto batch = (*batcher)->Batch(3);
  ASSERT_TRUE(batch.ok());
  EXPECT_EQ(batch->images.num_images(), 4);
  EXPECT_EQ(batch->images.pixel_values.sizes(), (std::vector<int64_t>{4 * 24, 24}));
  EXPECT_EQ((batch->input_ids == kImage).sum().item<int64_t>(), 4 * 6);
  EXPECT_TRUE(torch::equal(batch->input_ids, (*batcher)->Batch(3)->input_ids));
  syn.width = 10;  // not a multiple of patch x merge = 4
  EXPECT_FALSE(io::VlBatcher::Create(s, nullptr, syn, o).ok());
  syn.width = 12;
  o.seq_len = 12;  // two images of 6 tokens and their text do not fit
  EXPECT_FALSE(io::VlBatcher::Create(s, nullptr, syn, o).ok());
}

TEST(VlDataTest, FlagsAndRefusals) {
  auto parse = [](std::vector<std::string> extra) {
    std::vector<std::string> args = {"--arch", "llama-tiny"};
    args.insert(args.end(), extra.begin(), extra.end());
    return ParseTrainArgs(args);
  };
  auto c = parse({"--synthetic-images", "2", "--image-size", "448x224"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->synthetic_images, 2);
  EXPECT_EQ(c->image_height, 448);
  EXPECT_EQ(c->image_width, 224);
  EXPECT_FALSE(c->vision_checkpoint);
  auto ckpt = parse({"--synthetic-images", "2", "--image-size", "448x224", "--vision-checkpoint"});
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_TRUE(ckpt->vision_checkpoint);
  EXPECT_TRUE(parse({"--data-vl", "samples.safetensors"}).ok());
  EXPECT_FALSE(parse({"--synthetic-images", "2"}).ok());
  EXPECT_FALSE(parse({"--synthetic-images", "1", "--image-size", "448"}).ok());
  EXPECT_FALSE(parse({"--data-vl", "a", "--synthetic-data"}).ok());

  // A vision-language model is never trained text-only; image data needs such a model.
  const ModelSpec vl = VlSpec();
  TrainConfig text;
  text.synthetic_data = true;
  absl::Status st = CheckVlData(text, vl);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("--data-vl"), std::string::npos) << st;
  ModelSpec llama = vl;
  llama.family = "llama";
  llama.vision = VisionSpec();
  EXPECT_TRUE(CheckVlData(text, llama).ok());
  EXPECT_FALSE(CheckVlData(*c, llama).ok());
  EXPECT_TRUE(CheckVlData(*c, vl).ok());
  TrainConfig eval = *c;
  eval.eval_tokens_file = "eval.tokens";
  EXPECT_FALSE(CheckVlData(eval, vl).ok());

  // The trainer's micro-batch: ids, shifted targets, images.
  c->batch = 1;
  c->seq = 64;
  c->image_height = 8;
  c->image_width = 8;
  auto batcher = OpenVlData(*c, vl, 0, 1);
  ASSERT_TRUE(batcher.ok()) << batcher.status();
  auto mb = NextVlBatch(**batcher, 0);
  ASSERT_TRUE(mb.ok());
  EXPECT_EQ(mb->input_ids.sizes(), (std::vector<int64_t>{1, 64}));
  EXPECT_EQ(mb->images.num_images(), 2);
}

// [Largest VL sample]: a file of images of several sizes is described to the planner by its
// sample with the most patches, never fewer patches; synthetic images as given.
TEST(VlDataTest, WorkloadDescribesTheLargestSample) {
  const ModelSpec s = VlSpec();
  const std::string path = TempPath("vl-largest");
  ASSERT_TRUE(io::SaveSafetensorsFile(path, ThreeSamples(s)).ok());
  auto file = io::VlSampleFile::Open(path, s);
  ASSERT_TRUE(file.ok()) << file.status();
  const io::VlSampleFile::ImageExtent largest = (*file)->LargestSample();
  EXPECT_EQ(largest.sample, 2);
  EXPECT_EQ(largest.images, 2);
  EXPECT_EQ(largest.patches, 16 + 32);
  EXPECT_EQ(largest.largest_rows, 4);
  EXPECT_EQ(largest.largest_cols, 8);

  TrainConfig c;
  c.vl_data_file = path;
  absl::StatusOr<VlWorkloadImages> d = DescribeVlImages(c, s);
  ASSERT_TRUE(d.ok()) << d.status();
  // Two images 4 patches tall and 6 wide (whole merged columns): 48 patches, the sample's 48.
  EXPECT_EQ(d->images_per_sample, 2);
  EXPECT_EQ(d->image_height, 4 * s.vision.patch_size);
  EXPECT_EQ(d->image_width, 6 * s.vision.patch_size);
  EXPECT_EQ(d->sample, 2);
  EXPECT_EQ(d->sample_patches, 48);
  EXPECT_EQ(d->described_patches, 48);
  std::filesystem::remove(path);

  TrainConfig synthetic;
  synthetic.synthetic_images = 3;
  synthetic.image_height = 448;
  synthetic.image_width = 224;
  d = DescribeVlImages(synthetic, s);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->images_per_sample, 3);
  EXPECT_EQ(d->image_height, 448);
  EXPECT_EQ(d->image_width, 224);
  ModelSpec llama = s;
  llama.family = "llama";
  llama.vision = VisionSpec();
  d = DescribeVlImages(synthetic, llama);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->images_per_sample, 0);
}

}  // namespace
}  // namespace memplan
