#include "agent/io/vl_samples.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "agent/io/safetensors_torch.h"
#include "agent/io/token_batcher.h"
#include "agent/model/mrope.h"
#include "common/status.h"

namespace memplan::io {
namespace {

absl::Status Bad(const std::string& path, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
}

// An int64 tensor of `rank` dimensions (the last of size `cols` when given), whole.
absl::StatusOr<std::vector<int64_t>> ReadInts(const SafetensorsReader& reader,
                                              const std::string& path, const char* name,
                                              size_t rank, int64_t cols = 0) {
  const SafetensorsTensorInfo* t = reader.header().Find(name);
  if (t == nullptr) return Bad(path, absl::StrCat("tensor \"", name, "\" is missing"));
  if (t->dtype != SafetensorsDType::kI64 || t->shape.size() != rank ||
      (cols > 0 && t->shape.back() != cols)) {
    return Bad(path, absl::StrCat("tensor \"", name, "\" must be int64 of ", rank,
                                  " dimension(s)", cols > 0 ? absl::StrCat(", the last ", cols) : ""));
  }
  std::vector<int64_t> out(static_cast<size_t>(t->numel()));
  RETURN_IF_ERROR(reader.ReadTensorBytes(*t, out.data(), t->size_bytes()));
  return out;
}

absl::Status CheckOffsets(const std::string& path, const char* name,
                          const std::vector<int64_t>& offsets, int64_t total) {
  bool ok = offsets.size() >= 2 && offsets.front() == 0 && offsets.back() == total;
  for (size_t i = 1; ok && i < offsets.size(); ++i) ok = offsets[i] >= offsets[i - 1];
  if (!ok) {
    return Bad(path, absl::StrCat("tensor \"", name, "\" must rise from 0 to ", total,
                                  " (one entry per sample, and one more)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<VlSampleFile>> VlSampleFile::Open(const std::string& path,
                                                                 const ModelSpec& spec) {
  std::unique_ptr<VlSampleFile> f(new VlSampleFile());
  ASSIGN_OR_RETURN(f->reader_, SafetensorsReader::Open(path));
  const SafetensorsReader& r = *f->reader_;
  ASSIGN_OR_RETURN(f->ids_, ReadInts(r, path, "input_ids", 1));
  if (r.header().Find("labels") != nullptr) {
    ASSIGN_OR_RETURN(f->labels_, ReadInts(r, path, "labels", 1));
    if (f->labels_.size() != f->ids_.size()) {
      return Bad(path, "tensor \"labels\" must have as many entries as \"input_ids\"");
    }
  } else {
    f->labels_ = f->ids_;
    for (int64_t& l : f->labels_) {
      if (l == spec.image_token_id) l = -100;
    }
  }
  ASSIGN_OR_RETURN(f->sample_tokens_, ReadInts(r, path, "sample_tokens", 1));
  ASSIGN_OR_RETURN(f->grids_, ReadInts(r, path, "image_grid_thw", 2, 3));
  ASSIGN_OR_RETURN(f->sample_images_, ReadInts(r, path, "sample_images", 1));
  RETURN_IF_ERROR(CheckOffsets(path, "sample_tokens", f->sample_tokens_,
                               static_cast<int64_t>(f->ids_.size())));
  RETURN_IF_ERROR(CheckOffsets(path, "sample_images", f->sample_images_, f->num_images()));
  if (f->sample_images_.size() != f->sample_tokens_.size()) {
    return Bad(path, "tensors \"sample_tokens\" and \"sample_images\" must have one entry per "
                     "sample and one more");
  }
  f->pixels_ = r.header().Find("pixel_values");
  if (f->pixels_ == nullptr) return Bad(path, "tensor \"pixel_values\" is missing");
  const SafetensorsDType d = f->pixels_->dtype;
  if ((d != SafetensorsDType::kF32 && d != SafetensorsDType::kBF16 &&
       d != SafetensorsDType::kF16) ||
      f->pixels_->shape.size() != 2 || f->pixels_->shape[1] != spec.vision.PatchDim()) {
    return Bad(path, absl::StrCat("tensor \"pixel_values\" must be F32, BF16 or F16 [patches, ",
                                  spec.vision.PatchDim(),
                                  "] (channels x temporal_patch_size x patch_size²)"));
  }
  f->image_patches_ = {0};
  for (int64_t i = 0; i < f->num_images(); ++i) {
    const int64_t* g = &f->grids_[static_cast<size_t>(3 * i)];
    f->image_patches_.push_back(f->image_patches_.back() + g[0] * g[1] * g[2]);
  }
  if (f->image_patches_.back() != f->pixels_->shape[0]) {
    return Bad(path, absl::StrCat("tensor \"pixel_values\" has ", f->pixels_->shape[0],
                                  " patches; image_grid_thw adds up to ",
                                  f->image_patches_.back()));
  }
  for (int64_t id : f->ids_) {
    if (id < 0 || id >= spec.vocab_size) {
      return Bad(path, absl::StrCat("input_ids holds ", id, ", outside the vocabulary of ",
                                    spec.vocab_size));
    }
  }
  // Every sample's image tokens against its grids, before the first step.
  for (int64_t s = 0; s < f->num_samples(); ++s) {
    const size_t a = static_cast<size_t>(f->sample_tokens_[s]);
    const size_t b = static_cast<size_t>(f->sample_tokens_[s + 1]);
    f->max_tokens_ = std::max<int64_t>(f->max_tokens_, static_cast<int64_t>(b - a));
    const torch::Tensor ids =
        torch::tensor(std::vector<int64_t>(f->ids_.begin() + a, f->ids_.begin() + b)).view({1, -1});
    const int64_t i0 = f->sample_images_[s], i1 = f->sample_images_[s + 1];
    const torch::Tensor grids =
        torch::tensor(std::vector<int64_t>(f->grids_.begin() + 3 * i0, f->grids_.begin() + 3 * i1))
            .view({-1, 3});
    absl::StatusOr<torch::Tensor> positions = MropePositions(spec, ids, grids);
    if (!positions.ok()) {
      return Bad(path, absl::StrCat("sample ", s, ": ", positions.status().message()));
    }
  }
  return f;
}

VlSampleFile::ImageExtent VlSampleFile::LargestSample() const {
  ImageExtent largest;
  for (int64_t s = 0; s < num_samples(); ++s) {
    const int64_t i0 = sample_images_[s], i1 = sample_images_[s + 1];
    const int64_t patches = image_patches_[i1] - image_patches_[i0];
    if (i1 == i0 || patches <= largest.patches) continue;
    largest = ImageExtent{s, i1 - i0, patches, 0, 0};
    int64_t most = 0;
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t* g = &grids_[static_cast<size_t>(3 * i)];
      if (g[0] * g[1] * g[2] <= most) continue;
      most = g[0] * g[1] * g[2];
      largest.largest_rows = g[1];
      largest.largest_cols = g[2];
    }
  }
  return largest;
}

absl::StatusOr<VlSample> VlSampleFile::Read(int64_t sample) const {
  if (sample < 0 || sample >= num_samples()) {
    return absl::OutOfRangeError(absl::StrCat("sample ", sample, " of ", num_samples()));
  }
  VlSample out;
  const auto a = sample_tokens_[sample], b = sample_tokens_[sample + 1];
  out.input_ids.assign(ids_.begin() + a, ids_.begin() + b);
  out.labels.assign(labels_.begin() + a, labels_.begin() + b);
  const int64_t i0 = sample_images_[sample], i1 = sample_images_[sample + 1];
  out.images.image_grid_thw =
      torch::tensor(std::vector<int64_t>(grids_.begin() + 3 * i0, grids_.begin() + 3 * i1))
          .view({-1, 3});
  const int64_t p0 = image_patches_[i0], p1 = image_patches_[i1];
  const int64_t width = pixels_->shape[1];
  torch::Tensor pixels =
      torch::empty({p1 - p0, width}, torch::TensorOptions().dtype(TorchDTypeOf(pixels_->dtype)));
  const int64_t row_bytes = width * static_cast<int64_t>(pixels.element_size());
  if (p1 > p0) {
    RETURN_IF_ERROR(reader_->ReadTensorBytesAt(*pixels_, p0 * row_bytes, pixels.data_ptr(),
                                               (p1 - p0) * row_bytes));
  }
  out.images.pixel_values = pixels;
  return out;
}

absl::Status CheckSyntheticVl(const ModelSpec& spec, const SyntheticVlOptions& o) {
  const VisionSpec& v = spec.vision;
  const int64_t unit = v.patch_size * v.spatial_merge_size;
  if (o.images < 1 || o.height < unit || o.width < unit || o.height % unit != 0 ||
      o.width % unit != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--synthetic-images ", o.images, " --image-size ", o.height, "x", o.width,
        ": needs at least one image whose sides are multiples of patch_size x spatial_merge_size "
        "= ", unit, " pixels"));
  }
  const int64_t tokens = o.images * ((o.height / unit) * (o.width / unit) + 2 + 2) + 1;
  if (tokens > o.seq_len) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--synthetic-images ", o.images, " of ", o.height, "x", o.width, " take ", tokens,
        " tokens with their text; --seq ", o.seq_len, " is shorter"));
  }
  return absl::OkStatus();
}

