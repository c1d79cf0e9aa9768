"""swarmfactory: agent swarms that build, verify and measure AI-inference kernels and engines."""

__version__ = "0.1.0"
