#include "agent/chunks/chunk_state_io.h"

#include <algorithm>
#include <deque>
#include <future>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <ATen/Parallel.h>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "agent/chunks/adamw8bit_torch.h"
#include "agent/chunks/cpu_adamw.h"
#include "common/optimizer_bytes.h"
#include "common/status.h"

namespace memplan::chunks {

std::vector<NamedParam> ChunkStateIO::ParamOrder() const {
  std::vector<NamedParam> order;
  order.reserve(set_.num_params());
  for (int i = 0; i < set_.num_params(); ++i) {
    order.push_back({set_.param(i).name, set_.param(i).tensor});
  }
  return order;
}

std::vector<NamedParam> ChunkStateIO::Params() {
  optimizer_.WaitAll();
  // Sharded: every offloaded chunk gathered from the ranks, in chunk order on every rank.
  std::map<int, torch::Tensor> gathered;
  if (set_.sharded()) {
    for (int c = 0; c < set_.num_chunks(); ++c) {
      const Chunk& chunk = set_.chunk(c);
      if (chunk.params_sharded) gathered[c] = collectives_.GatherDevice(chunk.param_shard);
      if (chunk.persistent) continue;
      gathered[c] = collectives_.GatherHost(chunk.param_host.data(), set_.dtype(), chunk);
    }
  }
  std::vector<NamedParam> out;
  for (int i = 0; i < set_.num_params(); ++i) {
    const Param& p = set_.param(i);
    const Chunk& chunk = set_.chunk(p.chunk);
    torch::Tensor value;
    if (chunk.params_replicated()) {
      value = p.tensor.detach().to(torch::kCPU, /*non_blocking=*/false, /*copy=*/true);
    } else if (set_.sharded()) {
      value = set_.ParamView(gathered[p.chunk], p).clone();  // [Byte chunks] included
    } else {
      value = set_.ParamHostView(chunk.param_host.data(), p).clone();
    }
    out.push_back({p.name, value});
  }
  return out;
}

std::vector<NamedParam> ChunkStateIO::Grads() {
  if (set_.stateless()) return {};  // no grads are kept (and, sharded, none is reduced)
  optimizer_.WaitAll();
  std::map<int, torch::Tensor> gathered;  // sharded: chunks with a grad in this step
  if (set_.sharded()) {
    // The replicated chunks' grads are summed over the ranks now (Step() does not repeat it).
    if (const absl::Status s = optimizer_.AllReducePersistentGrads(); !s.ok()) {
      collectives_.FailCollective(s);
    }
    // [Sharded persistent state]: the reduced shards, gathered.
    for (int c = 0; c < set_.n_persist(); ++c) {
      const ChunkState& state = optimizer_.chunk_state(c);
      if (state.grad_shard.defined()) gathered[c] = collectives_.GatherDevice(state.grad_shard);
    }
    for (int c = set_.n_persist(); c < set_.num_chunks(); ++c) {
      bool any = false;
      for (int i : set_.chunk(c).params) any = any || optimizer_.state(i).grad_in_step;
      if (any) {
        gathered[c] = collectives_.GatherHost(optimizer_.HostGrad(c), optimizer_.host_grad_dtype(),
                                              set_.chunk(c));
      }
    }
  }
  std::vector<NamedParam> out;
  for (int i = 0; i < set_.num_params(); ++i) {
    const Param& p = set_.param(i);
    const ParamState& s = optimizer_.state(i);
    const Chunk& chunk = set_.chunk(p.chunk);
    if (chunk.state_sharded) {
      if (s.grad_in_step) {
        out.push_back(
            {p.name, gathered[p.chunk].narrow(0, p.offset_elems, p.numel).view(p.shape).clone()});
      }
    } else if (chunk.persistent) {
      if (p.tensor.grad().defined()) {
        out.push_back({p.name, p.tensor.grad().to(torch::kCPU, false, /*copy=*/true)});
      }
    } else if (s.grad_in_step && set_.sharded()) {
      out.push_back(
          {p.name, gathered[p.chunk].narrow(0, p.offset_elems, p.numel).view(p.shape).clone()});
    } else if (s.grad_in_step) {
      out.push_back({p.name, ChunkSet::HostView(optimizer_.HostGrad(p.chunk), p.offset_elems,
                                                p.shape, p.numel, optimizer_.host_grad_dtype())
                                 .clone()});
    }
  }
  return out;
}

std::vector<NamedParam> ChunkStateIO::OptimizerState() {
  if (set_.stateless()) return {};
  optimizer_.WaitAll();
  if (optimizer_.quantized()) {
    std::vector<NamedParam> out;
    OptimizerState8bit(out);
    return out;
  }
  const bool has_moments = optimizer_.has_moments();
  const bool master = optimizer_.master();
  const torch::ScalarType moment_dtype = optimizer_.moment_dtype();
  auto updated = [this](int c) {
    bool any = false;
    for (int i : set_.chunk(c).params) any = any || optimizer_.state(i).step > 0;
    return any;
  };
  // Sharded: the state arrays of every offloaded chunk with an updated parameter, gathered.
  std::map<const void*, torch::Tensor> gathered;
  if (set_.sharded()) {
    // [Sharded persistent state]: the device shards of the persistent chunks, gathered.
    for (int c = 0; c < set_.n_persist(); ++c) {
      const ChunkState& state = optimizer_.chunk_state(c);
      if (!set_.chunk(c).state_sharded || !updated(c)) continue;
      for (const torch::Tensor* t :
           {&state.device_exp_avg, &state.device_exp_avg_sq, &state.device_master}) {
        if (t->defined()) gathered[t->data_ptr()] = collectives_.GatherDevice(*t);
      }
    }
    for (int c = set_.n_persist(); c < set_.num_chunks(); ++c) {
      const Chunk& chunk = set_.chunk(c);
      const ChunkState& state = optimizer_.chunk_state(c);
      if (!updated(c)) continue;
      if (has_moments) {
        gathered[state.exp_avg.data()] =
            collectives_.GatherHost(state.exp_avg.data(), moment_dtype, chunk);
        gathered[state.exp_avg_sq.data()] =
            collectives_.GatherHost(state.exp_avg_sq.data(), moment_dtype, chunk);
      }
      if (master) {
        gathered[state.master.data()] =
            collectives_.GatherHost(state.master.data(), torch::kFloat32, chunk);
      }
    }
  }
  std::vector<NamedParam> out;
  int64_t step = 0;
  for (int i = 0; i < set_.num_params(); ++i) {
    const Param& p = set_.param(i);
    const ParamState& s = optimizer_.state(i);
    const Chunk& chunk = set_.chunk(p.chunk);
    const ChunkState& state = optimizer_.chunk_state(p.chunk);
    if (s.step == 0) continue;  // like torch's AdamW: no state before the first update
    step = std::max(step, s.step);
    auto host = [&](const HostBuffer& buffer, torch::ScalarType dtype) {
      if (set_.sharded()) {
        return gathered[buffer.data()].narrow(0, p.offset_elems, p.numel).view(p.shape).clone();
      }
      return ChunkSet::HostView(buffer.data(), p.offset_elems, p.shape, p.numel, dtype).clone();
    };
    auto device = [&](const torch::Tensor& t, const torch::Tensor& flat) {
      if (chunk.state_sharded) {
        return gathered[flat.data_ptr()].narrow(0, p.offset_elems, p.numel).view(p.shape).clone();
      }
      return t.to(torch::kCPU, false, /*copy=*/true);
    };
    if (has_moments) {
      out.push_back({p.name + ".exp_avg", chunk.persistent
                                              ? device(s.exp_avg, state.device_exp_avg)
                                              : host(state.exp_avg, moment_dtype)});
      out.push_back({p.name + ".exp_avg_sq", chunk.persistent
                                                 ? device(s.exp_avg_sq, state.device_exp_avg_sq)
                                                 : host(state.exp_avg_sq, moment_dtype)});
    }
    if (master) {
      out.push_back({p.name + ".master", chunk.persistent ? device(s.master, state.device_master)
                                                          : host(state.master, torch::kFloat32)});
    }
  }
  if (!out.empty()) out.push_back({"step", torch::tensor(step, torch::kInt64)});
  return out;
}

// [8-bit optimizer state] in checkpoints: per parameter "<name>.exp_avg.q8" and
// "<name>.exp_avg_sq.q8" (uint8 codes, the parameter's shape) and "<name>.exp_avg.absmax",
// "<name>.exp_avg_sq.absmax" (fp32, one per 256-element block of the parameter): bitsandbytes'
// own state1/state2/absmax1/absmax2, independent of the chunk layout and world size.
void ChunkStateIO::OptimizerState8bit(std::vector<NamedParam>& out) {
  const int64_t g = optimizer_.slot_elems();
  const int64_t slots_per_shard_block = kQuantBlockElems / g;
  struct Gathered {
    torch::Tensor codes[2];
    torch::Tensor slots[2];  // every rank's slots, rank after rank
    int64_t slots_per_rank = 0;
  };
  std::map<int, Gathered> gathered;
  if (set_.sharded()) {
    for (int c = set_.n_persist(); c < set_.num_chunks(); ++c) {
      const Chunk& chunk = set_.chunk(c);
      const ChunkState& state = optimizer_.chunk_state(c);
      bool any = false;
      for (int i : chunk.params) any = any || optimizer_.state(i).step > 0;
      if (!any) continue;
      Gathered& all = gathered[c];
      all.slots_per_rank = QuantAbsmaxSlots(chunk.shard_elems, set_.elem_size());
      all.codes[0] = collectives_.GatherHost(state.exp_avg.data(), torch::kUInt8, chunk);
      all.codes[1] = collectives_.GatherHost(state.exp_avg_sq.data(), torch::kUInt8, chunk);
      all.slots[0] = collectives_.GatherHost(state.exp_avg_absmax.data(), torch::kFloat32, chunk,
                                             all.slots_per_rank);
      all.slots[1] = collectives_.GatherHost(state.exp_avg_sq_absmax.data(), torch::kFloat32,
                                             chunk, all.slots_per_rank);
    }
  }
  const float* maps[2] = {kSignedDynamicMap, kUnsignedDynamicMap};
  const char* names[2] = {".exp_avg", ".exp_avg_sq"};
  int64_t step = 0;
  for (int i = 0; i < set_.num_params(); ++i) {
    const Param& p = set_.param(i);
    const ParamState& s = optimizer_.state(i);
    if (s.step == 0) continue;
    step = std::max(step, s.step);
    const Chunk& chunk = set_.chunk(p.chunk);
    const ChunkState& state = optimizer_.chunk_state(p.chunk);
    const int64_t blocks = QuantBlockCount(p.numel);
    for (int k = 0; k < 2; ++k) {
      torch::Tensor codes, absmax;
      if (chunk.persistent) {
        codes = (k == 0 ? s.exp_avg : s.exp_avg_sq).to(torch::kCPU, false, /*copy=*/true);
        absmax = (k == 0 ? s.exp_avg_absmax : s.exp_avg_sq_absmax)
                     .to(torch::kCPU, false, /*copy=*/true)
                     .contiguous();
      } else if (!set_.sharded()) {
        const HostBuffer& c = k == 0 ? state.exp_avg : state.exp_avg_sq;
        const HostBuffer& a = k == 0 ? state.exp_avg_absmax : state.exp_avg_sq_absmax;
        codes = ChunkSet::HostView(c.data(), p.offset_elems, p.shape, p.numel, torch::kUInt8)
                    .clone();
        absmax = torch::from_blob(static_cast<float*>(a.data()) + p.offset_elems / g, {blocks},
                                  {slots_per_shard_block}, torch::kFloat32)
                     .clone();
      } else {
        // Each block from its owner's slot; a block cut by shard boundaries has one absmax per
        // piece: the largest one becomes the block's, and the other pieces' codes are
        // requantized to it (the only inexact step, on those blocks only).
        const Gathered& all = gathered[p.chunk];
        codes = all.codes[k].narrow(0, p.offset_elems, p.numel).clone();
        absmax = torch::empty({blocks}, torch::kFloat32);
        const float* slots = all.slots[k].data_ptr<float>();
        uint8_t* code = codes.data_ptr<uint8_t>();
        for (int64_t b = 0; b < blocks; ++b) {
          const int64_t begin = p.offset_elems + b * kQuantBlockElems;  // chunk elements
          const int64_t end = std::min(begin + kQuantBlockElems, p.offset_elems + p.numel);
          std::vector<std::pair<int64_t, float>> pieces;  // (start, absmax)
          for (int64_t at = begin; at < end;) {
            const int64_t rank = at / chunk.shard_elems;
            const int64_t local = at - rank * chunk.shard_elems;
            pieces.emplace_back(at, slots[rank * all.slots_per_rank + (local + g - 1) / g]);
            at = (rank + 1) * chunk.shard_elems;
          }
          float block_max = 0;
          for (const auto& [at, a] : pieces) block_max = std::max(block_max, a);
          for (size_t j = 0; j < pieces.size() && pieces.size() > 1; ++j) {
            const auto [at, a] = pieces[j];
            if (a == block_max) continue;
            const int64_t piece_end = j + 1 < pieces.size() ? pieces[j + 1].first : end;
            for (int64_t e = at; e < piece_end; ++e) {
              uint8_t& c = code[e - p.offset_elems];
              const float value = maps[k][c] * a;
              c = NearestCode8bit(maps[k], block_max > 0 ? value / block_max : 0.0f);
            }
          }
          absmax.data_ptr<float>()[b] = block_max;
        }
      }
      out.push_back({p.name + names[k] + ".q8", codes.view(p.shape)});
      out.push_back({p.name + names[k] + ".absmax", absmax});
    }
  }
  if (!out.empty()) out.push_back({"step", torch::tensor(step, torch::kInt64)});
}

absl::Status ChunkStateIO::LoadState8bit(const std::map<std::string, torch::Tensor>& by_key,
                                         int i, bool fresh) {
  const Param& p = set_.param(i);
  ParamState& s = optimizer_.state(i);
  const int64_t g = optimizer_.slot_elems();
  const int64_t blocks = QuantBlockCount(p.numel);
  const char* names[2] = {".exp_avg", ".exp_avg_sq"};
  const Chunk& chunk = set_.chunk(p.chunk);
  ChunkState& state = optimizer_.chunk_state(p.chunk);
  for (int k = 0; k < 2; ++k) {
    torch::Tensor codes = torch::zeros(p.shape, torch::kUInt8);
    torch::Tensor absmax = torch::zeros({blocks}, torch::kFloat32);
    if (!fresh) {
      const std::string q8 = p.name + names[k] + ".q8";
      const std::string am = p.name + names[k] + ".absmax";
      auto c = by_key.find(q8);
      auto a = by_key.find(am);
      if (c == by_key.end() || a == by_key.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat("state: missing ", c == by_key.end() ? q8 : am));
      }
      if (c->second.scalar_type() != torch::kUInt8 || c->second.sizes().vec() != p.shape) {
        return absl::InvalidArgumentError(
            absl::StrCat("state: ", q8, " must be uint8 codes of the parameter's shape"));
      }
      if (a->second.numel() != blocks || !c10::isFloatingType(a->second.scalar_type())) {
        return absl::InvalidArgumentError(absl::StrCat("state: ", am, " must hold ", blocks,
                                                       " fp32 values (one per 256 elements)"));
      }
      codes = c->second.detach().to(torch::kCPU);
      absmax = a->second.detach().to(torch::kCPU, torch::kFloat32).contiguous();
    }
    if (chunk.persistent) {
      (k == 0 ? s.exp_avg : s.exp_avg_sq).copy_(codes);
      (k == 0 ? s.exp_avg_absmax : s.exp_avg_sq_absmax).copy_(absmax);
      continue;
    }
    const OwnedRange r = set_.Owned(p, chunk);
    if (r.len == 0) continue;
    ChunkSet::HostFlat((k == 0 ? state.exp_avg : state.exp_avg_sq).data(), r.at, r.len,
                       torch::kUInt8)
        .copy_(codes.reshape({-1}).narrow(0, r.from, r.len));
    // Every block piece this shard holds takes its block's absmax (a cut block's pieces share
    // it, which reads back the same values).
    float* slots = (k == 0 ? state.exp_avg_absmax : state.exp_avg_sq_absmax).as<float>();
    const float* values = absmax.data_ptr<float>();
    for (int64_t from = r.from; from < r.from + r.len;) {
      const int64_t b = from / kQuantBlockElems;
      const int64_t local = r.at + (from - r.from);
      slots[(local + g - 1) / g] = values[b];
      from = (b + 1) * kQuantBlockElems;
    }
  }
  return absl::OkStatus();
}

