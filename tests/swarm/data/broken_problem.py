"""A problem whose template only yields broken kernels: every knob value fails differently."""

import dataclasses

from swarmfactory.problems.suites.cpu.rmsnorm import PROBLEM as RMSNORM

TEMPLATE = """#include <stdint.h>
#include <stdlib.h>
{{ signature }} {
{% if mode == "syntax" %}
    int broken = ;
{% elif mode == "segv" %}
    volatile float *p = 0; *p = x[0];
{% elif mode == "exit" %}
    exit(7);
{% else %}
    for (int64_t i = 0; i < rows * cols; i++) y[i] = {{ value }};
{% endif %}
}
"""

PROBLEM = dataclasses.replace(
    RMSNORM, name="rmsnorm", template=TEMPLATE,
    knobs={"mode": ["syntax", "segv", "exit", "constant"], "value": ["0.0f", "1.0f", "x[i]"]},
    knob_defaults={"mode": "syntax", "value": "0.0f"},
    knob_aspects={"mode": "algorithm", "value": "vectorisation"},
)
