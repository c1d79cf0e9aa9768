"""Benchmark clients: serving.py is a load generator for OpenAI-compatible servers."""