VlSample SyntheticVlSample(const ModelSpec& spec, const SyntheticVlOptions& o, int64_t index) {
  const VisionSpec& v = spec.vision;
  const int64_t gh = o.height / v.patch_size, gw = o.width / v.patch_size;
  const int64_t tokens = gh * gw / (v.spatial_merge_size * v.spatial_merge_size);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(o.seed * 0x9E3779B97F4A7C15ull +
                                                      static_cast<uint64_t>(index));
  // Text ids below the smallest special id, so that no text token reads as an image.
  const int64_t text_ids = std::max<int64_t>(
      1, std::min({spec.vocab_size, spec.image_token_id, spec.video_token_id,
                   spec.vision_start_token_id, spec.vision_end_token_id}));
  auto text = [&](int64_t n, std::vector<int64_t>* ids) {
    const torch::Tensor t = torch::randint(0, text_ids, {n}, gen, torch::kLong);
    for (int64_t i = 0; i < n; ++i) ids->push_back(t[i].item<int64_t>());
  };
  VlSample s;
  for (int64_t i = 0; i < o.images; ++i) {
    text(2, &s.input_ids);
    s.input_ids.push_back(spec.vision_start_token_id);
    s.input_ids.insert(s.input_ids.end(), tokens, spec.image_token_id);
    s.input_ids.push_back(spec.vision_end_token_id);
  }
  text(o.seq_len + 1 - static_cast<int64_t>(s.input_ids.size()), &s.input_ids);
  s.labels = s.input_ids;
  for (int64_t& l : s.labels) {
    if (l == spec.image_token_id) l = -100;
  }
  s.images.image_grid_thw = torch::tensor({int64_t{1}, gh, gw}, torch::kLong).repeat({o.images, 1});
  s.images.pixel_values = torch::randn({o.images * gh * gw, v.PatchDim()}, gen);
  return s;
}