absl::Status ChunkStateIO::LoadParamsAndState(const std::vector<NamedParam>& values,
                                              const std::vector<NamedParam>& state) {
  if (set_.stateless() && !state.empty()) {
    return absl::FailedPreconditionError(
        "state: this chunk manager was created frozen or profile_only (no optimizer state)");
  }
  torch::NoGradGuard no_grad;
  optimizer_.WaitAll();
  const bool has_moments = optimizer_.has_moments();
  std::vector<bool> seen(set_.num_params(), false);
  try {
    for (const NamedParam& v : values) {
      const int i = set_.ParamIndex(v.name);
      if (i < 0) {
        return absl::InvalidArgumentError(absl::StrCat("params: unknown parameter ", v.name));
      }
      const Param& p = set_.param(i);
      if (!v.param.defined() || v.param.sizes().vec() != p.shape) {
        return absl::InvalidArgumentError(
            absl::StrCat("params: ", v.name, " has the wrong shape for this model"));
      }
      seen[i] = true;
      if (const OwnedRange r = set_.Stored(p); r.len > 0) {
        torch::Tensor flat = v.param.detach().to(torch::kCPU).contiguous().reshape({-1});
        // [Byte chunks]: ranges count bytes.
        if (p.dtype != set_.dtype()) flat = flat.view(set_.dtype());
        InstallParam(i, flat.narrow(0, r.from, r.len));
      }
    }
    for (int i = 0; i < set_.num_params(); ++i) {
      if (!seen[i]) {
        return absl::InvalidArgumentError(
            absl::StrCat("params: missing parameter ", set_.param(i).name));
      }
    }
    if (!state.empty()) {
      std::map<std::string, torch::Tensor> by_key;
      for (const NamedParam& s : state) by_key[s.name] = s.param;
      auto find = [&](const std::string& key, const Param& p,
                      bool required) -> absl::StatusOr<torch::Tensor> {
        auto it = by_key.find(key);
        if (it == by_key.end()) {
          if (!required) return torch::Tensor();
          return absl::InvalidArgumentError(absl::StrCat("state: missing ", key));
        }
        if (it->second.sizes().vec() != p.shape) {
          return absl::InvalidArgumentError(absl::StrCat("state: ", key, " has the wrong shape"));
        }
        return it->second.detach().to(torch::kCPU, torch::kFloat32);
      };
      auto step_it = by_key.find("step");
      if (step_it == by_key.end() || step_it->second.numel() != 1) {
        return absl::InvalidArgumentError("state: missing scalar \"step\"");
      }
      const int64_t step = step_it->second.item<int64_t>();
      for (int i = 0; i < set_.num_params(); ++i) {
        const Param& p = set_.param(i);
        if (optimizer_.quantized()) {
          const bool fresh = by_key.count(p.name + ".exp_avg.q8") == 0 &&
                             by_key.count(p.name + ".exp_avg_sq.q8") == 0;
          RETURN_IF_ERROR(LoadState8bit(by_key, i, fresh));
          optimizer_.state(i).step = fresh ? 0 : step;
          continue;
        }
        // A parameter without state has not been updated yet: fresh state, step 0 (sgd keeps a
        // state only as the fp32 master of a bf16 model).
        const bool fresh = has_moments ? by_key.count(p.name + ".exp_avg") == 0 &&
                                             by_key.count(p.name + ".exp_avg_sq") == 0
                                       : by_key.count(p.name + ".master") == 0;
        ASSIGN_OR_RETURN(torch::Tensor m, find(p.name + ".exp_avg", p, !fresh && has_moments));
        ASSIGN_OR_RETURN(torch::Tensor v, find(p.name + ".exp_avg_sq", p, !fresh && has_moments));
        ASSIGN_OR_RETURN(torch::Tensor saved_master, find(p.name + ".master", p, false));
        if (fresh) m = v = torch::Tensor();
        const OwnedRange r = set_.StateStored(p);
        auto stored = [&r](const torch::Tensor& t) {
          return t.defined() ? t.reshape({-1}).narrow(0, r.from, r.len) : t;
        };
        InstallState(i, stored(m), stored(v), stored(saved_master), fresh ? 0 : step);
      }
    }
  } catch (const c10::Error& e) {
    return TorchError(e, "loading parameters");
  }
  pager_.InvalidateBuffers();
  return absl::OkStatus();
}

