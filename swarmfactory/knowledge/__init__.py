"""Knowledge that carries across problems, runs and machines.

``analyst.py`` reads the evidence store and writes lessons (claims about knob values with an
effect size, a bootstrap CI and the evaluations that support them) and re-checks them as evidence
grows; ``priors.py`` turns the lessons that hold for a problem into the knob-value priors and the
prompt lines the agents read from their board.
"""
