// How the CPU kernels split m activation rows into register tiles: near-equal tiles of at most
// max_rows (13 rows by 6: 5 + 4 + 4, not 6 + 6 + 1), so no tile is left with too few rows'
// independent chains to hide the instruction latency.
#pragma once

#include <cstdint>

namespace sy::kernels {

// Calls body(tile, first_row, row_count) for each tile in order.
template <typename Body>
void ForEachRowTile(int64_t m, int64_t max_rows, Body body) {
  const int64_t tiles = (m + max_rows - 1) / max_rows;
  int64_t row = 0;
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t count = (m - row) / (tiles - t);
    body(t, row, count);
    row += count;
  }
}

}  // namespace sy::kernels
