"""rmsnorm whose template's default hides a bug (rows beyond 1024 are never written) that no seed
case has: the largest seed shape has 512 rows."""

import dataclasses

from swarmfactory.problems.suites.cpu.rmsnorm import PROBLEM as RMSNORM

TEMPLATE = """#include <stdint.h>
#include <math.h>
{{ signature }} {
{% if tail == "buggy" %}
    const int64_t last = rows > 1024 ? 1024 : rows;  /* a fixed table of 1024 row pointers */
{% else %}
    const int64_t last = rows;
{% endif %}
    for (int64_t r = 0; r < last; r++) {
        const float *xr = x + r * cols;
        double ss = 0.0;  /* exact enough for any row length: the planted bug is elsewhere */
        for (int64_t c = 0; c < cols; c++) ss += (double)xr[c] * xr[c];
        const float inv = 1.0f / sqrtf(ss / (float)cols + eps);
        for (int64_t c = 0; c < cols; c++) y[r * cols + c] = xr[c] * inv * w[c]{{ " * 1.0f" if unroll == 2 else "" }};
    }
}
"""

PROBLEM = dataclasses.replace(
    RMSNORM, template=TEMPLATE, knobs={"tail": ["buggy", "correct"], "unroll": [1, 2]},
    knob_defaults={"tail": "buggy", "unroll": 1},
    knob_aspects={"tail": "algorithm", "unroll": "unrolling"},
)
