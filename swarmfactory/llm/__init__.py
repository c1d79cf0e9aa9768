"""Talking to language models: an OpenAI-compatible client with retries, limits and accounting."""