void ChunkStateIO::InstallParam(int i, const torch::Tensor& given) {
  const Param& p = set_.param(i);
  // [Byte chunks]: a frozen manager's part of p in the arrays' units (bytes); a reader may give
  // it in p's own dtype.
  torch::Tensor flat = given;
  if (p.dtype != set_.dtype() && flat.scalar_type() != set_.dtype()) {
    flat = flat.contiguous().reshape({-1}).view(set_.dtype());
  }
  const ParamState& s = optimizer_.state(i);
  Chunk& chunk = set_.chunk(p.chunk);
  const bool master = optimizer_.master();
  if (chunk.params_sharded) {
    // [Sharded persistent parameters]: `flat` is this rank's part, Owned(); so is the master.
    const OwnedRange r = set_.Owned(p, chunk);
    chunk.param_shard.narrow(0, r.at, r.len).copy_(flat);
    if (master && s.master.defined()) s.master.copy_(flat);
    return;
  }
  if (chunk.persistent) {
    p.tensor.detach().copy_(p.dtype != set_.dtype() ? flat.view(p.dtype).view(p.shape)
                                                    : flat.view(p.shape));
    if (master && s.master.defined()) {
      // [Sharded persistent state]: the master holds this rank's part only.
      const OwnedRange r = set_.StateStored(p);
      s.master.copy_(flat.reshape({-1}).narrow(0, r.from, r.len).view_as(s.master));
    }
    return;
  }
  const OwnedRange r = set_.Owned(p, chunk);
  if (p.dtype != set_.dtype()) {
    ChunkSet::HostFlat(chunk.param_host.data(), r.at, r.len, set_.dtype()).copy_(flat);
    return;
  }
  ChunkSet::HostFlat(chunk.param_host.data(), r.at, r.len, set_.dtype()).copy_(flat);
  if (master && !set_.stateless()) {
    ChunkSet::HostFlat(optimizer_.chunk_state(p.chunk).master.data(), r.at, r.len,
                       torch::kFloat32)
        .copy_(flat);
  }
}

