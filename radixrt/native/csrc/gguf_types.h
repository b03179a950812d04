// llama.cpp's GGUF block types, each decoded 32 weights (a "sub-block") at a time into one
// common form: 32 small integer codes q and, per 16 weights, a scale a and an offset b, with
//   w[j] = a[j / 16] * q[j] + b[j / 16].
// Every type fits it (legacy blocks of 32 are one sub-block; K-quant super-blocks of 256 are
// eight), and computing w as fma(a, q, b) gives gguf-py's dequantize bit for bit: in every type
// a * q is exact in float32 (at most 24 significant bits), so the one rounding left is that of
// gguf-py's final add or multiply. The kernels (gguf_linear.cpp) widen q to floats in vector
// registers and never write the weights out.
//
// Layouts (ggml's structs; fp16 values little-endian):
//   Q4_0   [d][16 B: element j low nibble of byte j, j + 16 high]        w = d (q - 8)
//   Q4_1   [d][m][16 B as Q4_0]                                           w = d q + m
//   Q5_0   [d][4 B qh: bit j = element j's 5th bit][16 B as Q4_0]        w = d (q - 16)
//   Q5_1   [d][m][qh][16 B]                                               w = d q + m
//   Q8_0   [d][32 x int8]                                                 w = d q
//   IQ4_NL [d][16 B as Q4_0]                                              w = d kvalues[q]
//   Q2_K   [16 B scales: low nibble scale, high min][64 B codes][d][dmin]: 2 bits per weight
//   Q3_K   [32 B hmask][64 B low 2 bits][12 B 6-bit scales][d]            w = d (s - 32) q
//   Q4_K   [d][dmin][12 B 6-bit scales and mins][128 B nibbles]          w = d s q - dmin m
//   Q5_K   [d][dmin][12 B][32 B 5th bits][128 B nibbles]
//   Q6_K   [128 B low nibbles][64 B high 2 bits][16 x int8 scales][d]    w = d s (q - 32)
//   IQ4_XS [d][2 B high scale bits][4 B low scale nibbles][128 B]        w = d (s - 32) kv[q]
#pragma once

#include <c10/util/Half.h>

#include <cstdint>
#include <cstring>
#include <vector>
#ifdef __F16C__
#include <immintrin.h>
#endif

namespace radixrt::gguf {

// ggml's type ids (GGMLQuantizationType), as the GGUF file stores them.
enum Type : int64_t {
  Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q2_K = 10, Q3_K = 11, Q4_K = 12,
  Q5_K = 13, Q6_K = 14, IQ4_NL = 20, IQ4_XS = 23,
};

struct Sub {
  alignas(64) int8_t q[32];
  float a[2], b[2];  // per 16 weights
};

// How far ahead of the block being read the narrow kernels prefetch: with it a batch-1 step's
// matmuls went from 15.6 to 8.7 ms on an AVX-512 Xeon, whose hardware prefetchers left these
// short row-by-row reads at ~3 GB/s a core.
constexpr int64_t kPrefetchBytes = 4096;

// Prefetch every cache line of the `bytes` bytes kPrefetchBytes past p. A K-quant super-block
// spans 3-4 lines: one prefetch a block left the rest to demand misses while a batch-1 step
// streams its weights (the small model's matmuls took 6.3 ms, not 5.0).
inline void prefetch_ahead(const uint8_t* p, int64_t bytes) {
  for (int64_t at = 0; at < bytes; at += 64) __builtin_prefetch(p + kPrefetchBytes + at, 0, 3);
}

inline float fp16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
#ifdef __F16C__
  return _cvtsh_ss(h);
#else
  return c10::detail::fp16_ieee_to_fp32_value(h);
#endif
}

constexpr int8_t kIQ4Values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                   1,    13,   25,  38,  53,  69,  89,  113};

template <int64_t T> struct Traits;
template <> struct Traits<Q4_0> { static constexpr int64_t weights = 32, bytes = 18; };
template <> struct Traits<Q4_1> { static constexpr int64_t weights = 32, bytes = 20; };
template <> struct Traits<Q5_0> { static constexpr int64_t weights = 32, bytes = 22; };
template <> struct Traits<Q5_1> { static constexpr int64_t weights = 32, bytes = 24; };
template <> struct Traits<Q8_0> { static constexpr int64_t weights = 32, bytes = 34; };
template <> struct Traits<IQ4_NL> { static constexpr int64_t weights = 32, bytes = 18; };
template <> struct Traits<Q2_K> { static constexpr int64_t weights = 256, bytes = 84; };
template <> struct Traits<Q3_K> { static constexpr int64_t weights = 256, bytes = 110; };
template <> struct Traits<Q4_K> { static constexpr int64_t weights = 256, bytes = 144; };
template <> struct Traits<Q5_K> { static constexpr int64_t weights = 256, bytes = 176; };
template <> struct Traits<Q6_K> { static constexpr int64_t weights = 256, bytes = 210; };
template <> struct Traits<IQ4_XS> { static constexpr int64_t weights = 256, bytes = 136; };

