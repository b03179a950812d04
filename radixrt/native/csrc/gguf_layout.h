// A packed weight's header as the kernels read it (gguf_layout.cpp), and the int8 kernel's
// tiles (gguf_tiles.cpp), which gguf_tile appends to it.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

#include "gguf_types.h"

namespace radixrt::gguf {

int64_t block_weights(int64_t type);  // weights per block of a type (0: unsupported)
int64_t block_bytes(int64_t type);
Layout read_layout(const at::Tensor& packed);
void require_rows(const Layout& l, const char* op);  // refuse a weight that kept tiles only

bool int8_supported();  // gguf_dot8.cpp: this build runs the int8 kernel
// Whether parts of `type` get tiles here, how many bytes they take, and writing them.
constexpr int64_t kTileColumns = 16;  // output columns a tile interleaves
bool tiles_supported(int64_t type);
int64_t tiles_bytes(int64_t type, int64_t rows, int64_t K);
void build_tiles(const Part& part, int64_t K, uint8_t* out);
// Row n (of the part) rebuilt in its blocks' bytes from the tiles alone, for the types
// untile_supported names (the 32-weight ones): a tied embedding's lookup without its rows.
bool untile_supported(int64_t type);
void untile_row(const Part& part, int64_t K, int64_t n, uint8_t* row);
// The same for the K-quants' tiles (gguf_ktiles.cpp; Q4_K, Q5_K, Q6_K), which build_tiles and
// tiles_bytes call.
bool is_ktile_type(int64_t type);
int64_t ktile_block_bytes(int64_t type);  // one super-block of one tile
void build_ktiles(const Part& part, int64_t K, uint8_t* out);

}  // namespace radixrt::gguf