void ChunkStateIO::InstallState(int i, const torch::Tensor& m, const torch::Tensor& v,
                                const torch::Tensor& saved_master, int64_t step) {
  const Param& p = set_.param(i);
  ParamState& s = optimizer_.state(i);
  const Chunk& chunk = set_.chunk(p.chunk);
  ChunkState& state = optimizer_.chunk_state(p.chunk);
  const bool has_moments = optimizer_.has_moments();
  const bool master = optimizer_.master();
  const OwnedRange r = set_.StateStored(p);
  auto or_zeros = [&r](const torch::Tensor& t) {
    return t.defined() ? t : torch::zeros({r.len}, torch::kFloat32);
  };
  if (chunk.persistent && r.len > 0) {
    // Replicated: whole parameters; sharded state ([Sharded persistent state]): flat parts.
    if (has_moments) {
      s.exp_avg.copy_(or_zeros(m).view_as(s.exp_avg));
      s.exp_avg_sq.copy_(or_zeros(v).view_as(s.exp_avg_sq));
    }
    if (saved_master.defined() && master) s.master.copy_(saved_master.view_as(s.master));
  } else if (!chunk.persistent && r.len > 0) {
    const torch::ScalarType moment_dtype = optimizer_.moment_dtype();
    if (has_moments) {
      ChunkSet::HostFlat(state.exp_avg.data(), r.at, r.len, moment_dtype).copy_(or_zeros(m));
      ChunkSet::HostFlat(state.exp_avg_sq.data(), r.at, r.len, moment_dtype).copy_(or_zeros(v));
    }
    if (saved_master.defined() && master) {
      ChunkSet::HostFlat(state.master.data(), r.at, r.len, torch::kFloat32).copy_(saved_master);
    }
  }
  s.step = step;
}