absl::StatusOr<std::unique_ptr<VlBatcher>> VlBatcher::Create(
    const ModelSpec& spec, std::shared_ptr<const VlSampleFile> file,
    const SyntheticVlOptions& synthetic, const Options& options) {
  if (options.batch_size < 1 || options.seq_len < 1 || options.world_size < 1 ||
      options.rank < 0 || options.rank >= options.world_size) {
    return absl::InvalidArgumentError("VL batcher: options out of range");
  }
  if (file != nullptr) {
    if (file->num_samples() < 1) return absl::InvalidArgumentError("--data-vl: no samples");
    // The shifted targets need one token beyond the sequence, which the last position lacks:
    // a sample of seq_len + 1 tokens fills a row.
    if (file->max_sample_tokens() > options.seq_len + 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--data-vl: the longest sample has ", file->max_sample_tokens(), " tokens; --seq ",
          options.seq_len, " is shorter (samples are never cut: an image's tokens stay whole)"));
    }
  } else {
    SyntheticVlOptions s = synthetic;
    s.seq_len = options.seq_len;
    RETURN_IF_ERROR(CheckSyntheticVl(spec, s));
  }
  std::unique_ptr<VlBatcher> b(new VlBatcher());
  b->spec_ = spec;
  b->file_ = std::move(file);
  b->synthetic_ = synthetic;
  b->synthetic_.seq_len = options.seq_len;
  b->options_ = options;
  return b;
}

absl::StatusOr<VlBatch> VlBatcher::Batch(int64_t step) const {
  const Options& o = options_;
  torch::Tensor ids = torch::zeros({o.batch_size, o.seq_len}, torch::kLong);
  torch::Tensor targets = torch::full({o.batch_size, o.seq_len}, -100, torch::kLong);
  std::vector<torch::Tensor> pixels, grids;
  for (int64_t row = 0; row < o.batch_size; ++row) {
    const int64_t g = (step * o.world_size + o.rank) * o.batch_size + row;
    VlSample s;
    if (file_ != nullptr) {
      const int64_t n = file_->num_samples();
      const uint64_t key = o.seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(g / n);
      ASSIGN_OR_RETURN(s, file_->Read(PermuteIndex(g % n, n, key)));
    } else {
      s = SyntheticVlSample(spec_, synthetic_, g);
    }
    const int64_t len = std::min<int64_t>(static_cast<int64_t>(s.input_ids.size()), o.seq_len);
    auto id = ids.accessor<int64_t, 2>();
    auto target = targets.accessor<int64_t, 2>();
    for (int64_t t = 0; t < len; ++t) id[row][t] = s.input_ids[static_cast<size_t>(t)];
    for (int64_t t = 0; t + 1 < static_cast<int64_t>(s.labels.size()) && t < o.seq_len; ++t) {
      target[row][t] = s.labels[static_cast<size_t>(t + 1)];
    }
    if (s.images.num_images() > 0) {
      pixels.push_back(s.images.pixel_values.to(torch::kFloat32));
      grids.push_back(s.images.image_grid_thw);
    }
  }
  VlBatch out{ids, targets, {}};
  if (!grids.empty()) {
    out.images.pixel_values = torch::cat(pixels, 0);
    out.images.image_grid_thw = torch::cat(grids, 0);
  }
  return out;
}

}  // namespace memplan::io
