"""rmsnorm whose template is wrong on rows wider than 4096 columns (a fixed 4096-float buffer),
with no model shapes in its seed cases and one drawn full-size shape (a 5120-wide hidden row):
only a drawn case can break it."""

import dataclasses

from swarmfactory.problems.suites.cpu.rmsnorm import PROBLEM as RMSNORM

TEMPLATE = """#include <stdint.h>
#include <math.h>
{{ signature }} {
    for (int64_t r = 0; r < rows; r++) {
        float row[4096];
        const int64_t n = cols < 4096 ? cols : 4096;    /* the bug: wider rows lose their tail */
        double ss = 0.0;
        for (int64_t c = 0; c < n; c++) { row[c] = x[r * cols + c]; ss += (double)row[c] * row[c]; }
        const float inv = (float)(1.0 / sqrt(ss / (double)cols + (double){{ eps_cast }}eps));
        for (int64_t c = 0; c < cols; c++) y[r * cols + c] = (c < n ? row[c] : 0.0f) * inv * w[c];
    }
}
"""

PROBLEM = dataclasses.replace(
    RMSNORM, template=TEMPLATE, knobs={"eps_cast": ["", "(float)"]}, knob_defaults={"eps_cast": ""},
    knob_aspects={"eps_cast": "algorithm"},
    edge_shapes=({"rows": 1, "cols": 7}, {"rows": 3, "cols": 17}), stress_shapes=(),
    model_shapes=(), model_draws=(("a 5120-wide hidden row", {"rows": 1, "cols": 5120}),),
)
