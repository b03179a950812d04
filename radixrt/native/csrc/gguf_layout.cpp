// The packed weight's header (layers/gguf_blocks.py writes it), read by every GGUF kernel, and
// the op that appends the int8 kernel's tiles to it (gguf_tiles.cpp).
//
// A packed weight is one uint8 tensor: an int64 header [magic, K, N, parts, then per part:
// type, rows, byte offset, bytes per row], then each part's rows. A tiled weight ("RXQT")
// has, after that table, one more int64 per part: the byte offset of the part's tiles, or 0
// where it has none. Its rows stay as they were, unless the weight is only ever multiplied
// with int8 activations: then a part with tiles keeps no rows (byte offset -1) and the weight
// takes about its file's bytes, once. The other kernels (dequantize, the float and wide
// matmuls, embedding rows) read rows, and refuse a weight without them (require_rows);
// layers/gguf_blocks.py's unpack reads only the part table.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cstdint>
#include <cstring>

#include "gguf_layout.h"
#include "gguf_types.h"

namespace radixrt::gguf {

namespace {

constexpr int64_t kMagic = 0x57515852;       // "RXQW": rows only
constexpr int64_t kMagicTiled = 0x54515852;  // "RXQT": rows, then tiles
constexpr int64_t kHeaderFields = 4, kPartFields = 4, kAlign = 64;
constexpr int64_t kNoRows = -1;  // a tiled part's row offset when only its tiles are kept

int64_t aligned(int64_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

void write_field(uint8_t* base, int64_t i, int64_t v) { std::memcpy(base + 8 * i, &v, 8); }

}  // namespace

int64_t block_weights(int64_t type) {
  int64_t w = 0;
  dispatch(type, [&]<int64_t T>() { w = Traits<T>::weights; });
  return w;
}

int64_t block_bytes(int64_t type) {
  int64_t b = 0;
  dispatch(type, [&]<int64_t T>() { b = Traits<T>::bytes; });
  return b;
}

Layout read_layout(const at::Tensor& packed) {
  TORCH_CHECK(packed.dtype() == at::kByte && packed.dim() == 1 && packed.is_contiguous() &&
                  packed.numel() >= kHeaderFields * 8,
              "gguf_linear: the weight must be a packed uint8 tensor (GGUFWeight.packed)");
  const uint8_t* base = packed.data_ptr<uint8_t>();
  auto field = [&](int64_t i) {
    int64_t v;
    std::memcpy(&v, base + 8 * i, 8);
    return v;
  };
  const bool tiled = field(0) == kMagicTiled;
  TORCH_CHECK(field(0) == kMagic || tiled, "gguf_linear: not a packed weight (bad magic)");
  Layout l;
  l.K = field(1);
  l.N = field(2);
  const int64_t parts = field(3);
  const int64_t table = kHeaderFields + parts * kPartFields;
  TORCH_CHECK(parts >= 1 && (table + (tiled ? parts : 0)) * 8 <= packed.numel(),
              "gguf_linear: bad part count ", parts);
  int64_t row0 = 0;
  for (int64_t p = 0; p < parts; ++p) {
    int64_t v[kPartFields];
    for (int64_t i = 0; i < kPartFields; ++i) v[i] = field(kHeaderFields + p * kPartFields + i);
    const int64_t type = v[0], rows = v[1], offset = v[2], row_bytes = v[3];
    const int64_t bw = block_weights(type);
    TORCH_CHECK(bw > 0, "gguf_linear: unsupported GGUF type ", type);
    TORCH_CHECK(l.K % bw == 0 && row_bytes == l.K / bw * block_bytes(type),
                "gguf_linear: part ", p, " has ", row_bytes, " bytes per row for ", l.K,
                " inputs of type ", type);
    const int64_t tiles = tiled ? field(table + p) : 0;
    TORCH_CHECK((offset == kNoRows && tiles != 0) ||
                    (offset >= 0 && offset + rows * row_bytes <= packed.numel()),
                "gguf_linear: part ", p, " runs past the tensor");
    Part part{type, rows, row0, offset == kNoRows ? nullptr : base + offset, row_bytes};
    if (tiles != 0) {
      TORCH_CHECK(tiles_supported(type) && tiles > 0 &&
                      tiles + tiles_bytes(type, rows, l.K) <= packed.numel(),
                  "gguf_linear: part ", p, "'s tiles run past the tensor");
      part.tiles = base + tiles;
    }
    l.parts.push_back(part);
    row0 += rows;
  }
  TORCH_CHECK(row0 == l.N, "gguf_linear: parts hold ", row0, " rows, expected ", l.N);
  return l;
}

void require_rows(const Layout& l, const char* op) {
  for (const Part& p : l.parts)
    TORCH_CHECK(p.data != nullptr, op, ": this weight keeps only its int8 tiles (it multiplies "
                "int8 activations at every step), not the rows this needs");
}

}  // namespace radixrt::gguf

namespace radixrt {

// The packed weight with tiles for each part the int8 kernel reads from tiles (tiles_supported:
// the 32-weight types but IQ4_NL, and Q4_K, Q5_K, Q6_K, where the CPU runs the int8 kernel);
// the weight itself where there is none or it has them already. Without keep_rows the parts
// with tiles keep none of their rows.
at::Tensor gguf_tile(const at::Tensor& packed, bool keep_rows) {
  using namespace radixrt::gguf;
  const Layout l = read_layout(packed);
  const int64_t parts = static_cast<int64_t>(l.parts.size());
  bool any = false, tiled = false;
  for (const Part& p : l.parts) {
    any = any || tiles_supported(p.type);
    tiled = tiled || p.tiles != nullptr;
  }
  if (!any || tiled) return packed;
  const int64_t table = kHeaderFields + parts * (kPartFields + 1);
  int64_t offset = aligned(8 * table);
  std::vector<int64_t> rows_at(parts), tiles_at(parts, 0);
  for (int64_t p = 0; p < parts; ++p) {
    if (!keep_rows && tiles_supported(l.parts[p].type)) {
      rows_at[p] = kNoRows;
      continue;
    }
    rows_at[p] = offset;
    offset += aligned(l.parts[p].rows * l.parts[p].row_bytes);
  }
  for (int64_t p = 0; p < parts; ++p) {
    if (!tiles_supported(l.parts[p].type)) continue;
    tiles_at[p] = offset;
    offset += aligned(tiles_bytes(l.parts[p].type, l.parts[p].rows, l.K));
  }
  at::Tensor out = at::zeros({offset}, packed.options());
  uint8_t* base = out.data_ptr<uint8_t>();
  for (int64_t i : {int64_t{1}, int64_t{2}, int64_t{3}}) {
    int64_t v;
    std::memcpy(&v, packed.data_ptr<uint8_t>() + 8 * i, 8);
    write_field(base, i, v);
  }
  write_field(base, 0, kMagicTiled);
  for (int64_t p = 0; p < parts; ++p) {
    const Part& part = l.parts[p];
    const int64_t f = kHeaderFields + p * kPartFields;
    write_field(base, f, part.type);
    write_field(base, f + 1, part.rows);
    write_field(base, f + 2, rows_at[p]);
    write_field(base, f + 3, part.row_bytes);
    write_field(base, kHeaderFields + parts * kPartFields + p, tiles_at[p]);
    if (rows_at[p] != kNoRows) std::memcpy(base + rows_at[p], part.data, part.rows * part.row_bytes);
    if (tiles_at[p] != 0) build_tiles(part, l.K, base + tiles_at[p]);
  }
  return out;
}

}  // namespace radixrt

TORCH_LIBRARY_FRAGMENT(radixrt, m) {
  m.def("gguf_tile(Tensor packed, bool keep_rows=True) -> Tensor");
}

TORCH_LIBRARY_IMPL(radixrt, CPU, m) { m.impl("gguf_tile", radixrt::gguf_tile); }