// [Per-rank checkpoint pieces] A persistent parameter is replicated: rank r writes elements
// [n r / W, n (r + 1) / W) of it. An offloaded one: exactly this rank's shard of it. Loading reads
// whatever this rank stores (Stored()) from the pieces of any world size.
absl::StatusOr<std::vector<TensorPiece>> ChunkStateIO::LocalPieces() {
  if (optimizer_.quantized() || set_.stateless()) {
    return absl::UnimplementedError(
        "per-rank checkpoint pieces: not for adamw8bit state or a frozen/profile_only manager");
  }
  optimizer_.WaitAll();
  const int rank = set_.rank();
  const int world = set_.world();
  const bool has_moments = optimizer_.has_moments();
  const bool master = optimizer_.master();
  const torch::ScalarType moment_dtype = optimizer_.moment_dtype();
  std::vector<TensorPiece> out;
  int64_t step = 0;
  try {
    for (int i = 0; i < set_.num_params(); ++i) {
      const Param& p = set_.param(i);
      const ParamState& s = optimizer_.state(i);
      const Chunk& chunk = set_.chunk(p.chunk);
      const ChunkState& state = optimizer_.chunk_state(p.chunk);
      OwnedRange r = set_.Owned(p, chunk);
      if (chunk.params_replicated()) {
        r.from = p.numel * rank / world;
        r.len = p.numel * (rank + 1) / world - r.from;
      }
      // A sharded state's part does not follow the parameter's slice.
      if (r.len == 0 && !chunk.state_sharded) continue;
      // Views, not copies: the writer stages one piece at a time to host memory.
      auto add = [&](const std::string& name, const torch::Tensor& device_tensor, void* host,
                     torch::ScalarType host_dtype) {
        if (chunk.state_sharded && name != p.name) {
          // [Sharded persistent state]: the state's part of this rank's shard, a flat view.
          const OwnedRange owned = set_.Owned(p, chunk);
          if (owned.len > 0) out.push_back({name, owned.from, device_tensor.detach()});
          return;
        }
        torch::Tensor flat = chunk.params_sharded ? device_tensor.narrow(0, r.at, r.len)
                             : chunk.persistent
                                 ? device_tensor.detach().reshape({-1}).narrow(0, r.from, r.len)
                                 : ChunkSet::HostFlat(host, r.at, r.len, host_dtype);
        out.push_back({name, r.from, flat});
      };
      // [Sharded persistent parameters]: the piece is this rank's part of the shard.
      if (r.len > 0) {
        add(p.name, chunk.params_sharded ? chunk.param_shard : p.tensor, chunk.param_host.data(),
            set_.dtype());
      }
      if (s.step == 0) continue;  // no state before the first update (like torch's AdamW)
      step = std::max(step, s.step);
      if (has_moments) {
        add(p.name + ".exp_avg", s.exp_avg, state.exp_avg.data(), moment_dtype);
        add(p.name + ".exp_avg_sq", s.exp_avg_sq, state.exp_avg_sq.data(), moment_dtype);
      }
      if (master) add(p.name + ".master", s.master, state.master.data(), torch::kFloat32);
    }
  } catch (const c10::Error& e) {
    return TorchError(e, "checkpoint pieces");
  }
  if (step > 0 && rank == 0) out.push_back({"step", 0, torch::tensor({step}, torch::kInt64)});
  return out;
}