inline void set_scale(Sub& o, float a, float b) {
  o.a[0] = o.a[1] = a;
  o.b[0] = o.b[1] = b;
}

// Nibbles of 16 bytes: elements 0..15 the low ones, 16..31 the high ones (+ bias).
inline void nibbles(const uint8_t* qs, int bias, int8_t* q) {
  for (int j = 0; j < 16; ++j) {
    q[j] = static_cast<int8_t>((qs[j] & 0xF) + bias);
    q[j + 16] = static_cast<int8_t>((qs[j] >> 4) + bias);
  }
}

// Q5's: the nibbles plus each element's 5th bit from a 32-bit mask.
inline void nibbles5(const uint8_t* qh_bytes, const uint8_t* qs, int bias, int8_t* q) {
  uint32_t qh;
  std::memcpy(&qh, qh_bytes, 4);
  for (int j = 0; j < 16; ++j) {
    q[j] = static_cast<int8_t>(((qs[j] & 0xF) | ((qh >> j & 1) << 4)) + bias);
    q[j + 16] = static_cast<int8_t>(((qs[j] >> 4) | ((qh >> (j + 16) & 1) << 4)) + bias);
  }
}

// Q4_K's and Q5_K's 6-bit scale and minimum of sub-block s from their 12 packed bytes.
inline void scale_min_k4(const uint8_t* s12, int s, int& sc, int& m) {
  if (s < 4) {
    sc = s12[s] & 63;
    m = s12[s + 4] & 63;
  } else {
    sc = (s12[s + 4] & 0xF) | ((s12[s - 4] >> 6) << 4);
    m = (s12[s + 4] >> 4) | ((s12[s] >> 6) << 4);
  }
}

template <int64_t T> void decode_sub(const uint8_t* blk, int s, Sub& o);

template <> inline void decode_sub<Q4_0>(const uint8_t* blk, int, Sub& o) {
  set_scale(o, fp16(blk), 0.0f);
  nibbles(blk + 2, -8, o.q);
}
template <> inline void decode_sub<Q4_1>(const uint8_t* blk, int, Sub& o) {
  set_scale(o, fp16(blk), fp16(blk + 2));
  nibbles(blk + 4, 0, o.q);
}
template <> inline void decode_sub<Q5_0>(const uint8_t* blk, int, Sub& o) {
  set_scale(o, fp16(blk), 0.0f);
  nibbles5(blk + 2, blk + 6, -16, o.q);
}
template <> inline void decode_sub<Q5_1>(const uint8_t* blk, int, Sub& o) {
  set_scale(o, fp16(blk), fp16(blk + 2));
  nibbles5(blk + 4, blk + 8, 0, o.q);
}
template <> inline void decode_sub<Q8_0>(const uint8_t* blk, int, Sub& o) {
  set_scale(o, fp16(blk), 0.0f);
  std::memcpy(o.q, blk + 2, 32);
}
template <> inline void decode_sub<IQ4_NL>(const uint8_t* blk, int, Sub& o) {
  set_scale(o, fp16(blk), 0.0f);
  for (int j = 0; j < 16; ++j) {
    o.q[j] = kIQ4Values[blk[2 + j] & 0xF];
    o.q[j + 16] = kIQ4Values[blk[2 + j] >> 4];
  }
}
// Q2_K: sub-block s takes bits 2 (s % 4) of code bytes 32 (s / 4) .. + 31; scales per 16.
template <> inline void decode_sub<Q2_K>(const uint8_t* blk, int s, Sub& o) {
  const float d = fp16(blk + 80), dmin = fp16(blk + 82);
  const uint8_t* qs = blk + 16 + 32 * (s / 4);
  const int shift = 2 * (s % 4);
  for (int j = 0; j < 32; ++j) o.q[j] = static_cast<int8_t>((qs[j] >> shift) & 3);
  for (int h = 0; h < 2; ++h) {
    const uint8_t sc = blk[2 * s + h];
    o.a[h] = d * static_cast<float>(sc & 0xF);
    o.b[h] = -(dmin * static_cast<float>(sc >> 4));
  }
}
// Q3_K: low 2 bits as Q2_K's, the 3rd bit from hmask bit s (set: no offset, clear: -4).
template <> inline void decode_sub<Q3_K>(const uint8_t* blk, int s, Sub& o) {
  const uint8_t* hmask = blk;
  const uint8_t* qs = blk + 32 + 32 * (s / 4);
  const uint8_t* sc = blk + 96;
  const float d = fp16(blk + 108);
  const int shift = 2 * (s % 4);
  for (int j = 0; j < 32; ++j) {
    const int low = (qs[j] >> shift) & 3;
    o.q[j] = static_cast<int8_t>(low - (((hmask[j] >> s) & 1) ? 0 : 4));
  }
  for (int h = 0; h < 2; ++h) {
    const int i = 2 * s + h;
    const int lo = i < 8 ? sc[i] & 0xF : sc[i - 8] >> 4;
    const int hi = (sc[8 + i % 4] >> (2 * (i / 4))) & 3;
    o.a[h] = d * static_cast<float>((lo | hi << 4) - 32);
    o.b[h] = 0.0f;
  }
}
// Q4_K: sub-block s is the low (s even) or high nibbles of code bytes 32 (s / 2) .. + 31.
template <> inline void decode_sub<Q4_K>(const uint8_t* blk, int s, Sub& o) {
  int sc, m;
  scale_min_k4(blk + 4, s, sc, m);
  set_scale(o, fp16(blk) * static_cast<float>(sc), -(fp16(blk + 2) * static_cast<float>(m)));
  const uint8_t* qs = blk + 16 + 32 * (s / 2);
  const int shift = 4 * (s % 2);
  for (int j = 0; j < 32; ++j) o.q[j] = static_cast<int8_t>((qs[j] >> shift) & 0xF);
}
template <> inline void decode_sub<Q5_K>(const uint8_t* blk, int s, Sub& o) {
  int sc, m;
  scale_min_k4(blk + 4, s, sc, m);
  set_scale(o, fp16(blk) * static_cast<float>(sc), -(fp16(blk + 2) * static_cast<float>(m)));
  const uint8_t* qh = blk + 16;
  const uint8_t* qs = blk + 48 + 32 * (s / 2);
  const int shift = 4 * (s % 2);
  for (int j = 0; j < 32; ++j)
    o.q[j] = static_cast<int8_t>(((qs[j] >> shift) & 0xF) | (((qh[j] >> s) & 1) << 4));
}
// Q6_K: halves of 128; in half h, sub-block r = s % 4 takes nibble r / 2 of low bytes
// 64 h + 32 (r % 2) .. + 31 and bits 2 r of high bytes 32 h .. + 31.
template <> inline void decode_sub<Q6_K>(const uint8_t* blk, int s, Sub& o) {
  const int h = s / 4, r = s % 4;
  const uint8_t* ql = blk + 64 * h + 32 * (r % 2);
  const uint8_t* qh = blk + 128 + 32 * h;
  const auto* scales = reinterpret_cast<const int8_t*>(blk + 192);
  const float d = fp16(blk + 208);
  const int lshift = 4 * (r / 2), hshift = 2 * r;
  for (int j = 0; j < 32; ++j) {
    const int q = ((ql[j] >> lshift) & 0xF) | (((qh[j] >> hshift) & 3) << 4);
    o.q[j] = static_cast<int8_t>(q - 32);
  }
  for (int k = 0; k < 2; ++k) {
    o.a[k] = d * static_cast<float>(scales[2 * s + k]);
    o.b[k] = 0.0f;
  }
}
template <> inline void decode_sub<IQ4_XS>(const uint8_t* blk, int s, Sub& o) {
  uint16_t high;
  std::memcpy(&high, blk + 2, 2);
  const int lo = (blk[4 + s / 2] >> (4 * (s % 2))) & 0xF;
  const int hi = (high >> (2 * s)) & 3;
  set_scale(o, fp16(blk) * static_cast<float>((lo | hi << 4) - 32), 0.0f);
  const uint8_t* qs = blk + 8 + 16 * s;
  for (int j = 0; j < 16; ++j) {
    o.q[j] = kIQ4Values[qs[j] & 0xF];
    o.q[j + 16] = kIQ4Values[qs[j] >> 4];
  }
}

