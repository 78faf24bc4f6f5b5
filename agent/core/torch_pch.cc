// Anchor translation unit for the shared Torch precompiled header.
#include "agent/core/torch_pch.h"