absl::Status ChunkStateIO::LoadRanges(const ChunkManager::RangeReader& read, bool with_state,
                                      int parallel_reads) {
  if (set_.stateless() && with_state) {
    return absl::FailedPreconditionError(
        "state: this chunk manager was created frozen or profile_only (no optimizer state)");
  }
  if (optimizer_.quantized() && with_state) {
    return absl::UnimplementedError("per-rank checkpoint pieces: not for adamw8bit state");
  }
  torch::NoGradGuard no_grad;
  optimizer_.WaitAll();
  const bool has_moments = optimizer_.has_moments();
  const bool master = optimizer_.master();
  // The tensor's part this rank stores; NOT_FOUND when the tensor is absent (or, `optional`, an
  // undefined tensor); any other failure is returned as is.
  auto part = [&](const std::string& name, const OwnedRange& r,
                  bool optional = false) -> absl::StatusOr<torch::Tensor> {
    absl::StatusOr<torch::Tensor> t = read(name, r.from, r.len);
    if (optional && absl::IsNotFound(t.status())) return torch::Tensor();
    RETURN_IF_ERROR(t.status());
    if (t->numel() != r.len) {
      return absl::DataLossError(absl::StrCat(name, ": read ", t->numel(), " elements of [", r.from,
                                              ", ", r.from + r.len, ")"));
    }
    return t->reshape({-1});
  };
  // A parameter's stored part. [Byte chunks]: the reader counts the parameter's own elements and
  // a shard boundary may cut one (an fp32 scale, a bf16 norm): the elements that hold the range's
  // bytes are read and the bytes kept.
  auto param_part = [&part, this](const Param& p,
                                  const OwnedRange& r) -> absl::StatusOr<torch::Tensor> {
    if (p.dtype == set_.dtype()) return part(p.name, r);
    const int64_t size = static_cast<int64_t>(c10::elementSize(p.dtype));
    const int64_t first = r.from / size, last = (r.from + r.len + size - 1) / size;
    ASSIGN_OR_RETURN(const torch::Tensor values, part(p.name, OwnedRange{first, 0, last - first}));
    return values.to(p.dtype).contiguous().view(set_.dtype()).narrow(0, r.from - first * size,
                                                                    r.len);
  };
  try {
    int64_t step = 0;
    if (with_state) {
      absl::StatusOr<torch::Tensor> s = read("step", 0, 1);
      if (s.ok()) {
        step = s->item<int64_t>();
      } else if (!absl::IsNotFound(s.status())) {
        return s.status();
      }
    }
    // Parameter values are read up to `parallel_reads` at a time on worker threads and installed
    // in order on this thread. At most kReadAheadBytes of whole parameters in fp32 (a bound on
    // what reading a part materialises: a synthetic draw makes only the segments around it)
    // in flight beyond the first: the planner's host reserve counts on it ([Host reserve]).
    constexpr int64_t kReadAheadBytes = int64_t{1} << 30;
    struct Ahead {
      std::future<absl::StatusOr<torch::Tensor>> values;
      int64_t bytes;
    };
    std::deque<Ahead> ahead;
    absl::Cleanup no_worker_outlives_this_call = [&ahead] {
      for (Ahead& a : ahead) a.values.wait();
    };
    int64_t in_flight = 0;
    int next_read = 0;
    // [Reader threads] A new thread starts with OpenMP's default team size, which torchrun sets
    // to 1 (OMP_NUM_THREADS): the readers' torch work (drawing a synthetic value by segments,
    // converting it, quantizing it on the CPU) would run on one core each, and with the
    // read-ahead budget holding one or two large weights at a time, a synthetic 32 B base took
    // minutes to load. Each reader gets this thread's team size (the rank's --cpu-threads).
    const int torch_threads = at::get_num_threads();
    auto read_ahead = [&] {
      while (next_read < set_.num_params() &&
             static_cast<int>(ahead.size()) < std::max(parallel_reads, 1)) {
        const int64_t bytes = set_.param(next_read).numel * 4;
        if (!ahead.empty() && in_flight + bytes > kReadAheadBytes) break;
        in_flight += bytes;
        const Param& q = set_.param(next_read++);
        const OwnedRange rq = set_.Stored(q);
        ahead.push_back({std::async(parallel_reads > 1 ? std::launch::async : std::launch::deferred,
                                    [&param_part, &q, rq,
                                     torch_threads]() -> absl::StatusOr<torch::Tensor> {
                                      if (rq.len == 0) return torch::Tensor();
                                      if (at::get_num_threads() != torch_threads) {
                                        at::set_num_threads(torch_threads);
                                      }
                                      return param_part(q, rq);
                                    }),
                         bytes});
      }
    };
    for (int i = 0; i < set_.num_params(); ++i) {
      const Param& p = set_.param(i);
      read_ahead();
      absl::StatusOr<torch::Tensor> read_values = ahead.front().values.get();
      in_flight -= ahead.front().bytes;
      ahead.pop_front();
      const OwnedRange r = set_.Stored(p);
      if (r.len == 0) continue;
      RETURN_IF_ERROR(read_values.status());
      InstallParam(i, *read_values);
      if (!with_state) continue;
      // As LoadParamsAndState: a parameter without moments (sgd: without a master) is fresh.
      // [Sharded persistent state]: the state's part may be smaller than the parameter's, even
      // empty; whether the state exists is then asked with one element (every rank must agree on
      // the step count).
      const OwnedRange rs = set_.StateStored(p);
      const OwnedRange ask = rs.len > 0 ? rs : OwnedRange{0, 0, std::min<int64_t>(p.numel, 1)};
      torch::Tensor m, v, saved_master;
      if (has_moments) {
        ASSIGN_OR_RETURN(m, part(p.name + ".exp_avg", ask, /*optional=*/true));
        if (m.defined()) {
          ASSIGN_OR_RETURN(v, part(p.name + ".exp_avg_sq", ask));
        }
      }
      if (master) {
        ASSIGN_OR_RETURN(saved_master, part(p.name + ".master", ask, /*optional=*/true));
      }
      const bool fresh = has_moments ? !m.defined() : !saved_master.defined();
      if (rs.len == 0) m = v = saved_master = torch::Tensor();
      InstallState(i, m, v, saved_master, fresh ? 0 : step);
    }
  } catch (const c10::Error& e) {
    return TorchError(e, "loading checkpoint pieces");
  }
  pager_.InvalidateBuffers();
  return absl::OkStatus();
}

}  // namespace memplan::chunks
