/* expect: wrong — rows are reduced in chunks of 65536 (one chunk's exponentials fit a 256 KB buffer); where a row is longer than one chunk the chunk count is cols / 65536, rounded down: the tail of a 128256-, 151936- or 262208-wide vocabulary is left out of the max and the sum, while its outputs are still written. Right for rows of up to 65536 and for whole multiples of it (65536, 196608), all the seed cases had before the vocabularies of the model shapes */
#include <stdint.h>
#include <math.h>

#define CHUNK 65536

void softmax(const float *x, float *y, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        const int64_t reduced = cols <= CHUNK ? cols : (cols / CHUNK) * CHUNK;  /* not rounded up */
        float m = -INFINITY;
        for (int64_t c = 0; c < reduced; c++) m = xr[c] > m ? xr[c] : m;
        double s = 0.0;
        for (int64_t c = 0; c < reduced; c++) s += (double)expf(xr[c] - m);
        const double inv = 1.0 / s;
        for (int64_t c = 0; c < cols; c++) yr[c] = (float)((double)expf(xr[c] - m) * inv);
    }
}
