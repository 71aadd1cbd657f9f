"""The HTTP server: OpenAI and Anthropic APIs, Prometheus metrics and a chat and monitor page over one Engine."""
