"""rmsnorm whose template's default hides a tail bug (cols % 4 == 2) that no seed case has."""

import dataclasses

from swarmfactory.problems.suites.cpu.rmsnorm import PROBLEM as RMSNORM

TEMPLATE = """#include <stdint.h>
#include <math.h>
{{ signature }} {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float ss = 0.0f;
        for (int64_t c = 0; c < cols; c++) ss += xr[c] * xr[c];
        const float inv = 1.0f / sqrtf(ss / (float)cols + eps);
{% if tail == "buggy" %}
        int64_t end = (cols % 4 == 2) ? cols - 2 : cols;
{% else %}
        int64_t end = cols;
{% endif %}
        for (int64_t c = 0; c < end; c++) y[r * cols + c] = xr[c] * inv * w[c]{{ " * 1.0f" if unroll == 2 else "" }};
    }
}
"""

PROBLEM = dataclasses.replace(
    RMSNORM, template=TEMPLATE, knobs={"tail": ["buggy", "correct"], "unroll": [1, 2]},
    knob_defaults={"tail": "buggy", "unroll": 1},
    knob_aspects={"tail": "algorithm", "unroll": "unrolling"},
)
