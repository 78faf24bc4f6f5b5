// Precompiled header for every agent translation unit that uses LibTorch.
// Never include protobuf or gRPC headers next to this (see docs/architecture.md).
#pragma once

#include <torch/torch.h>