// A packed weight as the kernels read it (gguf_linear.cpp's read_layout): its parts, each one
// type's rows of the output, stacked.
struct Part {
  int64_t type, rows, row0;  // row0: its first output column
  const uint8_t* data;
  int64_t row_bytes;
  const uint8_t* tiles = nullptr;  // the int8 kernel's copy (gguf_tiles.cpp), if it has one
};

struct Layout {
  int64_t K = 0, N = 0;
  std::vector<Part> parts;
};

// f.template operator()<N>() for N = min(n, kMax), n >= 1: a runtime count (input rows, blocks
// left in a row) as the compile-time constant the kernels unroll by.
template <int kMax, typename F> auto up_to(int64_t n, F&& f) {
  if constexpr (kMax > 1)
    if (n < kMax) return up_to<kMax - 1>(n, f);
  return f.template operator()<kMax>();
}

// Calls f.template operator()<T>() for the runtime type id; false for an unsupported one.
template <typename F> bool dispatch(int64_t type, F&& f) {
  switch (type) {
    case Q4_0: f.template operator()<Q4_0>(); return true;
    case Q4_1: f.template operator()<Q4_1>(); return true;
    case Q5_0: f.template operator()<Q5_0>(); return true;
    case Q5_1: f.template operator()<Q5_1>(); return true;
    case Q8_0: f.template operator()<Q8_0>(); return true;
    case Q2_K: f.template operator()<Q2_K>(); return true;
    case Q3_K: f.template operator()<Q3_K>(); return true;
    case Q4_K: f.template operator()<Q4_K>(); return true;
    case Q5_K: f.template operator()<Q5_K>(); return true;
    case Q6_K: f.template operator()<Q6_K>(); return true;
    case IQ4_NL: f.template operator()<IQ4_NL>(); return true;
    case IQ4_XS: f.template operator()<IQ4_XS>(); return true;
    default: return false;
  }
}

}  // namespace radixrt::gguf
